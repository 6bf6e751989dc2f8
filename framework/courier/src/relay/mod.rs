//! The relay: publishes the outbox's rows to Pub/Sub in per-key order, as supervised actors.
//!
//! - [`tree`]: starts the actor tree below ([`Relay::spawn`]).
//! - [`notify_listener`] → [`shard_owner`] → [`claimer`] → [`publisher`]: the actors;
//!   `marking` writes the claimer's outcomes and `scan_from` says where its claims start
//!   looking, from a shard's `floor`; [`publish_limit`] is the congestion control they
//!   share, judged partly by the claimers' [`keys_out`] (by [`publisher_key`]);
//!   [`topic_clients`] the Pub/Sub clients the publishers use.
//! - [`store`]: the relay's SQL (`queries/*.sql`), which marks rows at their
//!   [`row_address`]; [`backlog`]: the outbox gauges.

pub mod backlog;
pub mod claimer;
mod floor;
pub mod keys_out;
mod marking;
pub mod notify_listener;
pub mod publish_limit;
pub mod publisher;
pub mod publisher_key;
pub mod row_address;
mod scan_from;
pub mod shard_owner;
pub mod store;
pub mod topic_clients;
pub mod tree;

pub use tree::{Relay, RelayError, RelayHandle, RelayOptions};
