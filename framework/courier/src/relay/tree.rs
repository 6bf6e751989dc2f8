//! The relay: wires NotifyListener → ShardOwner → Claimers → Publishers, each supervised.
//!
//! [`Relay::spawn`] runs the actor tree on its own thread and actix System
//! ([`SystemThread`]); [`RelayHandle::kill`] stops it abruptly, like a crash.

use crate::config::CourierConfig;
use crate::db::DbError;
use crate::outbox::wake_channel;
use crate::pubsub::PubSub;
use crate::relay::claimer::BeforeMark;
use crate::relay::notify_listener::NotifyListener;
use crate::relay::publish_limit::{LimitSettings, LimitSnapshot, PublishLimit};
use crate::relay::publisher::{PublishFault, PublisherSettings, Publishers};
use crate::relay::shard_owner::{ClaimerParts, Deregister, OwnedShards, ReleaseAll, ShardOwner};
use crate::relay::store::{OutboxStore, PublishedRows};
use crate::supervision::{exit_process_on_escalation, EscalationHandler, Supervision};
use crate::system_thread::{SystemThread, ThreadStartError};
use actix::prelude::*;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// How a relay is started beyond its config: escalation and test hooks.
#[derive(Clone)]
pub struct RelayOptions {
    pub escalate: EscalationHandler,
    /// Fails chosen publishes (fault tests).
    pub publish_fault: Option<PublishFault>,
    /// Runs between publishing and marking (crash-window tests).
    pub before_mark: Option<BeforeMark>,
}

impl Default for RelayOptions {
    fn default() -> Self {
        Self {
            escalate: exit_process_on_escalation(),
            publish_fault: None,
            before_mark: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Start(#[from] ThreadStartError),
}

/// The running actor tree, for callers inside its actix System.
pub struct RelayActors {
    pub instance_id: Uuid,
    pub store: Arc<OutboxStore>,
    pub publishers: Arc<Publishers>,
    pub shard_owner: Addr<ShardOwner>,
    pub listener: Addr<NotifyListener>,
}

/// Starts the relay's actors on the current actix System; its Pub/Sub clients run on `clients`.
pub fn start(
    config: &CourierConfig,
    options: RelayOptions,
    clients: tokio::runtime::Handle,
) -> Result<RelayActors, RelayError> {
    let config = Arc::new(config.clone());
    let pool = crate::db::relay_pool(&config.database, "courier-relay")?;
    let store = Arc::new(OutboxStore::with_published_rows(
        pool,
        &config.database.schema,
        PublishedRows::from_config(&config.retention),
    ));
    record_shard_count(store.clone(), config.clone());
    let publishers = Arc::new(Publishers::new(
        PubSub::new(config.pubsub.clone()),
        PublisherSettings {
            idle_after: Duration::from_secs(config.relay.publisher_idle_secs),
            publish_timeout: Duration::from_secs(config.relay.publish_timeout_secs),
            max_in_flight_batches: config.relay.max_in_flight_batches as usize,
            fault: options.publish_fault.clone(),
            limit: PublishLimit::new(LimitSettings::from_config(&config.relay)),
        },
        clients,
    ));
    let instance_id = Uuid::new_v4();
    let parts = ClaimerParts {
        store: store.clone(),
        publishers: publishers.clone(),
        relay: Arc::new(config.relay.clone()),
        config: config.clone(),
        escalate: options.escalate.clone(),
        before_mark: options.before_mark.clone(),
    };
    let owner_supervision = Supervision::new(
        "shard_owner",
        instance_id.to_string(),
        config.supervision.shard_owner,
        options.escalate.clone(),
    );
    let shard_owner =
        Supervisor::start(move |_| ShardOwner::new(instance_id, parts, owner_supervision));
    let target = shard_owner.clone().recipient();
    let listener_config = config.clone();
    let escalate = options.escalate.clone();
    let listener = Supervisor::start(move |_| {
        NotifyListener::new(
            listener_config.database.clone(),
            wake_channel(&listener_config.database.schema),
            target,
            Supervision::new(
                "notify_listener",
                "listen",
                listener_config.supervision.notify_listener,
                escalate,
            ),
        )
    });
    tracing::info!(instance = %instance_id, shards = config.relay.shard_count, "relay started");
    Ok(RelayActors {
        instance_id,
        store,
        publishers,
        shard_owner,
        listener,
    })
}

/// Records the relay's `shard_count` where the SQL appends read it, in the background
/// ([`crate::outbox::record_shard_count`]); a failure is logged, not fatal: `<service>
/// migrate` records it too, and the relay's own work does not depend on it.
fn record_shard_count(store: Arc<OutboxStore>, config: Arc<CourierConfig>) {
    actix::spawn(async move {
        let recorded = match store.pool().get().await {
            Ok(conn) => crate::outbox::record_shard_count(&conn, &config).await,
            Err(e) => Err(DbError::Pool {
                context: "record the shard count".into(),
                error: e,
            }),
        };
        if let Err(e) = recorded {
            tracing::warn!(error = %e,
                "cannot record relay.shard_count for SQL appends (migrate records it too)");
        }
    });
}

/// A relay running on its own thread.
pub struct RelayHandle {
    pub instance_id: Uuid,
    thread: SystemThread,
    store: Arc<OutboxStore>,
    publishers: Arc<Publishers>,
    shard_owner: Addr<ShardOwner>,
    /// Held so the supervisor keeps restarting the listener: an actix supervisor gives up on
    /// an actor nobody holds an address of.
    _listener: Addr<NotifyListener>,
}

/// Entry point for running a relay beside other work.
pub struct Relay;

impl Relay {
    /// Starts a relay on a new thread with its own actix System.
    pub fn spawn(config: &CourierConfig, options: RelayOptions) -> Result<RelayHandle, RelayError> {
        let config = config.clone();
        let (thread, actors) =
            SystemThread::spawn_with_clients("courier-relay", move |clients| async move {
                start(&config, options, clients)
            })?;
        Ok(RelayHandle {
            instance_id: actors.instance_id,
            thread,
            store: actors.store,
            publishers: actors.publishers,
            shard_owner: actors.shard_owner,
            _listener: actors.listener,
        })
    }
}

impl RelayHandle {
    /// Shards this relay owns now.
    pub async fn owned_shards(&self) -> Vec<u32> {
        self.shard_owner.send(OwnedShards).await.unwrap_or_default()
    }

    /// Rows this relay marked published since it started.
    pub fn published(&self) -> u64 {
        self.store.published_total()
    }

    /// Rows this relay gave back untried since it started: claimed behind an earlier row of
    /// their key that had not gone out (it failed, or went out on no key publisher's watch).
    pub fn given_back(&self) -> u64 {
        self.store.given_back_total()
    }

    /// Per-key publishers alive (and lone rows out) now, and topic clients alive now (each
    /// holds the crate's per-key state of the keys it served): bounded by what is in flight,
    /// not by the keys ever published.
    pub fn live_publishers(&self) -> (usize, usize) {
        (self.publishers.live(), self.publishers.clients_alive())
    }

    /// The adaptive limit on publishes in flight, what is in flight, and recent latency.
    pub fn publish_limit(&self) -> LimitSnapshot {
        self.publishers.limit().snapshot()
    }

    /// Stops at once: nothing is drained or marked (what a crash does).
    pub fn kill(mut self) {
        self.thread.stop();
    }

    /// Stops claiming, waits (up to `grace`) for in-flight batches to be marked, then stops.
    pub async fn shutdown(self, grace: Duration) {
        let _ = self.shard_owner.send(ReleaseAll).await;
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline && !self.owned_shards().await.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.shard_owner.send(Deregister).await;
        self.kill();
    }
}
