//! The Pub/Sub attributes of an outbox event (DESIGN.md §2, Publisher).
//!
//! Consumers route and deduplicate on these without decoding the payload, so the names are a
//! contract: `event_id, event_type, aggregate_id, aggregate_type, version, occurred_at,
//! schema_version`, plus `correlation_id, causation_id, trace_id, source_service` when set.

use chrono::{DateTime, SecondsFormat, Utc};
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
            fields.schema_version.to_string(),
        ),
    ]);
    attributes.extend(
        optional
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    attributes
}
