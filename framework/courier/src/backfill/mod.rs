//! Backfill: emit a full-snapshot event for every existing aggregate of one type through the
//! outbox, in bounded batches, resumable after a crash.
//!
//! A new read model cannot be built from Pub/Sub alone (it retains a week at most, and
//! retention deletes published outbox rows); a backfill gives every consumer the whole current
//! state instead. The service supplies a [`BackfillSource`] (which rows, how a snapshot looks);
//! the framework runs it:
//!
//! - One transaction per batch: lock the run row → the source locks the next aggregates after
//!   the run's cursor (keyset order), bumps their versions and builds their snapshots → append
//!   them with [`Outbox::append_all`] → advance the cursor → commit. A crash loses at most the
//!   uncommitted batch, and a rerun resumes after the last committed one, so every aggregate is
//!   snapshotted exactly once per run.
//! - Why bump the version: the outbox keeps one event per `(aggregate_id, version)`, and a
//!   consumer's versioned upsert applies only newer versions. A snapshot at a version of its
//!   own is ordered after every earlier event of its aggregate and before every later one (the
//!   bump takes the row lock, so it serialises with live writes); it never overwrites a newer
//!   state, and a consumer that already holds the state just applies the same values again.
//! - At most one unfinished run per aggregate type (a partial unique index); starting again
//!   resumes it. Concurrent runners of one run take turns on its row lock.

use crate::db::{render, DbError, PgPool, PgTransaction};
use crate::outbox::{AppendError, NewEvent, Outbox};
use crate::CourierConfig;
use chrono::{DateTime, Utc};
pub use futures::future::BoxFuture;
use std::sync::Arc;
use tokio_postgres::Client;

/// The largest batch: one batch is one transaction holding its aggregates' row locks (live
/// writes to them wait for it) and one outbox insert of that many rows.
pub const MAX_BATCH_SIZE: u32 = 10_000;
/// A few hundred snapshots per transaction: live writes wait milliseconds, not seconds.
pub const DEFAULT_BATCH_SIZE: u32 = 500;

/// What a service supplies to backfill one aggregate type.
///
/// Aggregates are walked in the keyset order of their id; the cursor is the last id done, as
/// text (the source parses it back).
pub trait BackfillSource: Send + Sync + 'static {
    /// The aggregate type, as in the events (`video`); names the run.
    fn aggregate_type(&self) -> &'static str;

    /// How many aggregates come after `after` (all when `None`).
    fn count_after<'a>(
        &'a self,
        client: &'a Client,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<i64, DbError>>;

    /// In `tx`: locks the next `limit` aggregates after `after`, moves each to its next version
    /// and returns one snapshot event per aggregate at that version, in keyset order. An empty
    /// batch means the walk is done.
    fn snapshot_batch<'a, 'tx: 'a>(
        &'a self,
        tx: &'a PgTransaction<'tx>,
        after: Option<&'a str>,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<NewEvent>, BackfillError>>;
}

#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("append snapshots to the outbox: {0}")]
    Append(#[from] AppendError),
    /// The source could not build a snapshot (bad stored data); names the aggregate.
    #[error("snapshot of {aggregate_type} {aggregate_id}: {reason}")]
    Snapshot {
        aggregate_type: String,
        aggregate_id: String,
        reason: String,
    },
    #[error("--batch-size must be 1 to {MAX_BATCH_SIZE}, got {0}")]
    BatchSize(u32),
    #[error("backfill run #{0} does not exist")]
    NoSuchRun(i64),
    /// Another operator's run of the same type started and finished between our two looks.
    #[error("another {0} backfill started and finished meanwhile; run again if still needed")]
    Contended(String),
}

/// A run as recorded in `backfill_runs`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunState {
    pub run_id: i64,
    pub aggregate_type: String,
    /// The last aggregate id done; `None` before the first batch.
    pub cursor: Option<String>,
    pub emitted: i64,
    pub batches: i64,
    pub batch_size: i32,
    pub started_at: DateTime<Utc>,
    pub started_by: String,
    pub reason: String,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl RunState {
    fn from_row(row: &tokio_postgres::Row) -> Self {
        Self {
            run_id: row.get("run_id"),
            aggregate_type: row.get("aggregate_type"),
            cursor: row.get("cursor"),
            emitted: row.get("emitted"),
            batches: row.get("batches"),
            batch_size: row.get("batch_size"),
            started_at: row.get("started_at"),
            started_by: row.get("started_by"),
            reason: row.get("reason"),
            updated_at: row.get("updated_at"),
            finished_at: row.get("finished_at"),
        }
    }
}

/// What a dry run found: the run a real one would resume (if any) and how many snapshots it
/// would emit now.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub aggregate_type: String,
    pub resumes: Option<RunState>,
    pub would_emit: i64,
}

/// The outcome of one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A batch committed: its snapshots, and the run's total so far.
    Emitted { snapshots: u64, run_total: i64 },
    /// Nothing left after the cursor: the run is finished (now or by another runner).
    Finished { run_total: i64 },
}

/// Progress after each batch, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub run_id: i64,
    /// Snapshots emitted by the run so far (earlier attempts included).
    pub emitted: i64,
    /// `emitted` plus what was left when this attempt started (grows if aggregates are
    /// created meanwhile).
    pub total: i64,
}

/// What a run did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub run_id: i64,
    pub aggregate_type: String,
    /// Whether an unfinished run was resumed.
    pub resumed: bool,
    /// Snapshots emitted by this attempt.
    pub emitted_now: i64,
    /// Snapshots of the whole run, earlier attempts included.
    pub emitted_total: i64,
    pub batches_now: u64,
}

/// Runs backfills of one source against one schema.
#[derive(Clone)]
pub struct Backfill {
    pool: PgPool,
    outbox: Outbox,
    source: Arc<dyn BackfillSource>,
    queries: Arc<Queries>,
}

struct Queries {
    start: String,
    unfinished: String,
    resume: String,
    lock: String,
    advance: String,
    finish: String,
    list: String,
    emitted: String,
}

impl Backfill {
    /// `pool` connects to the service's schema (its tables unqualified on the search path).
    pub fn new(pool: PgPool, config: &CourierConfig, source: Arc<dyn BackfillSource>) -> Self {
        let schema = &config.database.schema;
        let q = |sql: &str| render(sql, schema);
        Self {
            pool,
            outbox: Outbox::new(config),
            source,
            queries: Arc::new(Queries {
                start: q(include_str!("queries/start_run.sql")),
                unfinished: q(include_str!("queries/unfinished_run.sql")),
                resume: q(include_str!("queries/resume_run.sql")),
                lock: q(include_str!("queries/lock_run.sql")),
                advance: q(include_str!("queries/advance_run.sql")),
                finish: q(include_str!("queries/finish_run.sql")),
                list: q(include_str!("queries/list_runs.sql")),
                emitted: q("SELECT emitted FROM {schema}.backfill_runs WHERE run_id = $1"),
            }),
        }
    }

    pub fn aggregate_type(&self) -> &'static str {
        self.source.aggregate_type()
    }

    async fn conn(&self, what: &str) -> Result<crate::db::PooledClient<'_>, DbError> {
        self.pool.get().await.map_err(DbError::pool(what))
    }

    /// The unfinished run of this aggregate type, if one stopped before the end.
    pub async fn unfinished(&self) -> Result<Option<RunState>, BackfillError> {
        let context = format!("read the unfinished {} backfill", self.aggregate_type());
        let conn = self.conn(&context).await?;
        let row = conn
            .query_opt(&self.queries.unfinished, &[&self.aggregate_type()])
            .await
            .map_err(DbError::query(context))?;
        Ok(row.as_ref().map(RunState::from_row))
    }

    /// The latest `limit` runs of any aggregate type, newest first.
    pub async fn runs(&self, limit: i64) -> Result<Vec<RunState>, BackfillError> {
        let conn = self.conn("list backfill runs").await?;
        let rows = conn
            .query(&self.queries.list, &[&limit])
            .await
            .map_err(DbError::query("list backfill runs"))?;
        Ok(rows.iter().map(RunState::from_row).collect())
    }

    /// A dry run: what a real run would do now. Reads only.
    pub async fn plan(&self) -> Result<Plan, BackfillError> {
        let resumes = self.unfinished().await?;
        let would_emit = self
            .remaining(resumes.as_ref().and_then(|r| r.cursor.as_deref()))
            .await?;
        Ok(Plan {
            aggregate_type: self.aggregate_type().into(),
            resumes,
            would_emit,
        })
    }

    async fn remaining(&self, after: Option<&str>) -> Result<i64, BackfillError> {
        let context = format!("count {} aggregates to backfill", self.aggregate_type());
        let conn = self.conn(&context).await?;
        Ok(self.source.count_after(&conn, after).await?)
    }

    /// Starts a run, or returns the unfinished one (then `true`) with its batch size updated.
    pub async fn start_or_resume(
        &self,
        batch_size: u32,
        by: &str,
        reason: &str,
    ) -> Result<(RunState, bool), BackfillError> {
        check_batch_size(batch_size)?;
        let size = i32::try_from(batch_size).map_err(|_| BackfillError::BatchSize(batch_size))?;
        let context = format!("start a {} backfill", self.aggregate_type());
        let conn = self.conn(&context).await?;
        // A concurrent start may finish or create a run between the two statements: try twice.
        for _ in 0..2 {
            if let Some(row) = conn
                .query_opt(
                    &self.queries.start,
                    &[&self.aggregate_type(), &size, &by, &reason],
                )
                .await
                .map_err(DbError::query(&context))?
            {
                return Ok((RunState::from_row(&row), false));
            }
            if let Some(row) = conn
                .query_opt(&self.queries.unfinished, &[&self.aggregate_type()])
                .await
                .map_err(DbError::query(&context))?
            {
                let mut run = RunState::from_row(&row);
                conn.execute(&self.queries.resume, &[&run.run_id, &size])
                    .await
                    .map_err(DbError::query(&context))?;
                run.batch_size = size;
                return Ok((run, true));
            }
        }
        Err(BackfillError::Contended(self.aggregate_type().to_owned()))
    }

    /// Runs one batch of run `run_id` in one transaction (see the module docs).
    pub async fn step(&self, run_id: i64, batch_size: u32) -> Result<Step, BackfillError> {
        check_batch_size(batch_size)?;
        let kind = self.aggregate_type();
        let context = format!("backfill {kind} run #{run_id}: batch");
        let mut conn = self.conn(&context).await?;
        let tx = conn.transaction().await.map_err(DbError::query(&context))?;
        let run = tx
            .query_opt(&self.queries.lock, &[&run_id])
            .await
            .map_err(DbError::query(format!(
                "backfill {kind}: lock run #{run_id}"
            )))?
            .ok_or(BackfillError::NoSuchRun(run_id))?;
        let cursor: Option<String> = run.get("cursor");
        if run.get::<_, bool>("finished") {
            let total = self.total_of(&tx, run_id).await?;
            return Ok(Step::Finished { run_total: total });
        }
        let events = self
            .source
            .snapshot_batch(&tx, cursor.as_deref(), i64::from(batch_size))
            .await?;
        let step = match events.last().map(|e| e.aggregate_id.clone()) {
            None => {
                let total: i64 = tx
                    .query_one(&self.queries.finish, &[&run_id])
                    .await
                    .map_err(DbError::query(format!(
                        "backfill {kind}: finish run #{run_id}"
                    )))?
                    .get(0);
                Step::Finished { run_total: total }
            }
            Some(last) => {
                let n = events.len();
                self.outbox.append_all(&tx, events).await?;
                let total: i64 = tx
                    .query_one(&self.queries.advance, &[&run_id, &last, &(n as i64)])
                    .await
                    .map_err(DbError::query(format!(
                        "backfill {kind}: advance run #{run_id}"
                    )))?
                    .get(0);
                Step::Emitted {
                    snapshots: n as u64,
                    run_total: total,
                }
            }
        };
        tx.commit().await.map_err(DbError::query(&context))?;
        metrics::counter!(crate::metrics::BACKFILL_SNAPSHOTS_TOTAL).increment(match step {
            Step::Emitted { snapshots, .. } => snapshots,
            Step::Finished { .. } => 0,
        });
        Ok(step)
    }

    async fn total_of(&self, tx: &PgTransaction<'_>, run_id: i64) -> Result<i64, BackfillError> {
        let row = tx
            .query_one(&self.queries.emitted, &[&run_id])
            .await
            .map_err(DbError::query(format!("read backfill run #{run_id}")))?;
        Ok(row.get(0))
    }

    /// Starts (or resumes) a run and goes on batch by batch until every aggregate is done,
    /// reporting progress after each batch.
    pub async fn run(
        &self,
        batch_size: u32,
        by: &str,
        reason: &str,
        mut on_progress: impl FnMut(Progress),
    ) -> Result<Report, BackfillError> {
        let (run, resumed) = self.start_or_resume(batch_size, by, reason).await?;
        let total = run.emitted + self.remaining(run.cursor.as_deref()).await?;
        on_progress(Progress {
            run_id: run.run_id,
            emitted: run.emitted,
            total,
        });
        let mut batches_now = 0;
        let mut emitted_now = 0;
        loop {
            match self.step(run.run_id, batch_size).await? {
                Step::Emitted {
                    snapshots,
                    run_total,
                } => {
                    batches_now += 1;
                    emitted_now += snapshots as i64;
                    on_progress(Progress {
                        run_id: run.run_id,
                        emitted: run_total,
                        total: total.max(run_total),
                    });
                }
                Step::Finished { run_total } => {
                    return Ok(Report {
                        run_id: run.run_id,
                        aggregate_type: run.aggregate_type,
                        resumed,
                        emitted_now,
                        emitted_total: run_total,
                        batches_now,
                    })
                }
            }
        }
    }
}

fn check_batch_size(batch_size: u32) -> Result<(), BackfillError> {
    if (1..=MAX_BATCH_SIZE).contains(&batch_size) {
        Ok(())
    } else {
        Err(BackfillError::BatchSize(batch_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_size_is_bounded() {
        assert!(check_batch_size(0).is_err());
        assert!(check_batch_size(1).is_ok());
        assert!(check_batch_size(MAX_BATCH_SIZE).is_ok());
        assert!(check_batch_size(MAX_BATCH_SIZE + 1).is_err());
    }
}
