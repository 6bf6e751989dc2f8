//! A document's state at a version as an outbox event: `video.indexed` when the video can be
//! found, `video.unindexed` when it cannot, caused by the catalog event that made it so.

use crate::contract::v1::{event::Payload, Event, VideoIndexed, VideoUnindexed};
use crate::contract::{AGGREGATE_TYPE, TOPIC};
use courier::inbound::EventMeta;
use courier::outbox::NewEvent;
use prost::Message;
use uuid::Uuid;

/// A video's searchable state after the catalog event `cause` was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub video_id: Uuid,
    pub title: String,
    /// `draft`, `published` or `deleted`.
    pub status: String,
}

/// The event saying whether `document` can be found from `cause`'s version on. It has the
/// cause's version and names the cause, so a replay of the cause appends nothing
/// (`Outbox` skips a cause's version it already has).
pub fn document_event(cause: &EventMeta, document: &Document) -> NewEvent {
    let video_id = document.video_id.to_string();
    let payload = if document.status == "published" {
        Payload::VideoIndexed(VideoIndexed {
            video_id: video_id.clone(),
            title: document.title.clone(),
        })
    } else {
        Payload::VideoUnindexed(VideoUnindexed {
            video_id: video_id.clone(),
            reason: document.status.clone(),
        })
    };
    let event_type = match payload {
        Payload::VideoIndexed(_) => "video.indexed",
        Payload::VideoUnindexed(_) => "video.unindexed",
    };
    let mut event = NewEvent::new(
        TOPIC,
        AGGREGATE_TYPE,
        video_id,
        event_type,
        cause.version,
        Vec::new(),
    )
    .with_causation_id(cause.event_id.to_string())
    .with_source_service(crate::NAME)
    .with_source_version(env!("CARGO_PKG_VERSION"));
    event.payload = Event {
        event_id: event.event_id.to_string(),
        event_type: event.event_type.clone(),
        aggregate_id: event.aggregate_id.clone(),
        aggregate_type: event.aggregate_type.clone(),
        version: event.version,
        occurred_at: Some(courier_proto::timestamp(event.occurred_at)),
        payload: Some(payload),
    }
    .encode_to_vec();
    event
}
