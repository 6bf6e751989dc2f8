//! The Pub/Sub attributes of an outbox event (docs/design.md; every attribute in docs/writing-a-service.md).
//!
//! Consumers route and deduplicate on these without decoding the payload, so names and formats
//! are a contract:
//! - `event_id` (UUID), `event_type` (lowercase and dotted, named in the past tense:
//!   `video.created`), `aggregate_id`, `aggregate_type`, `version` (decimal, ≥ 1),
//!   `occurred_at` (RFC 3339, UTC, microseconds), `schema_version` (`v1`, `v2`, …; the outbox
//!   column stays an integer);
//! - when set: `correlation_id`, `causation_id`, `user_id`, `source_service`,
//!   `source_version`, `trace_id`, `span_id`, `traceparent` (W3C trace context of the write:
//!   32 and 16 lowercase hex digits, and the whole `traceparent` header) ([`OPTIONAL`]).

use chrono::{DateTime, SecondsFormat, Utc};
use google_cloud_pubsub::model::Message;
use std::collections::BTreeMap;

pub const EVENT_ID: &str = "event_id";
pub const EVENT_TYPE: &str = "event_type";
pub const AGGREGATE_ID: &str = "aggregate_id";
pub const AGGREGATE_TYPE: &str = "aggregate_type";
pub const VERSION: &str = "version";
pub const OCCURRED_AT: &str = "occurred_at";
pub const SCHEMA_VERSION: &str = "schema_version";

/// The attributes every event carries.
pub const REQUIRED: [&str; 7] = [
    EVENT_ID,
    EVENT_TYPE,
    AGGREGATE_ID,
    AGGREGATE_TYPE,
    VERSION,
    OCCURRED_AT,
    SCHEMA_VERSION,
];

/// The optional attributes an event may carry.
pub const OPTIONAL: [&str; 8] = [
    "correlation_id",
    "causation_id",
    "user_id",
    "source_service",
    "source_version",
    "trace_id",
    "span_id",
    "traceparent",
];

/// `schema_version` on the wire: `v1` for 1.
pub fn format_schema_version(version: i32) -> String {
    format!("v{version}")
}

/// `v1` → 1. A bare `1` is accepted too: what relays published before the `v` prefix.
pub fn parse_schema_version(value: &str) -> Option<i32> {
    value
        .strip_prefix('v')
        .unwrap_or(value)
        .parse()
        .ok()
        .filter(|v| *v >= 1)
}

/// Whether `name` follows the event-type convention: lowercase words of letters, digits and
/// `_`, at least two, joined by dots (`video.created`, `watch.progressed`). The past tense is
/// the convention's other half, which no pattern checks.
pub fn is_event_type(name: &str) -> bool {
    let mut words = 0;
    let well_formed = name.split('.').all(|word| {
        words += 1;
        word.starts_with(|c: char| c.is_ascii_lowercase())
            && word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    });
    well_formed && words >= 2
}

/// RFC 3339 with microseconds (PostgreSQL's precision), so the value round-trips exactly.
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The fields every event has, in attribute form.
pub struct RequiredFields<'a> {
    pub event_id: uuid::Uuid,
    pub event_type: &'a str,
    pub aggregate_id: &'a str,
    pub aggregate_type: &'a str,
    pub version: i64,
    pub occurred_at: DateTime<Utc>,
    pub schema_version: i32,
}

/// The Pub/Sub message an event is published as: its payload, its aggregate id as the
/// ordering key, and the attributes of `fields` plus the optional `(key, value)` pairs.
pub fn message<'a>(
    fields: RequiredFields<'_>,
    optional: impl IntoIterator<Item = (&'a str, &'a str)>,
    payload: Vec<u8>,
) -> Message {
    let ordering_key = fields.aggregate_id.to_owned();
    Message::new()
        .set_data(payload)
        .set_ordering_key(ordering_key)
        .set_attributes(build(fields, optional))
}

/// The optional attributes of an outbox row's `attributes` column as `(key, value)` pairs (JSON
/// strings; other values are left out).
pub fn stored(
    optional: &serde_json::Map<String, serde_json::Value>,
) -> impl Iterator<Item = (&str, &str)> {
    optional
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
}

/// Builds the attribute map from the required fields plus optional `(key, value)` pairs.
pub fn build<'a>(
    fields: RequiredFields<'_>,
    optional: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, String> {
    let mut attributes = BTreeMap::from([
        (EVENT_ID.to_string(), fields.event_id.to_string()),
        (EVENT_TYPE.to_string(), fields.event_type.to_string()),
        (AGGREGATE_ID.to_string(), fields.aggregate_id.to_string()),
        (
            AGGREGATE_TYPE.to_string(),
            fields.aggregate_type.to_string(),
        ),
        (VERSION.to_string(), fields.version.to_string()),
        (OCCURRED_AT.to_string(), format_time(fields.occurred_at)),
        (
            SCHEMA_VERSION.to_string(),
            format_schema_version(fields.schema_version),
        ),
    ]);
    attributes.extend(
        optional
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    attributes
}
