//! Marking: writing a claimer's publish outcomes to the outbox, and deciding for each failure
//! when the row is tried again or whether it is dead.

use crate::backoff::Backoff;
use crate::config::RelayConfig;
use crate::fast_hash::FastHash;
use crate::relay::publisher::{FailureKind, PublishOutcome, PublisherKey, Publishers};
use crate::relay::row_address::RowAddress;
use crate::relay::store::{FailedRow, OutboxStore, PublishedRow};
use chrono::Utc;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Marking is retried this often on transient errors before the claimer restarts.
const MARK_ATTEMPTS: u32 = 5;

/// What the claimer remembers of a row until it is marked.
pub(super) struct RowMeta {
    pub key: PublisherKey,
    pub version: i64,
    /// Its key's closest earlier version unpublished at claim time.
    pub prev_version: Option<i64>,
    /// Where the claim left the row, for the mark.
    pub address: RowAddress,
    /// For logs: which event a failure concerns.
    pub event_id: Uuid,
    /// Attempts before this claim.
    pub attempts: i32,
    /// It had failed before (see [`ClaimedRow::retried`]).
    ///
    /// [`ClaimedRow::retried`]: crate::relay::store::ClaimedRow::retried
    pub retried: bool,
}

/// One round of marks: the settled rows' metadata and what writing their outcomes needs.
pub(super) struct Marking {
    pub rows: HashMap<i64, RowMeta, FastHash>,
    pub shard: u32,
    pub token: Uuid,
    pub store: Arc<OutboxStore>,
    pub publishers: Arc<Publishers>,
    pub config: Arc<RelayConfig>,
}

impl Marking {
    /// Writes the outcomes: published rows, failures (with their retry time or death), and
    /// rows given back untried.
    pub async fn record(&self, outcomes: Vec<PublishOutcome>) -> Result<(), crate::db::DbError> {
        let mut published = Vec::new();
        let mut failed = Vec::new();
        let mut not_tried = Vec::new();
        for outcome in outcomes {
            let seq = match &outcome {
                PublishOutcome::Published { seq, .. }
                | PublishOutcome::Failed { seq, .. }
                | PublishOutcome::NotTried { seq } => *seq,
            };
            // Every outcome is of a row this claimer dispatched and remembers.
            let Some(row) = self.rows.get(&seq) else {
                continue;
            };
            match outcome {
                PublishOutcome::Published { acked, .. } => published.push(PublishedRow {
                    address: row.address,
                    acked,
                }),
                PublishOutcome::Failed { error, kind, .. } => failed.push((seq, row, error, kind)),
                PublishOutcome::NotTried { .. } => not_tried.push(row.address),
            }
        }
        let failed = self.plan_failures(failed);
        retry_transient(|| self.store.mark_published(&published, self.token)).await?;
        retry_transient(|| self.store.mark_failed(&failed, self.token)).await?;
        retry_transient(|| self.store.release(&not_tried, self.token)).await?;
        Ok(())
    }

    /// Decides retry time or death for each failure. A broker failure spends none of the
    /// row's attempts and waits the broker's backoff; the row's own failures spend one and
    /// wait its backoff; a permanent one, or the last attempt, kills it.
    fn plan_failures(&self, failed: Vec<(i64, &RowMeta, String, FailureKind)>) -> Vec<FailedRow> {
        let backoff = self.config.retry_backoff();
        let limit = self.publishers.limit();
        let mut broker_failures = 0;
        let planned = failed
            .into_iter()
            .map(|(seq, row, error, kind)| {
                let attempts = row.attempts;
                if kind == FailureKind::Broker {
                    broker_failures += 1;
                    return FailedRow {
                        address: row.address,
                        retry_at: Some(after(limit.broker_retry_delay())),
                        error,
                        dead: false,
                        counts_attempt: false,
                    };
                }
                let attempts_after = attempts.saturating_add(1);
                let event_id = row.event_id.to_string();
                let ordering_key = row.key.ordering_key.as_str();
                let dead = kind == FailureKind::Permanent
                    || u32::try_from(attempts_after).unwrap_or(u32::MAX)
                        >= self.config.publish_max_attempts;
                if dead {
                    metrics::counter!(crate::metrics::OUTBOX_DEAD_TOTAL).increment(1);
                    tracing::error!(shard = self.shard, seq, event_id, ordering_key, attempts = attempts_after,
                        error = %error, "outbox row is dead; its key waits for an operator (retry or skip)");
                } else {
                    tracing::warn!(shard = self.shard, seq, event_id, ordering_key, attempts = attempts_after,
                        error = %error, "publish failed, will retry");
                }
                let retry_at = (!dead)
                    .then(|| after(backoff.delay(u32::try_from(attempts).unwrap_or(0))));
                FailedRow {
                    address: row.address,
                    error,
                    retry_at,
                    dead,
                    counts_attempt: true,
                }
            })
            .collect();
        if broker_failures > 0 {
            // One line per round, not per row: a stalled broker fails thousands at once.
            let snapshot = limit.snapshot();
            tracing::warn!(
                shard = self.shard,
                rows = broker_failures,
                publish_limit = snapshot.limit,
                "publishes failed on the broker's side; retrying without spending the rows' attempts"
            );
        }
        planned
    }
}

fn after(delay: Duration) -> chrono::DateTime<Utc> {
    Utc::now() + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::zero())
}

/// Runs `op` until it succeeds, fails permanently, or `MARK_ATTEMPTS` transient failures.
async fn retry_transient<T, F, Fut>(mut op: F) -> Result<T, crate::db::DbError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, crate::db::DbError>>,
{
    let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if e.is_transient() && attempt + 1 < MARK_ATTEMPTS => {
                tokio::time::sleep(backoff.delay(attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}
