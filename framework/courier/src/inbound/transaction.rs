//! Projection transactions: one key's group, or the groups of many keys in one transaction
//! (the committer's batches), and how each delivery is settled afterwards.
//!
//! One transaction: inbox insert (`ON CONFLICT DO NOTHING`) for all → the service's handler
//! per key for the events seen for the first time (contiguous projections: only those that
//! continue the key's stored version) → one offset save → commit. Then acks.

use crate::backoff::Backoff;
use crate::db::{DbError, PgConnection, PgTransaction};
use crate::inbound::delivery::{Delivery, EventMeta};
use crate::inbound::offsets::Position;
use crate::inbound::parked::KeyMove;
use crate::inbound::parts::ConsumerParts;
use crate::inbound::projection::{HandlerError, Projection};
use crate::metrics as m;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Why a projection transaction failed.
#[derive(Debug, thiserror::Error)]
enum TransactionFailure {
    #[error(transparent)]
    Db(#[from] DbError),
    /// The database went away during the transaction (whatever step noticed it first).
    #[error("database unavailable: {0}")]
    Unavailable(Box<TransactionFailure>),
    #[error("handler failed on {events} event(s) from event {event_id}: {error}")]
    Handler {
        /// The group's first new event (a group that fails permanently is retried event by
        /// event, so a dead-lettered event's reason names that event alone).
        event_id: uuid::Uuid,
        events: usize,
        error: HandlerError,
    },
}

impl TransactionFailure {
    fn is_transient(&self) -> bool {
        match self {
            TransactionFailure::Db(e) => e.is_transient(),
            TransactionFailure::Unavailable(_) => true,
            TransactionFailure::Handler { error, .. } => error.is_transient(),
        }
    }

    fn is_unavailable(&self) -> bool {
        match self {
            TransactionFailure::Db(e) => e.is_unavailable(),
            TransactionFailure::Unavailable(_) => true,
            TransactionFailure::Handler { error, .. } => error.is_unavailable(),
        }
    }
}

/// Waits between retries of a transaction while the database is unavailable.
const OUTAGE_BACKOFF: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// What a finished transaction means for the key.
pub(crate) struct Settled<E> {
    /// Deliveries settled (acked, nacked or dead-lettered).
    pub(crate) count: usize,
    /// Versions acked or dead-lettered: done with, whatever their outcome.
    pub(crate) done: Vec<i64>,
    /// The oldest version given back to Pub/Sub, if any: later ones must wait for it.
    pub(crate) nacked: Option<i64>,
    /// Contiguous projections: the version missing before the ones in `back`.
    pub(crate) gap: Option<i64>,
    /// Not tried this time, to go back to the front of the queue in this order.
    pub(crate) back: Vec<Delivery<E>>,
}

impl<E> Settled<E> {
    fn nothing() -> Self {
        Self {
            count: 0,
            done: Vec::new(),
            nacked: None,
            gap: None,
            back: Vec::new(),
        }
    }

    /// `count` deliveries dropped unsettled (which nacks them), the oldest at `oldest`.
    pub(crate) fn lost(count: usize, oldest: Option<i64>) -> Self {
        Self {
            count,
            nacked: oldest,
            ..Self::nothing()
        }
    }

    fn done(version: i64) -> Self {
        Self {
            count: 1,
            done: vec![version],
            ..Self::nothing()
        }
    }

    fn nacked(version: i64) -> Self {
        Self {
            count: 1,
            nacked: Some(version),
            ..Self::nothing()
        }
    }

    fn and(mut self, other: Settled<E>) -> Self {
        self.count += other.count;
        self.done.extend(other.done);
        let min = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.nacked = min(self.nacked, other.nacked);
        self.gap = min(self.gap, other.gap);
        self.back.extend(other.back);
        self
    }
}

/// Parks `key` behind `expected` with `held` in one transaction, then acks them; returns how
/// many deliveries it settled. If the database fails, they are nacked instead (Pub/Sub brings
/// them back, and the gap holds them again).
pub(crate) async fn park<P: Projection>(
    parts: Arc<ConsumerParts<P>>,
    key: String,
    expected: i64,
    held: Vec<Delivery<P::Event>>,
) -> usize {
    let count = held.len();
    let group = &parts.spec.group;
    let reason = format!(
        "version {expected} did not come within {} s",
        parts.settings.gap_wait_secs
    );
    let context = format!("park key {key:?} of group {group}");
    let parked = async {
        let _slot = parts.transactions.acquire().await;
        let mut client = parts.pool.get().await.map_err(DbError::pool(&context))?;
        let tx = client
            .transaction()
            .await
            .map_err(DbError::query(&context))?;
        let events: Vec<(&EventMeta, &google_cloud_pubsub::model::Message)> =
            held.iter().map(|d| (&d.meta, &d.message)).collect();
        parts
            .versions
            .park(
                &tx,
                group,
                &parts.spec.subscription,
                &key,
                expected,
                &reason,
                &events,
            )
            .await?;
        tx.commit().await.map_err(DbError::query(&context))?;
        Ok::<_, DbError>(())
    }
    .await;
    match parked {
        Ok(()) => {
            tracing::warn!(ordering_key = %key, consumer_group = %group, expected_version = expected,
                held = count, %reason, "key parked; `courier parked release` lets it go on");
            parts.count_parked(count);
            for delivery in held {
                parts.ack(delivery);
            }
            parts.refresh_parked_gauge().await;
        }
        Err(error) => {
            tracing::error!(ordering_key = %key, consumer_group = %group, %error,
                "cannot park the key; its held events go back to Pub/Sub");
            for delivery in held {
                parts.nack(delivery);
            }
        }
    }
    count
}

/// Applies `group` (one key's deliveries, in order) and settles its deliveries, or gives some
/// back to the queue (see [`Settled::back`]).
pub(crate) async fn project<P: Projection>(
    parts: Arc<ConsumerParts<P>>,
    mut group: Vec<Delivery<P::Event>>,
) -> Settled<P::Event> {
    let count = group.len();
    let retries = parts.settings.transient_retries;
    match apply_with_retries(&parts, &[&group], retries).await {
        Ok(mut committed) => settle_group(&parts, group, committed.remove(0)).await,
        Err(failure) if count > 1 && failure.is_transient() => {
            tracing::debug!(ordering_key = %group[0].meta.ordering_key, error = %failure,
                "grouped transaction still failing transiently; retrying its first event alone");
            let rest = group.split_off(1);
            let first = Box::pin(project(parts, group)).await;
            Settled {
                back: rest,
                ..Settled::nothing()
            }
            .and(first)
        }
        Err(failure) if count > 1 => {
            tracing::debug!(ordering_key = %group[0].meta.ordering_key, error = %failure,
                "grouped transaction failed permanently; retrying its events one by one");
            let mut settled = Settled::nothing();
            let mut rest = group.into_iter();
            for delivery in rest.by_ref() {
                settled = settled.and(Box::pin(project(parts.clone(), vec![delivery])).await);
                if settled.nacked.is_some() {
                    break;
                }
            }
            // Behind a nacked event: back to the queue, where the gate holds them.
            settled.back.extend(rest);
            settled
        }
        Err(failure) => {
            let delivery = group.remove(0);
            note_failure(&parts, &delivery.meta, &failure);
            let version = delivery.meta.version;
            let attempt = delivery.meta.delivery_attempt.unwrap_or(1);
            let max_attempts =
                i32::try_from(parts.settings.max_delivery_attempts).unwrap_or(i32::MAX);
            let reason = if !failure.is_transient() {
                format!("permanent failure: {failure}")
            } else if attempt < max_attempts {
                parts.nack(delivery);
                return Settled::nacked(version);
            } else {
                format!(
                    "transient failure on delivery attempt {attempt}, after {} retries: {failure}",
                    parts.settings.transient_retries
                )
            };
            if parts
                .dead_letter(&delivery.message, delivery.handler, &reason, &delivery.span)
                .await
            {
                Settled::done(version)
            } else {
                Settled::nacked(version)
            }
        }
    }
}

/// Acks what `committed` settled of `group`; the rest goes back to the projector's queue.
async fn settle_group<P: Projection>(
    parts: &ConsumerParts<P>,
    group: Vec<Delivery<P::Event>>,
    committed: Committed,
) -> Settled<P::Event> {
    let (back, settle): (Vec<_>, Vec<_>) = group
        .into_iter()
        .enumerate()
        .partition(|(i, _)| committed.kept_back.contains(i));
    let settle: Vec<Delivery<P::Event>> = settle.into_iter().map(|(_, d)| d).collect();
    let done = settle.iter().map(|d| d.meta.version).collect();
    let count = settle.len();
    settle_committed(parts, settle, committed.applied, committed.parked).await;
    Settled {
        count,
        done,
        gap: committed.expected,
        back: back.into_iter().map(|(_, d)| d).collect(),
        ..Settled::nothing()
    }
}

/// Applies the groups of many keys in one transaction and settles each; if that transaction
/// fails for any reason but a database outage (waited out), each group is applied on its own
/// instead, with its retries, narrowing and dead-lettering, so one bad event costs the others
/// one failed transaction. Returns each group's outcome, in order.
pub(crate) async fn project_many<P: Projection>(
    parts: Arc<ConsumerParts<P>>,
    mut groups: Vec<Vec<Delivery<P::Event>>>,
) -> Vec<Settled<P::Event>> {
    if groups.len() == 1 {
        let group = groups.remove(0);
        return vec![project(parts, group).await];
    }
    let shared = {
        let slices: Vec<&[Delivery<P::Event>]> = groups.iter().map(Vec::as_slice).collect();
        apply_with_retries(&parts, &slices, 0).await
    };
    match shared {
        Ok(committed) => {
            let mut settled = Vec::with_capacity(groups.len());
            for (group, committed) in groups.into_iter().zip(committed) {
                settled.push(settle_group(&parts, group, committed).await);
            }
            settled
        }
        Err(failure) => {
            tracing::debug!(keys = groups.len(), consumer_group = %parts.spec.group,
                error = %failure, "shared transaction failed; applying each key on its own");
            let alone = groups
                .into_iter()
                .map(|group| project(parts.clone(), group));
            futures::future::join_all(alone).await
        }
    }
}

/// [`apply`], retried after a backoff for as long as the database is unavailable, and up to
/// `transient_retries_allowed` times after a transient failure.
async fn apply_with_retries<P: Projection>(
    parts: &ConsumerParts<P>,
    groups: &Groups<'_, P::Event>,
    transient_retries_allowed: u32,
) -> Result<Vec<Committed>, TransactionFailure> {
    let first_key = &groups[0][0].meta.ordering_key;
    let mut outage_retries = 0u32;
    let mut transient_retries = 0u32;
    loop {
        let failure = match apply(parts, groups).await {
            Ok(committed) => return Ok(committed),
            Err(failure) => failure,
        };
        let delay = if failure.is_unavailable() {
            let delay = OUTAGE_BACKOFF.delay(outage_retries);
            outage_retries = outage_retries.saturating_add(1);
            tracing::warn!(ordering_key = %first_key, keys = groups.len(),
                consumer_group = %parts.spec.group, retry_in_ms = delay.as_millis() as u64,
                error = %failure, "database unavailable; keeping the events and retrying");
            delay
        } else if failure.is_transient() && transient_retries < transient_retries_allowed {
            let delay = parts
                .settings
                .transient_backoff()
                .spread_delay(transient_retries);
            transient_retries += 1;
            tracing::info!(ordering_key = %first_key,
                consumer_group = %parts.spec.group, retry = transient_retries,
                retry_in_ms = delay.as_millis() as u64, error = %failure,
                "transient failure; keeping the events and retrying");
            metrics::counter!(m::PROJECTION_TRANSIENT_RETRIES_TOTAL).increment(1);
            delay
        } else {
            return Err(failure);
        };
        parts.stats.failed.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::PROJECTION_PROCESS_ERROR_TOTAL).increment(1);
        tokio::time::sleep(delay).await;
    }
}

/// One transaction for `groups`, on a pooled connection.
async fn apply<P: Projection>(
    parts: &ConsumerParts<P>,
    groups: &Groups<'_, P::Event>,
) -> Result<Vec<Committed>, TransactionFailure> {
    let group_name = &parts.spec.group;
    // Held (inside the `Result`) until the transaction ends; the semaphore is never closed.
    let _slot = parts.transactions.acquire().await;
    let mut client = parts.pool.get().await.map_err(DbError::pool(format!(
        "projection transaction of group {group_name}"
    )))?;
    match transact(parts, &mut client, groups).await {
        // A handler that maps errors itself may not say the connection broke; the client does.
        Err(failure) if client.is_closed() && !failure.is_unavailable() => {
            Err(TransactionFailure::Unavailable(Box::new(failure)))
        }
        result => result,
    }
}

/// What a committed transaction did with its group.
#[derive(Debug, Default)]
struct Committed {
    /// Events that took effect for the first time.
    applied: usize,
    /// Indices (into the group) of deliveries not settled: behind a gap (contiguous
    /// projections), waiting for `expected`.
    kept_back: Vec<usize>,
    expected: Option<i64>,
    /// Deliveries kept in the database for their parked key, acked.
    parked: usize,
}

/// How a contiguous projection's group divides against the key's stored version.
#[derive(Debug, PartialEq, Eq)]
struct ContiguousPlan {
    /// Indices to apply, in version order: stored + 1, stored + 2, …
    apply: Vec<usize>,
    /// Indices at or below a version already applied, or repeated in the group.
    stale: Vec<usize>,
    /// Indices past a gap, in version order.
    gap: Vec<usize>,
    /// The version the key needs next.
    expected: i64,
}

/// `events`: (version, carries the whole state) per delivery. A whole-state event applies at
/// any version from the expected one on, and what waited before it is superseded (stale).
fn plan_contiguous(events: &[(i64, bool)], stored: i64) -> ContiguousPlan {
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by_key(|&i| events[i].0);
    let mut plan = ContiguousPlan {
        apply: Vec::new(),
        stale: Vec::new(),
        gap: Vec::new(),
        expected: stored + 1,
    };
    for i in order {
        let (version, whole) = events[i];
        if version < plan.expected {
            plan.stale.push(i);
        } else if whole || (version == plan.expected && plan.gap.is_empty()) {
            plan.stale.append(&mut plan.gap);
            plan.apply.push(i);
            plan.expected = version + 1;
        } else {
            plan.gap.push(i);
        }
    }
    plan
}

/// The groups of one transaction: each one key's deliveries, no key twice.
pub(crate) type Groups<'a, E> = [&'a [Delivery<E>]];

/// One transaction for `groups`; what it did with each group, in order.
async fn transact<P: Projection>(
    parts: &ConsumerParts<P>,
    client: &mut PgConnection,
    groups: &Groups<'_, P::Event>,
) -> Result<Vec<Committed>, TransactionFailure> {
    let group_name = &parts.spec.group;
    let tx = client.transaction().await.map_err(DbError::query(format!(
        "begin projection transaction of group {group_name}"
    )))?;
    let mut committed: Vec<Committed> = groups.iter().map(|_| Committed::default()).collect();
    // Parked here, acked after the commit: not in the inbox, so they apply when released.
    let mut parked_now: Vec<Vec<usize>> = vec![Vec::new(); groups.len()];
    // Per group, which deliveries may take effect, in which order; the others are stale, or
    // kept back, or parked.
    let candidates: Vec<Vec<usize>> = if parts.projection.contiguous_versions() {
        let keys: Vec<&str> = groups.iter().map(|g| g[0].meta.routing_key()).collect();
        // Where each key stands if its events come in order: just below the lowest.
        let expected: Vec<(&str, i64)> = groups
            .iter()
            .zip(&keys)
            .map(|(group, key)| {
                let lowest = group.iter().map(|d| d.meta.version).min().unwrap_or(1);
                (*key, (lowest - 1).max(0))
            })
            .collect();
        let stored = parts.versions.stored(&tx, group_name, &expected).await?;
        let mut moves = Vec::new();
        let mut candidates = Vec::with_capacity(groups.len());
        for (g, group) in groups.iter().enumerate() {
            let key = keys[g];
            let events: Vec<(i64, bool)> = group
                .iter()
                .map(|d| {
                    let whole = parts.projection.is_whole_state(&d.meta, &d.event);
                    (d.meta.version, whole)
                })
                .collect();
            let stands_at = stored.get(key).copied().unwrap_or(0);
            let plan = plan_contiguous(&events, stands_at);
            if let (Some(first), Some(last)) = (plan.apply.first(), plan.apply.last()) {
                moves.push(KeyMove {
                    key,
                    from: stands_at,
                    to: group[*last].meta.version,
                    first_publish_time: group[*first].meta.publish_time,
                });
            }
            if !plan.gap.is_empty() {
                if parts.versions.is_parked(&tx, group_name, key).await? {
                    let held: Vec<(&EventMeta, &google_cloud_pubsub::model::Message)> = plan
                        .gap
                        .iter()
                        .map(|&i| (&group[i].meta, &group[i].message))
                        .collect();
                    let reason = format!("waiting for version {}", plan.expected);
                    parts
                        .versions
                        .park(
                            &tx,
                            group_name,
                            &parts.spec.subscription,
                            key,
                            plan.expected,
                            &reason,
                            &held,
                        )
                        .await?;
                    committed[g].parked = held.len();
                    parked_now[g] = plan.gap;
                } else {
                    committed[g].kept_back = plan.gap;
                    committed[g].expected = Some(plan.expected);
                }
            }
            candidates.push(plan.apply);
        }
        if !moves.is_empty() {
            parts.versions.advance(&tx, group_name, &moves).await?;
        }
        candidates
    } else {
        groups.iter().map(|g| (0..g.len()).collect()).collect()
    };
    // Settled by this transaction: all but those kept back.
    let settled: Vec<&Delivery<P::Event>> = groups
        .iter()
        .zip(&committed)
        .flat_map(|(group, c)| {
            group
                .iter()
                .enumerate()
                .filter(|(i, _)| !c.kept_back.contains(i))
                .map(|(_, d)| d)
        })
        .collect();
    let seen: Vec<(uuid::Uuid, chrono::DateTime<chrono::Utc>)> = groups
        .iter()
        .zip(&committed)
        .zip(&parked_now)
        .flat_map(|((group, c), parked)| {
            group
                .iter()
                .enumerate()
                .filter(|(i, _)| !c.kept_back.contains(i) && !parked.contains(i))
                .map(|(_, d)| (d.meta.event_id, d.meta.publish_time))
        })
        .collect();
    let mut fresh = parts.inbox.record(&tx, group_name, &seen).await?;
    let mut work: Vec<Vec<(&EventMeta, &P::Event)>> = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        let new_events: Vec<(&EventMeta, &P::Event)> = candidates[g]
            .iter()
            .map(|&i| &group[i])
            // `remove`: an event twice in one group takes effect once.
            .filter(|d| fresh.remove(&d.meta.event_id))
            .map(|d| (&d.meta, &d.event))
            .collect();
        committed[g].applied = new_events.len();
        if !new_events.is_empty() {
            work.push(new_events);
        }
    }
    if parts.projection.independent_keys() {
        // A failure aborts the transaction whichever key's statement met it first; the
        // fallback applies each key on its own and finds the failing one.
        futures::future::try_join_all(work.iter().map(|events| apply_key(parts, &tx, events)))
            .await?;
    } else {
        for events in &work {
            apply_key(parts, &tx, events).await?;
        }
    }
    // One position per transaction: its newest message, in that message's lane.
    let newest = settled.iter().max_by_key(|d| d.meta.publish_time);
    if let Some(newest) = newest {
        let lag_millis = parts
            .offsets
            .save(
                &tx,
                group_name,
                &parts.spec.subscription,
                Position {
                    routing_key: newest.meta.routing_key(),
                    message_id: &newest.meta.message_id,
                    publish_time: newest.meta.publish_time,
                },
                &parts.instance,
            )
            .await?;
        #[allow(clippy::cast_precision_loss)]
        metrics::gauge!(parts.offset_lag_metric.clone()).set(lag_millis as f64);
    }
    tx.commit().await.map_err(DbError::query(format!(
        "commit projection transaction of group {group_name}"
    )))?;
    let events: usize = groups.iter().map(|g| g.len()).sum();
    parts.stats.transactions.fetch_add(1, Ordering::Relaxed);
    if groups.len() > 1 {
        parts
            .stats
            .shared_transactions
            .fetch_add(1, Ordering::Relaxed);
    }
    #[allow(clippy::cast_precision_loss)]
    metrics::histogram!(m::PROJECTION_TRANSACTION_EVENTS).record(events as f64);
    Ok(committed)
}

/// Applies one key's new events in `tx`, oldest first.
async fn apply_key<P: Projection>(
    parts: &ConsumerParts<P>,
    tx: &PgTransaction<'_>,
    events: &[(&EventMeta, &P::Event)],
) -> Result<(), TransactionFailure> {
    parts
        .projection
        .apply_group(tx, events)
        .await
        .map_err(|error| TransactionFailure::Handler {
            event_id: events[0].0.event_id,
            events: events.len(),
            error,
        })
}

async fn settle_committed<P: Projection>(
    parts: &ConsumerParts<P>,
    group: Vec<Delivery<P::Event>>,
    applied: usize,
    parked: usize,
) {
    if let Some(hook) = &parts.before_ack {
        let metas: Vec<EventMeta> = group.iter().map(|d| d.meta.clone()).collect();
        hook(&metas).await;
    }
    let duplicates = group.len() - applied - parked;
    if parked > 0 {
        parts.count_parked(parked);
    }
    parts
        .stats
        .applied
        .fetch_add(applied as u64, Ordering::Relaxed);
    parts
        .stats
        .duplicates
        .fetch_add(duplicates as u64, Ordering::Relaxed);
    metrics::counter!(m::PROJECTION_PROCESS_SUCCESS_TOTAL).increment(group.len() as u64);
    metrics::counter!(m::PROJECTION_DUPLICATES_TOTAL).increment(duplicates as u64);
    for delivery in group {
        parts.ack(delivery);
    }
}

fn note_failure<P: Projection>(
    parts: &ConsumerParts<P>,
    meta: &EventMeta,
    failure: &TransactionFailure,
) {
    parts.stats.failed.fetch_add(1, Ordering::Relaxed);
    metrics::counter!(m::PROJECTION_PROCESS_ERROR_TOTAL).increment(1);
    tracing::warn!(
        event_id = %meta.event_id,
        message_id = %meta.message_id,
        ordering_key = %meta.ordering_key,
        consumer_group = %parts.spec.group,
        delivery_attempt = meta.delivery_attempt,
        transient = failure.is_transient(),
        error = %failure,
        "projection failed"
    );
}

#[cfg(test)]
mod tests {
    use super::{plan_contiguous, ContiguousPlan};

    #[test]
    fn a_contiguous_plan_applies_the_chain_in_version_order_and_keeps_back_past_a_gap() {
        // Stored 2; arrived: v4, v3, v2 (stale), v6 (past the gap at 5), v4 again.
        let deltas = |versions: &[i64]| versions.iter().map(|&v| (v, false)).collect::<Vec<_>>();
        assert_eq!(
            plan_contiguous(&deltas(&[4, 3, 2, 6, 4]), 2),
            ContiguousPlan {
                apply: vec![1, 0],
                stale: vec![2, 4],
                gap: vec![3],
                expected: 5,
            }
        );
        // Nothing stored: the key starts at v1.
        let plan = plan_contiguous(&deltas(&[2, 3]), 0);
        assert_eq!(
            (plan.apply, plan.gap, plan.expected),
            (vec![], vec![0, 1], 1)
        );
    }

    #[test]
    fn a_whole_state_event_applies_over_a_gap_and_supersedes_what_waited() {
        // Stored 1; v3 (delta) waits for v2, then a snapshot at v5 arrives, then v6.
        let plan = plan_contiguous(&[(3, false), (5, true), (6, false)], 1);
        assert_eq!(
            plan,
            ContiguousPlan {
                apply: vec![1, 2],
                stale: vec![0],
                gap: vec![],
                expected: 7,
            }
        );
        // A create (whole) starts a key that has seen nothing, at whatever version.
        let plan = plan_contiguous(&[(4, true), (5, false)], 0);
        assert_eq!((plan.apply, plan.expected), (vec![0, 1], 6));
    }
}
