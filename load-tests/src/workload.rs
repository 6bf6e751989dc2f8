//! The harness's workload: a business table that is the source of truth, one event per write
//! through the framework's outbox API in the same transaction, and a projection that keeps the
//! latest value per aggregate and logs every effect it has.
//!
//! Everything the checker and the latency report need is in the database: `load.writes` is
//! the log of committed writes (with the time each write was *meant* to start, which makes
//! open-loop latency coordinated-omission safe), `load.applied` one row per effect of the
//! projection (a second row for one version is a double effect), `load.projection` the read
//! model to compare with `load.source`.

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use courier::db::PgTransaction;
use courier::inbound::{EventMeta, HandlerError, Projection, VersionedUpsert};
use courier::outbox::{NewEvent, Outbox};

/// Creates the workload's tables (idempotent).
pub const SCHEMA: &str = "
    CREATE SCHEMA IF NOT EXISTS load;
    CREATE TABLE IF NOT EXISTS load.source (
        aggregate_id text PRIMARY KEY,
        version bigint NOT NULL,
        value text NOT NULL);
    CREATE TABLE IF NOT EXISTS load.writes (
        seq bigserial UNIQUE,
        aggregate_id text NOT NULL,
        version bigint NOT NULL,
        value text NOT NULL,
        intended_at timestamptz NOT NULL,
        committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (aggregate_id, version));
    CREATE TABLE IF NOT EXISTS load.applied (
        seq bigserial PRIMARY KEY,
        aggregate_id text NOT NULL,
        version bigint NOT NULL,
        intended_at timestamptz NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
    CREATE TABLE IF NOT EXISTS load.projection (
        aggregate_id text PRIMARY KEY,
        version bigint NOT NULL,
        value text NOT NULL);";

pub const AGGREGATE_TYPE: &str = "load";
pub const EVENT_TYPE: &str = "ValueSet";

/// The workload's event payload.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueSet {
    #[prost(string, tag = "1")]
    pub value: String,
    /// When the write was scheduled to start (open loop) or started (closed loop), in
    /// microseconds since the epoch: latency is measured from here.
    #[prost(int64, tag = "2")]
    pub intended_at_micros: i64,
}

/// Aggregate ids `agg-000000` …: a fixed key space the writers pick from.
pub fn aggregate_id(index: u64) -> String {
    format!("agg-{index:06}")
}

/// Writes one value of one aggregate: bumps the source row (its lock orders writes of one
/// aggregate), logs the write, and appends the event, all in one transaction.
pub struct Writer {
    outbox: Outbox,
    topic: String,
}

impl Writer {
    pub fn new(config: &courier::CourierConfig, topic: &str) -> Self {
        Self {
            outbox: Outbox::new(config),
            topic: topic.into(),
        }
    }

    /// Commits one write; returns its version.
    pub async fn write(
        &self,
        client: &mut tokio_postgres::Client,
        aggregate_id: &str,
        intended_at: DateTime<Utc>,
    ) -> anyhow::Result<i64> {
        let value = format!("{aggregate_id}@{}", intended_at.timestamp_micros());
        let tx = client.transaction().await.context("begin a write")?;
        let version: i64 = tx
            .query_one(
                "INSERT INTO load.source AS s (aggregate_id, version, value) VALUES ($1, 1, $2)
                 ON CONFLICT (aggregate_id) DO UPDATE SET version = s.version + 1, value = $2
                 RETURNING version",
                &[&aggregate_id, &value],
            )
            .await
            .context("bump the source row")?
            .get(0);
        tx.execute(
            "INSERT INTO load.writes (aggregate_id, version, value, intended_at)
             VALUES ($1, $2, $3, $4)",
            &[&aggregate_id, &version, &value, &intended_at],
        )
        .await
        .context("log the write")?;
        let payload = prost::Message::encode_to_vec(&ValueSet {
            value,
            intended_at_micros: intended_at.timestamp_micros(),
        });
        let event = NewEvent::new(
            &self.topic,
            AGGREGATE_TYPE,
            aggregate_id,
            EVENT_TYPE,
            version,
            payload,
        )
        .with_source_service("courier-load");
        self.outbox
            .append(&tx, event)
            .await
            .context("append the event")?;
        tx.commit().await.context("commit a write")?;
        Ok(version)
    }
}

/// The read model: the latest value per aggregate (versioned upsert) plus one `load.applied`
/// row per effect.
pub struct LoadProjection {
    upsert: VersionedUpsert,
}

impl LoadProjection {
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            upsert: VersionedUpsert::new("load.projection", &["aggregate_id"], &["value"])
                .map_err(anyhow::Error::msg)?,
        })
    }
}

impl Projection for LoadProjection {
    type Event = ValueSet;

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &ValueSet,
    ) -> Result<(), HandlerError> {
        let intended_at = DateTime::<Utc>::from_timestamp_micros(event.intended_at_micros)
            .ok_or_else(|| {
                HandlerError::Permanent(format!(
                    "intended_at {} is out of range",
                    event.intended_at_micros
                ))
            })?;
        self.upsert
            .execute(tx, &[&meta.aggregate_id, &event.value], meta.version)
            .await?;
        let record = tx
            .prepared(
                "INSERT INTO load.applied (aggregate_id, version, intended_at) VALUES ($1, $2, $3)",
            )
            .await?;
        tx.execute(&record, &[&meta.aggregate_id, &meta.version, &intended_at])
            .await?;
        Ok(())
    }
}
