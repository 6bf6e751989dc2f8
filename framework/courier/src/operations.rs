//! What operators' tools use beside a service's API: the `courier` command line, the load
//! harness, and tests that look inside a running pipeline. A service needs none of it; the
//! relay's and the consumer's modules stay private to the crate and show only this much.
//!
//! - **Outbox rows**: [`OutboxOperator`] retries or skips dead rows (audited);
//!   [`OutboxStore`] runs the relay's statements (claim, mark, backlog) for inspection and
//!   for measuring them; [`BacklogGauge`] counts unpublished rows per shard as the relay's
//!   gauges do.
//! - **Read side**: [`DeadLetterLog`] and [`DeadLetters`] (the dead-letter topic, what is
//!   open, republishing), [`KeyVersions`] (parked keys: release, skip to), [`Position`] (a
//!   consumer group's offset).
//! - **The database**: [`Horizon`] (what holds the xmin horizon back); the retention
//!   janitor's [`sweep`], which `courier` and tests run once.
//! - **The relay's Pub/Sub client settings**, so that a raw publisher in the load harness
//!   measures the same client the relay uses: [`CLIENT_BATCH_DELAY`], [`TopicClients`].

pub use crate::horizon::{
    Horizon, HorizonQuery, OutboxTuples, PreparedHolder, SessionHolder, SlotHolder,
};
pub use crate::inbound::dead_letter::{read_kept, revived, DeadLetters, KeptDeadLetter};
pub use crate::inbound::dead_letter_log::{DeadLetterLog, OpenDeadLetters};
pub use crate::inbound::offsets::Position;
pub use crate::inbound::parked::{
    KeyMove, KeyVersions, ParkedKey, Release, ReleaseError, Released,
};
pub use crate::outbox::operator::{
    ActedOn, Audit, DeadRow, DeadSelection, OutboxOperator, ShardStats,
};
pub use crate::relay::backlog::BacklogGauge;
pub use crate::relay::publish_limit::LimitSnapshot;
pub use crate::relay::publisher::CLIENT_BATCH_DELAY;
pub use crate::relay::store::{
    claim_statement, Backlog, ClaimedRow, FailedRow, OutboxStore, PublishedRow, PublishedRows,
    ShardBacklog,
};
pub use crate::relay::topic_clients::{
    TopicClients, KEYS_PER_CLIENT, REQUESTS_THE_CONNECTION_CARRIES,
};
pub use crate::retention::{
    start as start_janitor, sweep, sweep_from, Positions, RetentionQueries,
};

/// The attributes Courier adds to a message it dead-letters (beside the event's own), which
/// tools reading the dead-letter topic rely on.
pub mod dead_letter_attributes {
    pub use crate::inbound::dead_letter::{
        CONSUMER_GROUP, DELIVERY_ATTEMPT, MESSAGE_ID, ORDERING_KEY, REASON, SUBSCRIPTION,
    };
}
