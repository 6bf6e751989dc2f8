//! Retention: the Janitor deletes published outbox rows, the version ledger's rows (which
//! refuse a second append of a version) and processed inbox rows older than `[retention]`
//! says, in small batches — each its own short statement, so no lock is held for long and the
//! relay never waits on it — and leaves dead and pending rows to operators.
//!
//! Each batch takes the oldest expired rows from where the previous one stopped (keyset order
//! on the table's timestamp), and the janitor remembers, per table, where its last sweep
//! stopped. While a long transaction pins the xmin horizon (P9), the rows it deleted keep their
//! index entries and heap tuples; a batch starting at the index's oldest entry would walk all
//! of them again, so each sweep would cost more than the last until the pin ends.

use crate::config::RetentionConfig;
use crate::db::{render, DbError, PgPool};
use crate::supervision::Supervision;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use std::time::{Duration, Instant};

/// How often the janitor forgets its positions and sweeps from each table's oldest row once,
/// for a row that came to sit below a position after it was passed (see [`Positions`]): such
/// a row outlives its retention by a day at most. While a pin lasts, that sweep's first batch
/// walks what was deleted since the pin began, once a day rather than every batch.
const FRESH_START_EVERY: Duration = Duration::from_secs(24 * 3600);

/// What one sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    pub outbox_rows: u64,
    /// Rows of the version ledger (`outbox_versions`), kept `version_hours`.
    pub version_rows: u64,
    pub inbox_rows: u64,
    /// DELETE statements run (each at most `batch_size` rows).
    pub batches: u32,
}

/// Where the janitor's batches have got to in each table: the newest timestamp
/// (`published_at`, `appended_at`, `processed_at`) a batch deleted. The next batch starts
/// there, `>=` because the rows one transaction wrote share its timestamp and the last batch
/// may have left some of them; `None` starts at the oldest row, as after a restart.
///
/// No expired row is left behind a position: a row is stamped with the start of the
/// transaction that writes it (publish, append, processing) and deleted only `hours` later,
/// so one committed behind a position already passed came from a writer open longer than
/// `hours` (an hour at least; the inbox's a week). A cutoff that moves back below a position
/// (the database clock stepped back) deletes nothing until it passes it again; a change of
/// `retention.*_hours` comes with a restart. The daily fresh start (`FRESH_START_EVERY`)
/// removes what this does not cover: such a writer, a clock stepped back further than `hours`,
/// a database restored from a backup. With `outbox_hours = 0` the cutoff is now() and a mark
/// in flight stamps rows behind any position, so the outbox's position lasts only one sweep
/// (the relay deletes the rows it publishes; the janitor finds skipped ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Positions {
    /// `published_at` of the newest outbox row deleted.
    pub outbox: Option<DateTime<Utc>>,
    /// `appended_at` of the newest ledger row deleted.
    pub versions: Option<DateTime<Utc>>,
    /// `processed_at` of the newest inbox row deleted.
    pub inbox: Option<DateTime<Utc>>,
}

/// The janitor's statements for one schema.
#[derive(Debug, Clone)]
pub struct RetentionQueries {
    outbox: String,
    versions: String,
    inbox: String,
}

impl RetentionQueries {
    pub fn new(schema: &str) -> Self {
        Self {
            outbox: render(include_str!("queries/delete_published_outbox.sql"), schema),
            versions: render(include_str!("queries/delete_expired_versions.sql"), schema),
            inbox: render(include_str!("queries/delete_processed_inbox.sql"), schema),
        }
    }
}

/// Deletes every expired row, from each table's oldest, batch by batch, until a batch comes
/// back short.
pub async fn sweep(
    pool: &PgPool,
    queries: &RetentionQueries,
    config: &RetentionConfig,
) -> Result<Sweep, DbError> {
    sweep_from(pool, queries, config, &mut Positions::default()).await
}

/// Deletes every expired row from `positions` on, batch by batch, until a batch comes back
/// short, and moves `positions` to where it stopped (also when it fails part way).
pub async fn sweep_from(
    pool: &PgPool,
    queries: &RetentionQueries,
    config: &RetentionConfig,
    positions: &mut Positions,
) -> Result<Sweep, DbError> {
    let mut sweep = Sweep::default();
    let batch = i64::from(config.batch_size);
    for (table, sql, hours, rows, position) in [
        (
            "outbox",
            &queries.outbox,
            config.outbox_hours,
            &mut sweep.outbox_rows,
            &mut positions.outbox,
        ),
        (
            "outbox_versions",
            &queries.versions,
            config.version_hours,
            &mut sweep.version_rows,
            &mut positions.versions,
        ),
        (
            "inbox",
            &queries.inbox,
            config.inbox_hours,
            &mut sweep.inbox_rows,
            &mut positions.inbox,
        ),
    ] {
        let context = format!("retention: delete expired {table} rows");
        let interval = i32::try_from(hours).unwrap_or(i32::MAX);
        // With `outbox_hours = 0` a position holds only within the sweep (see Positions).
        let kept = hours > 0;
        if !kept {
            *position = None;
        }
        let mut from = *position;
        loop {
            let client = pool.get().await.map_err(DbError::pool(&context))?;
            let row = client
                .query_one(sql.as_str(), &[&interval, &batch, &from])
                .await
                .map_err(DbError::query(&context))?;
            drop(client);
            let deleted = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
            if let Some(last) = row.get::<_, Option<DateTime<Utc>>>(1) {
                from = Some(last);
                if kept {
                    *position = from;
                }
            }
            sweep.batches += 1;
            metrics::counter!(crate::metrics::RETENTION_DELETED_TOTAL, "table" => table)
                .increment(deleted);
            *rows += deleted;
            if deleted < u64::from(config.batch_size) {
                break;
            }
        }
    }
    Ok(sweep)
}

/// Starts a supervised janitor for `config`'s schema on the current actix System, or `None`
/// when `retention.enabled` is off.
pub fn start(
    config: &crate::CourierConfig,
    escalate: crate::supervision::EscalationHandler,
) -> Result<Option<Addr<Janitor>>, DbError> {
    if !config.retention.enabled {
        return Ok(None);
    }
    let pool = crate::db::pool(&config.database, "courier-janitor")?;
    let schema = config.database.schema.clone();
    let retention = config.retention.clone();
    let policy = config.supervision.janitor;
    Ok(Some(Supervisor::start(move |_| {
        Janitor::new(
            pool,
            &schema,
            retention,
            Supervision::new("janitor", schema.clone(), policy, escalate),
        )
    })))
}

/// Sweeps every `interval_secs`; a database failure stops it and its supervisor restarts it
/// with backoff.
pub struct Janitor {
    pool: PgPool,
    queries: RetentionQueries,
    config: RetentionConfig,
    supervision: Supervision,
    /// Where the last sweep stopped in each table: the next one starts there.
    positions: Positions,
    /// When the next sweep forgets `positions` and starts from each table's oldest row.
    fresh_start_at: Instant,
    sweeping: bool,
    escalated: bool,
}

impl Janitor {
    pub fn new(
        pool: PgPool,
        schema: &str,
        config: RetentionConfig,
        supervision: Supervision,
    ) -> Self {
        Self {
            pool,
            queries: RetentionQueries::new(schema),
            config,
            supervision,
            positions: Positions::default(),
            fresh_start_at: Instant::now() + FRESH_START_EVERY,
            sweeping: false,
            escalated: false,
        }
    }

    fn sweep(&mut self, ctx: &mut Context<Self>) {
        if self.sweeping {
            return;
        }
        self.sweeping = true;
        if Instant::now() >= self.fresh_start_at {
            self.positions = Positions::default();
            self.fresh_start_at = Instant::now() + FRESH_START_EVERY;
        }
        let (pool, queries, config, mut positions) = (
            self.pool.clone(),
            self.queries.clone(),
            self.config.clone(),
            self.positions,
        );
        ctx.spawn(
            async move {
                let result = sweep_from(&pool, &queries, &config, &mut positions).await;
                (positions, result)
            }
            .into_actor(self)
            .map(|(positions, result), act, ctx| {
                // Kept after a failure too: everything below them is gone all the same.
                act.positions = positions;
                act.sweeping = false;
                match result {
                    Ok(swept) if swept.outbox_rows + swept.version_rows + swept.inbox_rows > 0 => tracing::info!(
                        outbox_rows = swept.outbox_rows,
                        version_rows = swept.version_rows,
                        inbox_rows = swept.inbox_rows,
                        batches = swept.batches,
                        "retention: expired rows deleted"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "retention sweep failed; restarting the janitor");
                        ctx.stop();
                    }
                }
            }),
        );
    }
}

impl Actor for Janitor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.escalated {
            return;
        }
        ctx.run_later(self.supervision.start_delay, |act, ctx| {
            act.sweep(ctx);
            ctx.run_interval(Duration::from_secs(act.config.interval_secs), |act, ctx| {
                act.sweep(ctx)
            });
        });
    }
}

impl Supervised for Janitor {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        self.sweeping = false;
        if !self.supervision.restarting() {
            self.escalated = true;
        }
    }
}
