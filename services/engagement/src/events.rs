//! A change of a user's engagement with a video as an outbox event: the
//! `engagement.v1.Event` envelope, prost-encoded, with `<video_id>:<user_id>` as aggregate id
//! (and so as ordering key).

use courier::outbox::NewEvent;
use courier_proto::engagement::v1::{event::Payload, Event};
use courier_proto::engagement::{aggregate_id, AGGREGATE_TYPE, TOPIC};
use prost::Message;
use uuid::Uuid;

/// The event that takes `user_id`'s engagement with `video_id` to `version`.
pub fn engagement_event(video_id: Uuid, user_id: Uuid, version: i64, payload: Payload) -> NewEvent {
    let event_type = match &payload {
        Payload::VideoViewed(_) => "video.viewed",
        Payload::VideoLiked(_) => "video.liked",
        Payload::VideoUnliked(_) => "video.unliked",
        Payload::WatchProgressed(_) => "watch.progressed",
    };
    let mut event = NewEvent::new(
        TOPIC,
        AGGREGATE_TYPE,
        aggregate_id(video_id, user_id),
        event_type,
        version,
        Vec::new(),
    )
    .with_source_service(crate::NAME)
    .with_source_version(env!("CARGO_PKG_VERSION"))
    .with_user_id(user_id.to_string());
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
