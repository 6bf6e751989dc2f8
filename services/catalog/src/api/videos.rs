//! Video writes (row + event in one transaction) and reads.

use crate::events::video_event;
use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use courier::service::{ApiError, ServiceContext, VersionToken, WriteAccess};
use courier_proto::catalog::v1::{
    event::Payload, VideoCreated, VideoDeleted, VideoStatus, VideoUpdated,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

const MAX_TITLE_CHARS: usize = 200;
const MAX_DESCRIPTION_CHARS: usize = 5000;
const MAX_REASON_CHARS: usize = 500;
/// A week: longer is a unit mistake (milliseconds sent as seconds), not a video.
const MAX_DURATION_SECS: i64 = 7 * 24 * 3600;

/// What a client may set; `deleted` is reached only through DELETE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Draft,
    Published,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Draft => "draft",
            Status::Published => "published",
        }
    }

    fn contract(self) -> VideoStatus {
        match self {
            Status::Draft => VideoStatus::Draft,
            Status::Published => VideoStatus::Published,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVideo {
    uploader_id: Uuid,
    title: String,
    #[serde(default)]
    description: String,
    duration_secs: i64,
    #[serde(default)]
    published_at: Option<DateTime<Utc>>,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateVideo {
    title: Option<String>,
    description: Option<String>,
    duration_secs: Option<i64>,
    status: Option<Status>,
    /// Optimistic concurrency: refuse the write unless the video is at this version.
    expected_version: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    #[serde(default)]
    reason: String,
    expected_version: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    min_version: Option<i64>,
}

#[derive(Debug, Serialize)]
struct VideoView {
    video_id: Uuid,
    uploader_id: Uuid,
    title: String,
    description: String,
    duration_secs: i64,
    published_at: Option<DateTime<Utc>>,
    status: String,
    version: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    deleted_at: Option<DateTime<Utc>>,
    deleted_reason: Option<String>,
}

fn check_title(title: &str) -> Result<String, ApiError> {
    let title = title.trim();
    if title.is_empty() {
        return Err(ApiError::BadRequest("title must not be empty".into()));
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(ApiError::BadRequest(format!(
            "title is longer than {MAX_TITLE_CHARS} characters"
        )));
    }
    Ok(title.to_owned())
}

fn check_description(description: &str) -> Result<(), ApiError> {
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(ApiError::BadRequest(format!(
            "description is longer than {MAX_DESCRIPTION_CHARS} characters"
        )));
    }
    Ok(())
}

fn check_duration(duration_secs: i64) -> Result<(), ApiError> {
    if duration_secs < 0 {
        return Err(ApiError::BadRequest(
            "duration_secs must not be negative".into(),
        ));
    }
    if duration_secs > MAX_DURATION_SECS {
        return Err(ApiError::BadRequest(format!(
            "duration_secs must be at most {MAX_DURATION_SECS}"
        )));
    }
    Ok(())
}

fn check_expected(video_id: Uuid, expected: Option<i64>, actual: i64) -> Result<(), ApiError> {
    match expected {
        Some(expected) if expected != actual => Err(ApiError::Conflict(format!(
            "video {video_id} is at version {actual}, not the expected {expected}"
        ))),
        _ => Ok(()),
    }
}

/// The video's row, locked until `tx` ends, or 404.
async fn lock_video(
    tx: &courier::db::PgTransaction<'_>,
    video_id: Uuid,
) -> Result<tokio_postgres::Row, ApiError> {
    tx.query_opt(include_str!("queries/lock_video.sql"), &[&video_id])
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("video {video_id} does not exist")))
}

fn token(video_id: Uuid, version: i64) -> VersionToken {
    VersionToken {
        aggregate_id: video_id.to_string(),
        version,
    }
}

pub async fn create(
    _access: WriteAccess,
    context: web::Data<ServiceContext>,
    body: web::Json<CreateVideo>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let title = check_title(&body.title)?;
    check_description(&body.description)?;
    check_duration(body.duration_secs)?;
    let status = body.status.unwrap_or(Status::Published);
    let published_at = match (status, body.published_at) {
        (Status::Published, None) => Some(Utc::now()),
        (_, at) => at,
    };
    let video_id = Uuid::now_v7();
    let event = video_event(
        video_id,
        1,
        Payload::VideoCreated(VideoCreated {
            video_id: video_id.to_string(),
            uploader_id: body.uploader_id.to_string(),
            title: title.clone(),
            description: body.description.clone(),
            duration_secs: body.duration_secs,
            published_at: published_at.map(courier_proto::timestamp),
            status: status.contract().into(),
        }),
    );
    let mut conn = context.connection("create video").await?;
    let tx = conn.transaction().await?;
    tx.execute(
        include_str!("queries/insert_video.sql"),
        &[
            &video_id,
            &body.uploader_id,
            &title,
            &body.description,
            &body.duration_secs,
            &published_at,
            &status.as_str(),
        ],
    )
    .await?;
    context.outbox.append_and_commit(tx, event).await?;
    Ok(HttpResponse::Created().json(token(video_id, 1)))
}

pub async fn update(
    _access: WriteAccess,
    context: web::Data<ServiceContext>,
    path: web::Path<Uuid>,
    body: web::Json<UpdateVideo>,
) -> Result<HttpResponse, ApiError> {
    let video_id = path.into_inner();
    let body = body.into_inner();
    let title = body.title.as_deref().map(check_title).transpose()?;
    if let Some(description) = &body.description {
        check_description(description)?;
    }
    if let Some(duration) = body.duration_secs {
        check_duration(duration)?;
    }
    if title.is_none()
        && body.description.is_none()
        && body.duration_secs.is_none()
        && body.status.is_none()
    {
        return Err(ApiError::BadRequest(
            "nothing to update: give title, description, duration_secs or status".into(),
        ));
    }
    let mut conn = context.connection("update video").await?;
    let tx = conn.transaction().await?;
    let row = lock_video(&tx, video_id).await?;
    let version: i64 = row.get("version");
    let status: String = row.get("status");
    if status == "deleted" {
        return Err(ApiError::Conflict(format!("video {video_id} is deleted")));
    }
    check_expected(video_id, body.expected_version, version)?;
    // Only what really changes goes into the event (explicit presence).
    let changed = VideoUpdated {
        video_id: video_id.to_string(),
        title: title.filter(|t| *t != row.get::<_, String>("title")),
        description: body
            .description
            .filter(|d| *d != row.get::<_, String>("description")),
        duration_secs: body
            .duration_secs
            .filter(|d| *d != row.get::<_, i64>("duration_secs")),
        status: body
            .status
            .filter(|s| s.as_str() != status)
            .map(|s| s.contract().into()),
    };
    let new_status = body.status.filter(|s| s.as_str() != status);
    if changed.title.is_none()
        && changed.description.is_none()
        && changed.duration_secs.is_none()
        && new_status.is_none()
    {
        return Ok(HttpResponse::Ok().json(token(video_id, version)));
    }
    let next = version + 1;
    tx.execute(
        include_str!("queries/update_video.sql"),
        &[
            &video_id,
            &changed.title,
            &changed.description,
            &changed.duration_secs,
            &new_status.map(Status::as_str),
            &next,
        ],
    )
    .await?;
    context
        .outbox
        .append_and_commit(
            tx,
            video_event(video_id, next, Payload::VideoUpdated(changed)),
        )
        .await?;
    Ok(HttpResponse::Ok().json(token(video_id, next)))
}

pub async fn delete(
    _access: WriteAccess,
    context: web::Data<ServiceContext>,
    path: web::Path<Uuid>,
    query: web::Query<DeleteQuery>,
) -> Result<HttpResponse, ApiError> {
    let video_id = path.into_inner();
    let query = query.into_inner();
    let reason = query.reason.trim().to_owned();
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(ApiError::BadRequest(format!(
            "reason is longer than {MAX_REASON_CHARS} characters"
        )));
    }
    let mut conn = context.connection("delete video").await?;
    let tx = conn.transaction().await?;
    let row = lock_video(&tx, video_id).await?;
    let version: i64 = row.get("version");
    check_expected(video_id, query.expected_version, version)?;
    if row.get::<_, String>("status") == "deleted" {
        // Deleting twice is the same delete.
        return Ok(HttpResponse::Ok().json(token(video_id, version)));
    }
    let next = version + 1;
    let deleted_at = Utc::now();
    tx.execute(
        include_str!("queries/delete_video.sql"),
        &[&video_id, &deleted_at, &reason, &next],
    )
    .await?;
    let payload = Payload::VideoDeleted(VideoDeleted {
        video_id: video_id.to_string(),
        deleted_at: Some(courier_proto::timestamp(deleted_at)),
        reason,
    });
    context
        .outbox
        .append_and_commit(tx, video_event(video_id, next, payload))
        .await?;
    Ok(HttpResponse::Ok().json(token(video_id, next)))
}

/// The video as stored. The catalog owns it, so a committed write is visible at once: a
/// `min_version` above the stored version can only come from elsewhere, and is a conflict.
pub async fn get(
    context: web::Data<ServiceContext>,
    path: web::Path<Uuid>,
    query: web::Query<ReadQuery>,
) -> Result<HttpResponse, ApiError> {
    let video_id = path.into_inner();
    let conn = context.connection("read video").await?;
    let row = conn
        .query_opt(include_str!("queries/select_video.sql"), &[&video_id])
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("video {video_id} does not exist")))?;
    let video = VideoView {
        video_id: row.get("video_id"),
        uploader_id: row.get("uploader_id"),
        title: row.get("title"),
        description: row.get("description"),
        duration_secs: row.get("duration_secs"),
        published_at: row.get("published_at"),
        status: row.get("status"),
        version: row.get("version"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        deleted_at: row.get("deleted_at"),
        deleted_reason: row.get("deleted_reason"),
    };
    if let Some(min) = query.min_version.filter(|min| *min > video.version) {
        return Err(ApiError::Conflict(format!(
            "video {video_id} is at version {}, below min_version {min}",
            video.version
        )));
    }
    Ok(HttpResponse::Ok().json(video))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_rules() {
        assert!(check_title("  ").is_err());
        assert!(check_title(&"x".repeat(MAX_TITLE_CHARS + 1)).is_err());
        assert_eq!(check_title(" Cats ").ok().as_deref(), Some("Cats"));
        assert!(check_duration(-1).is_err());
        assert!(check_duration(MAX_DURATION_SECS + 1).is_err());
        assert!(check_duration(0).is_ok());
        assert!(check_expected(Uuid::nil(), Some(2), 3).is_err());
        assert!(check_expected(Uuid::nil(), None, 3).is_ok());
    }
}
