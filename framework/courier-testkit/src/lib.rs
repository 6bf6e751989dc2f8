//! Courier's test kit: real PostgreSQL and the real Pub/Sub emulator, isolated per test.
//!
//! - [`TestDb`]: a fresh database per test with the framework's migrations applied, on the
//!   server named by `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`);
//!   dropped when the value is dropped.
//! - [`TestPubSub`]: the emulator at `PUBSUB_EMULATOR_HOST`, or one started for this test
//!   binary on a free port (stopped when the binary exits); unique topic and subscription
//!   names per test.
//! - [`Collector`]: keeps one long-lived StreamingPull stream per subscription and records
//!   what arrives (the emulator's dead-stream bug forbids timeouts around `next()`).
//! - [`wait_until`]: polls a condition until a deadline instead of sleeping.
//! - [`BrokerProxy`]: a TCP proxy in front of the emulator that makes Pub/Sub slow or silent
//!   for a while, as a congested or stalled broker is.
//! - [`TlsPostgres`]: a PostgreSQL cluster of the test's own that accepts TLS only, with a
//!   certificate from a CA made for the test.
//! - [`generic_plan`]: the plan PostgreSQL keeps for a prepared statement, as `EXPLAIN` prints it.
//! - [`Api`]: JSON over HTTP against a running service.
//! - [`ServiceStack`]: any set of services migrated, provisioned and running in this process
//!   on a database and an emulator project of their own; collects what a topic receives and
//!   delivers a published event again without stopping anything.

mod api;
mod broker_proxy;
mod collector;
mod db;
mod emulator;
mod plans;
mod services;
mod statement_stats;
mod tls_postgres;
mod wait;

pub use api::{Api, Reply};
pub use broker_proxy::BrokerProxy;
pub use collector::{Collector, Received};
pub use db::TestDb;
pub use emulator::{emulator_launcher, free_port, wait_ready, TestPubSub, TEST_HEAP_MIB};
pub use plans::generic_plan;
pub use services::{run_options, service_config, Declaration, ServiceStack};
pub use tls_postgres::TlsPostgres;
pub use wait::wait_until;

use courier::CourierConfig;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// A config for one test: its database, the emulator, and timings short enough for tests.
pub fn test_config(db: &TestDb, pubsub: &TestPubSub) -> CourierConfig {
    test_config_on(db.config.clone(), pubsub)
}

/// [`test_config`] for a database that is not a [`TestDb`] (a cluster of the test's own).
pub fn test_config_on(
    database: courier::config::DatabaseConfig,
    pubsub: &TestPubSub,
) -> CourierConfig {
    let mut config = CourierConfig::default();
    config.database = database;
    config.pubsub = pubsub.config();
    config.relay.shard_count = 4;
    config.relay.claim_lease_secs = 5;
    config.relay.retry_base_millis = 100;
    config.relay.retry_cap_millis = 1_000;
    config.relay.publish_timeout_secs = 4;
    config.relay.publisher_idle_secs = 5;
    config
}

/// A relay with the default options, except that an actor escalating its failure is logged
/// rather than ending the process: a test that fails then says why.
pub fn spawn_relay(config: &CourierConfig) -> anyhow::Result<courier::relay::RelayHandle> {
    Ok(courier::relay::Relay::spawn(
        config,
        courier::relay::RelayOptions {
            escalate: std::sync::Arc::new(|e| tracing::error!(?e, "actor escalated")),
            ..courier::relay::RelayOptions::default()
        },
    )?)
}

/// An event of aggregate `key` at `version` on `topic`, whose payload names both
/// (`"<key>:<version>"`).
pub fn keyed_event(topic: &str, key: &str, version: i64) -> courier::outbox::NewEvent {
    courier::outbox::NewEvent::new(
        topic,
        "video",
        key,
        "video.changed",
        version,
        format!("{key}:{version}").into_bytes(),
    )
}

/// A name no other test uses: `<prefix>-<12 hex digits>`, valid as a topic or subscription id.
pub fn unique_name(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &id[..12])
}

/// Sends the framework's logs to the test's output (shown for failing tests); level from
/// `RUST_LOG`, default `info`. Safe to call from every test.
pub fn init_logging() {
    install_logging(opentelemetry_sdk::trace::SdkTracerProvider::builder().build());
}

/// [`init_logging`] with every finished span recorded in memory, for tests of trace
/// propagation; returns the recording. Call it first thing in its own test binary: the
/// subscriber is global, and a binary that installed [`init_logging`] records nothing.
pub fn record_spans() -> opentelemetry_sdk::trace::InMemorySpanExporter {
    static SPANS: std::sync::OnceLock<opentelemetry_sdk::trace::InMemorySpanExporter> =
        std::sync::OnceLock::new();
    SPANS
        .get_or_init(|| {
            let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
            install_logging(
                opentelemetry_sdk::trace::SdkTracerProvider::builder()
                    .with_simple_exporter(exporter.clone())
                    .build(),
            );
            exporter
        })
        .clone()
}

/// Test output at `RUST_LOG` (default info), with the binaries' trace context layer (spans
/// going to `provider`), so appended events carry their writer's trace.
fn install_logging(provider: opentelemetry_sdk::trace::SdkTracerProvider) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .with(courier::telemetry::trace_context_layer_with(provider))
        .try_init();
}
