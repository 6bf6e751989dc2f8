//! The write side a service calls: appending events in the caller's transaction. The relay
//! that publishes them is [`crate::relay`].
//!
//! [`Outbox::append`] / `append_all` inside the caller's transaction (which also wakes an idle
//! shard's claimer); [`NewEvent`] is what an event is, [`attributes`] the attributes it is
//! published with, [`shard_of`] the shard an aggregate's rows go to. The operator's commands
//! on outbox rows (`courier outbox`) are in [`crate::operations`].

mod append;
pub mod attributes;
mod event;
pub(crate) mod operator;
mod shard;

pub use append::{
    record_shard_count, wake_channel, AppendError, AppendTransaction, Appended, Outbox,
};
pub use event::{check_topic_id, InvalidEvent, NewEvent, MAX_MESSAGE_BYTES};
pub use shard::{shard_of, stable_hash};
