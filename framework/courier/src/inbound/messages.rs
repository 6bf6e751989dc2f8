//! The typed messages between the read side's actors: receiver → router → projector.

use crate::inbound::delivery::Delivery;
use actix::prelude::*;

/// Apply this delivery after the ones before it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deliver<E: 'static>(pub Delivery<E>);

/// Leave now (evicted by the router to make room); only sent with nothing queued.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;
