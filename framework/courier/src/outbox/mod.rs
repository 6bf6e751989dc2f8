//! The write side: appending events in the caller's transaction, and the relay that publishes
//! them to Pub/Sub in per-key order.
//!
//! - [`append`]: `Outbox::append` / `append_all` inside the caller's transaction.
//! - [`event`], [`attributes`]: what an event is and the attributes it is published with.
//! - [`relay`]: starts the actor tree below.
//! - [`notify_listener`] → [`shard_owner`] → [`claimer`] → [`publisher`]: the actors;
//!   [`marking`] writes the claimer's outcomes and [`scan_from`] says where its claims start
//!   looking; [`publish_limit`] is the congestion control they share, judged
//!   partly by the claimers' [`keys_out`]; [`topic_clients`] the
//!   Pub/Sub clients the publishers use.
//! - [`store`]: the relay's SQL (`queries/*.sql`), which marks rows at their
//!   [`row_address`]; [`shard`]: shard hashing.

pub mod append;
pub mod attributes;
pub mod backlog;
pub mod claimer;
pub mod event;
mod floor;
pub mod keys_out;
mod marking;
pub mod notify_listener;
pub mod operator;
pub mod publish_limit;
pub mod publisher;
pub mod relay;
pub mod row_address;
mod scan_from;
pub mod shard;
pub mod shard_owner;
pub mod store;
pub mod topic_clients;

pub use append::{AppendError, AppendTransaction, Appended, Outbox};
pub use event::{InvalidEvent, NewEvent};
pub use relay::{Relay, RelayHandle, RelayOptions};
