//! The write API: append events inside the caller's transaction (P1).
//!
//! There is no other way to emit an event: the outbox row commits or rolls back with the
//! business rows, and the relay publishes only committed rows.

use crate::config::CourierConfig;
use crate::db::{render, DbError, PgTransaction};
use crate::outbox::event::{InvalidEvent, NewEvent};
use crate::outbox::shard::shard_of;
use std::future::Future;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Transaction;
use uuid::Uuid;

/// Why an append failed. Nothing was written in either case.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The event breaks a rule; the caller must fix it (HTTP 400 at a service's edge).
    #[error(transparent)]
    Invalid(#[from] InvalidEvent),
    /// Two events of one call share `(aggregate_id, version)`.
    #[error("events {first} and {second} are both version {version} of aggregate {aggregate_id}")]
    DuplicateVersion {
        aggregate_id: String,
        version: i64,
        first: Uuid,
        second: Uuid,
    },
    #[error(transparent)]
    Db(#[from] DbError),
}

impl AppendError {
    /// A transient database error: retrying the caller's whole transaction may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, AppendError::Db(e) if e.is_transient())
    }

    /// The row already exists (same event id, or same aggregate version committed before):
    /// an optimistic-concurrency conflict for the caller.
    pub fn is_conflict(&self) -> bool {
        matches!(self, AppendError::Db(DbError::Query { error, .. })
            if error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION))
    }
}

/// A caller's transaction that an append can run in.
///
/// On a pooled connection's [`PgTransaction`] (what services get from their pool) the insert
/// runs prepared once per connection: parsing and planning it for every call cost the write
/// path ~30 % against a prepared plain INSERT (load-tests: append). A plain tokio-postgres
/// [`Transaction`] has no statement cache, so there it is parsed and planned each time, in the
/// same single round trip.
pub trait AppendTransaction {
    /// Runs `sql` with `params` (each with the type the statement declares for it).
    fn run_append(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<(), tokio_postgres::Error>>;
}

impl AppendTransaction for Transaction<'_> {
    async fn run_append(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<(), tokio_postgres::Error> {
        self.query_typed(sql, params).await.map(drop)
    }
}

impl AppendTransaction for PgTransaction<'_> {
    async fn run_append(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<(), tokio_postgres::Error> {
        let statement = self.prepared(sql).await?;
        let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(value, _)| *value).collect();
        self.execute(&statement, &values).await.map(drop)
    }
}

/// Appends events to one schema's outbox.
#[derive(Debug, Clone)]
pub struct Outbox {
    shard_count: u32,
    /// NOTIFY channel the relay's listener LISTENs on.
    channel: String,
    append_sql: String,
    /// The same insert without the wake-up.
    append_quiet_sql: String,
    /// Whether appends wake an idle relay (see [`Outbox::without_wakeups`]).
    wakeups: bool,
}

/// The NOTIFY channel of a schema's outbox.
pub fn wake_channel(schema: &str) -> String {
    format!("{schema}_outbox_wake")
}

/// What was appended: enough for a consistency token (`aggregate_id`, `version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub event_id: Uuid,
    pub aggregate_id: String,
    pub version: i64,
    pub shard: u32,
}

impl Outbox {
    pub fn new(config: &CourierConfig) -> Self {
        let schema = &config.database.schema;
        let insert = render(include_str!("queries/insert_events.sql"), schema);
        let wake = render(include_str!("queries/wake_idle_shards.sql"), schema);
        Self {
            shard_count: config.relay.shard_count,
            channel: wake_channel(schema),
            append_sql: format!("WITH inserted AS (\n{insert}\n)\n{wake}"),
            append_quiet_sql: insert,
            wakeups: true,
        }
    }

    /// An outbox whose appends never NOTIFY: the relay finds new rows only by polling (up to
    /// `relay.poll_max_millis` late when idle). For deployments where LISTEN is unavailable
    /// (some connection poolers), and as the write-path baseline in benchmarks.
    pub fn without_wakeups(mut self) -> Self {
        self.wakeups = false;
        self
    }

    /// Appends one event in `tx`.
    pub async fn append(
        &self,
        tx: &impl AppendTransaction,
        event: NewEvent,
    ) -> Result<Appended, AppendError> {
        let mut appended = self.append_all(tx, vec![event]).await?;
        Ok(appended.remove(0))
    }

    /// Appends `events` in `tx` with one statement. All are validated first: if any is
    /// invalid, none is written.
    pub async fn append_all(
        &self,
        tx: &impl AppendTransaction,
        mut events: Vec<NewEvent>,
    ) -> Result<Vec<Appended>, AppendError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(trace) = crate::telemetry::current_trace() {
            for event in &mut events {
                event.inherit_trace(&trace);
            }
        }
        let mut seen = std::collections::HashMap::new();
        for event in &events {
            event.validate()?;
            if let Some(first) = seen.insert((&event.aggregate_id, event.version), event.event_id) {
                return Err(AppendError::DuplicateVersion {
                    aggregate_id: event.aggregate_id.clone(),
                    version: event.version,
                    first,
                    second: event.event_id,
                });
            }
        }
        let n = events.len();
        let mut ids = Vec::with_capacity(n);
        let mut shards = Vec::with_capacity(n);
        let mut topics = Vec::with_capacity(n);
        let mut aggregate_types = Vec::with_capacity(n);
        let mut aggregate_ids = Vec::with_capacity(n);
        let mut event_types = Vec::with_capacity(n);
        let mut versions = Vec::with_capacity(n);
        let mut schema_versions = Vec::with_capacity(n);
        let mut payloads = Vec::with_capacity(n);
        let mut attributes = Vec::with_capacity(n);
        let mut occurred = Vec::with_capacity(n);
        let mut appended = Vec::with_capacity(n);
        for event in events {
            let shard = shard_of(&event.aggregate_id, self.shard_count);
            attributes.push(serde_json::json!(event.optional_attributes()));
            appended.push(Appended {
                event_id: event.event_id,
                aggregate_id: event.aggregate_id.clone(),
                version: event.version,
                shard,
            });
            ids.push(event.event_id);
            // shard < shard_count ≤ 1024 fits in i32.
            shards.push(i32::try_from(shard).unwrap_or(i32::MAX));
            topics.push(event.topic);
            aggregate_types.push(event.aggregate_type);
            aggregate_ids.push(event.aggregate_id);
            event_types.push(event.event_type);
            versions.push(event.version);
            schema_versions.push(event.schema_version);
            payloads.push(event.payload);
            occurred.push(event.occurred_at);
        }
        let params: [(&(dyn ToSql + Sync), Type); 12] = [
            (&ids, Type::UUID_ARRAY),
            (&shards, Type::INT4_ARRAY),
            (&topics, Type::TEXT_ARRAY),
            (&aggregate_types, Type::TEXT_ARRAY),
            (&aggregate_ids, Type::TEXT_ARRAY),
            (&event_types, Type::TEXT_ARRAY),
            (&versions, Type::INT8_ARRAY),
            (&schema_versions, Type::INT4_ARRAY),
            (&payloads, Type::BYTEA_ARRAY),
            (&attributes, Type::JSONB_ARRAY),
            (&occurred, Type::TIMESTAMPTZ_ARRAY),
            (&self.channel, Type::TEXT),
        ];
        let (sql, params) = if self.wakeups {
            (&self.append_sql, &params[..])
        } else {
            (&self.append_quiet_sql, &params[..11])
        };
        tx.run_append(sql, params)
            .await
            .map_err(DbError::query(format!("append {n} events to outbox")))?;
        metrics::counter!(crate::metrics::OUTBOX_APPENDED_TOTAL).increment(n as u64);
        Ok(appended)
    }
}
