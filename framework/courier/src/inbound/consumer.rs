//! A consumer: Receiver → ProjectorRouter → Projector per aggregate, for one subscription and
//! one consumer group, each actor supervised; plus the parts they share and how a delivery is
//! settled (ack, nack, or dead-letter then ack).
//!
//! [`Consumer::spawn`] runs the actors on their own thread and actix System
//! ([`SystemThread`]); [`ConsumerHandle::kill`] stops it abruptly, like a crash.

use crate::config::{ConsumerConfig, CourierConfig};
use crate::db::{DbError, PgPool};
use crate::inbound::dead_letter::DeadLetters;
use crate::inbound::dead_letter_log::DeadLetterLog;
use crate::inbound::delivery::{Delivery, EventMeta};
use crate::inbound::inbox::Inbox;
use crate::inbound::offsets::OffsetStore;
use crate::inbound::projection::Projection;
use crate::inbound::receiver::Receiver;
use crate::inbound::router::{LiveProjectors, ProjectorRouter};
use crate::metrics as m;
use crate::pubsub::{PubSub, PubSubError};
use crate::supervision::{exit_process_on_escalation, EscalationHandler, Supervision};
use crate::system_thread::{SystemThread, ThreadStartError};
use actix::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which subscription a consumer reads, as which group, and where dead letters go.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// Names the read model's inbox rows and offsets; one group per read model.
    pub group: String,
    /// Subscription id (not the full path).
    pub subscription: String,
    /// Topic id of the dead-letter topic (`<topic>.dlq`).
    pub dead_letter_topic: String,
}

/// A test hook run after a projection transaction committed and before its messages are
/// acked (to stop a consumer in that window).
pub type BeforeAck = Arc<dyn Fn(&[EventMeta]) -> Pin<Box<dyn Future<Output = ()>>> + Send + Sync>;

/// How a consumer is started beyond its config: escalation and test hooks.
#[derive(Clone)]
pub struct ConsumerOptions {
    pub escalate: EscalationHandler,
    pub before_ack: Option<BeforeAck>,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            escalate: exit_process_on_escalation(),
            before_ack: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    PubSub(#[from] PubSubError),
    #[error(transparent)]
    Start(#[from] ThreadStartError),
}

/// Counters of one consumer, for tests, the CLI and the load tests (metrics carry the same).
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Messages received from the streams (redeliveries included).
    pub received: AtomicU64,
    /// Events whose effect was committed (first time seen by the group).
    pub applied: AtomicU64,
    /// Events committed as already seen (inbox hit): acked without a second effect.
    pub duplicates: AtomicU64,
    pub acked: AtomicU64,
    pub nacked: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Events whose projection transaction failed (handler, statement or commit).
    pub failed: AtomicU64,
    /// Received and not yet acked or nacked.
    pub outstanding: AtomicU64,
    /// The most ever outstanding at once (flow control bounds it).
    pub peak_outstanding: AtomicU64,
}

/// A plain copy of [`ConsumerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub received: u64,
    pub applied: u64,
    pub duplicates: u64,
    pub acked: u64,
    pub nacked: u64,
    pub dead_lettered: u64,
    pub failed: u64,
    pub outstanding: u64,
    pub peak_outstanding: u64,
}

impl ConsumerStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            received: get(&self.received),
            applied: get(&self.applied),
            duplicates: get(&self.duplicates),
            acked: get(&self.acked),
            nacked: get(&self.nacked),
            dead_lettered: get(&self.dead_lettered),
            failed: get(&self.failed),
            outstanding: get(&self.outstanding),
            peak_outstanding: get(&self.peak_outstanding),
        }
    }

    pub(crate) fn on_received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
        let now = self.outstanding.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_outstanding.fetch_max(now, Ordering::Relaxed);
        metrics::gauge!(m::RECEIVER_OUTSTANDING_MESSAGES).increment(1.0);
    }

    fn on_acked(&self) {
        self.acked.fetch_add(1, Ordering::Relaxed);
        self.on_settled();
    }

    fn on_nacked(&self) {
        self.nacked.fetch_add(1, Ordering::Relaxed);
        self.on_settled();
    }

    fn on_settled(&self) {
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(m::RECEIVER_OUTSTANDING_MESSAGES).decrement(1.0);
    }
}

/// What every actor of one consumer shares.
pub struct ConsumerParts<P: Projection> {
    pub projection: P,
    pub spec: ConsumerSpec,
    pub settings: ConsumerConfig,
    pub pubsub: PubSub,
    pub pool: PgPool,
    /// One permit per pooled connection: projectors queue here for a transaction, without
    /// a deadline, rather than time out in the pool while thousands of keys are busy.
    pub transactions: tokio::sync::Semaphore,
    pub inbox: Inbox,
    pub offsets: OffsetStore,
    pub dead_letters: DeadLetters,
    pub dead_letter_log: DeadLetterLog,
    /// This process, as recorded in `consumer_offsets.updated_by`.
    pub instance: String,
    pub stats: Arc<ConsumerStats>,
    pub before_ack: Option<BeforeAck>,
    /// `<group>_offset_lag_ms`, the agreed per-group metric name.
    pub offset_lag_metric: String,
}

impl<P: Projection> ConsumerParts<P> {
    /// Acks a delivery whose effect (or non-effect) is committed.
    pub(crate) fn ack<E>(&self, delivery: Delivery<E>) {
        metrics::histogram!(m::PROJECTION_PROCESS_LATENCY)
            .record(delivery.received_at.elapsed().as_secs_f64());
        delivery.handler.ack();
        self.stats.on_acked();
    }

    fn set_dead_letter_gauge(&self, open: i64) {
        #[allow(clippy::cast_precision_loss)]
        metrics::gauge!(m::DLQ_MESSAGE_COUNT, "subscription" => self.spec.subscription.clone())
            .set(open as f64);
    }

    /// Gives a delivery back to Pub/Sub for redelivery.
    pub(crate) fn nack<E>(&self, delivery: Delivery<E>) {
        delivery.handler.nack();
        self.stats.on_nacked();
    }

    /// Publishes the message to the dead-letter topic with `reason`, then acks it; if the
    /// dead-letter publish fails, nacks it instead so nothing is lost. Returns whether it
    /// was dead-lettered.
    pub(crate) async fn dead_letter(
        &self,
        message: &google_cloud_pubsub::model::Message,
        handler: google_cloud_pubsub::subscriber::handler::Handler,
        reason: &str,
    ) -> bool {
        let attempt = handler.delivery_attempt();
        match self.dead_letters.publish(message, reason, attempt).await {
            Ok(_) => {
                tracing::warn!(
                    message_id = %message.message_id,
                    ordering_key = %message.ordering_key,
                    consumer_group = %self.spec.group,
                    delivery_attempt = attempt,
                    reason,
                    "message dead-lettered"
                );
                handler.ack();
                metrics::counter!(m::PROJECTION_DEAD_LETTERED_TOTAL).increment(1);
                // Bookkeeping only: the dead letter itself is safe in its topic already.
                match self
                    .dead_letter_log
                    .record(
                        &self.pool,
                        &self.spec.group,
                        &self.spec.subscription,
                        &message.message_id,
                        &message.ordering_key,
                        reason,
                    )
                    .await
                {
                    Ok(open) => self.set_dead_letter_gauge(open),
                    Err(e) => {
                        tracing::warn!(message_id = %message.message_id, consumer_group = %self.spec.group,
                        error = %e, "dead letter not logged; dlq_message_count undercounts")
                    }
                }
                self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                self.stats.on_acked();
                true
            }
            Err(error) => {
                tracing::error!(
                    message_id = %message.message_id,
                    consumer_group = %self.spec.group,
                    %error,
                    "dead-letter publish failed; message nacked for redelivery"
                );
                handler.nack();
                self.stats.on_nacked();
                false
            }
        }
    }
}

/// The running actor tree, for callers inside its actix System.
pub struct ConsumerActors<P: Projection> {
    pub receiver: Addr<Receiver<P>>,
    pub router: Addr<ProjectorRouter<P>>,
    pub live: Arc<LiveProjectors<P>>,
    pub stats: Arc<ConsumerStats>,
}

/// A group without a saved offset starts where `consumer.start_from` says (and logs which);
/// a group with one resumes from the subscription as it is.
async fn cold_start(
    config: &CourierConfig,
    spec: &ConsumerSpec,
    pubsub: &PubSub,
    pool: &PgPool,
) -> Result<(), ConsumerError> {
    use crate::config::StartFrom;
    let offsets = OffsetStore::new(&config.database.schema, config.consumer.offset_lanes);
    if offsets.load(pool, &spec.group).await?.is_some() {
        return Ok(());
    }
    // Validated at config load; an unparsable value cannot reach here.
    let start = config
        .consumer
        .start_from()
        .unwrap_or(StartFrom::Subscription);
    let seek_to = match start {
        StartFrom::Subscription => None,
        StartFrom::Latest => Some(chrono::Utc::now()),
        // Pub/Sub retains at most 31 days; seeking before that delivers all it kept.
        StartFrom::Earliest => Some(chrono::Utc::now() - chrono::Duration::days(31)),
        StartFrom::Time(time) => Some(time),
    };
    tracing::info!(
        consumer_group = %spec.group,
        subscription = %spec.subscription,
        start_from = %config.consumer.start_from,
        seek_to = ?seek_to,
        "no saved offset: cold start"
    );
    if let Some(time) = seek_to {
        let admin = pubsub.subscription_admin().await?;
        pubsub.seek(&admin, &spec.subscription, time).await?;
    }
    Ok(())
}

/// Starts a consumer's actors on the current actix System.
pub async fn start<P: Projection>(
    config: &CourierConfig,
    spec: ConsumerSpec,
    projection: P,
    options: ConsumerOptions,
) -> Result<ConsumerActors<P>, ConsumerError> {
    let pubsub = PubSub::new(config.pubsub.clone());
    let pool = crate::db::pool(
        &config.database,
        &format!("courier-consumer-{}", spec.group),
    )?;
    cold_start(config, &spec, &pubsub, &pool).await?;
    let dead_letters = DeadLetters::new(
        &pubsub,
        &spec.dead_letter_topic,
        &spec.group,
        &spec.subscription,
        Duration::from_secs(config.relay.publish_timeout_secs),
    )
    .await?;
    let stats = Arc::new(ConsumerStats::default());
    let parts = Arc::new(ConsumerParts {
        projection,
        settings: config.consumer.clone(),
        pubsub,
        pool,
        transactions: tokio::sync::Semaphore::new(config.database.pool_size as usize),
        inbox: Inbox::new(&config.database.schema),
        offsets: OffsetStore::new(&config.database.schema, config.consumer.offset_lanes),
        dead_letters,
        dead_letter_log: DeadLetterLog::new(&config.database.schema),
        instance: format!("{}-{}", spec.group, uuid::Uuid::new_v4().simple()),
        stats: stats.clone(),
        before_ack: options.before_ack.clone(),
        offset_lag_metric: m::offset_lag_metric(&spec.group),
        spec,
    });
    let live = Arc::new(LiveProjectors::new("projector"));
    let router_parts = parts.clone();
    let router_live = live.clone();
    let router_policy = config.supervision.projector_router;
    let escalate = options.escalate.clone();
    let router = Supervisor::start(move |_| {
        ProjectorRouter::new(
            router_parts,
            router_live,
            Supervision::new("projector_router", "router", router_policy, escalate),
        )
    });
    let receiver_router = router.clone();
    let receiver_parts = parts.clone();
    let receiver_policy = config.supervision.receiver;
    let escalate = options.escalate.clone();
    let receiver = Supervisor::start(move |_| {
        let instance = receiver_parts.spec.subscription.clone();
        Receiver::new(
            receiver_parts,
            receiver_router,
            Supervision::new("receiver", instance, receiver_policy, escalate),
        )
    });
    // The gauge starts from what earlier runs left open.
    match parts.dead_letter_log.open(&parts.pool).await {
        Ok(open) => {
            let mine = open
                .iter()
                .find(|o| o.consumer_group == parts.spec.group)
                .map_or(0, |o| o.open);
            parts.set_dead_letter_gauge(mine);
        }
        Err(e) => {
            tracing::warn!(consumer_group = %parts.spec.group, error = %e, "cannot count open dead letters")
        }
    }
    tracing::info!(
        consumer_group = %parts.spec.group,
        subscription = %parts.spec.subscription,
        streams = parts.settings.streams,
        "consumer started"
    );
    Ok(ConsumerActors {
        receiver,
        router,
        live,
        stats,
    })
}

/// Entry point for running a consumer beside other work.
pub struct Consumer;

/// A consumer running on its own thread.
pub struct ConsumerHandle {
    pub stats: Arc<ConsumerStats>,
    live: Arc<dyn Fn() -> usize + Send + Sync>,
    thread: SystemThread,
    /// Held so the supervisors keep restarting the actors.
    _actors: Box<dyn std::any::Any + Send>,
}

impl Consumer {
    /// Starts a consumer on a new thread with its own actix System.
    pub fn spawn<P: Projection>(
        config: &CourierConfig,
        spec: ConsumerSpec,
        projection: P,
        options: ConsumerOptions,
    ) -> Result<ConsumerHandle, ConsumerError> {
        let config = config.clone();
        let name = format!("courier-consumer-{}", spec.group);
        let (thread, actors) = SystemThread::spawn(&name, move || async move {
            start(&config, spec, projection, options).await
        })?;
        let live = actors.live.clone();
        Ok(ConsumerHandle {
            stats: actors.stats.clone(),
            live: Arc::new(move || live.len()),
            thread,
            _actors: Box::new((actors.receiver, actors.router)),
        })
    }
}

impl ConsumerHandle {
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Projectors alive now.
    pub fn live_projectors(&self) -> usize {
        (self.live)()
    }

    /// Stops at once: nothing is acked that was not acked already (what a crash does).
    pub fn kill(mut self) {
        self.thread.stop();
    }
}
