//! The Pub/Sub message a claimed row is published as.

use crate::outbox::attributes::{self, RequiredFields};
use crate::relay::store::ClaimedRow;
use google_cloud_pubsub::model::Message as PubSubMessage;

/// The message for `row`: payload, ordering key and attributes.
pub fn message_for(row: &ClaimedRow) -> PubSubMessage {
    attributes::message(
        RequiredFields {
            event_id: row.event_id,
            event_type: &row.event_type,
            aggregate_id: &row.aggregate_id,
            aggregate_type: &row.aggregate_type,
            version: row.version,
            occurred_at: row.occurred_at,
            schema_version: row.schema_version,
        },
        attributes::stored(&row.optional_attributes),
        row.payload.clone(),
    )
}
