//! Claimer: drains one owned outbox shard.
//!
//! Loop: take permits from the relay's publish limit → claim that many rows at most → hand each
//! key's rows to its publisher → mark outcomes in batched statements (one mark at a time, of
//! what settled, gathered up to `MARK_GATHER_ROWS` or `MARK_LINGER`; in `marking`). A
//! batch found means claim again at once while fewer than `max_in_flight_batches ×
//! claim_batch_size` rows are unmarked — rows count, not batches, so one slow key does not hold
//! a whole batch's capacity (a partial batch waits `claim_linger_millis` first, so a trickle
//! gathers into batches); none found means idle, rows in flight or not: flag the shard idle so
//! writers NOTIFY it, look once more, then (nothing in flight) poll with exponential backoff
//! and full jitter until a wake or a hit. No
//! permits (the broker is slow and the limit full) means look again shortly, without a query.
//!
//! Each (re)start takes a fresh lock token: rows the previous incarnation held become
//! claimable when their lease expires, and its late marks no longer match.
//!
//! Claims look for rows only where one may have appeared since the last look (`ScanFrom`),
//! so a claim does not wade through this claimer's own rows in flight; a full scan from the
//! shard's floor (below which nothing is left to claim) picks up whatever a claim may have
//! passed over.

use crate::config::RelayConfig;
use crate::db::DbError;
use crate::fast_hash::FastHash;
use crate::horizon::HeldFlag;
use crate::relay::keys_out::KeysOut;
use crate::relay::marking::{Marking, RowMeta};
use crate::relay::publish_limit::Permits;
use crate::relay::publisher::{PublishOutcome, PublisherKey, Publishers};
use crate::relay::scan_from::{Scan, ScanFrom};
use crate::relay::store::{ClaimedRow, OutboxStore};
use crate::supervision::Supervision;
use actix::prelude::*;
use futures::channel::mpsc;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use uuid::Uuid;

/// Wakes are hints: one pending is as good as many, so a full mailbox just drops the extra.
const CLAIMER_MAILBOX: usize = 16;

/// Outcomes gathered before a mark runs, unless [`MARK_LINGER`] passes first: with a key
/// per row, outcomes arrive one at a time, and a mark statement costs PostgreSQL ~100 µs
/// besides its rows (a SQL loop of the relay's statements: 6.2 µs a row marking 200 at a
/// time, 7.8 marking 50, 12.9 marking 10).
const MARK_GATHER_ROWS: usize = 200;

/// The longest an outcome waits for others before it is marked. Marking late holds back
/// nothing but the row's bookkeeping: its permit went back when it settled.
const MARK_LINGER: Duration = Duration::from_millis(20);

/// How soon a claimer that found the publish limit full looks again.
const LIMIT_RECHECK: Duration = Duration::from_millis(50);

/// New rows may be waiting: claim now.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct OutboxNotified {
    /// Rows may also be waiting below where claims look: scan from the shard's start.
    pub rescan: bool,
}

/// Stop claiming, let in-flight batches finish and be marked, then stop; `drained` fires then.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopClaiming {
    pub drained: oneshot::Sender<()>,
}

/// The lowest seq the backlog gauge may count this claimer's shard from (see
/// [`Claimer::backlog_floor`]).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "i64")]
pub struct BacklogFloor;

/// A test hook run after publishing and before marking (to stop a relay in that window).
pub type BeforeMark = Arc<dyn Fn(u32) -> Pin<Box<dyn Future<Output = ()>>> + Send + Sync>;

pub struct Claimer {
    shard: u32,
    store: Arc<OutboxStore>,
    publishers: Arc<Publishers>,
    config: Arc<RelayConfig>,
    supervision: Supervision,
    before_mark: Option<BeforeMark>,
    /// Whether the xmin horizon is held back, as the shard owner last sampled it.
    horizon_held: HeldFlag,
    /// This incarnation's claim token.
    token: Uuid,
    /// A claim query is running.
    claiming: bool,
    /// Rows claimed and not yet marked.
    in_flight: usize,
    /// Where the next claim looks for new rows.
    scan_from: ScanFrom,
    /// Each unmarked row's key, version, and the attempts it had when claimed.
    rows: HashMap<i64, RowMeta, FastHash>,
    /// Rows dispatched and not settled, per key (the publish limit reads the relay's total).
    keys_out: KeysOut,
    /// Outcomes waiting for the next mark.
    settled: Vec<PublishOutcome>,
    /// Per key, a version acknowledged and not yet marked, with nothing before it left
    /// unpublished: a row claimed right behind it may go at once (see
    /// [`Claimer::acked_right_before`]).
    acked: HashMap<PublisherKey, i64, FastHash>,
    /// Entries of `acked` whose rows were marked while a claim ran: that claim may still name
    /// them as unpublished, so they go once its rows are dispatched.
    forget_after_claim: Vec<(PublisherKey, i64)>,
    /// Where each key's outcomes arrive (see [`Claimer::dispatch`]); replaced on restart, so
    /// outcomes of an earlier incarnation's rows are dropped with its stream.
    outcomes: mpsc::UnboundedSender<Vec<PublishOutcome>>,
    /// A mark is running.
    marking: bool,
    /// The lowest seq of the rows that mark is writing (no longer in `rows`, still unpublished
    /// until it commits).
    marking_from: Option<i64>,
    /// A mark waiting for more outcomes (see [`MARK_GATHER_ROWS`]).
    mark_linger: Option<SpawnHandle>,
    /// What this claimer last wrote as its shard's idle flag.
    idle_flagged: bool,
    /// The `flag_seq` of that flag, which the next one supersedes (`None` before the first).
    idle_flag_seq: Option<i64>,
    /// Empty polls in a row (the backoff exponent).
    empty_polls: u32,
    poll_timer: Option<SpawnHandle>,
    /// Set by `StopClaiming`: who to tell once drained.
    draining: Option<oneshot::Sender<()>>,
    /// Escalated: do nothing more; the process is going away.
    escalated: bool,
}

impl Claimer {
    pub fn new(
        shard: u32,
        store: Arc<OutboxStore>,
        publishers: Arc<Publishers>,
        config: Arc<RelayConfig>,
        supervision: Supervision,
        before_mark: Option<BeforeMark>,
        horizon_held: HeldFlag,
    ) -> Self {
        let keys_out = KeysOut::new(publishers.limit().keys_out());
        Self {
            shard,
            store,
            publishers,
            config,
            supervision,
            before_mark,
            horizon_held,
            token: Uuid::new_v4(),
            claiming: false,
            in_flight: 0,
            scan_from: ScanFrom::start(),
            rows: HashMap::default(),
            keys_out,
            settled: Vec::new(),
            acked: HashMap::default(),
            forget_after_claim: Vec::new(),
            // Replaced by `started` before the first claim.
            outcomes: mpsc::unbounded().0,
            marking: false,
            marking_from: None,
            mark_linger: None,
            idle_flagged: false,
            idle_flag_seq: None,
            empty_polls: 0,
            poll_timer: None,
            draining: None,
            escalated: false,
        }
    }

    fn claim(&mut self, ctx: &mut Context<Self>) {
        if self.escalated
            || self.draining.is_some()
            || self.claiming
            || self.in_flight + self.config.claim_batch_size as usize > self.max_in_flight_rows()
        {
            return;
        }
        let batch = self.config.claim_batch_size as usize;
        let limit = self.publishers.limit();
        let mut permits = limit.try_acquire(batch);
        if permits.count() < limit.enough_for_a_claim(batch) {
            drop(permits);
            self.claim_after(LIMIT_RECHECK, ctx);
            return;
        }
        if let Some(timer) = self.poll_timer.take() {
            ctx.cancel_future(timer);
        }
        self.claiming = true;
        let claim_started = std::time::Instant::now();
        let store = self.store.clone();
        let (shard, token) = (self.shard, self.token);
        let lease = self.config.claim_lease();
        let asked = permits.count();
        let limit = u32::try_from(asked).unwrap_or(u32::MAX);
        self.scan_from.horizon_held(self.horizon_held.get());
        let scan = self.scan_from.next();
        ctx.spawn(
            async move {
                let (from_seq, floor) = match scan {
                    Scan::From(seq) => (seq, None),
                    Scan::Full {
                        look_from,
                        regular,
                        rewinds,
                    } => {
                        let look = store.claim_floor(shard, token, look_from).await?;
                        tracing::debug!(shard, look_from, regular, rewinds, ?look, "full scan");
                        let start = look.lowest.unwrap_or(look.next_seq).min(regular);
                        (start, Some((rewinds, look)))
                    }
                };
                let claimed = store
                    .claim_from(shard, token, lease, limit, from_seq)
                    .await?;
                Ok((from_seq, floor, claimed))
            }
            .into_actor(self)
            .map(move |result: Result<_, DbError>, act, ctx| {
                    act.claiming = false;
                    let from_seq = result.as_ref().map_or(-1, |(from_seq, _, _)| *from_seq);
                    let result = result.map(|(from_seq, floor, mut claimed)| {
                        if let Some((rewinds, look)) = floor {
                            act.scan_from.floor_found(rewinds, look);
                            claimed = claimed.after(&look);
                        }
                        act.scan_from.claimed(from_seq, asked, &claimed);
                        claimed
                    });
                    tracing::debug!(
                        shard = act.shard,
                        in_flight = act.in_flight,
                        rows = result.as_ref().map_or(0, |claimed| claimed.rows.len()),
                        from_seq,
                        claim_ms = claim_started.elapsed().as_millis() as u64,
                        "claimed"
                    );
                    if result.is_err() {
                        act.scan_from.rewind();
                    }
                    match result.map(|claimed| claimed.rows) {
                        Ok(rows) if !rows.is_empty() => {
                            metrics::histogram!(crate::metrics::OUTBOX_CLAIM_BATCH_SIZE)
                                .record(rows.len() as f64);
                            act.empty_polls = 0;
                            if act.idle_flagged {
                                act.set_idle(false, ctx);
                            }
                            let full = rows.len() >= act.config.claim_batch_size as usize;
                            permits.keep(rows.len());
                            act.dispatch(rows, permits);
                            if full || act.config.claim_linger_millis == 0 {
                                act.claim(ctx);
                            } else {
                                act.claim_after(act.config.claim_linger(), ctx);
                            }
                        }
                        Ok(_) => act.on_empty(ctx),
                        Err(e) if e.is_transient() => {
                            tracing::warn!(shard = act.shard, error = %e, "claim failed, will poll again");
                            act.schedule_poll(ctx);
                        }
                        Err(e) => {
                            tracing::error!(shard = act.shard, error = %e, "claim failed permanently, restarting claimer");
                            ctx.stop();
                        }
                    }
                    for (key, version) in std::mem::take(&mut act.forget_after_claim) {
                        act.forget_acked(key, version);
                    }
                }),
        );
    }

    /// Claims after `delay` (unless a wake or a finished batch claims sooner).
    fn claim_after(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        if let Some(timer) = self.poll_timer.take() {
            ctx.cancel_future(timer);
        }
        self.poll_timer = Some(ctx.run_later(delay, |act, ctx| {
            act.poll_timer = None;
            act.claim(ctx);
        }));
    }

    fn on_empty(&mut self, ctx: &mut Context<Self>) {
        if !self.idle_flagged {
            // Flag idle first, then look once more: a writer that committed before the flag
            // is found by that look; one that commits after it sees the flag and NOTIFYs.
            // Also while rows are in flight: a write committed meanwhile is claimed at once,
            // not when they have been acknowledged and marked (a publish's round trip and the
            // mark's gathering later: the end-to-end tail at low rates, issue 54).
            self.set_idle(true, ctx);
            self.empty_polls = 0;
            ctx.run_later(Duration::ZERO, |act, ctx| act.claim(ctx));
            return;
        }
        if self.in_flight > 0 {
            // The batch completing will claim again.
            return;
        }
        self.schedule_poll(ctx);
    }

    /// Writes the idle flag. `wait` keeps flag writes in order (true after false can never be
    /// overtaken by the false).
    fn set_idle(&mut self, idle: bool, ctx: &mut Context<Self>) {
        self.idle_flagged = idle;
        let store = self.store.clone();
        let (shard, previous) = (self.shard, self.idle_flag_seq);
        ctx.wait(
            async move { store.set_shard_idle(shard, idle, previous).await }
                .into_actor(self)
                .map(move |result, act, _| match result {
                    Ok(flag_seq) => act.idle_flag_seq = Some(flag_seq),
                    Err(e) => {
                        tracing::warn!(shard = act.shard, idle, error = %e, "could not record shard idle flag");
                        // Unknown state: make the next transition write again.
                        act.idle_flagged = !idle;
                    }
                }),
        );
    }

    fn schedule_poll(&mut self, ctx: &mut Context<Self>) {
        let delay = self.config.poll_backoff().delay(self.empty_polls);
        self.empty_polls = self.empty_polls.saturating_add(1);
        if let Some(timer) = self.poll_timer.take() {
            ctx.cancel_future(timer);
        }
        self.poll_timer = Some(ctx.run_later(delay, |act, ctx| {
            act.poll_timer = None;
            act.claim(ctx);
        }));
    }

    fn max_in_flight_rows(&self) -> usize {
        self.config.max_in_flight_batches as usize * self.config.claim_batch_size as usize
    }

    /// Enqueues every key's rows to its publisher now (so keys see batches in claim order);
    /// each key's outcomes are marked as soon as they arrive, and its rows' permits go back
    /// then.
    fn dispatch(&mut self, rows: Vec<ClaimedRow>, mut permits: Permits) {
        self.in_flight += rows.len();
        // Each key's outcomes come back through one stream, not as a future spawned on this
        // context per key: actix polls every future of a context each time the actor wakes,
        // which with a thousand keys in flight cost more CPU than the publishing. The
        // channel is unbounded but holds at most one message per key group in flight, which
        // `max_in_flight_batches × claim_batch_size` bounds.
        for (key, group) in group_by_key(rows) {
            for r in &group {
                self.rows.insert(
                    r.seq,
                    RowMeta {
                        key: key.clone(),
                        version: r.version,
                        prev_version: r.prev_version,
                        address: r.address,
                        event_id: r.event_id,
                        attempts: r.publish_attempts,
                        retried: r.retried,
                    },
                );
            }
            let group_permits = permits.split_off(group.len());
            let out_to = self.acked_right_before(&key, &group);
            self.keys_out.handed(&key, group.len());
            let outcomes = self.publishers.dispatch(key, group, out_to);
            let sender = self.outcomes.clone();
            actix::spawn(async move {
                let outcomes = outcomes.await;
                drop(group_permits);
                let _ = sender.unbounded_send(outcomes);
            });
        }
    }

    /// The version a group's first row comes right behind, if it is known to be out with
    /// nothing before it unpublished: acknowledged and not marked yet, so the claim still
    /// named it as unpublished. Without this, a row claimed between its key's previous row's
    /// acknowledgement and that row's mark would go back untried, when that row was published
    /// alone (without a key publisher keeping the key's frontier).
    fn acked_right_before(&self, key: &PublisherKey, group: &[ClaimedRow]) -> Option<i64> {
        let prev = group.first()?.prev_version?;
        self.acked.get(key).copied().filter(|&acked| acked == prev)
    }

    /// Remembers a published row in `acked` if nothing before it is left unpublished: it had
    /// nothing unpublished before it when claimed, or it came right behind the key's entry.
    fn note_acked(&mut self, seq: i64) {
        let Some(meta) = self.rows.get(&seq) else {
            return;
        };
        match (self.acked.get_mut(&meta.key), meta.prev_version) {
            (Some(acked), Some(prev)) if *acked == prev => *acked = meta.version,
            (Some(acked), None) => *acked = (*acked).max(meta.version),
            (None, None) => {
                self.acked.insert(meta.key.clone(), meta.version);
            }
            _ => {}
        }
    }

    /// Drops `key`'s entry in `acked` if it is still `version` (which is now marked).
    fn forget_acked(&mut self, key: PublisherKey, version: i64) {
        if self.acked.get(&key) == Some(&version) {
            self.acked.remove(&key);
        }
    }

    /// Marks every settled outcome in one round of statements, unless a mark is running (its
    /// completion marks what settled meanwhile) or a few outcomes wait for more.
    fn mark(&mut self, ctx: &mut Context<Self>) {
        if self.marking || self.settled.is_empty() {
            return;
        }
        if self.settled.len() < MARK_GATHER_ROWS && self.draining.is_none() {
            if self.mark_linger.is_none() {
                self.mark_linger = Some(ctx.run_later(MARK_LINGER, |act, ctx| {
                    act.mark_linger = None;
                    act.mark_now(ctx);
                }));
            }
            return;
        }
        self.mark_now(ctx);
    }

    fn mark_now(&mut self, ctx: &mut Context<Self>) {
        if let Some(linger) = self.mark_linger.take() {
            ctx.cancel_future(linger);
        }
        if self.marking || self.settled.is_empty() {
            return;
        }
        self.marking = true;
        let outcomes = std::mem::take(&mut self.settled);
        self.marking_from = outcomes.iter().map(PublishOutcome::seq).min();
        // Rows that went back (given back untried, failed) and rows published after a retry,
        // whose key's later versions waited behind them: claimable again from the lowest.
        let rewind_to = outcomes
            .iter()
            .filter(|o| {
                !matches!(o, PublishOutcome::Published { .. })
                    || self.rows.get(&o.seq()).is_some_and(|meta| meta.retried)
            })
            .map(PublishOutcome::seq)
            .min();
        let count = outcomes.len();
        let batch = Marking {
            rows: outcomes
                .iter()
                .filter_map(|o| self.rows.remove(&o.seq()).map(|meta| (o.seq(), meta)))
                .collect(),
            shard: self.shard,
            token: self.token,
            store: self.store.clone(),
            publishers: self.publishers.clone(),
            config: self.config.clone(),
        };
        let before_mark = self.before_mark.clone();
        ctx.spawn(
            async move {
                if let Some(hook) = before_mark {
                    hook(batch.shard).await;
                }
                let started = std::time::Instant::now();
                let result = batch.record(outcomes).await;
                tracing::debug!(
                    shard = batch.shard,
                    rows = count,
                    mark_ms = started.elapsed().as_millis() as u64,
                    "marked"
                );
                (result, batch.rows)
            }
            .into_actor(self)
            .map(move |(result, marked), act, ctx| {
                act.marking = false;
                act.marking_from = None;
                act.in_flight -= count;
                for meta in marked.into_values() {
                    if act.claiming {
                        act.forget_after_claim.push((meta.key, meta.version));
                    } else {
                        act.forget_acked(meta.key, meta.version);
                    }
                }
                if let Some(seq) = rewind_to {
                    // Once marked they are claimable again, below where claims look.
                    act.scan_from.rewind_to(seq);
                }
                if let Err(e) = result {
                    // Rows stay claimed by this token; a restart takes a new token so they
                    // are reclaimed after the lease and published again (at least once).
                    tracing::error!(shard = act.shard, error = %e, "marking failed, restarting claimer");
                    ctx.stop();
                    return;
                }
                act.mark(ctx);
                if act.draining.is_some() {
                    act.finish_draining(ctx);
                } else if act.poll_timer.is_none() {
                    // Room for more rows. A claim already scheduled (the linger after a
                    // partial claim, a recheck of the limit) keeps its time: claiming at every
                    // mark would take a trickle in slivers, each publish carrying less.
                    act.claim(ctx);
                }
            }),
        );
    }

    /// Where the backlog gauge may count this shard from: the claimer's floor, or lower where a
    /// row of its own is in flight (its floor leaves them out; the gauge counts them as
    /// pending). The gauge needs no floor look of its own while claims move this on.
    fn backlog_floor(&self) -> i64 {
        self.rows
            .keys()
            .copied()
            .chain(self.marking_from)
            .fold(self.scan_from.floor(), i64::min)
    }

    fn finish_draining(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight == 0 {
            if let Some(drained) = self.draining.take() {
                let _ = drained.send(());
            }
            ctx.stop();
        }
    }
}

/// Splits a claimed batch into per-(topic, key) groups in version order, keeping the
/// batch's claim order between groups; each group's key is built once.
pub fn group_by_key(rows: Vec<ClaimedRow>) -> Vec<(PublisherKey, Vec<ClaimedRow>)> {
    let mut groups: Vec<(PublisherKey, Vec<ClaimedRow>)> = Vec::new();
    // Each row's group, found by the names it borrows from the rows (no key built per row).
    let group_of: Vec<usize> = {
        let mut index: HashMap<(&str, &str), usize, FastHash> = HashMap::default();
        rows.iter()
            .map(|row| {
                *index
                    .entry((row.topic.as_str(), row.aggregate_id.as_str()))
                    .or_insert_with(|| {
                        groups.push((row.publisher_key(), Vec::new()));
                        groups.len() - 1
                    })
            })
            .collect()
    };
    for (row, group) in rows.into_iter().zip(group_of) {
        groups[group].1.push(row);
    }
    for (_, group) in &mut groups {
        group.sort_by_key(|r| r.version);
    }
    groups
}

impl Actor for Claimer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(CLAIMER_MAILBOX);
        if self.escalated {
            return;
        }
        self.token = Uuid::new_v4();
        self.claiming = false;
        self.in_flight = 0;
        self.scan_from = ScanFrom::start();
        self.rows.clear();
        self.keys_out.clear();
        self.settled.clear();
        self.acked.clear();
        self.forget_after_claim.clear();
        let (sender, receiver) = mpsc::unbounded();
        self.outcomes = sender;
        ctx.add_stream(receiver);
        self.marking = false;
        self.marking_from = None;
        self.mark_linger = None;
        self.empty_polls = 0;
        self.poll_timer = None;
        // Unknown after a restart: the first idle transition writes it.
        self.idle_flagged = false;
        tracing::info!(shard = self.shard, token = %self.token, "claimer started");
        ctx.run_later(self.supervision.start_delay, |act, ctx| act.claim(ctx));
    }
}

impl Supervised for Claimer {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        if !self.supervision.restarting() {
            self.escalated = true;
        }
    }
}

impl StreamHandler<Vec<PublishOutcome>> for Claimer {
    /// One key group's outcomes (see `Claimer::dispatch`).
    fn handle(&mut self, outcomes: Vec<PublishOutcome>, ctx: &mut Self::Context) {
        if let Some(meta) = outcomes.first().and_then(|o| self.rows.get(&o.seq())) {
            self.keys_out.settled(&meta.key, outcomes.len());
        }
        for outcome in &outcomes {
            if let PublishOutcome::Published { seq, .. } = outcome {
                self.note_acked(*seq);
            }
        }
        self.settled.extend(outcomes);
        self.mark(ctx);
    }

    /// The stream ends only when this incarnation's sender is dropped, i.e. never while it runs.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

impl Handler<OutboxNotified> for Claimer {
    type Result = ();

    fn handle(&mut self, msg: OutboxNotified, ctx: &mut Self::Context) {
        if msg.rescan {
            self.scan_from.rescan_all();
        }
        self.empty_polls = 0;
        self.claim(ctx);
    }
}

impl Handler<BacklogFloor> for Claimer {
    type Result = i64;

    fn handle(&mut self, _: BacklogFloor, _: &mut Self::Context) -> i64 {
        self.backlog_floor()
    }
}

impl Handler<StopClaiming> for Claimer {
    type Result = ();

    fn handle(&mut self, msg: StopClaiming, ctx: &mut Self::Context) {
        if let Some(timer) = self.poll_timer.take() {
            ctx.cancel_future(timer);
        }
        self.draining = Some(msg.drained);
        self.finish_draining(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_keep_claim_order_and_sort_versions() {
        let groups = group_by_key(vec![
            ClaimedRow::for_test(1, "b", 2),
            ClaimedRow::for_test(2, "a", 1),
            ClaimedRow::for_test(3, "b", 1),
            ClaimedRow::for_test(4, "a", 2),
        ]);
        let shape: Vec<Vec<(String, i64)>> = groups
            .iter()
            .map(|(key, g)| {
                assert!(g.iter().all(|r| r.aggregate_id == key.ordering_key));
                g.iter()
                    .map(|r| (r.aggregate_id.clone(), r.version))
                    .collect()
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![("b".to_string(), 1), ("b".to_string(), 2)],
                vec![("a".to_string(), 1), ("a".to_string(), 2)]
            ]
        );
    }
}
