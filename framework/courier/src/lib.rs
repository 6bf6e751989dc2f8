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
//! The modules below are the machinery (relay, consumer, stores); a service needs them only
//! to run a relay or consumer outside a [`Service`] ([`Relay`], [`inbound::Consumer`]).
//!
//! # Layout
//! - [`outbox`]: the write API (`Outbox::append` in the caller's transaction).
//! - [`relay`]: the relay's actors: NotifyListener → ShardOwner → Claimer per shard →
//!   Publisher per ordering key.
//! - [`inbound`]: the read side: Receiver (StreamingPull) → ProjectorRouter → Projector per
//!   aggregate; inbox, offsets, dead letters, and the `Projection` trait services implement.
//! - [`keyed_actors`]: the registry of per-key actors (key publishers, projectors) created on
//!   demand and passivated when idle; [`fast_hash`]: the hasher of the per-key and per-row maps.
//! - [`supervision`]: restart policies (budget within a window, backoff, escalation).
//! - [`migrate`]: versioned SQL migrations from `migrations/`.
//! - [`db`], [`pubsub`]: PostgreSQL pool and dedicated connections (TLS per libpq's `sslmode`,
//!   [`conninfo`] reads it from connection strings); Pub/Sub clients that honour the emulator,
//!   and idempotent provisioning.
//! - [`service`]: what a service declares (schema, topics, subscriptions, routes), the runtime
//!   that runs it (relay, consumers, HTTP with health/readiness/metrics); its command line is
//!   in the `courier-cli` crate, so this crate carries no command-line dependencies.
//! - [`backfill`]: the operator's full-snapshot pass over a service's aggregates, through the
//!   outbox, in batches, resumable (`backfill_runs`).
//! - [`retention`]: the Janitor that deletes published outbox and processed inbox rows.
//! - [`horizon`]: what holds PostgreSQL's xmin horizon back (long transactions, replication
//!   slots, prepared transactions) and the outbox's dead row versions meanwhile.
//! - [`system_thread`]: a relay or consumer on its own thread and actix System.
//! - [`telemetry`]: logging set-up for the binaries.
//! - [`config`]: the deployment config with `COURIER_*` overrides.
//! - [`backoff`]: exponential backoff with full jitter; [`metrics`]: metric names and exporter.

pub mod backfill;
pub mod backoff;
pub mod config;
pub mod conninfo;
pub mod db;
pub mod fast_hash;
pub mod horizon;
pub mod inbound;
pub mod keyed_actors;
pub mod metrics;
pub mod migrate;
pub mod outbox;
pub mod pubsub;
pub mod relay;
pub mod retention;
pub mod service;
pub mod supervision;
pub mod system_thread;
pub mod telemetry;

pub use config::CourierConfig;
pub use db::PgTransaction;
pub use inbound::{uuid_field, EventMeta, HandlerError, Projection, VersionedUpsert};
pub use migrate::{Migration, MigrationSet};
pub use outbox::{AppendError, NewEvent, Outbox};
pub use relay::{Relay, RelayOptions};
pub use service::{ApiError, Inbound, Service, ServiceContext, VersionToken, WriteAccess};
