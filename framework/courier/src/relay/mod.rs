//! The relay: publishes the outbox's rows to Pub/Sub in per-key order, as supervised actors.
//!
//! What a program uses is [`Relay::spawn`] with [`RelayOptions`]; the modules are the
//! machinery, private to the crate (operators' tools reach the store and gauges through
//! [`crate::operations`]):
//! - `tree`: starts the actor tree below.
//! - `notify_listener` → `shard_owner` → `claimer` → `publisher`: the actors;
//!   `marking` writes the claimer's outcomes and `scan_from` says where its claims start
//!   looking, from a shard's `floor`; `publish_limit` is the congestion control they
//!   share, judged partly by the claimers' `keys_out` (by `publisher_key`);
//!   `topic_clients` the Pub/Sub clients the publishers use.
//! - `store`: the relay's SQL (`queries/*.sql`), which marks rows at their
//!   `row_address`; `backlog`: the outbox gauges.

pub(crate) mod backlog;
pub(crate) mod claimer;
mod floor;
pub(crate) mod keys_out;
mod marking;
pub(crate) mod notify_listener;
pub(crate) mod publish_limit;
pub(crate) mod publisher;
pub(crate) mod publisher_key;
pub(crate) mod row_address;
mod scan_from;
pub(crate) mod shard_owner;
pub(crate) mod store;
pub(crate) mod topic_clients;
pub(crate) mod tree;

pub use claimer::BeforeMark;
pub use publish_limit::LimitSnapshot;
pub use publisher::PublishFault;
pub use tree::{Relay, RelayError, RelayHandle, RelayOptions};
