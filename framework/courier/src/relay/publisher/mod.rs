//! Publishers: one actor per (topic, ordering key), created on demand and passivated when idle.
//!
//! Rows reach a key's actor in claim order (the claimer enqueues them synchronously, and the
//! mailbox is sized so it never refuses one), and the actor hands them to the official client
//! in that order without waiting for earlier acknowledgements: the client keeps one key's
//! messages in order with many in flight, across batches.
//!
//! - this module: the registry ([`Publishers`]) and what the claimer and publishers exchange;
//! - `key_publisher`: the actor; [`frontier`]: which rows a key may hand to the client;
//! - `lone_row`: a key's only row, published without an actor;
//! - `handed`: a row handed to the client and what its result means;
//! - [`message`]: the Pub/Sub message of a row.

pub mod frontier;
mod handed;
mod key_publisher;
mod lone_row;
pub mod message;

pub use crate::relay::publisher_key::PublisherKey;
pub use key_publisher::{KeyPublisher, PublishRows};
pub use message::message_for;

use crate::keyed_actors::{KeyedActors, Queued, Refused};
use crate::pubsub::PubSub;
use crate::relay::publish_limit::PublishLimit;
use crate::relay::store::ClaimedRow;
use crate::relay::topic_clients::TopicClients;
use actix::prelude::*;
use frontier::Frontier;
use futures::future::Either;
use lone_row::LoneRows;
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
        /// When the broker's acknowledgement arrived (a batch's rows: its last one), which the
        /// mark records as `published_at`, not its own later time.
        acked: Instant,
    },
    Failed {
        seq: i64,
        error: String,
        kind: FailureKind,
    },
    /// Not attempted (or attempted after an earlier row of its key failed): give it back.
    NotTried { seq: i64 },
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

/// Why a publish failed, which decides what the failure costs the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Pub/Sub was slow, unreachable or overloaded (a timeout, `UNAVAILABLE`,
    /// `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `CANCELLED`, a broken connection): not the
    /// row's doing, so the row retries with the broker's backoff and spends none of its attempts.
    Broker,
    /// A failure that may be the row's own and may pass (`ABORTED`, `INTERNAL`, `UNKNOWN`, an
    /// injected fault): retried, and one of the row's attempts is spent.
    Transient,
    /// The row can never be published as it is (`INVALID_ARGUMENT`, an unknown topic, …).
    Permanent,
}

/// An injected failure for a row, for fault tests: `Some(error)` fails that publish.
pub type PublishFault = Arc<dyn Fn(&ClaimedRow) -> Option<String> + Send + Sync>;

/// Settings every key publisher shares.
#[derive(Clone)]
pub struct PublisherSettings {
    /// Stop after being idle this long.
    pub idle_after: Duration,
    /// A publish not acknowledged within this counts as failed.
    pub publish_timeout: Duration,
    /// Batches a claimer may have in flight: a key's mailbox holds one message per batch.
    pub max_in_flight_batches: usize,
    pub fault: Option<PublishFault>,
    /// The relay's limit on publishes in flight, which acknowledgements and broker failures
    /// move.
    pub limit: Arc<PublishLimit>,
}

/// The registry: live key publishers, lone rows out, and the topic clients they publish
/// through. Cloning it is cheap and shares all of it.
#[derive(Clone)]
pub struct Publishers {
    settings: PublisherSettings,
    /// Generations of per-topic clients on one connection (see `topic_clients`).
    clients: Arc<TopicClients>,
    live: Arc<KeyedActors<PublisherKey, KeyPublisher>>,
    lone: Arc<LoneRows>,
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
            lone: Arc::new(LoneRows::default()),
        }
    }

    /// Enqueues `rows` — all of `key`, in version order — to that key's actor now (or
    /// publishes them as a lone row), so calls made in claim order reach the key in claim
    /// order. `out_to`: a version of the key the caller knows is out with nothing unpublished
    /// before it (acknowledged, not yet marked), which rows right behind it may follow when
    /// the key has no actor. The returned future yields their outcomes. Must be called, and
    /// the future polled, on an actix arbiter.
    pub fn dispatch(
        &self,
        key: PublisherKey,
        rows: Vec<ClaimedRow>,
        out_to: Option<i64>,
    ) -> impl Future<Output = Vec<PublishOutcome>> + 'static {
        if rows.is_empty() {
            return Either::Left(std::future::ready(Vec::new()));
        }
        let frontier = Frontier::out_to(out_to);
        if let Some(lone) = lone_row::try_publish(self, &key, &rows, frontier) {
            return Either::Right(Either::Left(lone));
        }
        let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
        let (reply, receiver) = oneshot::channel();
        let batch = PublishRows { rows, reply };
        if let Some(batch) = self.lone.wait_behind(&key, batch) {
            self.enqueue(&key, batch, frontier);
        }
        Either::Right(Either::Right(async move {
            // Dropped unanswered (a refused batch, a stopped actor): the rows go back untried.
            receiver.await.unwrap_or_else(|_| not_tried(&seqs))
        }))
    }

    /// The relay's limit on publishes in flight (claimers take permits from it).
    pub fn limit(&self) -> &Arc<PublishLimit> {
        &self.settings.limit
    }

    /// Key publishers alive and lone rows out now: the relay's per-key state.
    pub fn live(&self) -> usize {
        self.live.len() + self.lone.len()
    }

    /// Topic clients alive now (see `topic_clients`).
    pub fn clients_alive(&self) -> usize {
        self.clients.alive()
    }

    /// Hands `batch` to `key`'s actor, starting one with `frontier` if none is live. A
    /// refused batch is dropped with its reply.
    fn enqueue(&self, key: &PublisherKey, batch: PublishRows, frontier: Frontier) {
        let start = |queued| self.start_key_publisher(key, queued, frontier);
        match self.live.send(key, batch, start) {
            Ok(()) | Err(Refused::Closed(_)) => {}
            Err(Refused::Full(_)) => {
                // Cannot happen while claimers respect max_in_flight_batches; if it does,
                // the rows go back untried rather than out of order.
                tracing::warn!(ordering_key = %key.ordering_key, "key publisher mailbox full; rows given back");
            }
        }
    }

    fn start_key_publisher(
        &self,
        key: &PublisherKey,
        queued: Arc<Queued>,
        frontier: Frontier,
    ) -> Addr<KeyPublisher> {
        KeyPublisher::new(
            key.clone(),
            self.clients.clone(),
            self.settings.clone(),
            self.live.clone(),
            queued,
            frontier,
        )
        .start()
    }
}

fn not_tried(seqs: &[i64]) -> Vec<PublishOutcome> {
    seqs.iter()
        .map(|&seq| PublishOutcome::NotTried { seq })
        .collect()
}
