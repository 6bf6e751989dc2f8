//! A consumer: Receiver → ProjectorRouter → Projector per aggregate, for one subscription and
//! one consumer group, each actor supervised. What the actors share is in [`super::parts`].
//!
//! [`Consumer::spawn`] runs the actors on their own thread and actix System
//! ([`SystemThread`]); [`ConsumerHandle::kill`] stops it abruptly, like a crash.

use crate::config::CourierConfig;
use crate::db::{DbError, PgPool};
use crate::inbound::committer::Committer;
use crate::inbound::dead_letter::DeadLetters;
use crate::inbound::dead_letter_log::DeadLetterLog;
use crate::inbound::inbox::Inbox;
use crate::inbound::offsets::OffsetStore;
use crate::inbound::parked::KeyVersions;
use crate::inbound::parts::ConsumerParts;
pub use crate::inbound::parts::{BeforeAck, ConsumerSpec, ConsumerStats, StatsSnapshot};
use crate::inbound::projection::Projection;
use crate::inbound::projector::LiveProjectors;
use crate::inbound::receiver::Receiver;
use crate::inbound::router::ProjectorRouter;
use crate::metrics as m;
use crate::pubsub::{PubSub, PubSubError};
use crate::supervision::{exit_process_on_escalation, EscalationHandler, Supervision};
use crate::system_thread::{SystemThread, ThreadStartError};
use actix::prelude::*;
use std::sync::Arc;
use std::time::Duration;

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
        versions: KeyVersions::new(&config.database.schema),
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
    // Stateless between batches: a restart loses only what was pending, whose projectors see
    // their deliveries nacked.
    let committer = Supervisor::start({
        let parts = parts.clone();
        move |_| Committer::new(parts)
    });
    let router = Supervisor::start(move |_| {
        ProjectorRouter::new(
            router_parts,
            committer.clone(),
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
    parts.refresh_parked_gauge().await;
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
