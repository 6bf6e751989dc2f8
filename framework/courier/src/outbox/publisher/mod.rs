//! Publishers: one actor per (topic, ordering key), created on demand and passivated when idle.
//!
//! Rows reach a key's actor in claim order (the claimer enqueues them synchronously, and the
//! mailbox is sized so it never refuses one), and the actor hands them to the official client
//! in that order without waiting for earlier acknowledgements: the client keeps one key's
//! messages in order with many in flight, across batches.
//!
//! - this module: the registry ([`Publishers`]) and what the claimer and publishers exchange;
//! - [`key_publisher`]: the actor; [`frontier`]: which rows a key may hand to the client;
//! - [`message`]: the Pub/Sub message of a row.

pub mod frontier;
mod key_publisher;
pub mod message;

pub use key_publisher::{KeyPublisher, PublishRows};
pub use message::message_for;

use crate::keyed_actors::{KeyedActors, Queued, Refused};
use crate::outbox::publish_limit::PublishLimit;
use crate::outbox::store::ClaimedRow;
use crate::outbox::topic_clients::TopicClients;
use crate::pubsub::PubSub;
use actix::prelude::*;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
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
        kind: FailureKind,
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

/// Identifies one publisher actor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PublisherKey {
    pub topic: String,
    pub ordering_key: String,
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
    pub fault: Option<PublishFault>,
    /// The relay's limit on publishes in flight, which acknowledgements and broker failures
    /// move.
    pub limit: Arc<PublishLimit>,
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
    ) -> impl Future<Output = Vec<PublishOutcome>> + 'static {
        let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
        let receiver = match rows.first() {
            Some(first) => {
                let key = PublisherKey {
                    topic: first.topic.clone(),
                    ordering_key: first.aggregate_id.clone(),
                };
                self.enqueue(key, rows)
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

    /// The relay's limit on publishes in flight (claimers take permits from it).
    pub fn limit(&self) -> &Arc<PublishLimit> {
        &self.settings.limit
    }

    /// Key publishers alive now.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Topic clients alive now (see `topic_clients`).
    pub fn clients_alive(&self) -> usize {
        self.clients.alive()
    }

    fn enqueue(
        &self,
        key: PublisherKey,
        rows: Vec<ClaimedRow>,
    ) -> Option<oneshot::Receiver<Vec<PublishOutcome>>> {
        let (reply, receiver) = oneshot::channel();
        let message = PublishRows { rows, reply };
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
        KeyPublisher::new(
            key.clone(),
            self.clients.clone(),
            self.settings.clone(),
            self.live.clone(),
            queued,
        )
        .start()
    }
}

fn not_tried(seqs: &[i64]) -> Vec<PublishOutcome> {
    seqs.iter()
        .map(|&seq| PublishOutcome::NotTried { seq })
        .collect()
}
