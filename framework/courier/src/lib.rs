//! Courier moves domain events out of a service's PostgreSQL (transactional outbox) into
//! Google Cloud Pub/Sub, in per-aggregate order, and from Pub/Sub into other services' read
//! models, as supervised actix actors exchanging typed, bounded messages. The promises it
//! keeps are listed in docs/design.md (P1–P10).
//!
//! # Using it
//!
//! What a service touches is re-exported here; the README has a whole service in a page
//! (compiled as a doctest), and docs/writing-a-service.md the guide.
//! - **Declare the service**: a function returning a [`Service`] (its [`MigrationSet`], the
//!   topics it publishes to, an [`Inbound`] per consumed subscription, its HTTP routes), handed
//!   to `courier_cli::service::main`, which gives the binary `serve`, `migrate`, `provision`,
//!   `rebuild` and `backfill`.
//! - **Emit**: in an HTTP handler, take a connection from the [`ServiceContext`], write the
//!   business rows and [`Outbox::append`] (or `append_and_commit`) a [`NewEvent`] in the same
//!   transaction: the event exists iff the write commits. Invalid events are refused
//!   ([`AppendError`]) before anything is written.
//! - **Project**: implement [`Projection`] for the read model; write with a
//!   [`VersionedUpsert`] so replays and late duplicates never move a row backwards; return
//!   [`HandlerError::Transient`] for what a retry may fix and [`HandlerError::Permanent`] for
//!   what it cannot (dead-lettered with its reason).
//! - **Configure**: [`CourierConfig`], one TOML file per deployment with `COURIER_*`
//!   overrides (docs/configuration.md).
//!
//! A program that runs a relay or a consumer without a [`Service`] starts a [`Relay`] or an
//! [`inbound::Consumer`]. Operators' tools (the `courier` command line, the load harness)
//! reach what they inspect through [`operations`]. Everything else is machinery, private to
//! the crate.
//!
//! # Layout
//! Public:
//! - [`outbox`]: the write API (`Outbox::append` in the caller's transaction).
//! - [`inbound`]: the read side's API: the `Projection` trait services implement, the
//!   versioned upsert, and `Consumer` for running one outside a service.
//! - [`relay`]: `Relay::spawn` and its options.
//! - [`service`]: what a service declares (schema, topics, subscriptions, routes), the runtime
//!   that runs it (relay, consumers, HTTP with health/readiness/metrics); its command line is
//!   in the `courier-cli` crate, so this crate carries no command-line dependencies.
//! - [`config`]: the deployment config with `COURIER_*` overrides.
//! - [`migrate`]: versioned SQL migrations from `migrations/`.
//! - [`db`], [`pubsub`]: PostgreSQL pool and dedicated connections (TLS per libpq's
//!   `sslmode`); Pub/Sub clients that honour the emulator, and idempotent provisioning.
//! - [`backfill`]: the full-snapshot pass over a service's aggregates, through the outbox, in
//!   batches, resumable (`backfill_runs`).
//! - [`supervision`]: restart policies (budget within a window, backoff, escalation).
//! - [`telemetry`]: logging and trace export for the binaries; [`metrics`]: metric names and
//!   the exporter.
//! - [`operations`]: what operators' tools use.
//!
//! Private machinery:
//! - `relay/`: NotifyListener → ShardOwner → Claimer per shard → Publisher per ordering key;
//!   `inbound/`: Receiver (StreamingPull) → ProjectorRouter → Projector per aggregate →
//!   Committer; inbox, offsets, dead letters, parked keys.
//! - `keyed_actors`: the registry of per-key actors (key publishers, projectors) created on
//!   demand and passivated when idle; `fast_hash`: the hasher of the per-key and per-row maps.
//! - `retention`: the Janitor that deletes published outbox and processed inbox rows.
//! - `horizon`: what holds PostgreSQL's xmin horizon back (long transactions, replication
//!   slots, prepared transactions) and the outbox's dead row versions meanwhile.
//! - `system_thread`: a relay or consumer on its own thread and actix System; `backoff`:
//!   exponential backoff with full jitter; `conninfo`: reading libpq connection strings.

pub mod backfill;
pub(crate) mod backoff;
pub mod config;
pub(crate) mod conninfo;
pub mod db;
pub(crate) mod fast_hash;
pub(crate) mod horizon;
pub mod inbound;
pub(crate) mod keyed_actors;
pub mod metrics;
pub mod migrate;
pub mod operations;
pub mod outbox;
pub mod pubsub;
pub mod relay;
pub(crate) mod retention;
pub mod service;
pub mod supervision;
pub(crate) mod system_thread;
pub mod telemetry;

pub use config::CourierConfig;
pub use db::PgTransaction;
pub use inbound::{uuid_field, EventMeta, HandlerError, Projection, VersionedUpsert};
pub use migrate::{Migration, MigrationSet};
pub use outbox::{AppendError, NewEvent, Outbox};
pub use relay::{Relay, RelayOptions};
pub use service::{
    ApiError, Deployment, Inbound, Service, ServiceContext, VersionToken, WriteAccess,
};
