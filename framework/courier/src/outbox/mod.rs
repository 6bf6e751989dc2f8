//! The write side a service calls: appending events in the caller's transaction. The relay
//! that publishes them is [`crate::relay`].
//!
//! - [`append`]: `Outbox::append` / `append_all` inside the caller's transaction, and the
//!   wake-up of an idle shard's claimer.
//! - [`event`], [`attributes`]: what an event is and the attributes it is published with.
//! - [`shard`]: which shard an aggregate's rows go to.
//! - [`operator`]: the operator's commands on outbox rows (`courier outbox`).

pub mod append;
pub mod attributes;
pub mod event;
pub mod operator;
pub mod shard;

pub use append::{record_shard_count, AppendError, AppendTransaction, Appended, Outbox};
pub use event::{InvalidEvent, NewEvent};
