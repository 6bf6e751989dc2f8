//! Publisher: one actor per (topic, ordering key), created on demand and passivated when idle.
//!
//! Rows reach a key's actor in claim order (the claimer enqueues them synchronously, and the
//! mailbox is sized so it never refuses one), and the actor hands them to the official client
//! in that order without waiting for earlier acknowledgements: the client keeps one key's
//! messages in order with many in flight, across batches.
//!
//! The first failure of a key *parks* it ([`Parked`]): rows of later versions that were
//! claimed before the failure was recorded in the database are given back untried, because
//! they would otherwise overtake the failed row. Rows claimed after the record are safe — the
//! claim's head-of-line check kept them back until the failed row was due again — and the
//! failed row's own retry lifts the park. The client pauses a key after an error; the actor
//! resumes it just before handing over the next row it admits.

use crate::keyed_actors::Queued;
use crate::keyed_actors::{KeyedActors, Refused};
use crate::outbox::attributes::{self, RequiredFields};
use crate::outbox::store::ClaimedRow;
use crate::outbox::topic_clients::{TopicClient, TopicClients};
use crate::pubsub::{is_transient_rpc, PubSub};
use actix::prelude::*;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::error::PublishError;
use google_cloud_pubsub::model::Message as PubSubMessage;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// How long the client may gather messages into a batch before sending.
pub const CLIENT_BATCH_DELAY: Duration = Duration::from_millis(5);

/// What happened to one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    Published {
        seq: i64,
        message_id: String,
    },
    Failed {
        seq: i64,
        error: String,
        permanent: bool,
    },
    /// Not attempted (or attempted after an earlier row of its key failed): give it back.
    NotTried {
        seq: i64,
    },
}

impl PublishOutcome {
    pub fn seq(&self) -> i64 {
        match self {
            PublishOutcome::Published { seq, .. }
            | PublishOutcome::Failed { seq, .. }
            | PublishOutcome::NotTried { seq } => *seq,
        }
    }
}

/// An injected failure for a row, for fault tests: `Some(error)` fails that publish.
pub type PublishFault = Arc<dyn Fn(&ClaimedRow) -> Option<String> + Send + Sync>;

/// Identifies one publisher actor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PublisherKey {
    pub topic: String,
    pub ordering_key: String,
}

/// Publish one key's rows, in version order; the outcomes go to `reply`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishRows {
    pub rows: Vec<ClaimedRow>,
    /// When the claim that found these rows started (before its snapshot was taken).
    pub claimed_at: Instant,
    pub reply: oneshot::Sender<Vec<PublishOutcome>>,
}

/// The failure of `version` is now recorded in the database (committed at or before `at`):
/// claims that start later cannot return rows that would overtake it.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct FailureRecorded {
    pub version: i64,
    pub at: Instant,
}

/// Settings every key publisher shares.
#[derive(Clone)]
pub struct PublisherSettings {
    /// Stop after being idle this long.
    pub idle_after: Duration,
    /// A publish not acknowledged within this counts as failed.
    pub publish_timeout: Duration,
    /// Batches a claimer may have in flight: a key's mailbox holds one message per batch.
    pub max_in_flight_batches: usize,
    /// An unrecorded park expires after this (the claim lease): by then the failed row's
    /// claim has expired and the database decides again.
    pub park_expiry: Duration,
    pub fault: Option<PublishFault>,
}

/// The registry: live key publishers and the topic clients they publish through.
pub struct Publishers {
    settings: PublisherSettings,
    /// Generations of per-topic clients on one connection (see `topic_clients`).
    clients: Arc<TopicClients>,
    live: Arc<KeyedActors<PublisherKey, KeyPublisher>>,
}

impl Publishers {
    pub fn new(pubsub: PubSub, settings: PublisherSettings, client_runtime: Handle) -> Self {
        Self {
            settings,
            clients: Arc::new(TopicClients::new(
                pubsub,
                client_runtime,
                CLIENT_BATCH_DELAY,
            )),
            live: Arc::new(KeyedActors::new("key_publisher")),
        }
    }

    /// Enqueues `rows` — all of one topic and key, in version order — to that key's actor
    /// now, so calls made in claim order reach the key in claim order. The returned future
    /// yields their outcomes. Must be called on an actix arbiter.
    pub fn dispatch(
        &self,
        rows: Vec<ClaimedRow>,
        claimed_at: Instant,
    ) -> impl Future<Output = Vec<PublishOutcome>> + 'static {
        let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
        let receiver = match rows.first() {
            Some(first) => {
                let key = PublisherKey {
                    topic: first.topic.clone(),
                    ordering_key: first.aggregate_id.clone(),
                };
                self.enqueue(key, rows, claimed_at)
            }
            None => None,
        };
        async move {
            match receiver {
                Some(receiver) => receiver.await.unwrap_or_else(|_| not_tried(&seqs)),
                None => not_tried(&seqs),
            }
        }
    }

    /// Key publishers alive now.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Topic clients alive now (see `topic_clients`).
    pub fn clients_alive(&self) -> usize {
        self.clients.alive()
    }

    /// Tells the key's actor (if it is still live) that a failure is recorded.
    pub fn failure_recorded(&self, key: PublisherKey, version: i64, at: Instant) {
        if let Some(addr) = self.live.get(&key) {
            // Best effort: an unrecorded park expires on its own.
            let _ = addr.try_send(FailureRecorded { version, at });
        }
    }

    fn enqueue(
        &self,
        key: PublisherKey,
        rows: Vec<ClaimedRow>,
        claimed_at: Instant,
    ) -> Option<oneshot::Receiver<Vec<PublishOutcome>>> {
        let (reply, receiver) = oneshot::channel();
        let message = PublishRows {
            rows,
            claimed_at,
            reply,
        };
        match self.live.send(&key, message, |queued| {
            self.start_key_publisher(&key, queued)
        }) {
            Ok(()) => Some(receiver),
            Err(Refused::Full(_)) => {
                // Cannot happen while claimers respect max_in_flight_batches; if it does,
                // the rows go back untried rather than out of order.
                tracing::warn!(ordering_key = %key.ordering_key, "key publisher mailbox full; rows given back");
                None
            }
            Err(Refused::Closed(_)) => None,
        }
    }

    fn start_key_publisher(&self, key: &PublisherKey, queued: Arc<Queued>) -> Addr<KeyPublisher> {
        KeyPublisher {
            key: key.clone(),
            client: None,
            clients: self.clients.clone(),
            settings: self.settings.clone(),
            registry: self.live.clone(),
            queued,
            waiting: VecDeque::new(),
            connecting: false,
            in_flight: 0,
            parked: None,
            paused: false,
            last_active: Instant::now(),
        }
        .start()
    }
}

fn not_tried(seqs: &[i64]) -> Vec<PublishOutcome> {
    seqs.iter()
        .map(|&seq| PublishOutcome::NotTried { seq })
        .collect()
}

/// A key whose row of `version` failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parked {
    pub version: i64,
    pub failed_at: Instant,
    /// When the failure was known to be committed to the database.
    pub recorded_at: Option<Instant>,
    /// The failed row's retry was handed over. The park still stands for rows claimed before
    /// the failure was recorded: rows between the failed one and them were given back untried
    /// and come back only with a later claim, so those older-claim rows would overtake them.
    pub retried: bool,
}

/// Whether a row of `version`, claimed at `claimed_at`, may be handed to the client while the
/// key is `parked`. Rows up to the failed version always may (they are its retry, or come
/// before it); later ones only if their claim started after the failure was recorded (or
/// after the park expired), since that claim's head-of-line check already ordered them.
pub fn admits(
    parked: Option<&Parked>,
    version: i64,
    claimed_at: Instant,
    expiry: Duration,
) -> bool {
    match parked {
        None => true,
        Some(p) if version <= p.version => true,
        Some(p) => {
            p.recorded_at.is_some_and(|at| claimed_at > at) || claimed_at > p.failed_at + expiry
        }
    }
}

/// Records that a row of `version` went to the client. The failed row's retry lets the key
/// flow again — but only for rows claimed since the failure was recorded (see `admits`), so
/// the park stays, marked retried.
pub fn note_handed(parked: &mut Option<Parked>, version: i64) {
    if let Some(parked) = parked.as_mut().filter(|p| version <= p.version) {
        parked.retried = true;
    }
}

/// Publishes one ordering key's rows of one topic.
pub struct KeyPublisher {
    key: PublisherKey,
    /// The topic client this key publisher uses for its whole life (dropped with it, which
    /// lets a generation's client go once all its keys have passivated).
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
    parked: Option<Parked>,
    /// The client paused the key after an error and has not been resumed.
    paused: bool,
    last_active: Instant,
}

impl Actor for KeyPublisher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // One message per in-flight batch of the key's claimer, plus a control message.
        ctx.set_mailbox_capacity(self.settings.max_in_flight_batches + 2);
        metrics::gauge!(crate::metrics::LIVE_PUBLISHERS).increment(1.0);
        let check_every = (self.settings.idle_after / 2).max(Duration::from_millis(100));
        ctx.run_interval(check_every, |act, ctx| act.passivate_if_idle(ctx));
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        metrics::gauge!(crate::metrics::LIVE_PUBLISHERS).decrement(1.0);
    }
}

impl KeyPublisher {
    fn passivate_if_idle(&mut self, ctx: &mut Context<Self>) {
        // A park outlives its key publisher only once it has expired: until then it is what
        // keeps rows claimed before the failure was recorded from overtaking it.
        let park_over = self
            .parked
            .is_none_or(|p| p.failed_at.elapsed() >= self.settings.park_expiry);
        let idle = self.in_flight == 0
            && self.waiting.is_empty()
            && park_over
            && self.last_active.elapsed() >= self.settings.idle_after;
        if !idle {
            return;
        }
        if self.registry.leave_if_idle(&self.key, &ctx.address()) {
            ctx.stop();
        }
    }

    /// Hands waiting batches to the client once the topic's client exists.
    fn pump(&mut self, ctx: &mut Context<Self>) {
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
                                    let permanent = !e.is_transient();
                                    for batch in act.waiting.drain(..) {
                                        let outcomes =
                                            fail_first(&batch.rows, &e.to_string(), permanent);
                                        let _ = batch.reply.send(outcomes);
                                    }
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
            if stop
                || !admits(
                    self.parked.as_ref(),
                    row.version,
                    batch.claimed_at,
                    self.settings.park_expiry,
                )
            {
                stop = true;
                handed.push(Handed::NotTried);
                continue;
            }
            note_handed(&mut self.parked, row.version);
            if let Some(error) = self.settings.fault.as_ref().and_then(|f| f(row)) {
                self.park(row.version);
                handed.push(Handed::Injected(error));
                stop = true;
                continue;
            }
            if self.paused {
                client.resume_publish(self.key.ordering_key.clone());
                self.paused = false;
            }
            handed.push(Handed::Sent(Box::pin(client.publish(message_for(row)))));
        }
        self.in_flight += 1;
        let timeout = self.settings.publish_timeout;
        let started = Instant::now();
        ctx.spawn(
            async move {
                let mut results = Vec::with_capacity(handed.len());
                for item in handed {
                    results.push(match item {
                        Handed::Sent(future) => match tokio::time::timeout(timeout, future).await {
                            Ok(Ok(id)) => Settled::Acked(id),
                            Ok(Err(e)) => Settled::Error(e),
                            Err(_) => Settled::TimedOut,
                        },
                        Handed::Injected(error) => Settled::Injected(error),
                        Handed::NotTried => Settled::NotTried,
                    });
                }
                results
            }
            .into_actor(self)
            .map(move |results, act, _| {
                act.in_flight -= 1;
                act.last_active = Instant::now();
                let outcomes = act.settle(&batch.rows, results, started);
                let _ = batch.reply.send(outcomes);
            }),
        );
    }

    fn park(&mut self, version: i64) {
        // A park whose row was retried is over: a new failure starts a new one.
        let lowest = match self.parked {
            Some(p) if !p.retried => p.version.min(version),
            _ => version,
        };
        self.parked = Some(Parked {
            version: lowest,
            failed_at: Instant::now(),
            recorded_at: None,
            retried: false,
        });
    }

    /// Turns acknowledgements and errors into outcomes. Only the first failure of the key
    /// counts as a failure; rows after it go back untried, whether or not the client sent them.
    fn settle(
        &mut self,
        rows: &[ClaimedRow],
        results: Vec<Settled>,
        started: Instant,
    ) -> Vec<PublishOutcome> {
        let key = self.key.ordering_key.clone();
        let mut outcomes = Vec::with_capacity(rows.len());
        let mut failed = false;
        for (row, result) in rows.iter().zip(results) {
            let seq = row.seq;
            let behind_failure = failed
                || self
                    .parked
                    .is_some_and(|p| !p.retried && row.version > p.version);
            let failure = match result {
                Settled::Acked(message_id) => {
                    metrics::counter!(crate::metrics::OUTBOX_PUBLISH_SUCCESS_TOTAL).increment(1);
                    metrics::histogram!(crate::metrics::OUTBOX_PUBLISH_LATENCY)
                        .record(started.elapsed().as_secs_f64());
                    outcomes.push(PublishOutcome::Published { seq, message_id });
                    continue;
                }
                Settled::NotTried => {
                    outcomes.push(PublishOutcome::NotTried { seq });
                    continue;
                }
                Settled::Error(PublishError::OrderingKeyPaused) => {
                    self.paused = true;
                    outcomes.push(PublishOutcome::NotTried { seq });
                    continue;
                }
                Settled::Error(e) => {
                    self.paused = true;
                    let permanent = matches!(&e, PublishError::Rpc(rpc) if !is_transient_rpc(rpc));
                    (
                        format!("publish to ordering key {key} failed: {e}"),
                        permanent,
                    )
                }
                Settled::TimedOut => (
                    format!(
                        "publish to ordering key {key} not acknowledged within {:?}",
                        self.settings.publish_timeout
                    ),
                    false,
                ),
                Settled::Injected(error) => (error, false),
            };
            if behind_failure {
                outcomes.push(PublishOutcome::NotTried { seq });
                continue;
            }
            failed = true;
            self.park(row.version);
            metrics::counter!(crate::metrics::OUTBOX_PUBLISH_ERROR_TOTAL).increment(1);
            let (error, permanent) = failure;
            outcomes.push(PublishOutcome::Failed {
                seq,
                error,
                permanent,
            });
        }
        outcomes
    }
}

/// A row as handed to the client.
enum Handed {
    Sent(std::pin::Pin<Box<google_cloud_pubsub::publisher::PublishFuture>>),
    Injected(String),
    NotTried,
}

/// A handed row's result.
enum Settled {
    Acked(String),
    Error(PublishError),
    TimedOut,
    Injected(String),
    NotTried,
}

impl Handler<PublishRows> for KeyPublisher {
    type Result = ();

    fn handle(&mut self, msg: PublishRows, ctx: &mut Self::Context) {
        self.queued.finished(1);
        self.last_active = Instant::now();
        self.waiting.push_back(msg);
        self.pump(ctx);
    }
}

impl Handler<FailureRecorded> for KeyPublisher {
    type Result = ();

    fn handle(&mut self, msg: FailureRecorded, _ctx: &mut Self::Context) {
        if let Some(parked) = self.parked.as_mut() {
            if parked.version == msg.version {
                parked.recorded_at = Some(msg.at);
            }
        }
    }
}

fn fail_first(rows: &[ClaimedRow], error: &str, permanent: bool) -> Vec<PublishOutcome> {
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            if i == 0 {
                PublishOutcome::Failed {
                    seq: row.seq,
                    error: error.to_string(),
                    permanent,
                }
            } else {
                PublishOutcome::NotTried { seq: row.seq }
            }
        })
        .collect()
}

/// The message for `row`: payload, ordering key and attributes.
pub fn message_for(row: &ClaimedRow) -> PubSubMessage {
    let optional = row
        .optional_attributes
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)));
    let attributes = attributes::build(
        RequiredFields {
            event_id: row.event_id,
            event_type: &row.event_type,
            aggregate_id: &row.aggregate_id,
            aggregate_type: &row.aggregate_type,
            version: row.version,
            occurred_at: row.occurred_at,
            schema_version: row.schema_version,
        },
        optional,
    );
    PubSubMessage::new()
        .set_data(row.payload.clone())
        .set_ordering_key(row.aggregate_id.clone())
        .set_attributes(attributes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPIRY: Duration = Duration::from_secs(30);

    #[test]
    fn an_unparked_key_admits_everything() {
        assert!(admits(None, 7, Instant::now(), EXPIRY));
    }

    #[test]
    fn a_parked_key_admits_its_failed_row_and_earlier_ones() {
        let parked = Parked {
            version: 3,
            failed_at: Instant::now(),
            recorded_at: None,
            retried: false,
        };
        let claimed = parked.failed_at - Duration::from_millis(5);
        assert!(admits(Some(&parked), 3, claimed, EXPIRY));
        assert!(admits(Some(&parked), 2, claimed, EXPIRY));
    }

    #[test]
    fn later_rows_claimed_before_the_record_are_refused() {
        let t0 = Instant::now();
        let mut parked = Parked {
            version: 3,
            failed_at: t0,
            recorded_at: None,
            retried: false,
        };
        // Claimed while the failure was not yet in the database: it could overtake v3.
        assert!(!admits(
            Some(&parked),
            4,
            t0 + Duration::from_millis(1),
            EXPIRY
        ));
        parked.recorded_at = Some(t0 + Duration::from_millis(10));
        assert!(!admits(
            Some(&parked),
            4,
            t0 + Duration::from_millis(5),
            EXPIRY
        ));
        // Claimed after the record: the claim itself kept it behind v3.
        assert!(admits(
            Some(&parked),
            4,
            t0 + Duration::from_millis(11),
            EXPIRY
        ));
    }

    #[test]
    fn after_the_retry_rows_claimed_before_the_record_are_still_refused() {
        // v3 failed; v4-v7 were given back untried; v8 sat in an older claim. Once v3's retry
        // went out, v8 must still wait: v4-v7 come back only with a later claim.
        let t0 = Instant::now();
        let mut parked = Some(Parked {
            version: 3,
            failed_at: t0,
            recorded_at: Some(t0 + Duration::from_millis(10)),
            retried: false,
        });
        note_handed(&mut parked, 3);
        assert!(!admits(
            parked.as_ref(),
            8,
            t0 + Duration::from_millis(5),
            EXPIRY
        ));
        assert!(admits(
            parked.as_ref(),
            4,
            t0 + Duration::from_millis(11),
            EXPIRY
        ));
    }

    #[test]
    fn an_unrecorded_park_expires_after_the_lease() {
        let t0 = Instant::now();
        let parked = Parked {
            version: 1,
            failed_at: t0,
            recorded_at: None,
            retried: false,
        };
        assert!(!admits(Some(&parked), 2, t0 + EXPIRY, EXPIRY));
        assert!(admits(
            Some(&parked),
            2,
            t0 + EXPIRY + Duration::from_millis(1),
            EXPIRY
        ));
    }
}
