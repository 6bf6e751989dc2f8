//! ShardOwner: owns outbox shards through session advisory locks and runs a Claimer per shard.
//!
//! The locks live on one dedicated connection: if it drops, PostgreSQL releases them all at
//! once and this actor stops its claimers and restarts (reconnects) under its supervisor.
//! Every tick it heartbeats into `relay_instances`, computes its fair share
//! `ceil(shard_count / live instances)`, takes free shards up to that share and hands back
//! extras (after their claimers drained), so several processes split the shards and the
//! survivors take over a dead process's shards.

use crate::config::{CourierConfig, RelayConfig};
use crate::db::DbError;
use crate::horizon::{HeldFlag, HorizonQuery};
use crate::outbox::stable_hash;
use crate::relay::backlog::BacklogGauge;
use crate::relay::claimer::{BacklogFloor, BeforeMark, Claimer, OutboxNotified, StopClaiming};
use crate::relay::publisher::Publishers;
use crate::relay::store::OutboxStore;
use crate::supervision::{EscalationHandler, Supervision};
use actix::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Client;
use uuid::Uuid;

/// Wakes (hints) and control messages only; wakes are dropped when full.
const SHARD_OWNER_MAILBOX: usize = 64;

/// Wake a shard's claimer (`None`: all owned shards, e.g. after the listener reconnected).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct WakeShard {
    pub shard: Option<u32>,
    /// Rows below where claims look may be claimable (an operator retried or skipped a dead
    /// row, or wakes may have been lost): the claimer scans from the shard's start once.
    pub rescan: bool,
}

/// Which shards this process owns right now (for tests and `status`).
#[derive(Message)]
#[rtype(result = "Vec<u32>")]
pub struct OwnedShards;

/// Release every shard after draining, and stay idle: graceful shutdown.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReleaseAll;

/// Forget this instance in `relay_instances` (after [`ReleaseAll`] drained every shard), so
/// the other relays count one instance less and take its shards on their next tick instead
/// of after the heartbeat lease.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deregister;

/// Shared parts every claimer gets.
#[derive(Clone)]
pub struct ClaimerParts {
    pub store: Arc<OutboxStore>,
    pub publishers: Arc<Publishers>,
    pub relay: Arc<RelayConfig>,
    pub config: Arc<CourierConfig>,
    pub escalate: EscalationHandler,
    pub before_mark: Option<BeforeMark>,
}

pub struct ShardOwner {
    instance_id: Uuid,
    parts: ClaimerParts,
    supervision: Supervision,
    /// Namespace of this schema's shard locks (first key of the two-key advisory lock).
    lock_namespace: i32,
    /// What holds the xmin horizon back, sampled with the backlog gauges.
    horizon: Arc<HorizonQuery>,
    /// Whether that sample found the horizon held back; the claimers read it.
    horizon_held: HeldFlag,
    /// The outbox's backlog gauges, sampled once per tick (ticks do not overlap: the lock is
    /// never waited on).
    backlog: Arc<tokio::sync::Mutex<BacklogGauge>>,
    /// The dedicated connection holding the advisory locks.
    lock_client: Option<Arc<Client>>,
    owned: BTreeMap<u32, Addr<Claimer>>,
    /// Shards whose claimers are draining before the lock is released.
    releasing: BTreeSet<u32>,
    /// A rebalance is running; ticks do not overlap.
    rebalancing: bool,
    /// Graceful shutdown asked: take nothing more.
    shutting_down: bool,
    escalated: bool,
}

impl ShardOwner {
    pub fn new(instance_id: Uuid, parts: ClaimerParts, supervision: Supervision) -> Self {
        let schema = &parts.config.database.schema;
        let lock_namespace = i32::from_ne_bytes(
            ((stable_hash(&format!("courier-shard:{schema}")) >> 32) as u32).to_ne_bytes(),
        );
        let horizon = Arc::new(HorizonQuery::new(schema));
        let backlog = Arc::new(tokio::sync::Mutex::new(BacklogGauge::new(
            parts.relay.shard_count,
        )));
        Self {
            instance_id,
            parts,
            supervision,
            lock_namespace,
            horizon,
            horizon_held: HeldFlag::default(),
            backlog,
            lock_client: None,
            owned: BTreeMap::new(),
            releasing: BTreeSet::new(),
            rebalancing: false,
            shutting_down: false,
            escalated: false,
        }
    }

    /// Ticks often enough that a takeover happens well within one lease.
    fn tick_every(&self) -> Duration {
        (self.parts.relay.claim_lease() / 3).max(Duration::from_millis(500))
    }

    fn connect(&mut self, ctx: &mut Context<Self>) {
        let db = self.parts.config.database.clone();
        ctx.wait(
            async move { crate::db::dedicated(&db, "courier-shard-locks").await }
                .into_actor(self)
                .map(|result, act, ctx| match result {
                    Ok((client, connection)) => {
                        act.lock_client = Some(Arc::new(client));
                        // When the connection ends, every lock is gone: stop and restart.
                        ctx.spawn(connection.into_actor(act).map(|result, act, ctx| {
                            tracing::warn!(instance = %act.instance_id, error = ?result.err(),
                                "shard lock connection lost, releasing all shards");
                            ctx.stop();
                        }));
                        act.rebalance(ctx);
                        ctx.run_interval(act.tick_every(), |act, ctx| act.rebalance(ctx));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot open shard lock connection");
                        ctx.stop();
                    }
                }),
        );
    }

    fn rebalance(&mut self, ctx: &mut Context<Self>) {
        if self.rebalancing || self.escalated {
            return;
        }
        let Some(client) = self.lock_client.clone() else {
            return;
        };
        self.rebalancing = true;
        let store = self.parts.store.clone();
        let instance = self.instance_id;
        let owned: Vec<u32> = self.owned.keys().copied().collect();
        let busy: BTreeSet<u32> = self
            .owned
            .keys()
            .chain(self.releasing.iter())
            .copied()
            .collect();
        let shard_count = self.parts.relay.shard_count;
        let lease = self.parts.relay.claim_lease();
        let namespace = self.lock_namespace;
        let shutting_down = self.shutting_down;
        let limit = self.parts.publishers.limit().snapshot();
        limit.publish_gauges();
        let order = shard_order(instance, shard_count);
        let horizon = self.horizon.clone();
        let horizon_held = self.horizon_held.clone();
        let backlog = self.backlog.clone();
        let claimers: Vec<(u32, Addr<Claimer>)> = self
            .owned
            .iter()
            .map(|(shard, addr)| (*shard, addr.clone()))
            .collect();
        ctx.spawn(
            async move {
                // Shutting down: no heartbeat, so the row that `Deregister` deletes stays gone.
                let live = if shutting_down {
                    1
                } else {
                    let floors = backlog.lock().await.floors();
                    store.heartbeat(instance, &owned, lease, limit, &floors).await?
                };
                let from_claimers = claimers_floors(&claimers).await;
                backlog.lock().await.sample(&store, &from_claimers).await;
                crate::horizon::sample(&horizon, store.pool(), &horizon_held).await;
                let share = if shutting_down { 0 } else { shard_count.div_ceil(live) as usize };
                let mut acquired = Vec::new();
                if owned.len() < share {
                    for shard in order.into_iter().filter(|s| !busy.contains(s)) {
                        if owned.len() + acquired.len() >= share {
                            break;
                        }
                        let row = client
                            .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&namespace, &(shard as i32)])
                            .await
                            .map_err(DbError::query(format!("try to lock shard {shard}")))?;
                        if row.get::<_, bool>(0) {
                            acquired.push(shard);
                        }
                    }
                }
                Ok::<_, DbError>((share, acquired))
            }
            .into_actor(self)
            .map(|result, act, ctx| {
                act.rebalancing = false;
                match result {
                    Ok((share, acquired)) => {
                        for shard in acquired {
                            act.start_claimer(shard);
                        }
                        let extra = act.owned.len().saturating_sub(share);
                        let to_release: Vec<u32> = act.owned.keys().rev().take(extra).copied().collect();
                        for shard in to_release {
                            act.release(shard, ctx);
                        }
                        metrics::gauge!(crate::metrics::OUTBOX_OWNED_SHARDS).set(act.owned.len() as f64);
                    }
                    Err(e) if e.is_transient() => {
                        tracing::warn!(error = %e, "shard rebalance failed, will retry next tick");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "shard rebalance failed, restarting shard owner");
                        ctx.stop();
                    }
                }
            }),
        );
    }

    fn start_claimer(&mut self, shard: u32) {
        tracing::info!(instance = %self.instance_id, shard, "shard acquired");
        let parts = self.parts.clone();
        let horizon_held = self.horizon_held.clone();
        let addr = Supervisor::start(move |_| {
            Claimer::new(
                shard,
                parts.store.clone(),
                parts.publishers.clone(),
                parts.relay.clone(),
                Supervision::new(
                    "claimer",
                    format!("shard {shard}"),
                    parts.config.supervision.claimer,
                    parts.escalate.clone(),
                ),
                parts.before_mark.clone(),
                horizon_held.clone(),
            )
        });
        self.owned.insert(shard, addr);
    }

    /// Drains the shard's claimer, then unlocks the shard.
    fn release(&mut self, shard: u32, ctx: &mut Context<Self>) {
        let Some(addr) = self.owned.remove(&shard) else {
            return;
        };
        self.releasing.insert(shard);
        let (drained_tx, drained_rx) = tokio::sync::oneshot::channel();
        let client = self.lock_client.clone();
        let namespace = self.lock_namespace;
        ctx.spawn(
            async move {
                // The claimer stops itself once drained. No address may outlive that moment,
                // or its supervisor would restart it: send without waiting, then drop.
                addr.do_send(StopClaiming {
                    drained: drained_tx,
                });
                drop(addr);
                let _ = drained_rx.await;
                if let Some(client) = client {
                    client
                        .execute(
                            "SELECT pg_advisory_unlock($1, $2)",
                            &[&namespace, &(shard as i32)],
                        )
                        .await
                        .map_err(DbError::query(format!("unlock shard {shard}")))?;
                }
                Ok::<_, DbError>(())
            }
            .into_actor(self)
            .map(move |result, act, ctx| {
                act.releasing.remove(&shard);
                match result {
                    Ok(()) => tracing::info!(instance = %act.instance_id, shard, "shard released"),
                    Err(e) => {
                        // The lock may still be held: restart, which drops the connection.
                        tracing::warn!(shard, error = %e, "could not unlock shard, reconnecting");
                        ctx.stop();
                    }
                }
            }),
        );
    }

    fn stop_all_claimers(&mut self) {
        for (_, addr) in std::mem::take(&mut self.owned) {
            let (drained, _) = tokio::sync::oneshot::channel();
            addr.do_send(StopClaiming { drained });
        }
        self.releasing.clear();
    }
}

/// How long the tick waits for a claimer's backlog floor; past it the gauge looks itself.
const CLAIMER_FLOOR_WAIT: Duration = Duration::from_secs(1);

/// The backlog floor each claimer gives for its shard, asked of all at once; one that does not
/// answer in time (restarting, stopping) is left out, and the gauge looks at its shard itself.
async fn claimers_floors(claimers: &[(u32, Addr<Claimer>)]) -> Vec<(u32, i64)> {
    let asked = claimers.iter().map(|(shard, claimer)| async move {
        match tokio::time::timeout(CLAIMER_FLOOR_WAIT, claimer.send(BacklogFloor)).await {
            Ok(Ok(floor)) => Some((*shard, floor)),
            _ => None,
        }
    });
    futures::future::join_all(asked)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Visits shards starting at an instance-specific offset so instances do not all race for
/// shard 0 first.
fn shard_order(instance: Uuid, shard_count: u32) -> Vec<u32> {
    let start = (stable_hash(&instance.to_string()) % u64::from(shard_count.max(1))) as u32;
    (0..shard_count)
        .map(|i| (start + i) % shard_count)
        .collect()
}

impl Actor for ShardOwner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(SHARD_OWNER_MAILBOX);
        if self.escalated {
            return;
        }
        ctx.run_later(self.supervision.start_delay, |act, ctx| act.connect(ctx));
    }

    fn stopping(&mut self, _ctx: &mut Self::Context) -> Running {
        // The locks die with the connection; claimers must not go on as if they owned shards.
        self.stop_all_claimers();
        self.lock_client = None;
        self.rebalancing = false;
        Running::Stop
    }
}

impl Supervised for ShardOwner {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        if !self.supervision.restarting() {
            self.escalated = true;
        }
    }
}

impl Handler<WakeShard> for ShardOwner {
    type Result = ();

    fn handle(&mut self, msg: WakeShard, _ctx: &mut Self::Context) {
        let wake = |claimer: &Addr<Claimer>| {
            let notified = OutboxNotified { rescan: msg.rescan };
            if msg.rescan {
                // Rare (operator actions, reconnects) and not implied by a wake already queued.
                claimer.do_send(notified);
            } else {
                // A full mailbox already holds a wake: dropping this one loses nothing.
                let _ = claimer.try_send(notified);
            }
        };
        match msg.shard {
            Some(shard) => {
                if let Some(claimer) = self.owned.get(&shard) {
                    wake(claimer);
                }
            }
            None => self.owned.values().for_each(wake),
        }
    }
}

impl Handler<OwnedShards> for ShardOwner {
    type Result = Vec<u32>;

    fn handle(&mut self, _: OwnedShards, _ctx: &mut Self::Context) -> Vec<u32> {
        self.owned.keys().copied().collect()
    }
}

impl Handler<ReleaseAll> for ShardOwner {
    type Result = ();

    fn handle(&mut self, _: ReleaseAll, ctx: &mut Self::Context) {
        self.shutting_down = true;
        let shards: Vec<u32> = self.owned.keys().copied().collect();
        for shard in shards {
            self.release(shard, ctx);
        }
    }
}

impl Handler<Deregister> for ShardOwner {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Deregister, _ctx: &mut Self::Context) -> Self::Result {
        let store = self.parts.store.clone();
        let instance = self.instance_id;
        Box::pin(async move {
            if let Err(e) = store.deregister(instance).await {
                // The row then simply expires with its heartbeat lease.
                tracing::warn!(%instance, error = %e, "cannot deregister relay instance");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_order_covers_every_shard_once() {
        let mut order = shard_order(Uuid::new_v4(), 8);
        order.sort_unstable();
        assert_eq!(order, (0..8).collect::<Vec<_>>());
    }
}
