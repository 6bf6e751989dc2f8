//! Projector: one actor per aggregate (routing key), created on demand, passivated when idle.
//!
//! It applies its aggregate's events strictly one transaction after another, in arrival
//! order: inbox insert (`ON CONFLICT DO NOTHING`) → the service's handler for the events seen
//! for the first time → offset save → commit → ack. Up to
//! `consumer.max_events_per_transaction` waiting events share one transaction.
//!
//! Failures: a transient one nacks the events of the transaction *and every event queued
//! behind them* (real Pub/Sub redelivers a nacked ordered message together with the later
//! ones of its key; applying those first would reorder the key), except that an event past
//! `max_delivery_attempts` is dead-lettered instead. A database outage (no connection, the
//! connection lost, the server restarting) is not the events' fault: the projector keeps
//! them (the client extends their leases) and retries the transaction after a backoff until
//! the database is back, so an outage spends no delivery attempts and dead-letters nothing
//! (the subscription's own dead-letter policy counts nacks too). A permanent one is narrowed
//! down by retrying the events one per transaction; the culprit is dead-lettered, the others
//! applied.

use crate::backoff::Backoff;
use crate::db::{DbError, PgConnection};
use crate::inbound::consumer::ConsumerParts;
use crate::inbound::delivery::{Delivery, EventMeta};
use crate::inbound::offsets::Position;
use crate::inbound::projection::{HandlerError, Projection};
use crate::inbound::router::LiveProjectors;
use crate::keyed_actors::Queued;
use crate::metrics as m;
use actix::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Apply this delivery after the ones before it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deliver<E: 'static>(pub Delivery<E>);

/// Leave now (evicted by the router to make room); only sent with nothing queued.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

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

/// What a finished transaction means for the rest of the key.
struct Settled {
    /// Deliveries settled (acked, nacked or dead-lettered).
    count: usize,
    /// A delivery was nacked: everything queued behind it must be nacked too.
    nack_rest: bool,
}

pub struct Projector<P: Projection> {
    key: String,
    parts: Arc<ConsumerParts<P>>,
    /// To leave the registry when passivating.
    registry: Arc<LiveProjectors<P>>,
    /// Deliveries handed to this projector and not yet settled (shared with the router).
    queued: Arc<Queued>,
    mailbox: usize,
    /// Received, waiting for the running transaction to finish.
    waiting: VecDeque<Delivery<P::Event>>,
    /// A transaction is running.
    busy: bool,
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
            last_active: Instant::now(),
        }
    }

    fn idle_after(&self) -> Duration {
        Duration::from_secs(self.parts.settings.projector_idle_secs)
    }

    fn passivate_if_idle(&mut self, ctx: &mut Context<Self>) {
        let idle = !self.busy
            && self.waiting.is_empty()
            && self.last_active.elapsed() >= self.idle_after();
        if idle && self.registry.leave_if_idle(&self.key, &ctx.address()) {
            ctx.stop();
        }
    }

    /// Starts the next transaction if none is running.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.busy || self.waiting.is_empty() {
            return;
        }
        let take = self
            .waiting
            .len()
            .min(self.parts.settings.max_events_per_transaction as usize);
        let group: Vec<Delivery<P::Event>> = self.waiting.drain(..take).collect();
        self.busy = true;
        let parts = self.parts.clone();
        ctx.spawn(
            project(parts, group)
                .into_actor(self)
                .map(|settled, act, ctx| {
                    act.busy = false;
                    act.last_active = Instant::now();
                    let mut count = settled.count;
                    if settled.nack_rest {
                        count += act.waiting.len();
                        for delivery in act.waiting.drain(..) {
                            act.parts.nack(delivery);
                        }
                    }
                    act.queued.finished(count);
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
        ctx.run_interval(check_every, |act, ctx| act.passivate_if_idle(ctx));
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        metrics::gauge!(m::LIVE_PROJECTORS).decrement(1.0);
        // Only reachable with nothing queued; anything left would be nacked by its drop.
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

/// Applies `group` (one key's deliveries, in order) and settles every delivery.
async fn project<P: Projection>(
    parts: Arc<ConsumerParts<P>>,
    group: Vec<Delivery<P::Event>>,
) -> Settled {
    let count = group.len();
    match apply_outliving_outages(&parts, &group).await {
        Ok(applied) => {
            settle_committed(&parts, group, applied).await;
            Settled {
                count,
                nack_rest: false,
            }
        }
        Err(failure) if failure.is_transient() => {
            let nack_rest = settle_transient(&parts, group, &failure).await;
            Settled { count, nack_rest }
        }
        Err(failure) if count > 1 => {
            tracing::debug!(ordering_key = %group[0].meta.ordering_key, error = %failure,
                "grouped transaction failed permanently; retrying its events one by one");
            let mut nack_rest = false;
            let mut rest = group.into_iter();
            for delivery in rest.by_ref() {
                if Box::pin(project(parts.clone(), vec![delivery]))
                    .await
                    .nack_rest
                {
                    nack_rest = true;
                    break;
                }
            }
            for delivery in rest {
                parts.nack(delivery);
            }
            Settled { count, nack_rest }
        }
        Err(failure) => {
            let mut group = group;
            let delivery = group.remove(0);
            note_failure(&parts, &delivery.meta, &failure);
            let reason = format!("permanent failure: {failure}");
            let dead = parts
                .dead_letter(&delivery.message, delivery.handler, &reason)
                .await;
            Settled {
                count,
                nack_rest: !dead,
            }
        }
    }
}

/// [`apply`], retried after a backoff for as long as the database is unavailable.
async fn apply_outliving_outages<P: Projection>(
    parts: &ConsumerParts<P>,
    group: &[Delivery<P::Event>],
) -> Result<usize, TransactionFailure> {
    let mut retries = 0u32;
    loop {
        match apply(parts, group).await {
            Err(failure) if failure.is_unavailable() => {
                let delay = OUTAGE_BACKOFF.delay(retries);
                tracing::warn!(ordering_key = %group[0].meta.ordering_key,
                    consumer_group = %parts.spec.group, retry_in_ms = delay.as_millis() as u64,
                    error = %failure, "database unavailable; keeping the events and retrying");
                parts.stats.failed.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(m::PROJECTION_PROCESS_ERROR_TOTAL).increment(1);
                tokio::time::sleep(delay).await;
                retries = retries.saturating_add(1);
            }
            result => return result,
        }
    }
}

/// One transaction: inbox, handler for the new events, offset, commit. Returns how many
/// events took effect.
async fn apply<P: Projection>(
    parts: &ConsumerParts<P>,
    group: &[Delivery<P::Event>],
) -> Result<usize, TransactionFailure> {
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

async fn transact<P: Projection>(
    parts: &ConsumerParts<P>,
    client: &mut PgConnection,
    group: &[Delivery<P::Event>],
) -> Result<usize, TransactionFailure> {
    let group_name = &parts.spec.group;
    let tx = client.transaction().await.map_err(DbError::query(format!(
        "begin projection transaction of group {group_name}"
    )))?;
    let seen: Vec<(uuid::Uuid, chrono::DateTime<chrono::Utc>)> = group
        .iter()
        .map(|d| (d.meta.event_id, d.meta.publish_time))
        .collect();
    let mut fresh = parts.inbox.record(&tx, group_name, &seen).await?;
    let new_events: Vec<(&EventMeta, &P::Event)> = group
        .iter()
        // `remove`: an event twice in one group takes effect once.
        .filter(|d| fresh.remove(&d.meta.event_id))
        .map(|d| (&d.meta, &d.event))
        .collect();
    let applied = new_events.len();
    if let Some((first, _)) = new_events.first() {
        parts
            .projection
            .apply_group(&tx, &new_events)
            .await
            .map_err(|error| TransactionFailure::Handler {
                event_id: first.event_id,
                events: applied,
                error,
            })?;
    }
    if let Some(newest) = group.iter().max_by_key(|d| d.meta.publish_time) {
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
    Ok(applied)
}

async fn settle_committed<P: Projection>(
    parts: &ConsumerParts<P>,
    group: Vec<Delivery<P::Event>>,
    applied: usize,
) {
    if let Some(hook) = &parts.before_ack {
        let metas: Vec<EventMeta> = group.iter().map(|d| d.meta.clone()).collect();
        hook(&metas).await;
    }
    let duplicates = group.len() - applied;
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

/// Nacks the group, dead-lettering those out of attempts; true if any was nacked.
async fn settle_transient<P: Projection>(
    parts: &ConsumerParts<P>,
    group: Vec<Delivery<P::Event>>,
    failure: &TransactionFailure,
) -> bool {
    let max_attempts = i32::try_from(parts.settings.max_delivery_attempts).unwrap_or(i32::MAX);
    let mut nacked = false;
    for delivery in group {
        note_failure(parts, &delivery.meta, failure);
        let attempt = delivery.meta.delivery_attempt.unwrap_or(1);
        if attempt >= max_attempts {
            let reason = format!("transient failure on delivery attempt {attempt}: {failure}");
            nacked |= !parts
                .dead_letter(&delivery.message, delivery.handler, &reason)
                .await;
        } else {
            parts.nack(delivery);
            nacked = true;
        }
    }
    nacked
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
