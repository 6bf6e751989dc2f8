//! Views, likes and watch progress: each a change of the user's engagement row plus its
//! event, in one transaction, refused for videos the replica does not know or knows deleted.

use crate::events::engagement_event;
use actix_web::{web, HttpResponse};
use courier::service::{ApiError, ServiceContext, VersionToken, WriteAccess};
use courier_proto::engagement::aggregate_id;
use courier_proto::engagement::v1::{
    event::Payload, VideoLiked, VideoUnliked, VideoViewed, WatchProgressed,
};
use serde::Deserialize;
use uuid::Uuid;

/// A week: a longer position is a unit mistake, not a video.
const MAX_POSITION_SECS: i64 = 7 * 24 * 3600;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewBody {
    user_id: Uuid,
    expected_version: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressBody {
    position_secs: i64,
    #[serde(default)]
    completed: bool,
    expected_version: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedVersion {
    expected_version: Option<i64>,
}

/// A user's engagement with a video as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Engagement {
    views: i64,
    liked: bool,
    position_secs: i64,
    completed: bool,
    version: i64,
}

pub async fn view(
    _access: WriteAccess,
    context: web::Data<ServiceContext>,
    path: web::Path<Uuid>,
    body: web::Json<ViewBody>,
) -> Result<HttpResponse, ApiError> {
    let video_id = path.into_inner();
    let ViewBody {
        user_id,
        expected_version,
    } = body.into_inner();
    change(&context, video_id, user_id, expected_version, |current| {
        let views = current.views + 1;
        let payload = Payload::VideoViewed(VideoViewed {
            user_id: user_id.to_string(),
            video_id: video_id.to_string(),
            view_count: views,
        });
        Some((
            Engagement {
                views,
                ..current.clone()
            },
            payload,
        ))
    })
    .await
}

pub async fn like(
    access: WriteAccess,
    context: web::Data<ServiceContext>,
    path: web::Path<(Uuid, Uuid)>,
    query: web::Query<ExpectedVersion>,
) -> Result<HttpResponse, ApiError> {
    set_liked(access, context, path, query, true).await
}

pub async fn unlike(
    access: WriteAccess,
    context: web::Data<ServiceContext>,
    path: web::Path<(Uuid, Uuid)>,
    query: web::Query<ExpectedVersion>,
) -> Result<HttpResponse, ApiError> {
    set_liked(access, context, path, query, false).await
}

/// Liking twice (or unliking what is not liked) changes nothing and emits nothing.
async fn set_liked(
    _access: WriteAccess,
    context: web::Data<ServiceContext>,
    path: web::Path<(Uuid, Uuid)>,
    query: web::Query<ExpectedVersion>,
    liked: bool,
) -> Result<HttpResponse, ApiError> {
    let (video_id, user_id) = path.into_inner();
    change(
        &context,
        video_id,
        user_id,
        query.expected_version,
        |current| {
            if current.liked == liked {
                return None;
            }
            let (user, video) = (user_id.to_string(), video_id.to_string());
            let payload = if liked {
                Payload::VideoLiked(VideoLiked {
                    user_id: user,
                    video_id: video,
                })
            } else {
                Payload::VideoUnliked(VideoUnliked {
                    user_id: user,
                    video_id: video,
                })
            };
            Some((
                Engagement {
                    liked,
                    ..current.clone()
                },
                payload,
            ))
        },
    )
    .await
}

pub async fn progress(
    _access: WriteAccess,
    context: web::Data<ServiceContext>,
    path: web::Path<(Uuid, Uuid)>,
    body: web::Json<ProgressBody>,
) -> Result<HttpResponse, ApiError> {
    let (video_id, user_id) = path.into_inner();
    let body = body.into_inner();
    if !(0..=MAX_POSITION_SECS).contains(&body.position_secs) {
        return Err(ApiError::BadRequest(format!(
            "position_secs must be between 0 and {MAX_POSITION_SECS}"
        )));
    }
    change(
        &context,
        video_id,
        user_id,
        body.expected_version,
        |current| {
            let payload = Payload::WatchProgressed(WatchProgressed {
                user_id: user_id.to_string(),
                video_id: video_id.to_string(),
                position_secs: body.position_secs,
                completed: body.completed,
            });
            let next = Engagement {
                position_secs: body.position_secs,
                completed: body.completed,
                ..current.clone()
            };
            Some((next, payload))
        },
    )
    .await
}

/// The one write path: checks the video against the replica, locks the engagement row,
/// checks `expected_version`, applies `decide` (which may decline: no change, no event), and
/// commits the row and its event together.
async fn change(
    context: &ServiceContext,
    video_id: Uuid,
    user_id: Uuid,
    expected_version: Option<i64>,
    decide: impl FnOnce(&Engagement) -> Option<(Engagement, Payload)>,
) -> Result<HttpResponse, ApiError> {
    let aggregate = aggregate_id(video_id, user_id);
    let mut conn = context.connection("write engagement").await?;
    let tx = conn.transaction().await?;
    let video = tx
        .query_opt(include_str!("queries/video_status.sql"), &[&video_id])
        .await?;
    match video.map(|row| row.get::<_, String>("status")) {
        None => {
            return Err(ApiError::NotFound(format!(
                "video {video_id} is unknown to the engagement service (not in its catalog replica)"
            )))
        }
        Some(status) if status == "deleted" => {
            return Err(ApiError::Conflict(format!("video {video_id} is deleted")))
        }
        Some(_) => {}
    }
    tx.execute(
        include_str!("queries/ensure_engagement.sql"),
        &[&video_id, &user_id],
    )
    .await?;
    let row = tx
        .query_one(
            include_str!("queries/lock_engagement.sql"),
            &[&video_id, &user_id],
        )
        .await?;
    let current = Engagement {
        views: row.get("views"),
        liked: row.get("liked"),
        position_secs: row.get("position_secs"),
        completed: row.get("completed"),
        version: row.get("version"),
    };
    if let Some(expected) = expected_version.filter(|e| *e != current.version) {
        return Err(ApiError::Conflict(format!(
            "engagement {aggregate} is at version {}, not the expected {expected}",
            current.version
        )));
    }
    let Some((next, payload)) = decide(&current) else {
        // Nothing changes: the transaction (and any row it inserted) is rolled back.
        return Ok(HttpResponse::Ok().json(VersionToken {
            aggregate_id: aggregate,
            version: current.version,
        }));
    };
    let version = current.version + 1;
    tx.execute(
        include_str!("queries/update_engagement.sql"),
        &[
            &video_id,
            &user_id,
            &next.views,
            &next.liked,
            &next.position_secs,
            &next.completed,
            &version,
        ],
    )
    .await?;
    context
        .outbox
        .append_and_commit(tx, engagement_event(video_id, user_id, version, payload))
        .await?;
    Ok(HttpResponse::Ok().json(VersionToken {
        aggregate_id: aggregate,
        version,
    }))
}
