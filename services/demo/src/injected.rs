//! A dead letter the demo injects, for the operator console to act on: a title update of one
//! of the story's videos, committed in the catalog's table but put on the catalog topic's
//! dead-letter topic as if the search indexer had refused it, instead of being published.
//! Until an operator republishes it (the console's Republish, or `courier dlq republish
//! --subscription catalog.video.events.search-indexer`), search does not find the new title and
//! engagement's replica keeps the old one; republished, both projections are right.

use anyhow::Context as _;
use courier::operations::DeadLetters;
use courier::pubsub::PubSub;
use courier_proto::catalog::v1::{event::Payload, VideoUpdated};
use std::time::Duration;
use uuid::Uuid;

/// The subscription whose dead letter it poses as, and its keeper's topic.
pub const SUBSCRIPTION: &str = "catalog.video.events.search-indexer";
const DEAD_LETTER_TOPIC: &str = "catalog.video.events.dlq";
const GROUP: &str = "search_indexer";

/// What was injected.
#[derive(Debug, Clone)]
pub struct Injected {
    pub video: Uuid,
    pub version: i64,
    pub title: String,
}

/// Retitles `video` to `title` in `catalog.videos` (through `admin`, a connection that sees the
/// catalog's schema) and puts the event of that change on the dead-letter topic; commits only
/// once Pub/Sub stored the dead letter.
pub async fn inject(
    admin: &mut tokio_postgres::Client,
    pubsub: &PubSub,
    video: Uuid,
    title: &str,
) -> anyhow::Result<Injected> {
    let tx = admin.transaction().await?;
    let version: i64 = tx
        .query_opt(
            "UPDATE catalog.videos SET title = $2, version = version + 1, updated_at = now()
             WHERE video_id = $1 AND status <> 'deleted' RETURNING version",
            &[&video, &title],
        )
        .await
        .context("retitle the video in catalog.videos")?
        .with_context(|| format!("video {video} is not in catalog.videos or is deleted"))?
        .get(0);
    let event = courier_catalog::events::video_event(
        video,
        version,
        Payload::VideoUpdated(VideoUpdated {
            video_id: video.to_string(),
            title: Some(title.to_owned()),
            ..VideoUpdated::default()
        }),
    );
    let message = event.message();
    let dead_letters = DeadLetters::new(
        pubsub,
        DEAD_LETTER_TOPIC,
        GROUP,
        SUBSCRIPTION,
        Duration::from_secs(10),
    )
    .await?;
    dead_letters
        .publish(&message, "injected by the demo: republish me", Some(5))
        .await
        .map_err(anyhow::Error::msg)?;
    tx.commit().await?;
    Ok(Injected {
        video,
        version,
        title: title.to_owned(),
    })
}
