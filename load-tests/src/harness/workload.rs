//! The harness's workload: a business table that is the source of truth, one event per write
//! through the framework's outbox API in the same transaction, and a projection that logs
//! every effect it has.
//!
//! Two choices shape it, as production does:
//! - the key space: a fixed set of aggregates written again and again ([`KeySpace::Reused`]),
//!   or a fresh UUID aggregate per create, as every new video is ([`KeySpace::Unique`]),
//!   optionally followed by a few updates each;
//! - the events: each write carries the aggregate's whole state ([`Workload::Whole`], which a
//!   versioned upsert keeps right whatever the order), or only the one field it changed, as a
//!   `PATCH` does ([`Workload::Delta`], projected field by field like engagement's replica: an
//!   update applied out of order then leaves a wrong field).
//!
//! Everything the checker and the latency report need is in the database: `load.writes` is
//! the log of committed writes (with the time each write was *meant* to start, which makes
//! open-loop latency coordinated-omission safe), `load.applied` one row per effect of the
//! projection in the order they were applied (`seq`; a second row for one version is a double
//! effect), `load.projection` the read model to compare with `load.source` field by field.

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use courier::db::PgTransaction;
use courier::inbound::{EventMeta, HandlerError, Projection, VersionedUpsert};
use courier::outbox::{NewEvent, Outbox};
use rand::Rng as _;
use std::time::Duration;
use tokio_postgres::types::ToSql;

/// Creates the workload's tables but the aggregates' own (idempotent).
const LOGS: &str = "
    CREATE SCHEMA IF NOT EXISTS load;
    CREATE TABLE IF NOT EXISTS load.writes (
        seq bigserial UNIQUE,
        aggregate_id text NOT NULL,
        version bigint NOT NULL,
        intended_at timestamptz NOT NULL,
        committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (aggregate_id, version));
    CREATE TABLE IF NOT EXISTS load.applied (
        seq bigserial PRIMARY KEY,
        aggregate_id text NOT NULL,
        version bigint NOT NULL,
        intended_at timestamptz NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        -- When the broker accepted the event's publish, and when the consumer received it
        -- (hops.rs).
        publish_time timestamptz,
        received_at timestamptz,
        -- The projection transaction: events per transaction = rows / distinct values.
        tx bigint NOT NULL DEFAULT txid_current());";

/// The source of truth and the read model, a row per aggregate updated in place.
const ROWS_IN_PLACE: &str = "
    CREATE TABLE IF NOT EXISTS load.source (
        aggregate_id text PRIMARY KEY,
        version bigint NOT NULL,
        a text NOT NULL, b text NOT NULL, c text NOT NULL);
    CREATE TABLE IF NOT EXISTS load.projection (
        aggregate_id text PRIMARY KEY,
        version bigint NOT NULL,
        a text NOT NULL, b text NOT NULL, c text NOT NULL);";

/// The source of truth and the read model as logs of each aggregate's versions, and views
/// of the same name and columns as the in-place tables: an aggregate's newest version.
const ROWS_APPENDED: &str = "
    CREATE TABLE IF NOT EXISTS load.source_log (
        aggregate_id text NOT NULL,
        version bigint NOT NULL,
        a text NOT NULL, b text NOT NULL, c text NOT NULL,
        PRIMARY KEY (aggregate_id, version));
    CREATE OR REPLACE VIEW load.source AS
        SELECT DISTINCT ON (aggregate_id) aggregate_id, version, a, b, c
        FROM load.source_log ORDER BY aggregate_id, version DESC;
    CREATE TABLE IF NOT EXISTS load.projection_log (
        aggregate_id text NOT NULL,
        version bigint NOT NULL,
        a text NOT NULL, b text NOT NULL, c text NOT NULL,
        PRIMARY KEY (aggregate_id, version));
    CREATE OR REPLACE VIEW load.projection AS
        SELECT DISTINCT ON (aggregate_id) aggregate_id, version, a, b, c
        FROM load.projection_log ORDER BY aggregate_id, version DESC;";

/// How the application's own rows (the source of truth and the read model) are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AppRows {
    /// A row per aggregate, updated in place, as most services write theirs: while a long
    /// transaction pins the xmin horizon, each update leaves a dead version that the key's
    /// later writes and reads walk.
    InPlace,
    /// Each write appends the aggregate's next version and readers take the newest with a
    /// backward index scan, as Courier's own tables do: a pinned horizon leaves them nothing
    /// to walk. Tells the framework's cost under a pin apart from the application's.
    Appended,
}

impl AppRows {
    pub fn name(self) -> &'static str {
        match self {
            AppRows::InPlace => "in-place",
            AppRows::Appended => "appended",
        }
    }

    fn schema(self) -> &'static str {
        match self {
            AppRows::InPlace => ROWS_IN_PLACE,
            AppRows::Appended => ROWS_APPENDED,
        }
    }
}

/// A database for the workload: a fresh one (on `server`, or `DATABASE_URL`/the local
/// default) with the framework's migrations and the workload's tables.
pub async fn database(
    server: Option<&str>,
    rows: AppRows,
) -> anyhow::Result<courier_testkit::TestDb> {
    let db = match server {
        Some(url) => courier_testkit::TestDb::on_server_url(url).await?,
        None => courier_testkit::TestDb::new().await?,
    };
    db.client()
        .await?
        .batch_execute(&format!("{LOGS}{}", rows.schema()))
        .await
        .context("create the workload's tables")?;
    Ok(db)
}

/// The fields of an aggregate; a delta write changes one of them.
pub const FIELDS: [&str; 3] = ["a", "b", "c"];

pub const AGGREGATE_TYPE: &str = "load";
pub const EVENT_TYPE: &str = "fields.set";

/// The workload's event payload: the fields the write set (all of them for a create or a
/// whole-state write; one for a delta update).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FieldsSet {
    /// When the write was scheduled to start (open loop) or started (closed loop), in
    /// microseconds since the epoch: latency is measured from here.
    #[prost(int64, tag = "1")]
    pub intended_at_micros: i64,
    #[prost(string, optional, tag = "2")]
    pub a: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub b: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub c: Option<String>,
}

impl FieldsSet {
    fn is_whole(&self) -> bool {
        self.a.is_some() && self.b.is_some() && self.c.is_some()
    }
}

/// What each write's event carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// The aggregate's whole state; projected with a versioned upsert.
    Whole,
    /// A create carries the whole state, an update the one field it changed; projected field
    /// by field under the version guard (absent fields keep their value).
    Delta,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Whole => "whole",
            Workload::Delta => "delta",
        }
    }
}

/// Which aggregates the writes go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeySpace {
    /// `--keys` aggregates, each write to one of them at random.
    Reused,
    /// A fresh UUID aggregate per create, followed by `--updates` updates of it.
    Unique,
}

/// The shape of a run's writes.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub key_space: KeySpace,
    /// Aggregates of the reused key space.
    pub keys: u64,
    /// Updates after each create of the unique key space.
    pub updates: u32,
    pub workload: Workload,
    /// How the writers and the projection write the aggregates' rows.
    pub rows: AppRows,
}

impl Shape {
    pub fn describe(&self) -> String {
        let keys = match self.key_space {
            KeySpace::Reused => format!("{} keys, {} events", self.keys, self.workload.name()),
            KeySpace::Unique => format!(
                "a new key per create + {} update(s) each, {} events",
                self.updates,
                self.workload.name()
            ),
        };
        match self.rows {
            AppRows::InPlace => keys,
            AppRows::Appended => format!("{keys}, the application's rows appended"),
        }
    }
}

/// Aggregate ids `agg-000000` …: the reused key space.
pub fn aggregate_id(index: u64) -> String {
    format!("agg-{index:06}")
}

/// One writer's choice of aggregates. In the unique key space each writer keeps a few
/// aggregates open at once, so one aggregate's versions are interleaved with other writes
/// (and can be in flight together), as a service's many clients do.
pub struct KeyPicker {
    shape: Shape,
    /// Unique key space: aggregates created and still owed updates.
    open: Vec<(String, u32)>,
}

/// Aggregates a writer of the unique key space keeps open at once.
const OPEN_AGGREGATES: usize = 8;

impl KeyPicker {
    pub fn new(shape: Shape) -> Self {
        Self {
            shape,
            open: Vec::with_capacity(OPEN_AGGREGATES),
        }
    }

    /// The aggregate of the next write.
    pub fn next(&mut self, rng: &mut impl rand::Rng) -> String {
        match self.shape.key_space {
            KeySpace::Reused => aggregate_id(rng.gen_range(0..self.shape.keys.max(1))),
            KeySpace::Unique => {
                if self.shape.updates == 0 || self.open.len() < OPEN_AGGREGATES {
                    let id = uuid::Uuid::new_v4().to_string();
                    if self.shape.updates > 0 {
                        self.open.push((id.clone(), self.shape.updates));
                    }
                    return id;
                }
                let i = rng.gen_range(0..self.open.len());
                let id = self.open[i].0.clone();
                self.open[i].1 -= 1;
                if self.open[i].1 == 0 {
                    self.open.swap_remove(i);
                }
                id
            }
        }
    }
}

/// Writes one change of one aggregate: bumps the source row (its lock orders writes of one
/// aggregate), logs the write, and appends the event, all in one transaction.
pub struct Writer {
    outbox: Outbox,
    topic: String,
    workload: Workload,
    rows: AppRows,
}

/// Creates the row with every field at `v1`, or moves it one version on and sets the chosen
/// field (`$2`: a field name, or `*` for all of them) to `v<new version>`; logs the write
/// (intended at `$3`) in the same statement: the log is the harness's bookkeeping, and a
/// round trip of its own would make every write costlier than the service's part of it.
const WRITE_SOURCE: &str = "
    WITH source AS (
        INSERT INTO load.source AS s (aggregate_id, version, a, b, c)
        VALUES ($1, 1, 'v1', 'v1', 'v1')
        ON CONFLICT (aggregate_id) DO UPDATE SET
            version = s.version + 1,
            a = CASE WHEN $2 IN ('a', '*') THEN 'v' || (s.version + 1) ELSE s.a END,
            b = CASE WHEN $2 IN ('b', '*') THEN 'v' || (s.version + 1) ELSE s.b END,
            c = CASE WHEN $2 IN ('c', '*') THEN 'v' || (s.version + 1) ELSE s.c END
        RETURNING version, a, b, c
    ), logged AS (
        INSERT INTO load.writes (aggregate_id, version, intended_at)
        SELECT $1, version, $3 FROM source
    )
    SELECT version, a, b, c FROM source";

/// Orders the writes of one aggregate whose rows are appended (`$1`: its id), as the source
/// row's lock does for rows updated in place; an advisory lock leaves no row version behind.
const LOCK_AGGREGATE: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))";

/// [`WRITE_SOURCE`] for appended rows: the aggregate's next version from its newest (a
/// backward scan of the key's entries meets that one first), and the write's log entry.
/// Runs after [`LOCK_AGGREGATE`], so its snapshot sees the version committed before.
const APPEND_SOURCE: &str = "
    WITH newest AS (
        SELECT version, a, b, c FROM load.source_log
        WHERE aggregate_id = $1 ORDER BY version DESC LIMIT 1
    ), next AS (
        SELECT coalesce(max(version), 0) + 1 AS version, max(a) AS a, max(b) AS b, max(c) AS c
        FROM newest
    ), source AS (
        INSERT INTO load.source_log (aggregate_id, version, a, b, c)
        SELECT $1, version,
               CASE WHEN a IS NULL OR $2 IN ('a', '*') THEN 'v' || version ELSE a END,
               CASE WHEN b IS NULL OR $2 IN ('b', '*') THEN 'v' || version ELSE b END,
               CASE WHEN c IS NULL OR $2 IN ('c', '*') THEN 'v' || version ELSE c END
        FROM next
        RETURNING version, a, b, c
    ), logged AS (
        INSERT INTO load.writes (aggregate_id, version, intended_at)
        SELECT $1, version, $3 FROM source
    )
    SELECT version, a, b, c FROM source";

impl Writer {
    pub fn new(config: &courier::CourierConfig, topic: &str, shape: Shape) -> Self {
        Self {
            outbox: Outbox::new(config),
            topic: topic.into(),
            workload: shape.workload,
            rows: shape.rows,
        }
    }

    /// Commits one write; returns its version.
    pub async fn write(
        &self,
        conn: &mut courier::db::PgConnection,
        aggregate_id: &str,
        intended_at: DateTime<Utc>,
    ) -> anyhow::Result<i64> {
        let field = match self.workload {
            Workload::Whole => "*",
            Workload::Delta => FIELDS[rand::thread_rng().gen_range(0..FIELDS.len())],
        };
        let tx = conn.transaction().await.context("begin a write")?;
        let values: [&(dyn ToSql + Sync); 3] = [&aggregate_id, &field, &intended_at];
        let row = match self.rows {
            AppRows::InPlace => {
                let write_source = tx.prepared(WRITE_SOURCE).await.context("prepare")?;
                tx.query_one(&write_source, &values).await
            }
            AppRows::Appended => {
                let lock = tx.prepared(LOCK_AGGREGATE).await.context("prepare")?;
                let append = tx.prepared(APPEND_SOURCE).await.context("prepare")?;
                // One round trip: the server runs the append after the lock is granted.
                let id: [&(dyn ToSql + Sync); 1] = [&aggregate_id];
                futures::try_join!(tx.execute(&lock, &id), tx.query_one(&append, &values))
                    .map(|(_, row)| row)
            }
        }
        .context("write the source row and log it")?;
        let version: i64 = row.get(0);
        // A create, or a whole-state write, carries every field; a delta update its one field.
        let carries = |name: &str, column: usize| {
            (version == 1 || field == "*" || field == name).then(|| row.get::<_, String>(column))
        };
        let payload = prost::Message::encode_to_vec(&FieldsSet {
            intended_at_micros: intended_at.timestamp_micros(),
            a: carries("a", 1),
            b: carries("b", 2),
            c: carries("c", 3),
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
            .append_and_commit(tx, event)
            .await
            .context("append the event and commit")?;
        Ok(version)
    }
}

/// The read model: the fields per aggregate under the version guard, plus one `load.applied`
/// row per effect. An event carrying every field (a create, or any write of the whole
/// workload) is written whole with the versioned upsert; one carrying some fields (a delta
/// update) sets just those, so the event says how it is applied; the workload only decides
/// whether versions must be contiguous.
pub struct LoadProjection {
    upsert: VersionedUpsert,
    /// Delta updates need contiguous versions; whole-state events do not, so a whole
    /// workload's projection does not pay for them, as a service's whole-state projection
    /// would not.
    workload: Workload,
    /// When set, each projection transaction waits at most this long for a row lock (what a
    /// service sets so a held lock fails fast instead of stalling its consumer); the
    /// `handler-transient` fault holds rows locked to make it fire.
    lock_timeout: Option<Duration>,
    rows: AppRows,
}

/// A delta update: absent fields keep their value; an older or equal version changes nothing
/// (engagement's `update_replica.sql` does the same).
const APPLY_DELTA: &str = "
    UPDATE load.projection
    SET a = COALESCE($2, a), b = COALESCE($3, b), c = COALESCE($4, c), version = $5
    WHERE aggregate_id = $1 AND version < $5";

/// A whole event's version appended to the read model's log; an older one than the newest
/// is kept but not read, as the versioned upsert ignores it.
const APPEND_WHOLE: &str = "
    INSERT INTO load.projection_log (aggregate_id, version, a, b, c)
    VALUES ($1, $5, $2, $3, $4) ON CONFLICT DO NOTHING";

/// [`APPLY_DELTA`] for appended rows: the newest version with the event's fields set, as
/// the next entry.
const APPEND_DELTA: &str = "
    INSERT INTO load.projection_log (aggregate_id, version, a, b, c)
    SELECT $1, $5, COALESCE($2, a), COALESCE($3, b), COALESCE($4, c)
    FROM (SELECT version, a, b, c FROM load.projection_log
          WHERE aggregate_id = $1 ORDER BY version DESC LIMIT 1) newest
    WHERE version < $5
    ON CONFLICT DO NOTHING";

impl LoadProjection {
    pub fn new(
        workload: Workload,
        lock_timeout: Option<Duration>,
        rows: AppRows,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            upsert: VersionedUpsert::new("load.projection", &["aggregate_id"], &["a", "b", "c"])
                .map_err(anyhow::Error::msg)?,
            workload,
            lock_timeout,
            rows,
        })
    }
}

impl Projection for LoadProjection {
    type Event = FieldsSet;

    /// With deltas, an update applies only on top of the version before it; a whole event (a
    /// create) at any newer version. Whole-state events need no contiguity: the versioned
    /// upsert keeps the newest.
    fn contiguous_versions(&self) -> bool {
        self.workload == Workload::Delta
    }

    /// Each key writes its own projection row; the effect log only inserts.
    fn independent_keys(&self) -> bool {
        true
    }

    fn is_whole_state(&self, _meta: &EventMeta, event: &FieldsSet) -> bool {
        event.is_whole()
    }

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &FieldsSet,
    ) -> Result<(), HandlerError> {
        let intended_at = DateTime::<Utc>::from_timestamp_micros(event.intended_at_micros)
            .ok_or_else(|| {
                HandlerError::Permanent(format!(
                    "intended_at {} is out of range",
                    event.intended_at_micros
                ))
            })?;
        if let Some(timeout) = self.lock_timeout {
            let set = tx
                .prepared("SELECT set_config('lock_timeout', $1, true)")
                .await?;
            tx.execute(&set, &[&format!("{}ms", timeout.as_millis())])
                .await?;
        }
        // The effect's log row goes out right behind the update, in the same round trip: the
        // two are independent, and the log is the harness's bookkeeping, not the service's.
        let record = tx
            .prepared(
                "INSERT INTO load.applied (aggregate_id, version, intended_at, publish_time, received_at)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .await?;
        let log = async {
            let values: [&(dyn ToSql + Sync); 5] = [
                &meta.aggregate_id,
                &meta.version,
                &intended_at,
                &meta.publish_time,
                &meta.received_at,
            ];
            tx.execute(&record, &values)
                .await
                .map_err(HandlerError::from)
        };
        let apply = async {
            let fields: [&(dyn ToSql + Sync); 5] = [
                &meta.aggregate_id,
                &event.a,
                &event.b,
                &event.c,
                &meta.version,
            ];
            let statement = match (self.rows, event.is_whole()) {
                (AppRows::InPlace, true) => {
                    return self
                        .upsert
                        .execute(tx, &fields[..4], meta.version)
                        .await
                        .map(drop);
                }
                (AppRows::InPlace, false) => APPLY_DELTA,
                (AppRows::Appended, true) => APPEND_WHOLE,
                (AppRows::Appended, false) => APPEND_DELTA,
            };
            let statement = tx.prepared(statement).await?;
            tx.execute(&statement, &fields)
                .await
                .map(drop)
                .map_err(HandlerError::from)
        };
        futures::try_join!(apply, log)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng as _;

    fn shape(key_space: KeySpace, updates: u32) -> Shape {
        Shape {
            key_space,
            keys: 10,
            updates,
            workload: Workload::Whole,
            rows: AppRows::InPlace,
        }
    }

    #[test]
    fn the_unique_key_space_writes_each_new_aggregate_once_plus_its_updates() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut picker = KeyPicker::new(shape(KeySpace::Unique, 3));
        let mut writes: std::collections::HashMap<String, u32> = Default::default();
        for _ in 0..4_000 {
            *writes.entry(picker.next(&mut rng)).or_default() += 1;
        }
        // Every aggregate gets its create and 3 updates, except the few still open.
        let complete = writes.values().filter(|&&n| n == 4).count();
        assert!(writes.values().all(|&n| (1..=4).contains(&n)), "{writes:?}");
        assert!(
            complete >= writes.len() - OPEN_AGGREGATES,
            "{complete} of {}",
            writes.len()
        );
        assert!(writes.keys().all(|k| uuid::Uuid::parse_str(k).is_ok()));
    }

    #[test]
    fn without_updates_every_write_is_a_new_aggregate_and_reused_keys_stay_in_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut unique = KeyPicker::new(shape(KeySpace::Unique, 0));
        let ids: std::collections::HashSet<String> =
            (0..1_000).map(|_| unique.next(&mut rng)).collect();
        assert_eq!(ids.len(), 1_000);
        let mut reused = KeyPicker::new(shape(KeySpace::Reused, 0));
        let ids: std::collections::HashSet<String> =
            (0..1_000).map(|_| reused.next(&mut rng)).collect();
        assert_eq!(ids.len(), 10);
    }
}
