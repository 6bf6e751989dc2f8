//! What a request that failed answers: `{"error": "<reason>"}` with the matching status, and
//! how the framework's errors map onto it (an outage is 503, never the request's fault).

use crate::db::DbError;
use crate::outbox::AppendError;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

/// A request that failed, answered as `{"error": "<reason>"}` with the matching status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request itself is wrong (P8): nothing was written.
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    /// The request contradicts the current state (version mismatch, deleted aggregate).
    #[error("{0}")]
    Conflict(String),
    /// Retrying later can succeed (database unreachable, pool exhausted, serialization).
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        if matches!(self, ApiError::Unauthorized) {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        response.json(serde_json::json!({ "error": self.to_string() }))
    }
}

impl From<DbError> for ApiError {
    fn from(error: DbError) -> Self {
        if error.is_transient() {
            tracing::warn!(error = %error, "request failed on a transient database error");
            ApiError::Unavailable(format!("database unavailable, retry: {error}"))
        } else {
            tracing::error!(error = %error, "request failed on a database error");
            ApiError::Internal("database error".into())
        }
    }
}

impl From<tokio_postgres::Error> for ApiError {
    fn from(error: tokio_postgres::Error) -> Self {
        DbError::Query {
            context: "request".into(),
            error,
        }
        .into()
    }
}

impl From<AppendError> for ApiError {
    fn from(error: AppendError) -> Self {
        if error.is_conflict() {
            return ApiError::Conflict(
                "a concurrent write changed this aggregate; read it again and retry".into(),
            );
        }
        match error {
            AppendError::Db(e) => e.into(),
            // The service built an event the outbox refuses: a bug or unchecked input.
            other => ApiError::BadRequest(other.to_string()),
        }
    }
}
