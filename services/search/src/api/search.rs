//! `GET /search?q=<words>&limit=<n>`: the published videos that match, best first.

use actix_web::{web, HttpResponse};
use courier::service::{ApiError, ServiceContext};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

const MAX_QUERY_CHARS: usize = 200;
const DEFAULT_LIMIT: i64 = 20;
const MAX_LIMIT: i64 = 100;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    q: String,
    limit: Option<i64>,
}

#[derive(Debug, Serialize)]
struct Hit {
    video_id: Uuid,
    title: String,
    /// The catalog version the index last applied for this video.
    version: i64,
    rank: f32,
}

#[derive(Debug, Serialize)]
struct Hits {
    query: String,
    hits: Vec<Hit>,
}

pub async fn search(
    context: web::Data<ServiceContext>,
    query: web::Query<SearchQuery>,
) -> Result<HttpResponse, ApiError> {
    let SearchQuery { q, limit } = query.into_inner();
    let q = q.trim().to_owned();
    if q.is_empty() {
        return Err(ApiError::BadRequest(
            "q: give the words to search for".into(),
        ));
    }
    if q.chars().count() > MAX_QUERY_CHARS {
        return Err(ApiError::BadRequest(format!(
            "q: at most {MAX_QUERY_CHARS} characters"
        )));
    }
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit: between 1 and {MAX_LIMIT}, not {limit}"
        )));
    }
    let conn = context.connection("search").await?;
    let rows = conn
        .query(include_str!("queries/search.sql"), &[&q, &limit])
        .await?;
    let hits = rows
        .iter()
        .map(|row| Hit {
            video_id: row.get("video_id"),
            title: row.get("title"),
            version: row.get("version"),
            rank: row.get("rank"),
        })
        .collect();
    Ok(HttpResponse::Ok().json(Hits { query: q, hits }))
}
