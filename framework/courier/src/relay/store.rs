//! The relay's SQL: claim, mark, release, shard state, heartbeat, backlog gauges.
//! Queries live in `queries/*.sql`, rendered once for the configured schema.

use crate::db::{render, DbError, PgPool, PooledClient};
use crate::relay::publish_limit::LimitSnapshot;
use crate::relay::publisher_key::PublisherKey;
use crate::relay::row_address::RowAddress;
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_postgres::Statement;
use uuid::Uuid;

/// How many candidate rows per claimed row a claim may look at before giving up for now.
const CLAIM_WINDOW_FACTOR: i64 = 4;

/// A claimed outbox row: everything the publisher needs, so it looks nothing up again.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub seq: i64,
    /// Where the claim left the row, for its mark.
    pub address: RowAddress,
    pub event_id: Uuid,
    pub topic: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub version: i64,
    pub schema_version: i32,
    pub payload: Vec<u8>,
    /// Optional attributes as stored (`correlation_id`, …).
    pub optional_attributes: serde_json::Map<String, serde_json::Value>,
    pub occurred_at: DateTime<Utc>,
    /// Attempts before this one.
    pub publish_attempts: i32,
    /// The key's closest earlier version that was unpublished when this row was claimed
    /// (earlier in this claim, in flight, or left behind); `None` when all were published.
    pub prev_version: Option<i64>,
    /// It had failed and waited for its retry: its key's later versions waited behind it, so
    /// once it is published the claimer scans for them again (scan_from.rs, `rewind_to`).
    pub retried: bool,
}

impl ClaimedRow {
    /// The key publisher this row goes out through: its topic and ordering key.
    pub fn publisher_key(&self) -> PublisherKey {
        PublisherKey::new(self.topic.clone(), self.aggregate_id.clone())
    }
}

#[cfg(test)]
impl ClaimedRow {
    /// A row of `key` at `version` with seq `seq`, for unit tests of what handles rows.
    pub(crate) fn for_test(seq: i64, key: &str, version: i64) -> Self {
        Self {
            seq,
            address: RowAddress::default(),
            event_id: Uuid::new_v4(),
            topic: "t.events".into(),
            aggregate_type: "a".into(),
            aggregate_id: key.into(),
            event_type: "E".into(),
            version,
            schema_version: 1,
            payload: vec![],
            optional_attributes: Default::default(),
            occurred_at: Utc::now(),
            publish_attempts: 0,
            prev_version: None,
            retried: false,
        }
    }
}

/// What a claim or floor query saw of other transactions: those with ids from `xmin` up to
/// (not including) `next_xid` may still have been running, so rows they wrote were not visible
/// to it; every transaction below `xmin` had ended. `next_xid` is above every id handed out
/// before the snapshot, not the snapshot's `xmax` (the newest id completed plus one: a
/// transaction with a higher id may be running unlisted). A floor query's `xmin` leaves out
/// transactions holding no lock on the outbox, which have taken no seq (queries/claim_floor.sql).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimSnapshot {
    pub xmin: i64,
    pub next_xid: i64,
}

/// What a floor query saw (queries/claim_floor.sql): the lowest seq a claim may take, if a row
/// was visible, and the seq the next row would get, read after the statement's snapshot was
/// taken (see `crate::relay::scan_from::ScanFrom::floor_found` for why that matters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorLook {
    pub lowest: Option<i64>,
    pub next_seq: i64,
    pub snapshot: ClaimSnapshot,
}

/// The rows a claim took, in claim order, and its snapshot (`None` when it took none).
#[derive(Debug)]
pub struct Claimed {
    pub rows: Vec<ClaimedRow>,
    pub snapshot: Option<ClaimSnapshot>,
}

impl Claimed {
    /// The claim ran after `look`: every transaction writing the outbox that the look saw ended
    /// had ended for the claim too. The look's `xmin` leaves out transactions that hold no lock
    /// on the outbox, which the claim's own cannot, so a long one writing elsewhere does not
    /// keep the stretches this claim scanned unsettled (scan_from.rs).
    pub fn after(mut self, look: &FloorLook) -> Self {
        if let Some(snapshot) = &mut self.snapshot {
            snapshot.xmin = snapshot.xmin.max(look.snapshot.xmin);
        }
        self
    }
}

/// A row to mark published, and when the broker acknowledged it.
#[derive(Debug, Clone, Copy)]
pub struct PublishedRow {
    /// Where its claim left it: the mark finds it there.
    pub address: RowAddress,
    /// The mark sets `published_at` to the database's `now()` less the time since, so the
    /// column reads when the event reached the broker, on the database's clock like
    /// `locked_at` (the mark itself comes some milliseconds later: marks are gathered).
    pub acked: Instant,
}

impl PublishedRow {
    /// A row acknowledged just now (a caller that marks as soon as it publishes).
    pub fn acked_now(address: RowAddress) -> Self {
        Self {
            address,
            acked: Instant::now(),
        }
    }
}

/// A row whose publish failed, and what to do about it.
#[derive(Debug, Clone)]
pub struct FailedRow {
    /// Where its claim left it: the mark finds it there.
    pub address: RowAddress,
    pub error: String,
    /// When to try again; `None` together with `dead`.
    pub retry_at: Option<DateTime<Utc>>,
    pub dead: bool,
    /// Whether the failure spends one of the row's attempts (a broker failure does not).
    pub counts_attempt: bool,
}

/// Rendered statements and the pool they run on.
#[derive(Debug)]
pub struct OutboxStore {
    pool: PgPool,
    claim: String,
    claim_floor: String,
    /// The same look for the backlog gauges, under its own text so that `pg_stat_statements`
    /// tells their calls from the claimers'.
    gauge_floor: String,
    ensure_shard_state: String,
    /// Shards whose state row this store has made sure of.
    ensured: Mutex<HashSet<u32>>,
    mark_published: String,
    /// Whether a mark keeps the rows (and takes their acknowledgement times) or deletes them.
    published_rows: PublishedRows,
    mark_failed: String,
    release: String,
    set_shard_idle: String,
    heartbeat: String,
    deregister: String,
    backlog: String,
    recorded_floors: String,
    /// Rows this store marked published (a relay's progress, read without a query).
    published: AtomicU64,
    /// Rows this store gave back untried (held back behind an earlier row of their key).
    given_back: AtomicU64,
}

/// Gauges read from the outbox table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub pending: i64,
    pub dead: i64,
    pub max_attempts: i32,
    pub oldest_pending_secs: f64,
}

impl Backlog {
    /// The whole outbox's gauges from its parts.
    pub fn of(parts: &[ShardBacklog]) -> Self {
        Self {
            pending: parts.iter().map(|p| p.pending).sum(),
            dead: parts.iter().map(|p| p.dead).sum(),
            max_attempts: parts.iter().map(|p| p.max_attempts).max().unwrap_or(0),
            oldest_pending_secs: parts
                .iter()
                .map(|p| p.oldest_pending_secs)
                .fold(0.0, f64::max),
        }
    }
}

/// The unpublished rows of one topic in one shard (queries/backlog.sql).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ShardBacklog {
    pub shard: i32,
    pub topic: String,
    /// Rows that will be published, those in flight included.
    pub pending: i64,
    /// Pending rows claimed under a live lease: being published now.
    pub in_flight: i64,
    /// Out of attempts or failed permanently; each blocks its key until retried or skipped.
    pub dead: i64,
    /// The most attempts a pending row has had.
    pub max_attempts: i32,
    pub oldest_pending_secs: f64,
}

/// What marking a row published does to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishedRows {
    /// Kept with `published_at` set, until retention deletes them.
    Kept,
    /// Deleted at once (`retention.outbox_hours = 0`).
    Deleted,
}

impl PublishedRows {
    /// What `config` asks for.
    pub fn from_config(config: &crate::config::RetentionConfig) -> Self {
        if config.outbox_hours == 0 {
            PublishedRows::Deleted
        } else {
            PublishedRows::Kept
        }
    }
}

/// The relay's claim (queries/claim.sql) for `schema`, as the relay runs it.
pub fn claim_statement(schema: &str) -> String {
    render_claim_query(include_str!("queries/claim.sql"), schema)
}

/// `sql` with the fragments the claim queries share written in: the parked-row probe and the
/// next transaction id.
fn render_claim_query(sql: &str, schema: &str) -> String {
    let sql = sql
        .replace(
            "{not_behind_a_parked_row}",
            include_str!("queries/not_behind_a_parked_row.sql").trim_end(),
        )
        .replace(
            "{next_xid}",
            include_str!("queries/next_xid.sql").trim_end(),
        );
    render(&sql, schema)
}

impl OutboxStore {
    pub fn new(pool: PgPool, schema: &str) -> Self {
        Self::with_published_rows(pool, schema, PublishedRows::Kept)
    }

    /// A store whose marks keep or delete published rows.
    pub fn with_published_rows(pool: PgPool, schema: &str, published: PublishedRows) -> Self {
        let mark_published = match published {
            PublishedRows::Kept => include_str!("queries/mark_published.sql"),
            PublishedRows::Deleted => include_str!("queries/delete_published.sql"),
        };
        let claim_floor = render_claim_query(include_str!("queries/claim_floor.sql"), schema);
        Self {
            pool,
            claim: claim_statement(schema),
            // The backlog gauges' floor look (relay/backlog.rs): no token, so rows in flight
            // count. Wrapped, so pg_stat_statements keeps it apart from the claimers' looks
            // (it identifies a statement by its parse tree: a comment alone would not).
            gauge_floor: format!(
                "-- The backlog gauges' floor look (relay/backlog.rs).\nSELECT * FROM (\n{}\n) AS gauge_look",
                claim_floor.trim_end()
            ),
            claim_floor,
            ensure_shard_state: render(include_str!("queries/ensure_shard_state.sql"), schema),
            ensured: Mutex::default(),
            mark_published: render(mark_published, schema),
            published_rows: published,
            mark_failed: render(include_str!("queries/mark_failed.sql"), schema),
            release: render(include_str!("queries/release.sql"), schema),
            set_shard_idle: render(include_str!("queries/set_shard_idle.sql"), schema),
            heartbeat: render(include_str!("queries/heartbeat.sql"), schema),
            deregister: render(include_str!("queries/deregister.sql"), schema),
            backlog: render(include_str!("queries/backlog.sql"), schema),
            recorded_floors: render(include_str!("queries/recorded_floors.sql"), schema),
            published: AtomicU64::new(0),
            given_back: AtomicU64::new(0),
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn conn(&self, context: &str) -> Result<PooledClient<'_>, DbError> {
        self.pool
            .get()
            .await
            .map_err(DbError::pool(context.to_string()))
    }

    /// A connection and `sql` prepared on it: the per-batch statements skip parsing and
    /// planning, and the extra round trip an unprepared statement costs.
    async fn conn_prepared(
        &self,
        sql: &str,
        context: &str,
    ) -> Result<(PooledClient<'_>, Statement), DbError> {
        let conn = self.conn(context).await?;
        let statement = conn
            .prepared(sql)
            .await
            .map_err(DbError::query(format!("prepare: {context}")))?;
        Ok((conn, statement))
    }

    /// Claims up to `limit` rows of `shard` for `token`, in claim order, choosing among the
    /// first `limit × CLAIM_WINDOW_FACTOR` candidates (see queries/claim.sql).
    pub async fn claim(
        &self,
        shard: u32,
        token: Uuid,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<ClaimedRow>, DbError> {
        Ok(self.claim_from(shard, token, lease, limit, 0).await?.rows)
    }

    /// [`OutboxStore::claim`], looking for never-failed rows only from `from_seq` on (rows due
    /// for a retry are looked for everywhere): the claimer's way past its own rows in flight.
    pub async fn claim_from(
        &self,
        shard: u32,
        token: Uuid,
        lease: Duration,
        limit: u32,
        from_seq: i64,
    ) -> Result<Claimed, DbError> {
        let context = format!("claim batch for shard {shard}");
        let (conn, claim) = self.conn_prepared(&self.claim, &context).await?;
        if !self.ensured().contains(&shard) {
            // Without its state row a claim still keeps keys in order, but makes the costly
            // contested check every time.
            conn.execute(&self.ensure_shard_state, &[&shard_param(shard)])
                .await
                .map_err(DbError::query(format!("create state row of shard {shard}")))?;
            self.ensured().insert(shard);
        }
        let rows = conn
            .query(
                &claim,
                &[
                    &shard_param(shard),
                    &token,
                    &lease.as_secs_f64(),
                    &i64::from(limit),
                    &(i64::from(limit) * CLAIM_WINDOW_FACTOR),
                    &from_seq,
                ],
            )
            .await
            .map_err(DbError::query(context))?;
        let snapshot = rows.first().map(|row| ClaimSnapshot {
            xmin: row.get(13),
            next_xid: row.get(14),
        });
        let mut claimed: Vec<ClaimedRow> = rows
            .into_iter()
            .map(|row| ClaimedRow {
                seq: row.get(0),
                address: row.get(15),
                event_id: row.get(1),
                topic: row.get(2),
                aggregate_type: row.get(3),
                aggregate_id: row.get(4),
                event_type: row.get(5),
                version: row.get(6),
                schema_version: row.get(7),
                payload: row.get(8),
                optional_attributes: match row.get::<_, serde_json::Value>(9) {
                    serde_json::Value::Object(map) => map,
                    _ => serde_json::Map::new(),
                },
                occurred_at: row.get(10),
                publish_attempts: row.get(11),
                prev_version: row.get(12),
                retried: row.get(16),
            })
            .collect();
        // UPDATE … RETURNING does not keep the CTE's order.
        claimed.sort_by_key(|r| r.seq);
        Ok(Claimed {
            rows: claimed,
            snapshot,
        })
    }

    /// What a floor query of `shard` looking from `from` saw (see queries/claim_floor.sql).
    pub async fn claim_floor(
        &self,
        shard: u32,
        token: Uuid,
        from: i64,
    ) -> Result<FloorLook, DbError> {
        let context = format!("find the claim floor of shard {shard}");
        self.floor_look(&self.claim_floor, context, shard, token, from)
            .await
    }

    /// The floor query for the backlog gauges: no claimer's rows left out.
    pub async fn gauge_floor(&self, shard: u32, from: i64) -> Result<FloorLook, DbError> {
        let context = format!("find the backlog gauge's floor of shard {shard}");
        self.floor_look(&self.gauge_floor, context, shard, Uuid::nil(), from)
            .await
    }

    async fn floor_look(
        &self,
        sql: &str,
        context: String,
        shard: u32,
        token: Uuid,
        from: i64,
    ) -> Result<FloorLook, DbError> {
        let (conn, statement) = self.conn_prepared(sql, &context).await?;
        let row = conn
            .query_one(&statement, &[&shard_param(shard), &from, &token])
            .await
            .map_err(DbError::query(context))?;
        Ok(FloorLook {
            lowest: row.get(0),
            next_seq: row.get(1),
            snapshot: ClaimSnapshot {
                xmin: row.get(2),
                next_xid: row.get(3),
            },
        })
    }

    fn ensured(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        // The set only caches "this row exists": a panic elsewhere cannot leave it wrong.
        self.ensured
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks `rows` published; returns how many rows `token` still owned.
    pub async fn mark_published(&self, rows: &[PublishedRow], token: Uuid) -> Result<u64, DbError> {
        if rows.is_empty() {
            return Ok(0);
        }
        let context = format!("mark {} rows published", rows.len());
        let (conn, mark_published) = self.conn_prepared(&self.mark_published, &context).await?;
        let addresses: Vec<RowAddress> = rows.iter().map(|r| r.address).collect();
        let marked = match self.published_rows {
            PublishedRows::Kept => {
                // Ages taken now, as the statement goes: its now() is the time it starts.
                let ack_ages: Vec<i64> = rows
                    .iter()
                    .map(|r| i64::try_from(r.acked.elapsed().as_micros()).unwrap_or(i64::MAX))
                    .collect();
                conn.execute(&mark_published, &[&addresses, &token, &ack_ages])
                    .await
            }
            PublishedRows::Deleted => conn.execute(&mark_published, &[&addresses, &token]).await,
        }
        .map_err(DbError::query(context))?;
        self.published.fetch_add(marked, Ordering::Relaxed);
        Ok(marked)
    }

    /// Rows marked published through this store so far.
    pub fn published_total(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Records failures; returns how many rows `token` still owned.
    pub async fn mark_failed(&self, failed: &[FailedRow], token: Uuid) -> Result<u64, DbError> {
        if failed.is_empty() {
            return Ok(0);
        }
        let addresses: Vec<RowAddress> = failed.iter().map(|f| f.address).collect();
        let errors: Vec<&str> = failed.iter().map(|f| f.error.as_str()).collect();
        let retry_at: Vec<Option<DateTime<Utc>>> = failed.iter().map(|f| f.retry_at).collect();
        let dead: Vec<bool> = failed.iter().map(|f| f.dead).collect();
        let counts: Vec<bool> = failed.iter().map(|f| f.counts_attempt).collect();
        let context = format!("record {} failed publishes", failed.len());
        let (conn, mark_failed) = self.conn_prepared(&self.mark_failed, &context).await?;
        conn.execute(
            &mark_failed,
            &[&addresses, &errors, &retry_at, &dead, &counts, &token],
        )
        .await
        .map_err(DbError::query(context))
    }

    /// Gives back the rows claimed at `addresses` without counting an attempt.
    pub async fn release(&self, addresses: &[RowAddress], token: Uuid) -> Result<u64, DbError> {
        if addresses.is_empty() {
            return Ok(0);
        }
        let context = format!("release {} rows", addresses.len());
        let (conn, release) = self.conn_prepared(&self.release, &context).await?;
        let released = conn
            .execute(&release, &[&addresses, &token])
            .await
            .map_err(DbError::query(context))?;
        self.given_back.fetch_add(released, Ordering::Relaxed);
        Ok(released)
    }

    /// Rows given back untried through this store so far.
    pub fn given_back_total(&self) -> u64 {
        self.given_back.load(Ordering::Relaxed)
    }

    /// Sets shard `shard`'s idle flag, superseding the flag this claimer wrote last
    /// (`previous`, as returned then); returns the new flag's `flag_seq`.
    pub async fn set_shard_idle(
        &self,
        shard: u32,
        idle: bool,
        previous: Option<i64>,
    ) -> Result<i64, DbError> {
        let context = format!("set shard {shard} idle={idle}");
        let conn = self.conn(&context).await?;
        let row = conn
            .query_one(
                &self.set_shard_idle,
                &[&shard_param(shard), &idle, &previous],
            )
            .await
            .map_err(DbError::query(context))?;
        Ok(row.get(0))
    }

    /// Heartbeats `instance` with what its publish limit sees and its backlog gauge's
    /// `floors`, and returns the number of live instances (itself included).
    pub async fn heartbeat(
        &self,
        instance: Uuid,
        owned: &[u32],
        alive_within: Duration,
        limit: LimitSnapshot,
        floors: &[i64],
    ) -> Result<u32, DbError> {
        let owned: Vec<i32> = owned.iter().map(|s| shard_param(*s)).collect();
        let as_int = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        let conn = self.conn("relay heartbeat").await?;
        let row = conn
            .query_one(
                &self.heartbeat,
                &[
                    &instance,
                    &owned,
                    &alive_within.as_secs_f64(),
                    &as_int(limit.limit),
                    &as_int(limit.in_flight),
                    &limit.latency_ms,
                    &as_int(limit.keys_out),
                    &floors,
                ],
            )
            .await
            .map_err(DbError::query("relay heartbeat"))?;
        Ok(u32::try_from(row.get::<_, i64>(0)).unwrap_or(1).max(1))
    }

    /// Removes this instance from `relay_instances` (graceful shutdown).
    pub async fn deregister(&self, instance: Uuid) -> Result<(), DbError> {
        let conn = self.conn("relay deregister").await?;
        conn.execute(&self.deregister, &[&instance])
            .await
            .map_err(DbError::query("relay deregister"))?;
        Ok(())
    }

    /// The backlog floors the relays recorded (0 where none did), one per shard.
    pub async fn recorded_floors(&self, shard_count: u32) -> Result<Vec<i64>, DbError> {
        let context = "read the backlog floors the relays recorded";
        let conn = self.conn(context).await?;
        let rows = conn
            .query(
                &self.recorded_floors,
                &[&i32::try_from(shard_count).unwrap_or(i32::MAX)],
            )
            .await
            .map_err(DbError::query(context))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Reads the backlog per shard and topic, shard `i` counted from `floors[i]`
    /// (relay/backlog.rs); `claim_lease` tells live claims from expired ones.
    pub async fn backlog(
        &self,
        floors: &[i64],
        claim_lease: Duration,
    ) -> Result<Vec<ShardBacklog>, DbError> {
        let shards: Vec<i32> = (0u32..).take(floors.len()).map(shard_param).collect();
        let conn = self.conn("read outbox backlog").await?;
        let rows = conn
            .query(
                &self.backlog,
                &[&shards, &floors, &claim_lease.as_secs_f64()],
            )
            .await
            .map_err(DbError::query("read outbox backlog"))?;
        Ok(rows
            .iter()
            .map(|r| ShardBacklog {
                shard: r.get("shard"),
                topic: r.get("topic"),
                pending: r.get("pending"),
                in_flight: r.get("in_flight"),
                dead: r.get("dead"),
                max_attempts: r.get("max_attempts"),
                oldest_pending_secs: r.get("oldest_pending_secs"),
            })
            .collect())
    }
}

/// Shards are < 1024 (validated), so they fit PostgreSQL's integer.
fn shard_param(shard: u32) -> i32 {
    i32::try_from(shard).unwrap_or(i32::MAX)
}
