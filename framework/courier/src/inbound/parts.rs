//! What every actor of one consumer shares: its subscription and group, counters, the
//! database and Pub/Sub handles, and how a delivery is settled (ack, nack, or dead-letter
//! then ack). The receiver, the router and the projectors depend on this module, not on each
//! other's.

use crate::config::ConsumerConfig;
use crate::db::PgPool;
use crate::inbound::dead_letter::DeadLetters;
use crate::inbound::dead_letter_log::DeadLetterLog;
use crate::inbound::delivery::{Delivery, EventMeta};
use crate::inbound::inbox::Inbox;
use crate::inbound::offsets::OffsetStore;
use crate::inbound::parked::KeyVersions;
use crate::inbound::projection::Projection;
use crate::metrics as m;
use crate::pubsub::PubSub;
use google_cloud_pubsub::error::AckError;
use google_cloud_pubsub::subscriber::handler::Handler;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Which subscription a consumer reads, as which group, and where dead letters go.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// Names the read model's inbox rows and offsets; one group per read model.
    pub group: String,
    /// Subscription id (not the full path).
    pub subscription: String,
    /// Topic id of the dead-letter topic (`<topic>.dlq`).
    pub dead_letter_topic: String,
}

/// A test hook run after a projection transaction committed and before its messages are
/// acked (to stop a consumer in that window).
pub type BeforeAck = Arc<dyn Fn(&[EventMeta]) -> Pin<Box<dyn Future<Output = ()>>> + Send + Sync>;

/// Counters of one consumer, for tests, the CLI and the load tests (metrics carry the same).
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Messages received from the streams (redeliveries included).
    pub received: AtomicU64,
    /// Events whose effect was committed (first time seen by the group).
    pub applied: AtomicU64,
    /// Events committed as already seen (inbox hit): acked without a second effect.
    pub duplicates: AtomicU64,
    pub acked: AtomicU64,
    pub nacked: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Events whose projection transaction failed (handler, statement or commit).
    pub failed: AtomicU64,
    /// Events acked into a parked key's keeping (contiguous projections).
    pub parked: AtomicU64,
    /// Projection transactions committed (events per transaction = settled / this).
    pub transactions: AtomicU64,
    /// Of those, the ones that applied more than one key's events (the committer's sharing;
    /// a shared transaction that failed and fell back to one per key is not counted).
    pub shared_transactions: AtomicU64,
    /// Acks and nacks Pub/Sub confirmed (exactly-once subscriptions).
    pub confirmed: AtomicU64,
    /// Received and not yet acked or nacked.
    pub outstanding: AtomicU64,
    /// The most ever outstanding at once (flow control bounds it).
    pub peak_outstanding: AtomicU64,
}

/// A plain copy of [`ConsumerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub received: u64,
    pub applied: u64,
    pub duplicates: u64,
    pub acked: u64,
    pub nacked: u64,
    pub dead_lettered: u64,
    pub failed: u64,
    pub parked: u64,
    pub transactions: u64,
    pub shared_transactions: u64,
    pub confirmed: u64,
    pub outstanding: u64,
    pub peak_outstanding: u64,
}

impl ConsumerStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            received: get(&self.received),
            applied: get(&self.applied),
            duplicates: get(&self.duplicates),
            acked: get(&self.acked),
            nacked: get(&self.nacked),
            dead_lettered: get(&self.dead_lettered),
            failed: get(&self.failed),
            parked: get(&self.parked),
            transactions: get(&self.transactions),
            shared_transactions: get(&self.shared_transactions),
            confirmed: get(&self.confirmed),
            outstanding: get(&self.outstanding),
            peak_outstanding: get(&self.peak_outstanding),
        }
    }

    pub(crate) fn on_received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
        let now = self.outstanding.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_outstanding.fetch_max(now, Ordering::Relaxed);
        metrics::gauge!(m::RECEIVER_OUTSTANDING_MESSAGES).increment(1.0);
    }

    fn on_acked(&self) {
        self.acked.fetch_add(1, Ordering::Relaxed);
        self.on_settled();
    }

    fn on_nacked(&self) {
        self.nacked.fetch_add(1, Ordering::Relaxed);
        self.on_settled();
    }

    fn on_settled(&self) {
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(m::RECEIVER_OUTSTANDING_MESSAGES).decrement(1.0);
    }
}

/// How a delivery leaves the consumer.
#[derive(Debug, Clone, Copy)]
enum Settle {
    Ack,
    Nack,
}

/// Counts an exactly-once confirmation and logs a failed one.
fn record_confirmation(
    stats: &ConsumerStats,
    kind: &'static str,
    message_id: &str,
    failure: Option<AckError>,
) {
    let result = if failure.is_some() {
        "failed"
    } else {
        "confirmed"
    };
    metrics::counter!(m::CONSUMER_CONFIRMATIONS_TOTAL, "kind" => kind, "result" => result)
        .increment(1);
    match failure {
        None => {
            stats.confirmed.fetch_add(1, Ordering::Relaxed);
        }
        Some(error) => tracing::warn!(message_id, kind, %error,
            "Pub/Sub did not confirm; the message may come again, and the inbox absorbs it"),
    }
}

/// What every actor of one consumer shares.
pub struct ConsumerParts<P: Projection> {
    pub projection: P,
    pub spec: ConsumerSpec,
    pub settings: ConsumerConfig,
    pub pubsub: PubSub,
    pub pool: PgPool,
    /// One permit per pooled connection: projectors queue here for a transaction, without
    /// a deadline, rather than time out in the pool while thousands of keys are busy.
    pub transactions: tokio::sync::Semaphore,
    pub inbox: Inbox,
    pub offsets: OffsetStore,
    /// Contiguous projections: each key's version, and parked keys.
    pub versions: KeyVersions,
    pub dead_letters: DeadLetters,
    pub dead_letter_log: DeadLetterLog,
    /// This process, as recorded in `consumer_offsets.updated_by`.
    pub instance: String,
    pub stats: Arc<ConsumerStats>,
    pub before_ack: Option<BeforeAck>,
    /// `<group>_offset_lag_ms`, the agreed per-group metric name.
    pub offset_lag_metric: String,
}

impl<P: Projection> ConsumerParts<P> {
    /// Acks a delivery whose effect (or non-effect) is committed. On an exactly-once
    /// subscription the ack is confirmed in the background (the client retries transient
    /// failures); a confirmation that fails (an expired ack id) means Pub/Sub may deliver the
    /// event again, and the inbox gives it no second effect.
    pub(crate) fn ack<E>(&self, delivery: Delivery<E>) {
        metrics::histogram!(m::PROJECTION_PROCESS_LATENCY)
            .record(delivery.received_at.elapsed().as_secs_f64());
        self.settle(delivery.handler, &delivery.meta.message_id, Settle::Ack);
        self.stats.on_acked();
    }

    /// Acks or nacks; on an exactly-once subscription the confirmation is awaited in the
    /// background and counted.
    fn settle(&self, handler: Handler, message_id: &str, how: Settle) {
        match handler {
            Handler::ExactlyOnce(handler) => {
                let stats = self.stats.clone();
                let message_id = message_id.to_string();
                tokio::spawn(async move {
                    let (kind, confirmed) = match how {
                        Settle::Ack => ("ack", handler.confirmed_ack().await),
                        Settle::Nack => ("nack", handler.confirmed_nack().await),
                    };
                    record_confirmation(&stats, kind, &message_id, confirmed.err());
                });
            }
            handler => match how {
                Settle::Ack => handler.ack(),
                Settle::Nack => handler.nack(),
            },
        }
    }

    /// `n` events acked into a parked key's keeping.
    pub(crate) fn count_parked(&self, n: usize) {
        self.stats.parked.fetch_add(n as u64, Ordering::Relaxed);
        metrics::counter!(m::PROJECTION_PARKED_EVENTS_TOTAL).increment(n as u64);
    }

    pub(crate) fn set_dead_letter_gauge(&self, open: i64) {
        #[allow(clippy::cast_precision_loss)]
        metrics::gauge!(m::DLQ_MESSAGE_COUNT, "subscription" => self.spec.subscription.clone())
            .set(open as f64);
    }

    /// Sets `courier_projection_parked_keys{consumer_group}` from the database (an operator's
    /// release, in another process, lowers it).
    pub(crate) async fn refresh_parked_gauge(&self) {
        match self.versions.list(&self.pool).await {
            Ok(parked) => {
                let mine = parked
                    .iter()
                    .filter(|p| p.consumer_group == self.spec.group)
                    .count();
                #[allow(clippy::cast_precision_loss)]
                metrics::gauge!(m::PROJECTION_PARKED_KEYS, "consumer_group" => self.spec.group.clone())
                    .set(mine as f64);
            }
            Err(e) => {
                tracing::warn!(consumer_group = %self.spec.group, error = %e, "cannot count parked keys")
            }
        }
    }

    /// Gives a delivery back to Pub/Sub for redelivery (confirmed on an exactly-once
    /// subscription; unconfirmed, the message still comes back after its lease).
    pub(crate) fn nack<E>(&self, delivery: Delivery<E>) {
        self.settle(delivery.handler, &delivery.meta.message_id, Settle::Nack);
        self.stats.on_nacked();
    }

    /// Publishes the message to the dead-letter topic with `reason`, then acks it; if the
    /// dead-letter publish fails, nacks it instead so nothing is lost. Returns whether it
    /// was dead-lettered.
    pub(crate) async fn dead_letter(
        &self,
        message: &google_cloud_pubsub::model::Message,
        handler: google_cloud_pubsub::subscriber::handler::Handler,
        reason: &str,
        span: &tracing::Span,
    ) -> bool {
        let attempt = handler.delivery_attempt();
        match self.dead_letters.publish(message, reason, attempt).await {
            Ok(_) => {
                // On the message's processing span: an event of its trace.
                tracing::warn!(
                    parent: span,
                    message_id = %message.message_id,
                    ordering_key = %message.ordering_key,
                    consumer_group = %self.spec.group,
                    delivery_attempt = attempt,
                    reason,
                    "message dead-lettered"
                );
                self.settle(handler, &message.message_id, Settle::Ack);
                metrics::counter!(m::PROJECTION_DEAD_LETTERED_TOTAL).increment(1);
                // Bookkeeping only: the dead letter itself is safe in its topic already.
                match self
                    .dead_letter_log
                    .record(
                        &self.pool,
                        &self.spec.group,
                        &self.spec.subscription,
                        &message.message_id,
                        &message.ordering_key,
                        reason,
                    )
                    .await
                {
                    Ok(open) => self.set_dead_letter_gauge(open),
                    Err(e) => {
                        tracing::warn!(message_id = %message.message_id, consumer_group = %self.spec.group,
                        error = %e, "dead letter not logged; dlq_message_count undercounts")
                    }
                }
                self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                self.stats.on_acked();
                true
            }
            Err(error) => {
                tracing::error!(
                    message_id = %message.message_id,
                    consumer_group = %self.spec.group,
                    %error,
                    "dead-letter publish failed; message nacked for redelivery"
                );
                self.settle(handler, &message.message_id, Settle::Nack);
                self.stats.on_nacked();
                false
            }
        }
    }
}
