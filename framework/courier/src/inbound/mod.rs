//! The read side: from a Pub/Sub subscription into a service's read model, idempotently.
//!
//! What a service implements is [`Projection`] (writing with [`VersionedUpsert`]); a
//! [`crate::Service`] runs its consumers, and a program without one starts a [`Consumer`]
//! itself. The modules are the machinery, private to the crate (operators' tools reach the
//! dead letters, parked keys and offsets through [`crate::operations`]):
//! - `consumer`: starts Receiver → ProjectorRouter → Projector per aggregate for one
//!   subscription and consumer group; how deliveries are acked, nacked or dead-lettered.
//! - `receiver` → `router` → `projector` → `committer`: the actors;
//!   `transaction`: the projection transactions they run; `messages`: what they send;
//!   `parts`: what they share (settings, handles, counters, ack/nack/dead-letter).
//! - `projection`: what a service implements, and the versioned-upsert helper.
//! - `delivery`: an event's metadata (from attributes) and its ack handle.
//! - `inbox`, `offsets`: deduplication and the consumer's position, in the projection's
//!   transaction; `dead_letter`: the dead-letter topic; `parked`: keys of delta
//!   projections held behind a gap.

pub(crate) mod committer;
pub(crate) mod consumer;
pub(crate) mod dead_letter;
pub(crate) mod dead_letter_log;
pub(crate) mod delivery;
pub(crate) mod inbox;
pub(crate) mod messages;
pub(crate) mod offsets;
pub(crate) mod parked;
pub(crate) mod parts;
pub(crate) mod projection;
pub(crate) mod projector;
pub(crate) mod receiver;
pub(crate) mod router;
pub(crate) mod transaction;

pub use consumer::{
    BeforeAck, Consumer, ConsumerError, ConsumerHandle, ConsumerOptions, ConsumerSpec,
    ConsumerStats, StatsSnapshot,
};
pub use delivery::{EventMeta, Rejection};
pub use offsets::{GroupOffset, OffsetReset, OffsetStore};
pub use projection::{uuid_field, HandlerError, Projection, UpsertOutcome, VersionedUpsert};
