//! The catalog's backfill: a `VideoSnapshot` of every video, deleted ones included, each at
//! the video's next version (see `courier::backfill` for why the version moves).

use crate::events::video_event;
use chrono::{DateTime, Utc};
use courier::backfill::{BackfillError, BackfillSource, BoxFuture};
use courier::db::{DbError, PgTransaction};
use courier::outbox::NewEvent;
use courier_proto::catalog::v1::{event::Payload, VideoSnapshot, VideoStatus};
use courier_proto::catalog::AGGREGATE_TYPE;
use tokio_postgres::{Client, Row};
use uuid::Uuid;

/// Every video, in id order.
#[derive(Debug, Clone, Copy, Default)]
pub struct VideoSnapshots;

fn cursor(after: Option<&str>) -> Result<Option<Uuid>, BackfillError> {
    after
        .map(|text| {
            Uuid::parse_str(text).map_err(|e| BackfillError::Snapshot {
                aggregate_type: AGGREGATE_TYPE.into(),
                aggregate_id: text.into(),
                reason: format!("the run's cursor is not a video id: {e}"),
            })
        })
        .transpose()
}

fn status(video_id: Uuid, name: &str) -> Result<VideoStatus, BackfillError> {
    match name {
        "draft" => Ok(VideoStatus::Draft),
        "published" => Ok(VideoStatus::Published),
        "deleted" => Ok(VideoStatus::Deleted),
        other => Err(BackfillError::Snapshot {
            aggregate_type: AGGREGATE_TYPE.into(),
            aggregate_id: video_id.to_string(),
            reason: format!("stored status {other:?} has no contract value"),
        }),
    }
}

/// The snapshot event of one row of `snapshot_videos.sql`.
fn snapshot(row: &Row) -> Result<NewEvent, BackfillError> {
    let video_id: Uuid = row.get("video_id");
    let uploader_id: Uuid = row.get("uploader_id");
    let time = |column: &str| {
        row.get::<_, Option<DateTime<Utc>>>(column)
            .map(courier_proto::timestamp)
    };
    let payload = VideoSnapshot {
        video_id: video_id.to_string(),
        uploader_id: uploader_id.to_string(),
        title: row.get("title"),
        description: row.get("description"),
        duration_secs: row.get("duration_secs"),
        published_at: time("published_at"),
        status: status(video_id, row.get("status"))?.into(),
        created_at: time("created_at"),
        updated_at: time("updated_at"),
        deleted_at: time("deleted_at"),
        deleted_reason: row
            .get::<_, Option<String>>("deleted_reason")
            .unwrap_or_default(),
    };
    Ok(video_event(
        video_id,
        row.get("version"),
        Payload::VideoSnapshot(payload),
    ))
}

impl BackfillSource for VideoSnapshots {
    fn aggregate_type(&self) -> &'static str {
        AGGREGATE_TYPE
    }

    fn count_after<'a>(
        &'a self,
        client: &'a Client,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<i64, DbError>> {
        Box::pin(async move {
            // A bad cursor counts everything; the run itself reports it.
            let after = after.and_then(|a| Uuid::parse_str(a).ok());
            let row = client
                .query_one(include_str!("queries/count_videos_after.sql"), &[&after])
                .await
                .map_err(DbError::query("count videos to backfill"))?;
            Ok(row.get(0))
        })
    }

    fn snapshot_batch<'a, 'tx: 'a>(
        &'a self,
        tx: &'a PgTransaction<'tx>,
        after: Option<&'a str>,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<NewEvent>, BackfillError>> {
        Box::pin(async move {
            let after = cursor(after)?;
            let mut rows = tx
                .query(
                    include_str!("queries/snapshot_videos.sql"),
                    &[&after, &limit],
                )
                .await
                .map_err(DbError::query("lock and bump the next videos to backfill"))?;
            // RETURNING has no order; the cursor is the last id of the batch.
            rows.sort_by_key(|row| row.get::<_, Uuid>("video_id"));
            rows.iter().map(snapshot).collect()
        })
    }
}
