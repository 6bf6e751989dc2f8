//! Publisher: one actor per (topic, ordering key), created on demand and passivated when idle.
//!
//! It hands a key's rows to the official client all at once — the client keeps one key's
//! messages in order and several in flight — then awaits their acknowledgements in order. The
//! first failure fails the key: every later row of the batch is reported `NotTried` (even if
//! the client sent it, it will be sent again after the failed row, never before it), and the
//! key is resumed in the client, which pauses a key after an error.

use crate::outbox::attributes::{self, RequiredFields};
use crate::outbox::store::ClaimedRow;
use crate::pubsub::{is_transient_rpc, PubSub, PubSubError};
use actix::prelude::*;
use dashmap::DashMap;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::model::Message as PubSubMessage;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// A key's publisher holds at most one batch at a time (the claimer never claims a key's later
/// rows while earlier ones are in flight), so a small mailbox suffices; the slack absorbs a
/// batch racing with passivation.
const KEY_PUBLISHER_MAILBOX: usize = 4;

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

/// An injected failure for a row, for fault tests: `Some(error)` fails that publish.
pub type PublishFault = Arc<dyn Fn(&ClaimedRow) -> Option<String> + Send + Sync>;

/// Identifies one publisher actor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PublisherKey {
    pub topic: String,
    pub ordering_key: String,
}

/// Publish one key's rows, in order. Rows are shared so a retry after passivation does not
/// copy payloads.
#[derive(Message)]
#[rtype(result = "Vec<PublishOutcome>")]
pub struct PublishRows {
    pub rows: Arc<[ClaimedRow]>,
}

/// Settings every key publisher shares.
#[derive(Clone)]
pub struct PublisherSettings {
    /// Stop after being idle this long.
    pub idle_after: Duration,
    /// A publish not acknowledged within this counts as failed.
    pub publish_timeout: Duration,
    pub fault: Option<PublishFault>,
}

/// The registry: live key publishers and one client per topic.
pub struct Publishers {
    pubsub: PubSub,
    settings: PublisherSettings,
    /// One client per topic, built once even when many keys ask at the same time.
    clients: DashMap<String, Arc<OnceCell<Publisher>>>,
    live: Arc<DashMap<PublisherKey, Addr<KeyPublisher>>>,
}

impl Publishers {
    pub fn new(pubsub: PubSub, settings: PublisherSettings) -> Self {
        Self {
            pubsub,
            settings,
            clients: DashMap::new(),
            live: Arc::new(DashMap::new()),
        }
    }

    /// Live key publishers (a gauge).
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    async fn client(&self, topic: &str) -> Result<Publisher, PubSubError> {
        let cell = self.clients.entry(topic.to_string()).or_default().clone();
        cell.get_or_try_init(|| self.pubsub.publisher(topic, CLIENT_BATCH_DELAY))
            .await
            .cloned()
    }

    /// Publishes `rows` — all of one topic and key, in version order — through that key's
    /// actor. Must run on an actix arbiter.
    pub async fn publish(&self, rows: Vec<ClaimedRow>) -> Vec<PublishOutcome> {
        let Some(first) = rows.first() else {
            return Vec::new();
        };
        let key = PublisherKey {
            topic: first.topic.clone(),
            ordering_key: first.aggregate_id.clone(),
        };
        let client = match self.client(&key.topic).await {
            Ok(client) => client,
            Err(e) => return fail_all(&rows, &e.to_string(), !e.is_transient()),
        };
        let rows: Arc<[ClaimedRow]> = rows.into();
        // A publisher may passivate between lookup and send; then its mailbox is closed and
        // the batch goes to a fresh one.
        for _ in 0..3 {
            let addr = self
                .live
                .entry(key.clone())
                .or_insert_with(|| {
                    KeyPublisher {
                        key: key.clone(),
                        client: client.clone(),
                        settings: self.settings.clone(),
                        registry: self.live.clone(),
                        last_active: Instant::now(),
                    }
                    .start()
                })
                .clone();
            match addr.send(PublishRows { rows: rows.clone() }).await {
                Ok(outcomes) => return outcomes,
                Err(_) => {
                    self.live.remove_if(&key, |_, live| *live == addr);
                }
            }
        }
        fail_all(&rows, "key publisher unavailable", false)
    }
}

fn fail_all(rows: &[ClaimedRow], error: &str, permanent: bool) -> Vec<PublishOutcome> {
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

/// Publishes one ordering key's rows of one topic, one batch at a time.
pub struct KeyPublisher {
    key: PublisherKey,
    client: Publisher,
    settings: PublisherSettings,
    /// To leave the registry when passivating.
    registry: Arc<DashMap<PublisherKey, Addr<KeyPublisher>>>,
    last_active: Instant,
}

impl Actor for KeyPublisher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(KEY_PUBLISHER_MAILBOX);
        metrics::gauge!(crate::metrics::LIVE_PUBLISHERS).increment(1.0);
        let check_every = (self.settings.idle_after / 2).max(Duration::from_millis(100));
        ctx.run_interval(check_every, |act, ctx| {
            if act.last_active.elapsed() >= act.settings.idle_after {
                let me = ctx.address();
                act.registry.remove_if(&act.key, |_, live| *live == me);
                ctx.stop();
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        metrics::gauge!(crate::metrics::LIVE_PUBLISHERS).decrement(1.0);
    }
}

impl Handler<PublishRows> for KeyPublisher {
    // Atomic: the next batch of this key starts only after this one finished.
    type Result = AtomicResponse<Self, Vec<PublishOutcome>>;

    fn handle(&mut self, msg: PublishRows, _ctx: &mut Self::Context) -> Self::Result {
        self.last_active = Instant::now();
        let client = self.client.clone();
        let ordering_key = self.key.ordering_key.clone();
        let settings = self.settings.clone();
        AtomicResponse::new(Box::pin(
            async move { publish_in_order(&client, &ordering_key, &msg.rows, &settings).await }
                .into_actor(self)
                .map(|outcomes, act, _| {
                    act.last_active = Instant::now();
                    outcomes
                }),
        ))
    }
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

async fn publish_in_order(
    client: &Publisher,
    ordering_key: &str,
    rows: &[ClaimedRow],
    settings: &PublisherSettings,
) -> Vec<PublishOutcome> {
    let started = Instant::now();
    // Hand every row to the client before awaiting any, so they travel pipelined. A fault
    // stops the hand-over: rows after it must not be sent before it.
    let mut pending = Vec::with_capacity(rows.len());
    let mut injected = None;
    for row in rows {
        if let Some(error) = settings.fault.as_ref().and_then(|f| f(row)) {
            injected = Some(error);
            break;
        }
        pending.push(client.publish(message_for(row)));
    }
    let mut outcomes = Vec::with_capacity(rows.len());
    let mut failed = false;
    for (row, future) in rows.iter().zip(pending) {
        if failed {
            outcomes.push(PublishOutcome::NotTried { seq: row.seq });
            continue;
        }
        match tokio::time::timeout(settings.publish_timeout, future).await {
            Ok(Ok(message_id)) => {
                metrics::counter!(crate::metrics::OUTBOX_PUBLISH_SUCCESS_TOTAL).increment(1);
                metrics::histogram!(crate::metrics::OUTBOX_PUBLISH_LATENCY)
                    .record(started.elapsed().as_secs_f64());
                outcomes.push(PublishOutcome::Published {
                    seq: row.seq,
                    message_id,
                });
            }
            Ok(Err(e)) => {
                let permanent = match &e {
                    google_cloud_pubsub::error::PublishError::Rpc(rpc) => !is_transient_rpc(rpc),
                    _ => false,
                };
                failed = true;
                outcomes.push(PublishOutcome::Failed {
                    seq: row.seq,
                    error: format!("publish to ordering key {ordering_key} failed: {e}"),
                    permanent,
                });
            }
            Err(_) => {
                failed = true;
                outcomes.push(PublishOutcome::Failed {
                    seq: row.seq,
                    error: format!(
                        "publish to ordering key {ordering_key} not acknowledged within {:?}",
                        settings.publish_timeout
                    ),
                    permanent: false,
                });
            }
        }
    }
    // Rows never handed over: the injected failure and everything after it.
    let handed_over = outcomes.len();
    for (i, row) in rows.iter().enumerate().skip(handed_over) {
        if i == handed_over && !failed {
            if let Some(error) = injected.take() {
                failed = true;
                outcomes.push(PublishOutcome::Failed {
                    seq: row.seq,
                    error,
                    permanent: false,
                });
                continue;
            }
        }
        outcomes.push(PublishOutcome::NotTried { seq: row.seq });
    }
    if failed {
        metrics::counter!(crate::metrics::OUTBOX_PUBLISH_ERROR_TOTAL).increment(1);
        client.resume_publish(ordering_key);
    }
    outcomes
}
