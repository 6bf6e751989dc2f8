//! The read side: from a Pub/Sub subscription into a service's read model, idempotently.
//!
//! - [`consumer`]: starts Receiver → ProjectorRouter → Projector per aggregate for one
//!   subscription and consumer group; how deliveries are acked, nacked or dead-lettered.
//! - [`receiver`] → [`router`] → [`projector`] → [`committer`]: the actors;
//!   [`transaction`]: the projection transactions they run; [`messages`]: what they send;
//!   [`parts`]: what they share (settings, handles, counters, ack/nack/dead-letter).
//! - [`projection`]: what a service implements, and the versioned-upsert helper.
//! - [`delivery`]: an event's metadata (from attributes) and its ack handle.
//! - [`inbox`], [`offsets`]: deduplication and the consumer's position, in the projection's
//!   transaction; [`dead_letter`]: the dead-letter topic; [`parked`]: keys of delta
//!   projections held behind a gap.

pub mod committer;
pub mod consumer;
pub mod dead_letter;
pub mod dead_letter_log;
pub mod delivery;
pub mod inbox;
pub mod messages;
pub mod offsets;
pub mod parked;
pub mod parts;
pub mod projection;
pub mod projector;
pub mod receiver;
pub mod router;
pub mod transaction;

pub use consumer::{
    Consumer, ConsumerError, ConsumerHandle, ConsumerOptions, ConsumerSpec, ConsumerStats,
    StatsSnapshot,
};
pub use delivery::{EventMeta, Rejection};
pub use offsets::{GroupOffset, OffsetReset, OffsetStore};
pub use projection::{uuid_field, HandlerError, Projection, UpsertOutcome, VersionedUpsert};
