//! The write API: append events inside the caller's transaction (P1).
//!
//! There is no other way to emit an event: the outbox row commits or rolls back with the
//! business rows, and the relay publishes only committed rows.

use crate::config::CourierConfig;
use crate::db::{render, DbError, PgTransaction};
use crate::outbox::event::{InvalidEvent, NewEvent};
use crate::outbox::shard::shard_of;
use chrono::{DateTime, Utc};
use std::future::Future;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, Transaction};
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

    /// The row already exists (the same aggregate version committed before, or the same event
    /// id still unpublished): an optimistic-concurrency conflict for the caller.
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
    /// Runs `sql` with `params` (each with the type the statement declares for it) and returns
    /// its rows.
    fn run_append(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> impl Future<Output = Result<Vec<Row>, tokio_postgres::Error>>;
}

impl AppendTransaction for Transaction<'_> {
    async fn run_append(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.query_typed(sql, params).await
    }
}

impl AppendTransaction for PgTransaction<'_> {
    async fn run_append(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.prepared(sql).await?;
        self.query(&statement, &untyped(params)).await
    }
}

/// The values of typed parameters, for a prepared statement (which knows their types).
fn untyped<'a>(params: &[(&'a (dyn ToSql + Sync), Type)]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|(value, _)| *value).collect()
}

/// Appends events to one schema's outbox.
///
/// An event that names its cause (`causation_id`, e.g. the id of the event a projection
/// consumed) is appended once per cause: appending the same version of its aggregate again
/// with the same cause — a redelivered or replayed event re-running the projection that emitted
/// it — writes nothing and is returned as a [replay](Appended::replay), for as long as the
/// version ledger remembers the version (`retention.version_hours`, by default the 7 days a
/// Seek can go back). The same version with another cause, or none, is refused as a conflict.
#[derive(Debug, Clone)]
pub struct Outbox {
    shard_count: u32,
    /// NOTIFY channel the relay's listener LISTENs on.
    channel: String,
    /// The statements for appends of events without a cause.
    plain: AppendStatements,
    /// The statements for appends some of whose events name their cause.
    caused: AppendStatements,
    /// Whether appends wake an idle relay (see [`Outbox::without_wakeups`]).
    wakeups: bool,
}

/// The forms of one kind of append's statement: the version ledger, the rows, and a wake-up
/// NOTIFY for the events' idle shards, in one statement.
#[derive(Debug, Clone)]
struct AppendStatements {
    many_shards: String,
    /// For events that all go to one shard (most appends: see queries/wake_idle_shard.sql).
    one_shard: String,
    /// Without the wake-up.
    quiet: String,
    /// The parameters of the quiet form; the wake channel follows them, then the one shard.
    columns: usize,
}

impl AppendStatements {
    fn new(schema: &str, caused: bool) -> Self {
        let (versions, insert, columns) = if caused {
            (
                include_str!("queries/record_caused_versions.sql"),
                include_str!("queries/insert_caused_events.sql"),
                12,
            )
        } else {
            (
                include_str!("queries/record_versions.sql"),
                include_str!("queries/insert_events.sql"),
                11,
            )
        };
        let versions = render(versions, schema);
        let insert = render(insert, schema);
        let wake = |sql: &str| {
            render(sql, schema)
                .replace("{channel}", &format!("${}", columns + 1))
                .replace("{shard}", &format!("${}", columns + 2))
        };
        let with_wake = |wake: String| {
            if caused {
                // The ids of the rows written tell replays apart; the wake runs (once) when
                // a row is written.
                format!(
                    "WITH versions AS (\n{versions}\n), inserted AS (\n{insert}\n), \
                     woken AS (\n{wake}\n)\n\
                     SELECT id FROM inserted WHERE (SELECT count(*) FROM woken) >= 0"
                )
            } else {
                format!("WITH versions AS (\n{versions}\n), inserted AS (\n{insert}\n)\n{wake}")
            }
        };
        Self {
            many_shards: with_wake(wake(include_str!("queries/wake_idle_shards.sql"))),
            one_shard: with_wake(wake(include_str!("queries/wake_idle_shard.sql"))),
            quiet: format!("WITH versions AS (\n{versions}\n)\n{insert}"),
            columns,
        }
    }
}

/// The NOTIFY channel of a schema's outbox.
pub fn wake_channel(schema: &str) -> String {
    format!("{schema}_outbox_wake")
}

/// Records `config.relay.shard_count` in the schema's `outbox_settings`, where the SQL appends
/// (`append_event`, `append_events`: migrations/courier/0020_sql_append.sql) read the shard
/// count. `<service> migrate` and the relay call it with the deployment's config, so a producer
/// in another language shards exactly as [`Outbox::append`] and the relay do; until it has run
/// the SQL appends refuse (SQLSTATE 55000) rather than write rows into a shard no relay owns.
/// A count that changed is logged as a warning.
pub async fn record_shard_count(
    client: &tokio_postgres::Client,
    config: &CourierConfig,
) -> Result<(), DbError> {
    let schema = &config.database.schema;
    let count = i32::try_from(config.relay.shard_count).unwrap_or(i32::MAX);
    let sql = render(
        "WITH before AS (SELECT shard_count FROM {schema}.outbox_settings)
         , recorded AS (
             INSERT INTO {schema}.outbox_settings (shard_count) VALUES ($1)
             ON CONFLICT (singleton) DO UPDATE SET shard_count = EXCLUDED.shard_count,
                 recorded_at = now()
             WHERE {schema}.outbox_settings.shard_count <> EXCLUDED.shard_count)
         SELECT (SELECT shard_count FROM before)",
        schema,
    );
    let row = client
        .query_one(&sql, &[&count])
        .await
        .map_err(DbError::query(format!(
            "record relay.shard_count {count} in {schema}.outbox_settings"
        )))?;
    let before: Option<i32> = row
        .try_get(0)
        .map_err(DbError::query("read the shard count recorded before"))?;
    if let Some(before) = before.filter(|&before| before != count) {
        tracing::warn!(
            schema = %schema,
            before,
            now = count,
            "relay.shard_count changed; SQL appends now shard by the new count"
        );
    }
    Ok(())
}

/// What was appended: enough for a consistency token (`aggregate_id`, `version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub event_id: Uuid,
    pub aggregate_id: String,
    pub version: i64,
    pub shard: u32,
    /// The version was appended before with the same `causation_id`: this append wrote
    /// nothing (see [`Outbox`]), and `event_id` names no row.
    pub replay: bool,
}

impl Outbox {
    pub fn new(config: &CourierConfig) -> Self {
        let schema = &config.database.schema;
        Self {
            shard_count: config.relay.shard_count,
            channel: wake_channel(schema),
            plain: AppendStatements::new(schema, false),
            caused: AppendStatements::new(schema, true),
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
        events: Vec<NewEvent>,
    ) -> Result<Vec<Appended>, AppendError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let (rows, mut appended) = self.rows(events)?;
        let (sql, param_count) = self.insert(&rows);
        let params = rows.params(&self.channel);
        let count = appended.len();
        let context = || format!("append {count} events to outbox");
        let written = tx
            .run_append(sql, &params[..param_count])
            .await
            .map_err(DbError::query(context()))?;
        rows.note_replays(&mut appended, &written)
            .map_err(DbError::query(context()))?;
        Ok(appended)
    }

    /// Appends one event as the last statement of `tx` and commits (see
    /// [`Outbox::append_all_and_commit`]).
    pub async fn append_and_commit(
        &self,
        tx: PgTransaction<'_>,
        event: NewEvent,
    ) -> Result<Appended, AppendError> {
        let mut appended = self.append_all_and_commit(tx, vec![event]).await?;
        Ok(appended.remove(0))
    }

    /// Appends `events` as the last statement of `tx` and commits, with the COMMIT sent right
    /// behind the insert: one round trip less than [`Outbox::append_all`] and then a commit.
    /// Nothing is committed unless the events are: invalid events are refused before anything
    /// is sent (the transaction is then rolled back), and a failing insert makes PostgreSQL
    /// roll the transaction back at the COMMIT. A commit error is returned as the database
    /// error it is (a lost connection leaves it unknown whether the commit happened, as with
    /// any commit).
    pub async fn append_all_and_commit(
        &self,
        tx: PgTransaction<'_>,
        events: Vec<NewEvent>,
    ) -> Result<Vec<Appended>, AppendError> {
        let (rows, mut appended) = self.rows(events)?;
        let count = appended.len();
        let context = || format!("append {count} events to outbox and commit");
        if appended.is_empty() {
            tx.commit().await.map_err(DbError::query(context()))?;
            return Ok(appended);
        }
        let (sql, param_count) = self.insert(&rows);
        let statement = tx.prepared(sql).await.map_err(DbError::query(context()))?;
        let params = rows.params(&self.channel);
        let written = tx
            .query_and_commit(&statement, &untyped(&params[..param_count]))
            .await
            .map_err(DbError::query(context()))?;
        rows.note_replays(&mut appended, &written)
            .map_err(DbError::query(context()))?;
        Ok(appended)
    }

    /// The insert for `rows`, with the wake-up or without it (see [`Outbox::without_wakeups`]),
    /// and how many of [`AppendRows::params`] it takes (the wake channel, then the one shard).
    fn insert(&self, rows: &AppendRows) -> (&str, usize) {
        let statements = if rows.caused {
            &self.caused
        } else {
            &self.plain
        };
        let columns = statements.columns;
        if !self.wakeups {
            (&statements.quiet, columns)
        } else if rows.shards.iter().all(|&shard| shard == rows.first_shard) {
            (&statements.one_shard, columns + 2)
        } else {
            (&statements.many_shards, columns + 1)
        }
    }

    /// `events` validated (all of them, so that none is written if any is invalid) and laid
    /// out as the insert's columns, with what each append returns.
    fn rows(&self, mut events: Vec<NewEvent>) -> Result<(AppendRows, Vec<Appended>), AppendError> {
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
        let mut rows = AppendRows::with_capacity(n);
        let mut appended = Vec::with_capacity(n);
        for event in events {
            let shard = shard_of(&event.aggregate_id, self.shard_count);
            rows.attributes
                .push(serde_json::json!(event.optional_attributes()));
            appended.push(Appended {
                event_id: event.event_id,
                aggregate_id: event.aggregate_id.clone(),
                version: event.version,
                shard,
                replay: false,
            });
            rows.ids.push(event.event_id);
            // shard < shard_count ≤ 1024 fits in i32.
            let shard = i32::try_from(shard).unwrap_or(i32::MAX);
            if rows.shards.is_empty() {
                rows.first_shard = shard;
            }
            rows.shards.push(shard);
            rows.topics.push(event.topic);
            rows.aggregate_types.push(event.aggregate_type);
            rows.aggregate_ids.push(event.aggregate_id);
            rows.event_types.push(event.event_type);
            rows.versions.push(event.version);
            rows.schema_versions.push(event.schema_version);
            rows.payloads.push(event.payload);
            rows.occurred.push(event.occurred_at);
            rows.caused |= event.causation_id.is_some();
            rows.causations.push(event.causation_id);
        }
        Ok((rows, appended))
    }
}

/// The events of one append as the insert's array parameters, a column each.
struct AppendRows {
    ids: Vec<Uuid>,
    shards: Vec<i32>,
    /// The first event's shard: the one-shard wake's parameter.
    first_shard: i32,
    topics: Vec<String>,
    aggregate_types: Vec<String>,
    aggregate_ids: Vec<String>,
    event_types: Vec<String>,
    versions: Vec<i64>,
    schema_versions: Vec<i32>,
    payloads: Vec<Vec<u8>>,
    attributes: Vec<serde_json::Value>,
    occurred: Vec<DateTime<Utc>>,
    /// Each event's `causation_id`.
    causations: Vec<Option<String>>,
    /// Some event names its cause: the caused appends' statements, which skip replays.
    caused: bool,
}

impl AppendRows {
    fn with_capacity(n: usize) -> Self {
        Self {
            ids: Vec::with_capacity(n),
            shards: Vec::with_capacity(n),
            first_shard: 0,
            topics: Vec::with_capacity(n),
            aggregate_types: Vec::with_capacity(n),
            aggregate_ids: Vec::with_capacity(n),
            event_types: Vec::with_capacity(n),
            versions: Vec::with_capacity(n),
            schema_versions: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            attributes: Vec::with_capacity(n),
            occurred: Vec::with_capacity(n),
            causations: Vec::with_capacity(n),
            caused: false,
        }
    }

    /// The insert's parameters, each with its declared type: the columns, the causes (for
    /// the caused appends' statements), then the wake channel and the first event's shard.
    fn params<'a>(&'a self, channel: &'a String) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        let mut params: Vec<(&'a (dyn ToSql + Sync), Type)> = vec![
            (&self.ids, Type::UUID_ARRAY),
            (&self.shards, Type::INT4_ARRAY),
            (&self.topics, Type::TEXT_ARRAY),
            (&self.aggregate_types, Type::TEXT_ARRAY),
            (&self.aggregate_ids, Type::TEXT_ARRAY),
            (&self.event_types, Type::TEXT_ARRAY),
            (&self.versions, Type::INT8_ARRAY),
            (&self.schema_versions, Type::INT4_ARRAY),
            (&self.payloads, Type::BYTEA_ARRAY),
            (&self.attributes, Type::JSONB_ARRAY),
            (&self.occurred, Type::TIMESTAMPTZ_ARRAY),
        ];
        if self.caused {
            params.push((&self.causations, Type::TEXT_ARRAY));
        }
        params.push((channel, Type::TEXT));
        params.push((&self.first_shard, Type::INT4));
        params
    }

    /// Marks as replays the events of a caused append that `written` (the ids of the rows its
    /// statement returned) lacks, and counts what was written.
    fn note_replays(
        &self,
        appended: &mut [Appended],
        written: &[Row],
    ) -> Result<(), tokio_postgres::Error> {
        let mut replays = 0;
        if self.caused {
            let written = written
                .iter()
                .map(|row| row.try_get::<_, Uuid>(0))
                .collect::<Result<std::collections::HashSet<_>, _>>()?;
            for event in appended.iter_mut() {
                event.replay = !written.contains(&event.event_id);
                replays += u64::from(event.replay);
            }
        }
        let total = appended.len() as u64;
        metrics::counter!(crate::metrics::OUTBOX_APPENDED_TOTAL).increment(total - replays);
        if replays > 0 {
            metrics::counter!(crate::metrics::OUTBOX_REPLAYED_APPENDS_TOTAL).increment(replays);
        }
        Ok(())
    }
}
