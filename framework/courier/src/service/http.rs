//! The HTTP edge every service shares: JSON errors with a reason, bearer-token write access,
//! request-parsing errors as 400, the health, readiness and metrics endpoints, and a span per
//! request that continues the caller's W3C trace.

use super::api_error::ApiError;
use super::context::ServiceContext;
use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use std::future::{ready, Ready};
use std::time::Duration;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Liveness: answers while the process serves requests.
pub const HEALTH_PATH: &str = "/healthz";
/// Readiness: answers 200 only while the database answers.
pub const READY_PATH: &str = "/readyz";
/// Prometheus text exposition.
pub const METRICS_PATH: &str = "/metrics";
/// Largest JSON body a write accepts; events are small, anything bigger is a mistake.
const MAX_JSON_BYTES: usize = 64 * 1024;
/// Readiness answers within this, even when the database hangs.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Proof that a write request carried the configured bearer token (or that none is
/// configured). Write handlers take it as an argument, so forgetting it is visible.
pub struct WriteAccess;

impl FromRequest for WriteAccess {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let Some(context) = req.app_data::<web::Data<ServiceContext>>() else {
            return ready(Err(ApiError::Internal("service context missing".into())));
        };
        let Some(expected) = context.config.http.auth_token.as_deref() else {
            return ready(Ok(WriteAccess));
        };
        let presented = req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        ready(match presented {
            Some(token) if constant_time_eq(token.as_bytes(), expected.as_bytes()) => {
                Ok(WriteAccess)
            }
            _ => Err(ApiError::Unauthorized),
        })
    }
}

/// Compares without an early exit, so response timing does not reveal a token's prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Registers the shared parsing rules and endpoints; the service's routes come after.
pub fn configure_common(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::JsonConfig::default()
            .limit(MAX_JSON_BYTES)
            .error_handler(|error, _| {
                ApiError::BadRequest(format!("invalid JSON body: {error}")).into()
            }),
    )
    .app_data(
        web::PathConfig::default().error_handler(|error, _| {
            ApiError::BadRequest(format!("invalid path: {error}")).into()
        }),
    )
    .app_data(web::QueryConfig::default().error_handler(|error, _| {
        ApiError::BadRequest(format!("invalid query string: {error}")).into()
    }))
    .route(HEALTH_PATH, web::get().to(health))
    .route(READY_PATH, web::get().to(ready_check))
    .route(METRICS_PATH, web::get().to(metrics));
}

async fn health() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

async fn ready_check(context: web::Data<ServiceContext>) -> HttpResponse {
    let check = async {
        let conn = context.pool.get().await.map_err(|e| e.to_string())?;
        conn.simple_query("SELECT 1")
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(READY_TIMEOUT, check).await {
        Ok(Ok(_)) => HttpResponse::Ok().json(serde_json::json!({ "status": "ready" })),
        Ok(Err(reason)) => HttpResponse::ServiceUnavailable()
            .json(serde_json::json!({ "status": "not ready", "reason": reason })),
        Err(_) => HttpResponse::ServiceUnavailable().json(
            serde_json::json!({ "status": "not ready", "reason": "database did not answer" }),
        ),
    }
}

async fn metrics() -> HttpResponse {
    match crate::metrics::prometheus_handle() {
        Some(handle) => HttpResponse::Ok()
            .content_type("text/plain; version=0.0.4")
            .body(handle.render()),
        None => HttpResponse::ServiceUnavailable()
            .json(serde_json::json!({ "error": "another metrics recorder is installed" })),
    }
}

/// What every write answers: the aggregate and the version the write produced, the
/// consistency token a later read passes as `?min_version=`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VersionToken {
    pub aggregate_id: String,
    pub version: i64,
}

/// How often a read with `min_version` looks at its projection again.
const READ_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Read-your-writes for a projection: runs `read` (which returns the row and its version)
/// until the version reaches `min_version` or `wait` passed. Answers the row as JSON, or
/// 202 `{"status": "pending", …}` saying how far the projection got, or 404 when there is no
/// row and no version was asked for.
pub async fn read_at_least<T, F, Fut>(
    min_version: Option<i64>,
    wait: Duration,
    not_found: impl FnOnce() -> ApiError,
    mut read: F,
) -> Result<HttpResponse, ApiError>
where
    T: serde::Serialize,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<(T, i64)>, ApiError>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let row = read().await?;
        let reached = match (&row, min_version) {
            (Some((_, version)), Some(min)) => *version >= min,
            (Some(_), None) => true,
            (None, None) => return Err(not_found()),
            (None, Some(_)) => false,
        };
        if reached {
            if let Some((value, _)) = row {
                return Ok(HttpResponse::Ok().json(value));
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(HttpResponse::Accepted().json(serde_json::json!({
                "status": "pending",
                "min_version": min_version,
                "projected_version": row.map(|(_, version)| version),
            })));
        }
        tokio::time::sleep(READ_POLL_INTERVAL).await;
    }
}

/// Runs each request in a span whose parent is the caller's W3C `traceparent` (a new trace
/// when there is none): the request's business transaction happens inside it, so the events
/// a handler appends carry the request's trace (`Outbox::append`).
pub async fn trace_request(
    request: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    let parent = crate::telemetry::extract_context(|name| {
        request
            .headers()
            .get(name)?
            .to_str()
            .ok()
            .map(str::to_owned)
    });
    let span =
        tracing::info_span!("http.request", method = %request.method(), path = %request.path());
    // Fails only without the trace context layer, and then there is no trace to continue.
    let _ = span.set_parent(parent);
    next.call(request).instrument(span).await
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abcdefgh", b"abcdefgh"));
        assert!(!constant_time_eq(b"abcdefgh", b"abcdefgX"));
        assert!(!constant_time_eq(b"abc", b"abcdefgh"));
    }
}
