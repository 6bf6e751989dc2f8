//! Engagement as the catalog sees it: its projection of the engagement service's events.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use courier::service::{read_at_least, ApiError, ServiceContext};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    /// Wait (bounded) until the projection reflects at least this version of the user's
    /// engagement aggregate — the `version` a write to the engagement service answered.
    min_version: Option<i64>,
}

#[derive(Debug, Serialize)]
struct Summary {
    video_id: Uuid,
    viewers: i64,
    views: i64,
    likes: i64,
    completions: i64,
}

#[derive(Debug, Serialize)]
struct UserEngagement {
    video_id: Uuid,
    user_id: Uuid,
    views: i64,
    liked: bool,
    position_secs: i64,
    completed: bool,
    version: i64,
    projected_at: DateTime<Utc>,
}

/// Totals over every user of one video.
pub async fn summary(
    context: web::Data<ServiceContext>,
    path: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let video_id = path.into_inner();
    let conn = context.connection("read engagement").await?;
    if conn
        .query_opt("SELECT 1 FROM videos WHERE video_id = $1", &[&video_id])
        .await?
        .is_none()
    {
        return Err(ApiError::NotFound(format!(
            "video {video_id} does not exist"
        )));
    }
    let row = conn
        .query_one(include_str!("queries/engagement_summary.sql"), &[&video_id])
        .await?;
    Ok(HttpResponse::Ok().json(Summary {
        video_id,
        viewers: row.get("viewers"),
        views: row.get("views"),
        likes: row.get("likes"),
        completions: row.get("completions"),
    }))
}

/// One user's engagement with one video; with `min_version`, read-your-writes.
pub async fn of_user(
    context: web::Data<ServiceContext>,
    path: web::Path<(Uuid, Uuid)>,
    query: web::Query<ReadQuery>,
) -> Result<HttpResponse, ApiError> {
    let (video_id, user_id) = path.into_inner();
    let wait = context.config.http.read_wait();
    read_at_least(
        query.min_version,
        wait,
        || {
            ApiError::NotFound(format!(
                "no engagement of user {user_id} with video {video_id}"
            ))
        },
        || async {
            let conn = context.connection("read engagement").await?;
            let row = conn
                .query_opt(
                    include_str!("queries/engagement_of_user.sql"),
                    &[&video_id, &user_id],
                )
                .await?;
            Ok(row.map(|row| {
                let version = row.get("version");
                let engagement = UserEngagement {
                    video_id,
                    user_id,
                    views: row.get("views"),
                    liked: row.get("liked"),
                    position_secs: row.get("position_secs"),
                    completed: row.get("completed"),
                    version,
                    projected_at: row.get("projected_at"),
                };
                (engagement, version)
            }))
        },
    )
    .await
}
