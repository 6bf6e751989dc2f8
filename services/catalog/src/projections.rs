//! `video_user_engagements_projection`: one row per (video, user), fed by the engagement
//! service's events. Each event sets the columns it is about through a versioned upsert, so a
//! duplicate, a replay or a late redelivery never moves a row backwards.

use courier::db::PgTransaction;
use courier::inbound::{uuid_field, EventMeta, HandlerError, Projection, VersionedUpsert};
use courier_proto::engagement::v1::{event::Payload, Event};
use uuid::Uuid;

const TABLE: &str = "video_user_engagements_projection";
const KEYS: &[&str] = &["video_id", "user_id"];

#[derive(Clone)]
pub struct VideoUserEngagements {
    views: VersionedUpsert,
    liked: VersionedUpsert,
    progress: VersionedUpsert,
}

impl VideoUserEngagements {
    pub fn new() -> Self {
        let upsert = |columns: &[&str]| {
            VersionedUpsert::new(TABLE, KEYS, columns)
                .expect("static table and column names are identifiers")
        };
        Self {
            views: upsert(&["views"]),
            liked: upsert(&["liked"]),
            progress: upsert(&["position_secs", "completed"]),
        }
    }
}

impl Default for VideoUserEngagements {
    fn default() -> Self {
        Self::new()
    }
}

/// The ids of an event, which must be UUIDs (the producer checked them at its edge).
fn ids(video_id: &str, user_id: &str) -> Result<(Uuid, Uuid), HandlerError> {
    Ok((
        uuid_field("video_id", video_id)?,
        uuid_field("user_id", user_id)?,
    ))
}

impl Projection for VideoUserEngagements {
    type Event = Event;

    /// Each event sets some fields of the (video, user) row under the row's version: applied
    /// out of order, an older event's field would be lost to the version guard.
    fn contiguous_versions(&self) -> bool {
        true
    }

    /// Each event writes its own (video, user) row, in one statement.
    fn independent_keys(&self) -> bool {
        true
    }

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Event,
    ) -> Result<(), HandlerError> {
        let version = meta.version;
        match &event.payload {
            Some(Payload::VideoViewed(e)) => {
                let (video, user) = ids(&e.video_id, &e.user_id)?;
                self.views
                    .execute(tx, &[&video, &user, &e.view_count], version)
                    .await?;
            }
            Some(Payload::VideoLiked(e)) => {
                let (video, user) = ids(&e.video_id, &e.user_id)?;
                self.liked
                    .execute(tx, &[&video, &user, &true], version)
                    .await?;
            }
            Some(Payload::VideoUnliked(e)) => {
                let (video, user) = ids(&e.video_id, &e.user_id)?;
                self.liked
                    .execute(tx, &[&video, &user, &false], version)
                    .await?;
            }
            Some(Payload::WatchProgressed(e)) => {
                let (video, user) = ids(&e.video_id, &e.user_id)?;
                self.progress
                    .execute(
                        tx,
                        &[&video, &user, &e.position_secs, &e.completed],
                        version,
                    )
                    .await?;
            }
            None => {
                return Err(HandlerError::Permanent(format!(
                    "{} event has no payload",
                    meta.event_type
                )))
            }
        }
        Ok(())
    }
}
