//! Retention: the Janitor deletes published outbox rows, the version ledger's rows (which
//! refuse a second append of a version) and processed inbox rows older than `[retention]`
//! says, in small batches — each its own short statement, so no lock is held for long and the
//! relay never waits on it — and leaves dead and pending rows to operators.

use crate::config::RetentionConfig;
use crate::db::{render, DbError, PgPool};
use crate::supervision::Supervision;
use actix::prelude::*;
use std::time::Duration;

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

/// Deletes every expired row, batch by batch, until a batch comes back short.
pub async fn sweep(
    pool: &PgPool,
    queries: &RetentionQueries,
    config: &RetentionConfig,
) -> Result<Sweep, DbError> {
    let mut sweep = Sweep::default();
    let batch = i64::from(config.batch_size);
    for (table, sql, hours, rows) in [
        (
            "outbox",
            &queries.outbox,
            config.outbox_hours,
            &mut sweep.outbox_rows,
        ),
        (
            "outbox_versions",
            &queries.versions,
            config.version_hours,
            &mut sweep.version_rows,
        ),
        (
            "inbox",
            &queries.inbox,
            config.inbox_hours,
            &mut sweep.inbox_rows,
        ),
    ] {
        let hours = i32::try_from(hours).unwrap_or(i32::MAX);
        loop {
            let context = format!("retention: delete expired {table} rows");
            let client = pool.get().await.map_err(DbError::pool(&context))?;
            let deleted = client
                .execute(sql.as_str(), &[&hours, &batch])
                .await
                .map_err(DbError::query(&context))?;
            drop(client);
            sweep.batches += 1;
            metrics::counter!(crate::metrics::RETENTION_DELETED_TOTAL, "table" => table)
                .increment(deleted);
            *rows += deleted;
            if deleted < config.batch_size as u64 {
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
            sweeping: false,
            escalated: false,
        }
    }

    fn sweep(&mut self, ctx: &mut Context<Self>) {
        if self.sweeping {
            return;
        }
        self.sweeping = true;
        let (pool, queries, config) =
            (self.pool.clone(), self.queries.clone(), self.config.clone());
        ctx.spawn(
            async move { sweep(&pool, &queries, &config).await }
                .into_actor(self)
                .map(|result, act, ctx| {
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
