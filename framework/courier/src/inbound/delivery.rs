//! What the receiver hands a projector: the event's metadata from the attributes, the decoded
//! payload, the original message (kept for dead-lettering) and the handle that acks it.

use crate::outbox::attributes;
use chrono::{DateTime, Utc};
use google_cloud_pubsub::model::Message;
use google_cloud_pubsub::subscriber::handler::Handler;
use std::collections::HashMap;
use std::time::Instant;
use uuid::Uuid;

/// The attributes every event carries, parsed, plus what Pub/Sub says about the delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct EventMeta {
    pub event_id: Uuid,
    pub event_type: String,
    pub aggregate_id: String,
    pub aggregate_type: String,
    pub version: i64,
    pub occurred_at: DateTime<Utc>,
    pub schema_version: i32,
    pub message_id: String,
    pub ordering_key: String,
    pub publish_time: DateTime<Utc>,
    /// When this process received the message (its receiver parsed it): from `publish_time`
    /// to here is the broker's hop, from here to the commit the consumer's.
    pub received_at: DateTime<Utc>,
    /// 1, 2, … when the subscription has a dead-letter policy; `None` otherwise.
    pub delivery_attempt: Option<i32>,
}

/// Why a message cannot become an event. Always permanent: redelivery cannot fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("attribute {0} is missing")]
    MissingAttribute(&'static str),
    #[error("attribute {name} is invalid: {reason}")]
    InvalidAttribute { name: &'static str, reason: String },
    #[error("unknown schema version {0}")]
    UnknownSchemaVersion(i32),
    #[error("payload cannot be decoded as {type_name}: {reason}")]
    Undecodable {
        type_name: &'static str,
        reason: String,
    },
}

impl EventMeta {
    /// Parses the required attributes of `message`.
    pub fn parse(message: &Message, delivery_attempt: Option<i32>) -> Result<Self, Rejection> {
        let attrs = &message.attributes;
        let event_id = required(attrs, attributes::EVENT_ID)?;
        let version = required(attrs, attributes::VERSION)?;
        let occurred_at = required(attrs, attributes::OCCURRED_AT)?;
        let schema_version = required(attrs, attributes::SCHEMA_VERSION)?;
        let invalid = |name, reason: String| Rejection::InvalidAttribute { name, reason };
        let meta = EventMeta {
            event_id: event_id
                .parse()
                .map_err(|e| invalid(attributes::EVENT_ID, format!("not a UUID: {e}")))?,
            event_type: required(attrs, attributes::EVENT_TYPE)?.to_string(),
            aggregate_id: required(attrs, attributes::AGGREGATE_ID)?.to_string(),
            aggregate_type: required(attrs, attributes::AGGREGATE_TYPE)?.to_string(),
            version: version
                .parse()
                .ok()
                .filter(|v| *v >= 1)
                .ok_or_else(|| invalid(attributes::VERSION, format!("{version:?} is not ≥ 1")))?,
            occurred_at: DateTime::parse_from_rfc3339(occurred_at)
                .map_err(|e| invalid(attributes::OCCURRED_AT, format!("not RFC 3339: {e}")))?
                .with_timezone(&Utc),
            schema_version: attributes::parse_schema_version(schema_version).ok_or_else(|| {
                invalid(
                    attributes::SCHEMA_VERSION,
                    format!("{schema_version:?} is not v1, v2, …"),
                )
            })?,
            message_id: message.message_id.clone(),
            ordering_key: message.ordering_key.clone(),
            publish_time: message
                .publish_time
                .as_ref()
                .and_then(|t| DateTime::from_timestamp(t.seconds(), u32::try_from(t.nanos()).ok()?))
                .unwrap_or_else(Utc::now),
            received_at: Utc::now(),
            delivery_attempt,
        };
        Ok(meta)
    }

    /// The key a projector serializes on: the ordering key, else the aggregate id.
    pub fn routing_key(&self) -> &str {
        if self.ordering_key.is_empty() {
            &self.aggregate_id
        } else {
            &self.ordering_key
        }
    }
}

fn required<'a>(
    attrs: &'a HashMap<String, String>,
    name: &'static str,
) -> Result<&'a str, Rejection> {
    match attrs.get(name).map(String::as_str) {
        Some(value) if !value.trim().is_empty() => Ok(value),
        _ => Err(Rejection::MissingAttribute(name)),
    }
}

/// A message's share of its stream's flow control: held, never read; dropping it frees the
/// stream's slots.
#[derive(Debug)]
pub struct FlowPermit {
    _message: tokio::sync::OwnedSemaphorePermit,
    _bytes: tokio::sync::OwnedSemaphorePermit,
}

impl FlowPermit {
    pub fn new(
        message: tokio::sync::OwnedSemaphorePermit,
        bytes: tokio::sync::OwnedSemaphorePermit,
    ) -> Self {
        Self {
            _message: message,
            _bytes: bytes,
        }
    }
}

/// One received event on its way to its projector.
#[derive(Debug)]
pub struct Delivery<E> {
    pub meta: EventMeta,
    pub event: E,
    /// The message as received, for the dead-letter topic.
    pub message: Message,
    /// Acks or nacks the message; dropping it nacks.
    pub handler: Handler,
    pub received_at: Instant,
    /// The event's processing span ([`processing_span`]), open until the delivery is settled
    /// and dropped.
    pub span: tracing::Span,
    /// The stream's flow-control slots (one message, its bytes), freed when the delivery is
    /// settled and dropped.
    pub _flow_permit: FlowPermit,
}

/// The span of a message's processing by `consumer_group`: a child of the write's trace (its
/// `traceparent` attribute), with what an operator looks an event up by. Dead-lettering is an
/// event on it.
pub fn processing_span(
    consumer_group: &str,
    message: &Message,
    delivery_attempt: Option<i32>,
) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let span = tracing::info_span!(
        "projection.process",
        event_id = message.attributes.get("event_id").map(String::as_str).unwrap_or_default(),
        message_id = %message.message_id,
        ordering_key = %message.ordering_key,
        consumer_group,
        delivery_attempt = delivery_attempt.unwrap_or(1),
    );
    // A message written outside a trace starts none here, and costs no propagator call.
    if message.attributes.contains_key("traceparent") {
        let parent =
            crate::telemetry::extract_context(|name| message.attributes.get(name).cloned());
        // Fails only without the trace context layer, and then there is no trace to continue.
        let _ = span.set_parent(parent);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(pairs: &[(&str, &str)]) -> Message {
        Message::new()
            .set_message_id("m-1")
            .set_ordering_key("video-1")
            .set_attributes(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    fn valid() -> Vec<(&'static str, &'static str)> {
        vec![
            ("event_id", "0190a8d4-6f6c-7c3e-9d8e-1a2b3c4d5e6f"),
            ("event_type", "video.created"),
            ("aggregate_id", "video-1"),
            ("aggregate_type", "video"),
            ("version", "3"),
            ("occurred_at", "2026-11-23T10:00:00.123456Z"),
            ("schema_version", "v1"),
        ]
    }

    #[test]
    fn parses_required_attributes() {
        let meta = EventMeta::parse(&message(&valid()), Some(2)).expect("valid");
        assert_eq!(meta.version, 3);
        assert_eq!(meta.schema_version, 1);
        assert_eq!(meta.routing_key(), "video-1");
        assert_eq!(meta.delivery_attempt, Some(2));
        assert_eq!(meta.occurred_at.timestamp_subsec_micros(), 123_456);
    }

    #[test]
    fn names_the_missing_or_bad_attribute() {
        for (name, bad) in [
            ("event_id", Some("not-a-uuid")),
            ("version", Some("0")),
            ("version", Some("x")),
            ("occurred_at", Some("yesterday")),
            ("schema_version", Some("1.5")),
            ("schema_version", Some("v0")),
            ("event_type", None),
            ("aggregate_id", Some(" ")),
        ] {
            let attrs: Vec<(&str, &str)> = valid()
                .into_iter()
                .filter(|(k, _)| *k != name)
                .chain(bad.map(|b| (name, b)))
                .collect();
            let err = EventMeta::parse(&message(&attrs), None).expect_err(name);
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
    }
}
