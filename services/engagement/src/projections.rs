//! `videos_replica`: the engagement service's copy of the catalog's videos, enough to refuse
//! engagement with unknown or deleted videos. Creates, snapshots (from a catalog backfill) and
//! deletes are versioned upserts; an update changes only the fields it carries, and only over
//! an older version.

use courier::db::PgTransaction;
use courier::inbound::{uuid_field, EventMeta, HandlerError, Projection, VersionedUpsert};
use courier_proto::catalog::v1::{event::Payload, Event};

const TABLE: &str = "videos_replica";

#[derive(Clone)]
pub struct VideosReplica {
    whole_state: VersionedUpsert,
    deleted: VersionedUpsert,
}

impl VideosReplica {
    pub fn new() -> Self {
        let upsert = |columns: &[&str]| {
            VersionedUpsert::new(TABLE, &["video_id"], columns)
                .expect("static table and column names are identifiers")
        };
        Self {
            whole_state: upsert(&[
                "uploader_id",
                "title",
                "duration_secs",
                "status",
                "deleted_at",
            ]),
            deleted: upsert(&["status", "deleted_at"]),
        }
    }
}

/// A video's whole state, as a create or a snapshot carries it.
struct WholeState<'a> {
    video_id: &'a str,
    uploader_id: &'a str,
    title: &'a str,
    duration_secs: i64,
    status: i32,
    deleted_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl VideosReplica {
    /// Writes `state` over an older version of the row (or inserts it).
    async fn upsert_whole(
        &self,
        tx: &PgTransaction<'_>,
        state: WholeState<'_>,
        version: i64,
    ) -> Result<(), HandlerError> {
        let video = uuid_field("video_id", state.video_id)?;
        let uploader = uuid_field("uploader_id", state.uploader_id)?;
        let status = status_name(state.status)?;
        self.whole_state
            .execute(
                tx,
                &[
                    &video,
                    &uploader,
                    &state.title,
                    &state.duration_secs,
                    &status,
                    &state.deleted_at,
                ],
                version,
            )
            .await?;
        Ok(())
    }
}

impl Default for VideosReplica {
    fn default() -> Self {
        Self::new()
    }
}

/// The status as stored; an unknown one is the event's fault, for good.
fn status_name(status: i32) -> Result<&'static str, HandlerError> {
    courier_proto::catalog::status_name(status).map_err(HandlerError::Permanent)
}

impl Projection for VideosReplica {
    type Event = Event;

    /// An update carries only the changed fields (`update_replica.sql` keeps the others): it
    /// applies only on top of the version before it.
    fn contiguous_versions(&self) -> bool {
        true
    }

    /// Each event writes its own video's replica row, in one statement.
    fn independent_keys(&self) -> bool {
        true
    }

    /// A create or a snapshot carries the whole video.
    fn is_whole_state(&self, _meta: &EventMeta, event: &Event) -> bool {
        matches!(
            event.payload,
            Some(Payload::VideoCreated(_) | Payload::VideoSnapshot(_))
        )
    }

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Event,
    ) -> Result<(), HandlerError> {
        let version = meta.version;
        match &event.payload {
            Some(Payload::VideoCreated(e)) => {
                let state = WholeState {
                    video_id: &e.video_id,
                    uploader_id: &e.uploader_id,
                    title: &e.title,
                    duration_secs: e.duration_secs,
                    status: e.status,
                    deleted_at: None,
                };
                self.upsert_whole(tx, state, version).await?;
            }
            Some(Payload::VideoUpdated(e)) => {
                let video = uuid_field("video_id", &e.video_id)?;
                let status = e.status.map(status_name).transpose()?;
                let updated = tx
                    .execute(
                        include_str!("queries/update_replica.sql"),
                        &[&video, &e.title, &e.duration_secs, &status, &version],
                    )
                    .await?;
                if updated == 0 {
                    tracing::debug!(video_id = %video, version, "update of a video the replica does not hold at an older version");
                }
            }
            Some(Payload::VideoDeleted(e)) => {
                let video = uuid_field("video_id", &e.video_id)?;
                let deleted_at = e
                    .deleted_at
                    .as_ref()
                    .and_then(courier_proto::datetime)
                    .unwrap_or(meta.occurred_at);
                self.deleted
                    .execute(tx, &[&video, &"deleted", &deleted_at], version)
                    .await?;
            }
            Some(Payload::VideoSnapshot(e)) => {
                // The whole state at its own version: like a create, newer versions only.
                let state = WholeState {
                    video_id: &e.video_id,
                    uploader_id: &e.uploader_id,
                    title: &e.title,
                    duration_secs: e.duration_secs,
                    status: e.status,
                    deleted_at: e.deleted_at.as_ref().and_then(courier_proto::datetime),
                };
                self.upsert_whole(tx, state, version).await?;
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
