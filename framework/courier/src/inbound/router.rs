//! ProjectorRouter: hands each delivery to its aggregate's projector, creating projectors on
//! demand under a cap on how many live at once.
//!
//! Deliveries of one key reach its projector in the order the router receives them (one
//! mailbox, synchronous hand-over). The registry (`KeyedActors`, as for the key publishers)
//! is shared with the projectors, which leave it themselves when idle.

use crate::inbound::committer::Committer;
use crate::inbound::delivery::Delivery;
use crate::inbound::messages::{Deliver, Stop};
use crate::inbound::parts::ConsumerParts;
use crate::inbound::projection::Projection;
use crate::inbound::projector::{LiveProjectors, Projector};
use crate::keyed_actors::{Queued, Refused};
use crate::supervision::Supervision;
use actix::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// How often routing re-checks for an idle projector while all are busy at the cap.
const CAP_RECHECK: Duration = Duration::from_millis(5);

/// Deliveries waiting in the router's mailbox. Each stream awaits `send()`, so a full mailbox
/// stops the streams from pulling, and the subscriber's flow control pushes back to Pub/Sub.
const ROUTER_MAILBOX: usize = 1_024;

pub struct ProjectorRouter<P: Projection> {
    parts: Arc<ConsumerParts<P>>,
    committer: Addr<Committer<P>>,
    live: Arc<LiveProjectors<P>>,
    supervision: Supervision,
}

impl<P: Projection> ProjectorRouter<P> {
    pub fn new(
        parts: Arc<ConsumerParts<P>>,
        committer: Addr<Committer<P>>,
        live: Arc<LiveProjectors<P>>,
        supervision: Supervision,
    ) -> Self {
        Self {
            parts,
            committer,
            live,
            supervision,
        }
    }

    fn has_room(&self, key: &str) -> bool {
        self.live.contains(key)
            || self.live.len() < self.parts.settings.max_live_projectors as usize
            || evict_one_idle(&self.live)
    }

    fn route(&mut self, key: String, delivery: Delivery<P::Event>) {
        let sent = self.live.send(&key, Deliver(delivery), |queued| {
            self.start_projector(&key, queued)
        });
        match sent {
            Ok(()) => {}
            Err(Refused::Full(Deliver(delivery))) => {
                // Cannot happen while flow control bounds what is outstanding (the mailbox
                // holds that many); if it does, Pub/Sub redelivers later.
                tracing::warn!(ordering_key = %key, "projector mailbox full; message nacked");
                self.parts.nack(delivery);
            }
            Err(Refused::Closed(Deliver(delivery))) => self.parts.nack(delivery),
        }
    }

    fn start_projector(&self, key: &str, queued: Arc<Queued>) -> Addr<Projector<P>> {
        let settings = &self.parts.settings;
        let mailbox = (settings.streams * settings.max_outstanding_messages) as usize;
        Projector::new(
            key.to_string(),
            self.parts.clone(),
            self.committer.clone(),
            self.live.clone(),
            queued,
            mailbox,
        )
        .start()
    }
}

impl<P: Projection> Actor for ProjectorRouter<P> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(ROUTER_MAILBOX);
    }
}

impl<P: Projection> Supervised for ProjectorRouter<P> {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        self.supervision.restarting();
    }
}

impl<P: Projection> Handler<Deliver<P::Event>> for ProjectorRouter<P> {
    type Result = ();

    fn handle(&mut self, msg: Deliver<P::Event>, ctx: &mut Self::Context) {
        let key = msg.0.meta.routing_key().to_string();
        if self.has_room(&key) {
            self.route(key, msg.0);
            return;
        }
        // Every live projector is busy at the cap: hold this delivery, and the mailbox behind
        // it, until one is idle. The streams wait on the full mailbox meanwhile.
        let live = self.live.clone();
        ctx.wait(
            async move {
                while !evict_one_idle(&live) {
                    tokio::time::sleep(CAP_RECHECK).await;
                }
            }
            .into_actor(self)
            .map(move |(), act, _| act.route(key, msg.0)),
        );
    }
}

/// Stops one idle projector to make room under the cap; false if every one is busy.
fn evict_one_idle<P: Projection>(live: &LiveProjectors<P>) -> bool {
    live.evict_one_idle()
        .map(|addr| addr.do_send(Stop))
        .is_some()
}
