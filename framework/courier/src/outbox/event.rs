//! The event a service appends, and its validation against Pub/Sub's limits.
//!
//! Everything is checked before anything is written, so a bad event never reaches the outbox
//! (P8) and never becomes a row the relay could not publish.

use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use uuid::Uuid;

/// Pub/Sub's limit on a published message (data plus attributes), in bytes.
pub const MAX_MESSAGE_BYTES: usize = 10_000_000;
/// Pub/Sub's limit on an attribute key, in bytes.
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 256;
/// Pub/Sub's limit on an attribute value (and on an ordering key), in bytes.
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;

/// One domain event to append to the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Unique id; consumers deduplicate on it. Defaults to a time-ordered UUIDv7.
    pub event_id: Uuid,
    /// Topic id (not the full path), e.g. `catalog.video.events`.
    pub topic: String,
    pub aggregate_type: String,
    /// Also the Pub/Sub ordering key: one aggregate's events stay in order.
    pub aggregate_id: String,
    pub event_type: String,
    /// The aggregate's version after this event; 1 for the first.
    pub version: i64,
    /// Version of the payload schema; consumers refuse majors they do not know.
    pub schema_version: i32,
    /// The encoded payload (prost).
    pub payload: Vec<u8>,
    pub occurred_at: DateTime<Utc>,
    pub correlation_id: Option<String>,
    pub causation_id: Option<String>,
    /// The user on whose behalf the event happened.
    pub user_id: Option<String>,
    pub source_service: Option<String>,
    /// The version of the service that wrote the event.
    pub source_version: Option<String>,
    /// W3C trace context of the write (`trace_id` 32 hex digits, `span_id` 16, `traceparent`
    /// the whole header); `Outbox::append` fills them from the current span when unset.
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub traceparent: Option<String>,
}

impl NewEvent {
    /// An event with a fresh id, schema version 1, occurred now, no optional attributes.
    pub fn new(
        topic: impl Into<String>,
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        version: i64,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            event_id: Uuid::now_v7(),
            topic: topic.into(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            version,
            schema_version: 1,
            payload: payload.into(),
            occurred_at: Utc::now(),
            correlation_id: None,
            causation_id: None,
            user_id: None,
            source_service: None,
            source_version: None,
            trace_id: None,
            span_id: None,
            traceparent: None,
        }
    }

    pub fn with_schema_version(mut self, schema_version: i32) -> Self {
        self.schema_version = schema_version;
        self
    }
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }
    pub fn with_causation_id(mut self, id: impl Into<String>) -> Self {
        self.causation_id = Some(id.into());
        self
    }
    pub fn with_trace_id(mut self, id: impl Into<String>) -> Self {
        self.trace_id = Some(id.into());
        self
    }
    pub fn with_source_service(mut self, name: impl Into<String>) -> Self {
        self.source_service = Some(name.into());
        self
    }
    pub fn with_user_id(mut self, id: impl Into<String>) -> Self {
        self.user_id = Some(id.into());
        self
    }
    pub fn with_source_version(mut self, version: impl Into<String>) -> Self {
        self.source_version = Some(version.into());
        self
    }
    pub fn with_span_id(mut self, id: impl Into<String>) -> Self {
        self.span_id = Some(id.into());
        self
    }
    pub fn with_traceparent(mut self, header: impl Into<String>) -> Self {
        self.traceparent = Some(header.into());
        self
    }

    /// Fills the trace context left unset from `trace` (the writer's span).
    pub(crate) fn inherit_trace(&mut self, trace: &crate::telemetry::TraceIds) {
        if self.trace_id.is_none() && self.span_id.is_none() && self.traceparent.is_none() {
            self.trace_id = Some(trace.trace_id.clone());
            self.span_id = Some(trace.span_id.clone());
            self.traceparent = Some(trace.traceparent.clone());
        }
    }

    /// The attributes this event will be published with.
    pub fn attributes(&self) -> BTreeMap<String, String> {
        crate::outbox::attributes::build(self.required_fields(), self.optional_attributes())
    }

    /// The Pub/Sub message the relay will publish this event as (payload, ordering key,
    /// attributes).
    pub fn message(&self) -> google_cloud_pubsub::model::Message {
        crate::outbox::attributes::message(
            self.required_fields(),
            self.optional_attributes(),
            self.payload.clone(),
        )
    }

    fn required_fields(&self) -> crate::outbox::attributes::RequiredFields<'_> {
        crate::outbox::attributes::RequiredFields {
            event_id: self.event_id,
            event_type: &self.event_type,
            aggregate_id: &self.aggregate_id,
            aggregate_type: &self.aggregate_type,
            version: self.version,
            occurred_at: self.occurred_at,
            schema_version: self.schema_version,
        }
    }

    /// The optional attributes, as stored in the row's `attributes` column.
    pub fn optional_attributes(&self) -> BTreeMap<&'static str, &str> {
        [
            ("correlation_id", &self.correlation_id),
            ("causation_id", &self.causation_id),
            ("user_id", &self.user_id),
            ("source_service", &self.source_service),
            ("source_version", &self.source_version),
            ("trace_id", &self.trace_id),
            ("span_id", &self.span_id),
            ("traceparent", &self.traceparent),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect()
    }

    /// Checks the event against the framework's rules and Pub/Sub's limits.
    pub fn validate(&self) -> Result<(), InvalidEvent> {
        let invalid = |field: &'static str, reason: String| Err(InvalidEvent { field, reason });
        if let Err(reason) = check_topic_id(&self.topic) {
            return invalid("topic", reason);
        }
        for (field, value) in [
            ("aggregate_type", &self.aggregate_type),
            ("aggregate_id", &self.aggregate_id),
            ("event_type", &self.event_type),
        ] {
            if value.trim().is_empty() {
                return invalid(field, "must not be empty".into());
            }
        }
        if !crate::outbox::attributes::is_event_type(&self.event_type) {
            return invalid(
                "event_type",
                format!(
                    "{:?} is not a lowercase, dotted name like video.created",
                    self.event_type
                ),
            );
        }
        if self.version < 1 {
            return invalid(
                "version",
                format!("must be at least 1, got {}", self.version),
            );
        }
        if self.schema_version < 1 {
            return invalid(
                "schema_version",
                format!("must be at least 1, got {}", self.schema_version),
            );
        }
        let attributes = self.attributes();
        for (key, value) in &attributes {
            if key.len() > MAX_ATTRIBUTE_KEY_BYTES {
                return invalid(
                    "attributes",
                    format!("key {key} exceeds {MAX_ATTRIBUTE_KEY_BYTES} bytes"),
                );
            }
            if value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
                return invalid(
                    attribute_field(key),
                    format!(
                        "is {} bytes; Pub/Sub allows at most {MAX_ATTRIBUTE_VALUE_BYTES}",
                        value.len()
                    ),
                );
            }
        }
        let attribute_bytes: usize = attributes.iter().map(|(k, v)| k.len() + v.len()).sum();
        let total = self.payload.len() + attribute_bytes;
        if total > MAX_MESSAGE_BYTES {
            return invalid(
                "payload",
                format!(
                    "message would be {total} bytes (payload {} + attributes {attribute_bytes}); \
                     Pub/Sub allows at most {MAX_MESSAGE_BYTES}",
                    self.payload.len()
                ),
            );
        }
        Ok(())
    }
}

/// Maps an attribute key back to the event field it came from, for error messages.
fn attribute_field(key: &str) -> &'static str {
    match key {
        "event_type" => "event_type",
        "aggregate_id" => "aggregate_id",
        "aggregate_type" => "aggregate_type",
        "correlation_id" => "correlation_id",
        "causation_id" => "causation_id",
        "user_id" => "user_id",
        "source_service" => "source_service",
        "source_version" => "source_version",
        "trace_id" => "trace_id",
        "span_id" => "span_id",
        "traceparent" => "traceparent",
        _ => "attributes",
    }
}

/// Pub/Sub topic ids: 3–255 characters, start with a letter, letters, digits and `-_.~+%`,
/// not starting with `goog`.
pub fn check_topic_id(topic: &str) -> Result<(), String> {
    if !(3..=255).contains(&topic.len()) {
        return Err(format!("{topic:?} must be 3 to 255 characters"));
    }
    if !topic.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err(format!("{topic:?} must start with a letter"));
    }
    if topic.to_ascii_lowercase().starts_with("goog") {
        return Err(format!("{topic:?} must not start with \"goog\""));
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.~+%".contains(*c)))
    {
        return Err(format!(
            "{topic:?} contains {c:?}; allowed are letters, digits and -_.~+%"
        ));
    }
    Ok(())
}

/// An event that must not be appended, naming the field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event field {field} is invalid: {reason}")]
pub struct InvalidEvent {
    pub field: &'static str,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> NewEvent {
        NewEvent::new(
            "catalog.video.events",
            "video",
            "v-1",
            "video.created",
            1,
            vec![1, 2, 3],
        )
    }

    #[test]
    fn a_normal_event_is_valid() {
        assert_eq!(event().with_correlation_id("c-1").validate(), Ok(()));
    }

    #[test]
    fn each_rule_names_its_field() {
        let cases: Vec<(NewEvent, &str)> = vec![
            (
                NewEvent {
                    aggregate_id: " ".into(),
                    ..event()
                },
                "aggregate_id",
            ),
            (
                NewEvent {
                    aggregate_type: String::new(),
                    ..event()
                },
                "aggregate_type",
            ),
            (
                NewEvent {
                    event_type: String::new(),
                    ..event()
                },
                "event_type",
            ),
            (
                NewEvent {
                    version: 0,
                    ..event()
                },
                "version",
            ),
            (
                NewEvent {
                    schema_version: 0,
                    ..event()
                },
                "schema_version",
            ),
            (
                NewEvent {
                    topic: "ab".into(),
                    ..event()
                },
                "topic",
            ),
            (
                NewEvent {
                    topic: "9topic".into(),
                    ..event()
                },
                "topic",
            ),
            (
                NewEvent {
                    topic: "googthings".into(),
                    ..event()
                },
                "topic",
            ),
            (
                NewEvent {
                    topic: "bad/topic".into(),
                    ..event()
                },
                "topic",
            ),
            (
                NewEvent {
                    aggregate_id: "k".repeat(1025),
                    ..event()
                },
                "aggregate_id",
            ),
            (event().with_trace_id("t".repeat(2000)), "trace_id"),
            (
                NewEvent {
                    payload: vec![0; MAX_MESSAGE_BYTES],
                    ..event()
                },
                "payload",
            ),
        ];
        for (event, field) in cases {
            let err = event.validate().expect_err(field);
            assert_eq!(err.field, field, "{err}");
        }
    }

    #[test]
    fn payload_just_under_the_limit_is_accepted() {
        let mut e = event();
        let attribute_bytes: usize = e.attributes().iter().map(|(k, v)| k.len() + v.len()).sum();
        e.payload = vec![0; MAX_MESSAGE_BYTES - attribute_bytes];
        assert_eq!(e.validate(), Ok(()));
    }
}
