//! KeyPublisher: the actor that publishes one (topic, ordering key)'s rows.
//!
//! It hands a batch's rows to the client in order, each only right behind what is already out
//! (see `frontier`), and settles them against one deadline for the whole hand-over. The
//! client pauses a key after an error, and the actor resumes it just before handing over the
//! next row it admits. Acknowledgements and broker failures are reported to the relay's publish limit.

use super::frontier::Frontier;
use super::handed::{judge, Handed, Settled, Verdict};
use super::{FailureKind, PublishOutcome, PublisherKey, PublisherSettings};
use crate::keyed_actors::{KeyedActors, Queued};
use crate::pubsub::PubSubError;
use crate::relay::store::ClaimedRow;
use crate::relay::topic_clients::{TopicClient, TopicClients};
use actix::prelude::*;
use google_cloud_pubsub::client::Publisher;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Publish one key's rows, in version order; the outcomes go to `reply`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishRows {
    pub rows: Vec<ClaimedRow>,
    pub reply: oneshot::Sender<Vec<PublishOutcome>>,
}

/// Publishes one ordering key's rows of one topic.
pub struct KeyPublisher {
    key: PublisherKey,
    /// The topic client this key publisher uses for its whole life (let go when it stops,
    /// which lets a generation's client go once all its keys have passivated).
    client: Option<Arc<TopicClient>>,
    clients: Arc<TopicClients>,
    settings: PublisherSettings,
    /// To leave the registry when passivating.
    registry: Arc<KeyedActors<PublisherKey, KeyPublisher>>,
    queued: Arc<Queued>,
    /// Batches received while the topic's client is being built, in order.
    waiting: VecDeque<PublishRows>,
    connecting: bool,
    /// Batches handed to the client and not yet settled.
    in_flight: usize,
    /// What of the key is out, in order: the rule for which rows may go next.
    frontier: Frontier,
    /// The client paused the key after an error and has not been resumed.
    paused: bool,
    last_active: Instant,
    /// A passivation check is scheduled. One is while the actor is idle: a timer per idle
    /// spell, not a periodic one per actor (with a fresh key per row, thousands of actors
    /// live at once, and each periodic tick polled one of them for nothing).
    idle_check: bool,
}

impl Actor for KeyPublisher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // One message per in-flight batch of the key's claimer, plus a control message.
        ctx.set_mailbox_capacity(self.settings.max_in_flight_batches + 2);
        metrics::gauge!(crate::metrics::LIVE_PUBLISHERS).increment(1.0);
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        metrics::gauge!(crate::metrics::LIVE_PUBLISHERS).decrement(1.0);
        // Let go of the client first, so that the last key of a topic frees its client too.
        if self.client.take().is_some() {
            self.clients.release_if_unused(&self.key.topic);
        }
    }
}

impl KeyPublisher {
    pub(super) fn new(
        key: PublisherKey,
        clients: Arc<TopicClients>,
        settings: PublisherSettings,
        registry: Arc<KeyedActors<PublisherKey, KeyPublisher>>,
        queued: Arc<Queued>,
        frontier: Frontier,
    ) -> Self {
        Self {
            key,
            client: None,
            clients,
            settings,
            registry,
            queued,
            waiting: VecDeque::new(),
            connecting: false,
            in_flight: 0,
            frontier,
            paused: false,
            last_active: Instant::now(),
            idle_check: false,
        }
    }

    fn has_work(&self) -> bool {
        self.in_flight > 0 || !self.waiting.is_empty()
    }

    /// Called whenever the actor may have run out of work: schedules the check that
    /// passivates it once it has been idle for `idle_after`.
    fn check_idle_later(&mut self, ctx: &mut Context<Self>) {
        if self.idle_check || self.has_work() {
            return;
        }
        self.idle_check = true;
        let wait = self
            .settings
            .idle_after
            .saturating_sub(self.last_active.elapsed());
        ctx.run_later(wait, |act, ctx| {
            act.idle_check = false;
            act.passivate_if_idle(ctx);
        });
    }

    fn passivate_if_idle(&mut self, ctx: &mut Context<Self>) {
        if self.has_work() {
            // The batch that keeps it busy schedules the next check when it settles.
            return;
        }
        if self.last_active.elapsed() < self.settings.idle_after {
            self.check_idle_later(ctx);
            return;
        }
        // The frontier may go with the actor: a new one starts with nothing out, so it hands
        // only rows with nothing unpublished before them until its own run builds up.
        // Not left while a message is queued for it: handling that one schedules a check.
        if self.registry.leave_if_idle(&self.key, &ctx.address()) {
            ctx.stop();
        }
    }

    /// Hands waiting batches to the client once the topic's client exists.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.client.is_none() && !self.connecting {
            self.client = self.clients.for_new_key_now(&self.key.topic);
        }
        let Some(client) = self.client.clone() else {
            if !self.connecting {
                self.connecting = true;
                let clients = self.clients.clone();
                let topic = self.key.topic.clone();
                // `wait`: nothing else of this key may happen before the client exists.
                ctx.wait(
                    async move { clients.for_new_key(&topic).await }
                        .into_actor(self)
                        .map(|result, act, ctx| {
                            act.connecting = false;
                            match result {
                                Ok(client) => {
                                    act.client = Some(client);
                                    act.pump(ctx);
                                }
                                Err(e) => {
                                    let kind = client_failure_kind(&e);
                                    if kind == FailureKind::Broker {
                                        act.settings.limit.on_broker_failure();
                                    }
                                    for batch in act.waiting.drain(..) {
                                        if let Some(first) = batch.rows.first() {
                                            act.frontier.set_back(first.prev_version);
                                        }
                                        let outcomes =
                                            fail_first(&batch.rows, &e.to_string(), kind);
                                        let _ = batch.reply.send(outcomes);
                                    }
                                    act.check_idle_later(ctx);
                                }
                            }
                        }),
                );
            }
            return;
        };
        while let Some(batch) = self.waiting.pop_front() {
            self.hand_over(batch, &client.publisher, ctx);
        }
    }

    /// Gives a batch's admitted rows to the client in order, then settles them when their
    /// acknowledgements (or errors) arrive.
    fn hand_over(&mut self, batch: PublishRows, client: &Publisher, ctx: &mut Context<Self>) {
        let mut handed = Vec::with_capacity(batch.rows.len());
        let mut stop = false;
        for row in &batch.rows {
            if stop || !self.frontier.admits(row.prev_version) {
                stop = true;
                handed.push(Handed::NotTried);
                continue;
            }
            if let Some(error) = self.settings.fault.as_ref().and_then(|f| f(row)) {
                // Not handed, so the frontier stays behind it for the batches that follow.
                handed.push(Handed::Injected(error));
                stop = true;
                continue;
            }
            self.frontier.handed(row.version);
            if self.paused {
                client.resume_publish(self.key.ordering_key.clone());
                self.paused = false;
            }
            handed.push(Handed::send(client, row));
        }
        self.in_flight += 1;
        let started = Instant::now();
        // One deadline for the whole hand-over: the rows' acknowledgements are awaited one
        // after another, and a timeout per row would let a batch outlive the claim lease.
        let deadline = tokio::time::Instant::now() + self.settings.publish_timeout;
        ctx.spawn(
            async move {
                let mut results = Vec::with_capacity(handed.len());
                for item in handed {
                    results.push(item.settle(deadline).await);
                }
                results
            }
            .into_actor(self)
            .map(move |results, act, ctx| {
                act.in_flight -= 1;
                act.last_active = Instant::now();
                let outcomes = act.settle(&batch.rows, results, started);
                let _ = batch.reply.send(outcomes);
                act.check_idle_later(ctx);
            }),
        );
    }

    /// Turns acknowledgements and errors into outcomes. Only the first failure of the key
    /// counts as a failure; rows after it go back untried, whether or not the client sent them.
    /// The lowest row that did not go out sets the frontier back.
    fn settle(
        &mut self,
        rows: &[ClaimedRow],
        results: Vec<Settled>,
        started: Instant,
    ) -> Vec<PublishOutcome> {
        // The rows were awaited together: one latency for the batch.
        let latency = started.elapsed();
        let acked = Instant::now();
        let mut outcomes = Vec::with_capacity(rows.len());
        let mut failed = false;
        for (row, result) in rows.iter().zip(results) {
            let seq = row.seq;
            // Behind a failure of this batch, or (a handed row the frontier no longer covers)
            // of an earlier batch that settled first.
            let behind_failure =
                failed || (result.failed_out() && !self.frontier.covers(row.version));
            match judge(&self.settings, &self.key.ordering_key, result, latency) {
                Verdict::Published(message_id) => {
                    outcomes.push(PublishOutcome::Published {
                        seq,
                        message_id,
                        acked,
                    });
                }
                Verdict::NotTried { paused } => {
                    self.paused |= paused;
                    outcomes.push(PublishOutcome::NotTried { seq });
                }
                Verdict::Failed { paused, .. } if behind_failure => {
                    self.paused |= paused;
                    outcomes.push(PublishOutcome::NotTried { seq });
                }
                Verdict::Failed {
                    error,
                    kind,
                    paused,
                } => {
                    self.paused |= paused;
                    failed = true;
                    metrics::counter!(crate::metrics::OUTBOX_PUBLISH_ERROR_TOTAL).increment(1);
                    outcomes.push(PublishOutcome::Failed { seq, error, kind });
                }
            }
        }
        let left_behind = rows
            .iter()
            .zip(&outcomes)
            .find(|(_, outcome)| !matches!(outcome, PublishOutcome::Published { .. }));
        if let Some((row, _)) = left_behind {
            self.frontier.set_back(row.prev_version);
        }
        outcomes
    }
}

impl Handler<PublishRows> for KeyPublisher {
    type Result = ();

    fn handle(&mut self, msg: PublishRows, ctx: &mut Self::Context) {
        self.queued.finished(1);
        self.last_active = Instant::now();
        self.waiting.push_back(msg);
        // Leaves the actor with work (a batch in flight or waiting for the client): its
        // settling schedules the idle check.
        self.pump(ctx);
    }
}

/// Which kind of failure not getting a topic client is: the broker's when it could not be
/// reached, permanent when the client cannot be built at all.
fn client_failure_kind(error: &PubSubError) -> FailureKind {
    if error.is_transient() {
        FailureKind::Broker
    } else {
        FailureKind::Permanent
    }
}

fn fail_first(rows: &[ClaimedRow], error: &str, kind: FailureKind) -> Vec<PublishOutcome> {
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            if i == 0 {
                PublishOutcome::Failed {
                    seq: row.seq,
                    error: error.to_string(),
                    kind,
                }
            } else {
                PublishOutcome::NotTried { seq: row.seq }
            }
        })
        .collect()
}
