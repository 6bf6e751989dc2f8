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

use crate::inbound::committer::{Commit, Committer};
use crate::inbound::delivery::Delivery;
use crate::inbound::messages::{Deliver, Stop};
use crate::inbound::parts::ConsumerParts;
use crate::inbound::projection::Projection;
use crate::inbound::transaction::{park, Settled};
use crate::keyed_actors::{KeyedActors, Queued};
use crate::metrics as m;
use actix::prelude::*;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The registry of live projectors, by routing key (the router hands deliveries through it;
/// a projector leaves it when idle).
pub type LiveProjectors<P> = KeyedActors<String, Projector<P>>;

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
    /// Applies the key's groups, in transactions shared with other keys.
    committer: Addr<Committer<P>>,
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
        committer: Addr<Committer<P>>,
        registry: Arc<LiveProjectors<P>>,
        queued: Arc<Queued>,
        mailbox: usize,
    ) -> Self {
        Self {
            key,
            parts,
            committer,
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
        let (count, oldest) = (group.len(), group.iter().map(|d| d.meta.version).min());
        let (reply, outcome) = tokio::sync::oneshot::channel();
        self.committer.do_send(Commit { group, reply });
        ctx.spawn(outcome.into_actor(self).map(move |outcome, act, ctx| {
            // Unanswered: the committer stopped, and the deliveries were dropped with
            // the message, which nacks them.
            let settled = outcome.unwrap_or_else(|_| Settled::lost(count, oldest));
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
        }));
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

#[cfg(test)]
mod tests {
    use super::take_ready;
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
}
