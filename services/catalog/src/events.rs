//! A change of a video as an outbox event: the `catalog.v1.Event` envelope, prost-encoded,
//! with the video id as aggregate id (and so as ordering key).

use courier::outbox::NewEvent;
use courier_proto::catalog::v1::{event::Payload, Event};
use courier_proto::catalog::{AGGREGATE_TYPE, TOPIC};
use prost::Message;
use uuid::Uuid;

/// The event that takes video `video_id` to `version`.
pub fn video_event(video_id: Uuid, version: i64, payload: Payload) -> NewEvent {
    let event_type = match &payload {
        Payload::VideoCreated(_) => "video.created",
        Payload::VideoUpdated(_) => "video.updated",
        Payload::VideoDeleted(_) => "video.deleted",
        Payload::VideoSnapshot(_) => "video.snapshotted",
    };
    let mut event = NewEvent::new(
        TOPIC,
        AGGREGATE_TYPE,
        video_id.to_string(),
        event_type,
        version,
        Vec::new(),
    )
    .with_source_service(crate::NAME)
    .with_source_version(env!("CARGO_PKG_VERSION"));
    event.payload = Event {
        event_id: event.event_id.to_string(),
        event_type: event.event_type.clone(),
        aggregate_id: event.aggregate_id.clone(),
        aggregate_type: event.aggregate_type.clone(),
        version,
        occurred_at: Some(courier_proto::timestamp(event.occurred_at)),
        payload: Some(payload),
    }
    .encode_to_vec();
    event
}
