//! Projector: one actor per aggregate (routing key), created on demand, passivated when idle.
//!
//! It applies its aggregate's events strictly one transaction after another, in arrival
//! order: inbox insert (`ON CONFLICT DO NOTHING`) → the service's handler for the events seen
//! for the first time → offset save → commit → ack. Up to
//! `consumer.max_events_per_transaction` waiting events share one transaction.
//!
//! No failure lets a later version of the key overtake an earlier one:
//! - A database outage (no connection, the connection lost, the server restarting) is not the
//!   events' fault: the transaction is retried after a backoff until the database is back.
//! - A transient failure (lock timeout, serialization failure, deadlock, a handler's
//!   `Transient`) is retried in place `consumer.transient_retries` times, with backoff.
//!   Meanwhile the events stay held (the client extends their leases), spend no delivery
//!   attempt, and the key's later events wait behind them. A group still failing is narrowed:
//!   its first event alone gets the retries, the rest go back to the queue. A single event
//!   still failing is given back to Pub/Sub (nacked: one delivery attempt spent), or
//!   dead-lettered on its last attempt.
//! - A permanent failure is narrowed down by retrying the events one per transaction; the
//!   culprit is dead-lettered, the others applied.
//! - The gate: once the projector has given version n back to Pub/Sub, no later version of the
//!   key is applied until n is back and settled. Later ones are held, not nacked (the emulator
//!   redelivers a nack at once, which would burn their attempts); Pub/Sub redelivers n, and
//!   with ordering the later ones again, which the inbox absorbs. The gate opens when n is
//!   settled, or after `consumer.gate_timeout_secs` with a warning (n was dead-lettered by the
//!   subscription's own policy, or went to another consumer).

use crate::backoff::Backoff;
use crate::db::{DbError, PgConnection};
use crate::inbound::delivery::{Delivery, EventMeta};
use crate::inbound::messages::{Deliver, Stop};
use crate::inbound::offsets::Position;
use crate::inbound::parts::ConsumerParts;
use crate::inbound::projection::{HandlerError, Projection};
use crate::keyed_actors::{KeyedActors, Queued};
use crate::metrics as m;
use actix::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The registry of live projectors, by routing key (the router hands deliveries through it;
/// a projector leaves it when idle).
pub type LiveProjectors<P> = KeyedActors<String, Projector<P>>;

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
struct Settled<E> {
    /// Deliveries settled (acked, nacked or dead-lettered).
    count: usize,
    /// Versions acked or dead-lettered: done with, whatever their outcome.
    done: Vec<i64>,
    /// The oldest version given back to Pub/Sub, if any: later ones must wait for it.
    nacked: Option<i64>,
    /// Contiguous projections: the version missing before the ones in `back`.
    gap: Option<i64>,
    /// Not tried this time, to go back to the front of the queue in this order.
    back: Vec<Delivery<E>>,
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

/// A version the key waits for; later versions are held until it is settled.
struct Gate {
    version: i64,
    /// When the wait ends anyway: `gate_timeout_secs` after a nack, `gap_wait_secs` after a
    /// gap (contiguous projections).
    deadline: Instant,
}

/// Why a key waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaiting {
    /// The projector gave this version back to Pub/Sub.
    Nacked,
    /// A later version came first (contiguous projections).
    Gap,
}

pub struct Projector<P: Projection> {
    key: String,
    parts: Arc<ConsumerParts<P>>,
    /// To leave the registry when passivating.
    registry: Arc<LiveProjectors<P>>,
    /// Deliveries handed to this projector and not yet settled (shared with the router).
    queued: Arc<Queued>,
    mailbox: usize,
    /// Received, waiting for the running transaction to finish (or for the gate to open).
    waiting: VecDeque<Delivery<P::Event>>,
    /// A transaction is running.
    busy: bool,
    gate: Option<Gate>,
    last_active: Instant,
}

impl<P: Projection> Projector<P> {
    pub fn new(
        key: String,
        parts: Arc<ConsumerParts<P>>,
        registry: Arc<LiveProjectors<P>>,
        queued: Arc<Queued>,
        mailbox: usize,
    ) -> Self {
        Self {
            key,
            parts,
            registry,
            queued,
            mailbox,
            waiting: VecDeque::new(),
            busy: false,
            gate: None,
            last_active: Instant::now(),
        }
    }

    fn idle_after(&self) -> Duration {
        Duration::from_secs(self.parts.settings.projector_idle_secs)
    }

    /// Passivates when idle (a closed gate counts as queued in the registry, so a gated key
    /// never leaves), and ends a wait that lasted too long: a contiguous projection parks the
    /// key with what it holds, any other goes on with a warning.
    fn tick(&mut self, ctx: &mut Context<Self>) {
        let expired = self
            .gate
            .as_ref()
            .filter(|g| !self.busy && Instant::now() >= g.deadline)
            .map(|g| g.version);
        if let Some(version) = expired {
            if self.parts.projection.contiguous_versions() && !self.waiting.is_empty() {
                self.park_held(ctx, version);
            } else {
                tracing::warn!(ordering_key = %self.key, consumer_group = %self.parts.spec.group,
                    version, held = self.waiting.len(),
                    "the awaited version did not return; applying the later ones");
                metrics::counter!(m::PROJECTION_GATE_TIMEOUTS_TOTAL).increment(1);
                self.open_gate();
                self.pump(ctx);
            }
        }
        let idle = !self.busy
            && self.waiting.is_empty()
            && self.last_active.elapsed() >= self.idle_after();
        if idle && self.registry.leave_if_idle(&self.key, &ctx.address()) {
            ctx.stop();
        }
    }

    /// Parks the key behind `expected` with every delivery it holds (kept in the database,
    /// acked), then lets it go on: what arrives later finds the key parked and joins them.
    fn park_held(&mut self, ctx: &mut Context<Self>, expected: i64) {
        let held: Vec<Delivery<P::Event>> = self.waiting.drain(..).collect();
        self.busy = true;
        let parts = self.parts.clone();
        let key = self.key.clone();
        ctx.spawn(
            park(parts, key, expected, held)
                .into_actor(self)
                .map(|settled, act, ctx| {
                    act.busy = false;
                    act.last_active = Instant::now();
                    act.queued.finished(settled);
                    act.open_gate();
                    act.pump(ctx);
                }),
        );
    }

    fn close_gate(&mut self, version: i64, awaiting: Awaiting) {
        match &mut self.gate {
            Some(gate) => gate.version = gate.version.min(version),
            None => {
                self.queued.expect_one();
                metrics::gauge!(m::PROJECTION_GATED_KEYS).increment(1.0);
                let settings = &self.parts.settings;
                let wait = match awaiting {
                    Awaiting::Nacked => settings.gate_timeout_secs,
                    Awaiting::Gap => settings.gap_wait_secs,
                };
                self.gate = Some(Gate {
                    version,
                    deadline: Instant::now() + Duration::from_secs(wait),
                });
            }
        }
    }

    fn open_gate(&mut self) {
        if self.gate.take().is_some() {
            self.queued.finished(1);
            metrics::gauge!(m::PROJECTION_GATED_KEYS).decrement(1.0);
        }
    }

    fn take_ready(&mut self) -> Vec<Delivery<P::Event>> {
        take_ready(
            &mut self.waiting,
            |d| d.meta.version,
            self.gate.as_ref().map(|g| g.version),
            self.parts.settings.max_events_per_transaction as usize,
        )
    }

    /// Starts the next transaction if none is running.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            return;
        }
        let group = self.take_ready();
        if group.is_empty() {
            return;
        }
        self.busy = true;
        let parts = self.parts.clone();
        ctx.spawn(
            project(parts, group)
                .into_actor(self)
                .map(|settled, act, ctx| {
                    act.busy = false;
                    act.last_active = Instant::now();
                    for delivery in settled.back.into_iter().rev() {
                        act.waiting.push_front(delivery);
                    }
                    act.queued.finished(settled.count);
                    if let Some(version) = settled.nacked {
                        act.close_gate(version, Awaiting::Nacked);
                    }
                    if let Some(version) = settled.gap {
                        act.close_gate(version, Awaiting::Gap);
                    }
                    let awaited = act.gate.as_ref().map(|g| g.version);
                    if awaited.is_some_and(|v| settled.done.contains(&v)) {
                        act.open_gate();
                    }
                    act.pump(ctx);
                }),
        );
    }
}

impl<P: Projection> Actor for Projector<P> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Flow control bounds the deliveries in the process; the mailbox can hold them all,
        // so the router's hand-over never finds it full.
        ctx.set_mailbox_capacity(self.mailbox);
        metrics::gauge!(m::LIVE_PROJECTORS).increment(1.0);
        let check_every = (self.idle_after() / 2).max(Duration::from_millis(100));
        ctx.run_interval(check_every, |act, ctx| act.tick(ctx));
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        metrics::gauge!(m::LIVE_PROJECTORS).decrement(1.0);
        if self.gate.is_some() {
            metrics::gauge!(m::PROJECTION_GATED_KEYS).decrement(1.0);
        }
        // Only reachable with nothing queued, or when the whole consumer stops; anything left
        // would be nacked by its drop.
        for delivery in self.waiting.drain(..) {
            self.parts.nack(delivery);
        }
    }
}

impl<P: Projection> Handler<Deliver<P::Event>> for Projector<P> {
    type Result = ();

    fn handle(&mut self, msg: Deliver<P::Event>, ctx: &mut Self::Context) {
        self.waiting.push_back(msg.0);
        self.pump(ctx);
    }
}

impl<P: Projection> Handler<Stop> for Projector<P> {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Parks `key` behind `expected` with `held` in one transaction, then acks them; returns how
/// many deliveries it settled. If the database fails, they are nacked instead (Pub/Sub brings
/// them back, and the gap holds them again).
async fn park<P: Projection>(
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
    let parked = async {
        let _slot = parts.transactions.acquire().await;
        let mut client = parts
            .pool
            .get()
            .await
            .map_err(DbError::pool(format!("park key {key:?} of group {group}")))?;
        let tx = client
            .transaction()
            .await
            .map_err(DbError::query(format!("park key {key:?} of group {group}")))?;
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
        tx.commit()
            .await
            .map_err(DbError::query(format!("park key {key:?} of group {group}")))?;
        Ok::<_, DbError>(())
    }
    .await;
    match parked {
        Ok(()) => {
            tracing::warn!(ordering_key = %key, consumer_group = %group, expected_version = expected,
                held = count, %reason, "key parked; `courier parked release` lets it go on");
            parts
                .stats
                .parked
                .fetch_add(count as u64, Ordering::Relaxed);
            metrics::counter!(m::PROJECTION_PARKED_EVENTS_TOTAL).increment(count as u64);
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

/// The next transaction's items: the oldest waiting ones, up to `max`; behind a closed gate
/// only versions up to the gate's, the later ones staying in order.
fn take_ready<T>(
    waiting: &mut VecDeque<T>,
    version: impl Fn(&T) -> i64,
    gate: Option<i64>,
    max: usize,
) -> Vec<T> {
    let Some(gate) = gate else {
        let take = waiting.len().min(max);
        return waiting.drain(..take).collect();
    };
    let mut ready = Vec::new();
    let mut held = VecDeque::with_capacity(waiting.len());
    for item in waiting.drain(..) {
        if ready.len() < max && version(&item) <= gate {
            ready.push(item);
        } else {
            held.push_back(item);
        }
    }
    *waiting = held;
    ready
}

/// Applies `group` (one key's deliveries, in order) and settles its deliveries, or gives some
/// back to the queue (see [`Settled::back`]).
async fn project<P: Projection>(
    parts: Arc<ConsumerParts<P>>,
    mut group: Vec<Delivery<P::Event>>,
) -> Settled<P::Event> {
    let count = group.len();
    match apply_with_retries(&parts, &group).await {
        Ok(committed) => {
            let (back, settle): (Vec<_>, Vec<_>) = group
                .into_iter()
                .enumerate()
                .partition(|(i, _)| committed.kept_back.contains(i));
            let settle: Vec<Delivery<P::Event>> = settle.into_iter().map(|(_, d)| d).collect();
            let done = settle.iter().map(|d| d.meta.version).collect();
            let count = settle.len();
            settle_committed(&parts, settle, committed.applied, committed.parked).await;
            Settled {
                count,
                done,
                gap: committed.expected,
                back: back.into_iter().map(|(_, d)| d).collect(),
                ..Settled::nothing()
            }
        }
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
                .dead_letter(&delivery.message, delivery.handler, &reason)
                .await
            {
                Settled::done(version)
            } else {
                Settled::nacked(version)
            }
        }
    }
}

/// [`apply`], retried after a backoff for as long as the database is unavailable, and up to
/// `consumer.transient_retries` times after a transient failure.
async fn apply_with_retries<P: Projection>(
    parts: &ConsumerParts<P>,
    group: &[Delivery<P::Event>],
) -> Result<Committed, TransactionFailure> {
    let mut outage_retries = 0u32;
    let mut transient_retries = 0u32;
    loop {
        let failure = match apply(parts, group).await {
            Ok(committed) => return Ok(committed),
            Err(failure) => failure,
        };
        let delay = if failure.is_unavailable() {
            let delay = OUTAGE_BACKOFF.delay(outage_retries);
            outage_retries = outage_retries.saturating_add(1);
            tracing::warn!(ordering_key = %group[0].meta.ordering_key,
                consumer_group = %parts.spec.group, retry_in_ms = delay.as_millis() as u64,
                error = %failure, "database unavailable; keeping the events and retrying");
            delay
        } else if failure.is_transient() && transient_retries < parts.settings.transient_retries {
            let delay = parts
                .settings
                .transient_backoff()
                .spread_delay(transient_retries);
            transient_retries += 1;
            tracing::info!(ordering_key = %group[0].meta.ordering_key,
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

/// One transaction: inbox, handler for the new events, offset, commit. Returns how many
/// events took effect.
async fn apply<P: Projection>(
    parts: &ConsumerParts<P>,
    group: &[Delivery<P::Event>],
) -> Result<Committed, TransactionFailure> {
    let group_name = &parts.spec.group;
    // Held (inside the `Result`) until the transaction ends; the semaphore is never closed.
    let _slot = parts.transactions.acquire().await;
    let mut client = parts.pool.get().await.map_err(DbError::pool(format!(
        "projection transaction of group {group_name}"
    )))?;
    match transact(parts, &mut client, group).await {
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

async fn transact<P: Projection>(
    parts: &ConsumerParts<P>,
    client: &mut PgConnection,
    group: &[Delivery<P::Event>],
) -> Result<Committed, TransactionFailure> {
    let group_name = &parts.spec.group;
    let tx = client.transaction().await.map_err(DbError::query(format!(
        "begin projection transaction of group {group_name}"
    )))?;
    let key = group[0].meta.routing_key();
    let mut committed = Committed::default();
    // Parked here, acked after the commit: not in the inbox, so they apply when released.
    let mut parked_now: Vec<usize> = Vec::new();
    // Which deliveries may take effect, in which order; the others are stale, or kept back.
    let candidates: Vec<usize> = if parts.projection.contiguous_versions() {
        let stored = parts.versions.stored(&tx, group_name, key).await?;
        let events: Vec<(i64, bool)> = group
            .iter()
            .map(|d| {
                let whole = parts.projection.is_whole_state(&d.meta, &d.event);
                (d.meta.version, whole)
            })
            .collect();
        let plan = plan_contiguous(&events, stored);
        if let (Some(first), Some(last)) = (plan.apply.first(), plan.apply.last()) {
            let (version, published) = (group[*last].meta.version, group[*first].meta.publish_time);
            parts
                .versions
                .advance(&tx, group_name, key, version, published)
                .await?;
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
                committed.parked = held.len();
                parked_now = plan.gap;
            } else {
                committed.kept_back = plan.gap;
                committed.expected = Some(plan.expected);
            }
        }
        plan.apply
    } else {
        (0..group.len()).collect()
    };
    let settled = || {
        group
            .iter()
            .enumerate()
            .filter(|(i, _)| !committed.kept_back.contains(i))
            .map(|(_, d)| d)
    };
    let seen: Vec<(uuid::Uuid, chrono::DateTime<chrono::Utc>)> = group
        .iter()
        .enumerate()
        .filter(|(i, _)| !committed.kept_back.contains(i) && !parked_now.contains(i))
        .map(|(_, d)| (d.meta.event_id, d.meta.publish_time))
        .collect();
    let mut fresh = parts.inbox.record(&tx, group_name, &seen).await?;
    let new_events: Vec<(&EventMeta, &P::Event)> = candidates
        .iter()
        .map(|&i| &group[i])
        // `remove`: an event twice in one group takes effect once.
        .filter(|d| fresh.remove(&d.meta.event_id))
        .map(|d| (&d.meta, &d.event))
        .collect();
    committed.applied = new_events.len();
    if let Some((first, _)) = new_events.first() {
        parts
            .projection
            .apply_group(&tx, &new_events)
            .await
            .map_err(|error| TransactionFailure::Handler {
                event_id: first.event_id,
                events: new_events.len(),
                error,
            })?;
    }
    if let Some(newest) = settled().max_by_key(|d| d.meta.publish_time) {
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
    Ok(committed)
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
        parts
            .stats
            .parked
            .fetch_add(parked as u64, Ordering::Relaxed);
        metrics::counter!(m::PROJECTION_PARKED_EVENTS_TOTAL).increment(parked as u64);
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
    use super::{plan_contiguous, take_ready, ContiguousPlan};
    use std::collections::VecDeque;

    fn take(waiting: &mut VecDeque<i64>, gate: Option<i64>, max: usize) -> Vec<i64> {
        take_ready(waiting, |v| *v, gate, max)
    }

    #[test]
    fn an_open_gate_takes_the_oldest_in_arrival_order() {
        let mut waiting = VecDeque::from([3, 4, 5]);
        assert_eq!(take(&mut waiting, None, 2), vec![3, 4]);
        assert_eq!(waiting, VecDeque::from([5]));
    }

    #[test]
    fn behind_a_nacked_version_later_ones_are_held_even_when_they_arrive_first() {
        // v2 was nacked; v3 and v4 came (again) before v2's redelivery, then v2 and a
        // duplicate of v1.
        let mut waiting = VecDeque::from([3, 4, 2, 1]);
        assert_eq!(take(&mut waiting, Some(2), 50), vec![2, 1]);
        assert_eq!(waiting, VecDeque::from([3, 4]), "held in arrival order");
        assert!(
            take(&mut waiting, Some(2), 50).is_empty(),
            "nothing past v2"
        );
        assert_eq!(take(&mut waiting, None, 50), vec![3, 4], "the gate opened");
    }

    #[test]
    fn a_closed_gate_still_caps_the_group() {
        let mut waiting = VecDeque::from([1, 2, 9, 2]);
        assert_eq!(take(&mut waiting, Some(2), 2), vec![1, 2]);
        assert_eq!(waiting, VecDeque::from([9, 2]));
    }

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
