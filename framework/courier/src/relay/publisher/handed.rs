//! A row handed to the official client, its result, and what that result means for the relay:
//! shared by key publishers and lone rows.

use super::{message_for, FailureKind, PublisherSettings};
use crate::pubsub::{is_broker_side, is_transient_rpc};
use crate::relay::store::ClaimedRow;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::error::PublishError;
use google_cloud_pubsub::publisher::PublishFuture;
use std::pin::Pin;
use std::time::Duration;

/// A row as handed to the client (with its publish span, closed when it settles).
pub(super) enum Handed {
    Sent(Pin<Box<PublishFuture>>, Option<tracing::Span>),
    /// The fault hook failed it: not handed.
    Injected(String),
    NotTried,
}

impl Handed {
    /// `row` handed to `client` now.
    pub(super) fn send(client: &Publisher, row: &ClaimedRow) -> Self {
        Handed::Sent(
            Box::pin(client.publish(message_for(row))),
            publish_span(row),
        )
    }

    /// Its result, waiting for the acknowledgement until `deadline`.
    pub(super) async fn settle(self, deadline: tokio::time::Instant) -> Settled {
        match self {
            Handed::Sent(future, span) => {
                let result = match tokio::time::timeout_at(deadline, future).await {
                    Ok(Ok(id)) => Settled::Acked(id),
                    Ok(Err(e)) => Settled::Error(e),
                    Err(_) => Settled::TimedOut,
                };
                if let (Some(span), Settled::Acked(id)) = (&span, &result) {
                    span.record("message_id", id.as_str());
                }
                result
            }
            Handed::Injected(error) => Settled::Injected(error),
            Handed::NotTried => Settled::NotTried,
        }
    }
}

/// A handed row's result.
pub(super) enum Settled {
    Acked(String),
    Error(PublishError),
    TimedOut,
    Injected(String),
    NotTried,
}

impl Settled {
    /// The row went to the client and did not get through (it may still be out there).
    pub(super) fn failed_out(&self) -> bool {
        matches!(self, Settled::Error(_) | Settled::TimedOut)
    }
}

/// What a result means for the row.
pub(super) enum Verdict {
    Published(String),
    /// Given back untried: never handed, or refused by the client because an earlier failure
    /// paused the key (`paused`).
    NotTried {
        paused: bool,
    },
    /// `paused`: the client paused the key, so it must be resumed before the key's next row.
    Failed {
        error: String,
        kind: FailureKind,
        paused: bool,
    },
}

/// Judges one row's result, telling the relay's publish limit and metrics: an acknowledgement
/// `latency` after the hand-over, or a failure of the broker's.
pub(super) fn judge(
    settings: &PublisherSettings,
    ordering_key: &str,
    result: Settled,
    latency: Duration,
) -> Verdict {
    let (error, kind, paused) = match result {
        Settled::Acked(message_id) => {
            settings.limit.on_acked(latency);
            metrics::counter!(crate::metrics::OUTBOX_PUBLISH_SUCCESS_TOTAL).increment(1);
            metrics::histogram!(crate::metrics::OUTBOX_PUBLISH_LATENCY)
                .record(latency.as_secs_f64());
            return Verdict::Published(message_id);
        }
        Settled::NotTried => return Verdict::NotTried { paused: false },
        Settled::Error(PublishError::OrderingKeyPaused) => {
            return Verdict::NotTried { paused: true }
        }
        Settled::Error(e) => (
            format!("publish to ordering key {ordering_key} failed: {e}"),
            publish_failure_kind(&e),
            true,
        ),
        Settled::TimedOut => (
            format!(
                "publish to ordering key {ordering_key} not acknowledged within {:?}",
                settings.publish_timeout
            ),
            FailureKind::Broker,
            false,
        ),
        Settled::Injected(error) => (error, FailureKind::Transient, false),
    };
    if kind == FailureKind::Broker {
        settings.limit.on_broker_failure();
        metrics::counter!(crate::metrics::OUTBOX_BROKER_FAILURES_TOTAL).increment(1);
    }
    Verdict::Failed {
        error,
        kind,
        paused,
    }
}

/// The span of a row's publish, for a row written in a trace (its `traceparent`): a span of
/// its own, linked to the write's, from the hand-over until the acknowledgement. Rows written
/// outside a trace get none, so untraced writers (the load harness) pay nothing for it.
fn publish_span(row: &ClaimedRow) -> Option<tracing::Span> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let traceparent = row.optional_attributes.get("traceparent")?.as_str()?;
    let write = crate::telemetry::extract_context(|name| {
        (name == "traceparent").then(|| traceparent.to_string())
    });
    let span = tracing::info_span!(
        "outbox.publish",
        event_id = %row.event_id,
        ordering_key = %row.aggregate_id,
        topic = %row.topic,
        version = row.version,
        message_id = tracing::field::Empty,
    );
    span.add_link(write.span().span_context().clone());
    Some(span)
}

/// Which kind of failure a failed publish is (see [`FailureKind`]).
fn publish_failure_kind(error: &PublishError) -> FailureKind {
    match error {
        PublishError::Rpc(rpc) if is_broker_side(rpc) => FailureKind::Broker,
        PublishError::Rpc(rpc) if is_transient_rpc(rpc) => FailureKind::Transient,
        PublishError::Rpc(_) => FailureKind::Permanent,
        // The client shut down under the row (a paused key is handled before this): not the
        // row's doing either.
        _ => FailureKind::Broker,
    }
}
