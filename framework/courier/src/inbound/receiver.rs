//! Receiver: the StreamingPull streams of one subscription, through the official client, with
//! its flow control (max outstanding messages and bytes per stream) and lease extension.
//!
//! Flow control is enforced here too, not only asked of the server: a stream takes a permit
//! (of `max_outstanding_messages`) before each `next()` and permits for the message's bytes
//! (of `max_outstanding_bytes`) after it, and they live in the delivery until it is settled. The emulator ignores the server-side setting (9,000 outstanding were
//! seen for a limit of 1,000); with the permits, unread messages stay in the transport's
//! bounded window instead of in memory (P7).
//!
//! Each stream runs as one long-lived future that is never cancelled mid-`next()` while the
//! receiver lives (the emulator strands messages on cancelled streams). A message is turned
//! into a [`Delivery`] — attributes checked, payload decoded, schema version accepted — and
//! sent to the router with `send().await`, so a full router mailbox stops the stream from
//! pulling. A message that cannot become an event is dead-lettered here. When a stream ends
//! (the server closed it, an error) it alone is reopened after a backoff; when reopening keeps
//! bringing nothing (the subscription is gone) the receiver stops, and its supervisor restarts
//! it with backoff or escalates.

use crate::backoff::Backoff;
use crate::inbound::delivery::{processing_span, Delivery, EventMeta, FlowPermit, Rejection};
use crate::inbound::messages::Deliver;
use crate::inbound::parts::ConsumerParts;
use crate::inbound::projection::Projection;
use crate::inbound::router::ProjectorRouter;
use crate::supervision::Supervision;
use actix::prelude::*;
use google_cloud_pubsub::client::Subscriber;
use google_cloud_pubsub::model::Message;
use google_cloud_pubsub::subscriber::handler::Handler as AckHandler;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Receiver<P: Projection> {
    parts: Arc<ConsumerParts<P>>,
    router: Addr<ProjectorRouter<P>>,
    supervision: Supervision,
}

impl<P: Projection> Receiver<P> {
    pub fn new(
        parts: Arc<ConsumerParts<P>>,
        router: Addr<ProjectorRouter<P>>,
        supervision: Supervision,
    ) -> Self {
        Self {
            parts,
            router,
            supervision,
        }
    }

    fn open_streams(&mut self, ctx: &mut Context<Self>) {
        let parts = self.parts.clone();
        let delay = std::mem::take(&mut self.supervision.start_delay);
        ctx.wait(
            async move {
                tokio::time::sleep(delay).await;
                parts.pubsub.subscriber().await
            }
            .into_actor(self)
            .map(|subscriber, act, ctx| match subscriber {
                Ok(subscriber) => {
                    let subscriber = Arc::new(subscriber);
                    for stream in 0..act.parts.settings.streams {
                        let run = keep_stream_open(
                            act.parts.clone(),
                            subscriber.clone(),
                            act.router.clone(),
                            stream,
                        );
                        ctx.spawn(run.into_actor(act).map(move |(), act, ctx| {
                            tracing::warn!(
                                subscription = %act.parts.spec.subscription,
                                stream,
                                "stream keeps failing; restarting the receiver"
                            );
                            ctx.stop();
                        }));
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "cannot build subscriber; restarting the receiver");
                    ctx.stop();
                }
            }),
        );
    }
}

impl<P: Projection> Actor for Receiver<P> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.open_streams(ctx);
    }
}

impl<P: Projection> Supervised for Receiver<P> {
    fn restarting(&mut self, _ctx: &mut Self::Context) {
        if !self.supervision.restarting() {
            // Escalated: the handler ended the process, or (in tests) recorded it; receive
            // nothing more.
            self.supervision.start_delay = Duration::from_secs(u64::from(u32::MAX));
        }
    }
}

/// Waits between reopenings of a stream that ended.
const REOPEN_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
/// Reopenings in a row without a message before the receiver gives up (and its supervisor
/// restarts it, or escalates).
const MAX_FRUITLESS_REOPENS: u32 = 8;

/// Runs one stream, reopening it alone when it ends: the other streams go on untouched
/// (cancelling them would strand their messages on the emulator, and costs real Pub/Sub a
/// round of redeliveries). Returns when reopening stopped helping.
async fn keep_stream_open<P: Projection>(
    parts: Arc<ConsumerParts<P>>,
    subscriber: Arc<Subscriber>,
    router: Addr<ProjectorRouter<P>>,
    stream: u32,
) {
    let mut fruitless = 0u32;
    loop {
        let received = run_stream(parts.clone(), subscriber.clone(), router.clone()).await;
        fruitless = if received > 0 { 0 } else { fruitless + 1 };
        if fruitless > MAX_FRUITLESS_REOPENS {
            return;
        }
        let delay = REOPEN_BACKOFF.delay(fruitless);
        tracing::warn!(subscription = %parts.spec.subscription, stream, received,
            reopen_in_ms = delay.as_millis() as u64, "stream ended; reopening it");
        tokio::time::sleep(delay).await;
    }
}

/// Pulls from one stream until it ends; returns how many messages it received.
async fn run_stream<P: Projection>(
    parts: Arc<ConsumerParts<P>>,
    subscriber: Arc<Subscriber>,
    router: Addr<ProjectorRouter<P>>,
) -> u64 {
    let settings = &parts.settings;
    let mut stream = subscriber
        .subscribe(parts.pubsub.subscription_path(&parts.spec.subscription))
        .set_max_outstanding_messages(i64::from(settings.max_outstanding_messages))
        .set_max_outstanding_bytes(
            i64::try_from(settings.max_outstanding_bytes).unwrap_or(i64::MAX),
        )
        .set_max_lease_extension(Duration::from_secs(settings.lease_extension_secs))
        .build();
    let messages = Arc::new(tokio::sync::Semaphore::new(
        settings.max_outstanding_messages as usize,
    ));
    // Validated to fit in u32, the unit `acquire_many` counts in.
    let max_bytes = u32::try_from(settings.max_outstanding_bytes).unwrap_or(u32::MAX);
    let bytes = Arc::new(tokio::sync::Semaphore::new(max_bytes as usize));
    // Resolved once: recorded for every message.
    let flow_control_wait = metrics::histogram!(
        crate::metrics::BACKPRESSURE_WAIT_SECONDS, "stage" => "receiver_flow_control");
    let router_wait =
        metrics::histogram!(crate::metrics::BACKPRESSURE_WAIT_SECONDS, "stage" => "router_mailbox");
    let mut received = 0u64;
    loop {
        let waiting = Instant::now();
        let Ok(message_permit) = messages.clone().acquire_owned().await else {
            return received;
        };
        flow_control_wait.record(waiting.elapsed().as_secs_f64());
        let Some(item) = stream.next().await else {
            return received;
        };
        let (message, handler) = match item {
            Ok(item) => item,
            Err(error) => {
                tracing::warn!(subscription = %parts.spec.subscription, %error, "stream failed");
                return received;
            }
        };
        received += 1;
        parts.stats.on_received();
        // A message bigger than the whole budget waits for everything else, then goes alone.
        let size = u32::try_from(message.data.len())
            .unwrap_or(u32::MAX)
            .clamp(1, max_bytes);
        let Ok(bytes_permit) = bytes.clone().acquire_many_owned(size).await else {
            return received;
        };
        let flow_permit = FlowPermit::new(message_permit, bytes_permit);
        let span = processing_span(&parts.spec.group, &message, handler.delivery_attempt());
        match decode(&parts.projection, &message, handler.delivery_attempt()) {
            Ok((meta, event)) => {
                let delivery = Delivery {
                    meta,
                    event,
                    message,
                    handler,
                    received_at: Instant::now(),
                    span,
                    _flow_permit: flow_permit,
                };
                let waiting = Instant::now();
                let sent = router.send(Deliver(delivery)).await;
                router_wait.record(waiting.elapsed().as_secs_f64());
                if sent.is_err() {
                    // The router is restarting: the delivery was dropped, which nacks it.
                    tracing::warn!("router unavailable; message nacked");
                }
            }
            Err(rejection) => {
                reject(&parts, message, handler, rejection, &span).await;
                drop(flow_permit);
            }
        }
    }
}

/// Checks the attributes and the schema version, and decodes the payload.
pub fn decode<P: Projection>(
    projection: &P,
    message: &Message,
    delivery_attempt: Option<i32>,
) -> Result<(EventMeta, P::Event), Rejection> {
    let meta = EventMeta::parse(message, delivery_attempt)?;
    if !projection.supports_schema_version(meta.schema_version) {
        return Err(Rejection::UnknownSchemaVersion(meta.schema_version));
    }
    let event = <P::Event as prost::Message>::decode(message.data.clone()).map_err(|e| {
        Rejection::Undecodable {
            type_name: std::any::type_name::<P::Event>(),
            reason: e.to_string(),
        }
    })?;
    Ok((meta, event))
}

async fn reject<P: Projection>(
    parts: &ConsumerParts<P>,
    message: Message,
    handler: AckHandler,
    rejection: Rejection,
    span: &tracing::Span,
) {
    metrics::counter!(crate::metrics::PROJECTION_PROCESS_ERROR_TOTAL).increment(1);
    parts
        .dead_letter(&message, handler, &rejection.to_string(), span)
        .await;
}
