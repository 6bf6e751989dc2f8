//! The outbox's backlog gauges (pending and dead rows, the oldest pending row's age), read
//! without walking what a pinned xmin horizon keeps.
//!
//! Counting every row the outbox's unpublished indexes name walks, while a long transaction
//! pins the horizon, the entry of every row published since the pin: 6.7 → 580 ms a call ten
//! minutes into a pin at 800 events/s, growing with it (P9). The gauge keeps a floor per shard
//! as the claimers do (`Floor`) and counts from there. A shard this relay claims takes its
//! claimer's floor, lowered to the claimer's lowest row in flight, whenever that is higher: a
//! claimer moves it on with every full scan, so the gauge needs no look of its own. Any other
//! shard, or one whose claimer's floor has not moved (an idle claimer polls seldom), gets the
//! claimers' floor query with no token (so rows in flight with any claimer count as pending).
//! In a 10-minute pin the relay's gauge made no look of its own (docs/benchmarks.md, run M5).
//!
//! A row that becomes claimable again below a floor without being in flight (a key's later rows
//! once its failed row is published, a dead row an operator retries) is counted among the
//! failed rows or behind them until then, and not again until it is published: the gauge may
//! read low by such rows for the moment they take to go out.

use crate::db::DbError;
use crate::relay::floor::Floor;
use crate::relay::store::{Backlog, OutboxStore, ShardBacklog};
use std::time::Duration;

/// A floor per shard; the relay's shard owner samples it once per tick.
#[derive(Debug)]
pub struct BacklogGauge {
    floors: Vec<Floor>,
}

impl BacklogGauge {
    pub fn new(shard_count: u32) -> Self {
        Self {
            floors: (0..shard_count).map(|_| Floor::start()).collect(),
        }
    }

    /// Reads the backlog and sets its gauges, with the floors this relay's claimers gave for
    /// their shards (`(shard, floor)`); a failure is logged and leaves them as they were.
    pub async fn sample(&mut self, store: &OutboxStore, from_claimers: &[(u32, i64)]) {
        match self.read_with(store, from_claimers).await {
            Ok(b) => {
                metrics::gauge!(crate::metrics::OUTBOX_PENDING_COUNT).set(b.pending as f64);
                metrics::gauge!(crate::metrics::OUTBOX_DEAD_COUNT).set(b.dead as f64);
                metrics::gauge!(crate::metrics::OUTBOX_MAX_DELIVERY_ATTEMPTS)
                    .set(f64::from(b.max_attempts));
                metrics::gauge!(crate::metrics::OUTBOX_OLDEST_PENDING_SECONDS)
                    .set(b.oldest_pending_secs);
            }
            Err(e) => tracing::warn!(error = %e, "could not sample outbox backlog"),
        }
    }

    /// Moves each shard's floor on (one floor query each), then reads the backlog from them.
    pub async fn read(&mut self, store: &OutboxStore) -> Result<Backlog, DbError> {
        self.read_with(store, &[]).await
    }

    /// Moves each shard's floor on, to its claimer's where `from_claimers` has one above it,
    /// else by a floor query; then reads the backlog from them.
    async fn read_with(
        &mut self,
        store: &OutboxStore,
        from_claimers: &[(u32, i64)],
    ) -> Result<Backlog, DbError> {
        self.move_on(store, from_claimers).await?;
        Ok(Backlog::of(&self.by_shard(store, Duration::ZERO).await?))
    }

    /// The backlog per shard and topic from the floors as they are; `claim_lease` tells live
    /// claims from expired ones.
    pub async fn by_shard(
        &self,
        store: &OutboxStore,
        claim_lease: Duration,
    ) -> Result<Vec<ShardBacklog>, DbError> {
        let floors: Vec<i64> = self.floors.iter().map(Floor::get).collect();
        store.backlog(&floors, claim_lease).await
    }

    /// The floors, shard by shard: the relay records them with its heartbeat.
    pub fn floors(&self) -> Vec<i64> {
        self.floors.iter().map(Floor::get).collect()
    }

    /// The backlog per shard and topic read once, as `courier outbox stats`, `courier status`
    /// and the console ask for it: counted from the floors the relays recorded with their
    /// heartbeats, so that under a pinned horizon a read walks no more than the relay's own
    /// gauge does. A floor settles only over several looks seconds apart, which a one-off read
    /// cannot wait for; from the shard's start (no relay has recorded one) the count is the
    /// same, walked the long way.
    pub async fn read_once(
        store: &OutboxStore,
        shard_count: u32,
        claim_lease: Duration,
    ) -> Result<Vec<ShardBacklog>, DbError> {
        let floors = store.recorded_floors(shard_count).await?;
        let gauge = Self {
            floors: floors.into_iter().map(Floor::settled_at).collect(),
        };
        gauge.by_shard(store, claim_lease).await
    }

    /// Each shard's floor up to its claimer's, or one floor look where none is higher. A
    /// claimer's floor holds for the gauge as a settled one does: below it every never-failed row
    /// is published, waits behind a parked row, or is the claimer's own in flight, and those it
    /// gave the floor below.
    async fn move_on(
        &mut self,
        store: &OutboxStore,
        from_claimers: &[(u32, i64)],
    ) -> Result<(), DbError> {
        for (shard, floor) in (0u32..).zip(self.floors.iter_mut()) {
            let claimers = from_claimers
                .iter()
                .find(|(owned, _)| *owned == shard)
                .map(|&(_, claimers)| claimers);
            match claimers {
                Some(claimers) if claimers > floor.get() => *floor = Floor::settled_at(claimers),
                _ => floor.found(&store.gauge_floor(shard, floor.get()).await?),
            }
        }
        Ok(())
    }
}
