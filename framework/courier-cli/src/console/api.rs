//! The console's HTTP routes: the page and its assets, the state it polls, and the actions —
//! each one through the CLI's own function, audited, and only with the bearer token.

use super::dead_letters::{GroupKey, LetterSelection};
use super::state::Console;
use crate::refusal::Refusal;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use courier::operations::{DeadSelection, Release};
use courier::outbox::Outbox;
use courier::service::{ApiError, ServiceContext, WriteAccess};
use courier::CourierConfig;
use serde::Deserialize;
use std::sync::{Arc, Mutex, PoisonError};
use uuid::Uuid;

const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");

/// The console's routes under `/console`. `courier console` serves them; a service mounts them
/// by calling this from its `routes` (then the service's config is the console's: its schema,
/// its token).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/console")
            .route("", web::get().to(to_page))
            .route("/", web::get().to(page))
            .route("/console.js", web::get().to(script))
            .route("/console.css", web::get().to(style))
            .route("/api/state", web::get().to(state))
            .route("/api/outbox/retry", web::post().to(retry))
            .route("/api/outbox/skip", web::post().to(skip))
            .route("/api/parked/release", web::post().to(release))
            .route("/api/dlq/republish", web::post().to(republish)),
    );
}

/// Serves `console` on `listen` until SIGINT or SIGTERM (actix's own signal handling). The
/// token is `config`'s, checked by the framework's [`WriteAccess`] as a service's writes are.
pub(super) async fn serve(
    console: Console,
    config: CourierConfig,
    listen: &str,
) -> anyhow::Result<()> {
    let writable = console.writable;
    let console = web::Data::new(console);
    let context = web::Data::new(ServiceContext {
        service: "courier-console",
        pool: courier::db::pool(&config.database, "courier-console")?,
        outbox: Outbox::new(&config),
        config: Arc::new(config),
    });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(console.clone())
            .app_data(context.clone())
            .configure(courier::service::http::configure_common)
            .configure(routes)
    })
    .workers(2)
    .bind(listen)
    .map_err(|e| anyhow::anyhow!("--listen {listen}: {e}"))?;
    let addr = *server
        .addrs()
        .first()
        .ok_or_else(|| anyhow::anyhow!("--listen {listen}: no address bound"))?;
    super::announce(addr, writable)?;
    server.run().await?;
    Ok(())
}

/// The console a request is for: the one `courier console` registered, else (mounted in a
/// service) one built from the service's context, once per process.
fn console_of(req: &HttpRequest) -> Result<Arc<Console>, ApiError> {
    if let Some(console) = req.app_data::<web::Data<Console>>() {
        return Ok(console.clone().into_inner());
    }
    static MOUNTED: Mutex<Option<Arc<Console>>> = Mutex::new(None);
    let context = req
        .app_data::<web::Data<ServiceContext>>()
        .ok_or_else(|| ApiError::Internal("neither a console nor a service context".into()))?;
    let mut mounted = MOUNTED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(console) = mounted.as_ref() {
        return Ok(console.clone());
    }
    let config = (*context.config).clone();
    let console = Arc::new(
        Console::new(
            vec![config.clone()],
            courier::pubsub::PubSub::new(config.pubsub.clone()),
            crate::status::HORIZON_WARN_SECS,
            config.http.auth_token.is_some(),
        )
        .map_err(|e| ApiError::Internal(format!("start the console: {e:#}")))?,
    );
    *mounted = Some(console.clone());
    Ok(console)
}

/// An error of an action or a read, answered with its status: a refusal as 400/404/409, a
/// database outage as 503, anything else as 500 with its chain.
fn answer(error: anyhow::Error) -> ApiError {
    match error.downcast::<Refusal>() {
        Ok(Refusal::BadInput(why)) => ApiError::BadRequest(why),
        Ok(Refusal::NotFound(why)) => ApiError::NotFound(why),
        Ok(Refusal::Conflict(why)) => ApiError::Conflict(why),
        Err(error) => match error.downcast::<courier::db::DbError>() {
            Ok(db) => db.into(),
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "console request failed");
                ApiError::Internal(format!("{error:#}"))
            }
        },
    }
}

/// The console an action is for, and who acts, for the audit tables: the name the operator
/// gave, and from where. Refused when the console is read-only.
fn acting(req: &HttpRequest, operator: &str) -> Result<(Arc<Console>, String), actix_web::Error> {
    let console = console_of(req)?;
    if !console.writable {
        // 403, not 401: no token would do (the framework's errors have no 403 of their own).
        let refusal = HttpResponse::Forbidden().json(serde_json::json!({
            "error": "the console is read-only: no http.auth_token is configured"
        }));
        return Err(actix_web::error::InternalError::from_response("read-only", refusal).into());
    }
    let operator = operator.trim();
    if operator.is_empty() || operator.len() > 100 {
        return Err(ApiError::BadRequest(
            "operator must name who acts (1 to 100 characters)".into(),
        )
        .into());
    }
    let from = req
        .connection_info()
        .realip_remote_addr()
        .unwrap_or("unknown address")
        .to_owned();
    Ok((console, format!("{operator} (console, {from})")))
}

async fn to_page() -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header(("Location", "/console/"))
        .finish()
}

fn asset(content_type: &str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("Cache-Control", "no-cache"))
        // The page loads only its own script and style, and talks only to its own API.
        .insert_header((
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ))
        .body(body)
}

async fn page() -> HttpResponse {
    asset("text/html; charset=utf-8", PAGE)
}

async fn script() -> HttpResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLE)
}

async fn state(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let console = console_of(&req)?;
    let snapshot = console.snapshot().await;
    Ok(HttpResponse::Ok()
        .insert_header(("Cache-Control", "no-store"))
        .json(snapshot))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryRequest {
    schema: String,
    #[serde(default)]
    event_ids: Vec<Uuid>,
    /// Every dead row of the schema; `expected` must then say how many the operator saw.
    #[serde(default)]
    all: bool,
    expected: Option<usize>,
    reason: String,
    operator: String,
}

async fn retry(
    req: HttpRequest,
    _: WriteAccess,
    body: web::Json<RetryRequest>,
) -> Result<HttpResponse, actix_web::Error> {
    let (console, by) = acting(&req, &body.operator)?;
    let service = console
        .service(&body.schema)
        .map_err(|r| answer(r.into()))?;
    let selection = match (body.all, body.event_ids.is_empty()) {
        (true, true) => {
            let expected = body.expected.ok_or_else(|| {
                ApiError::BadRequest("retrying every dead row needs expected: the count".into())
            })?;
            let dead = service
                .operator
                .dead_rows(i64::MAX)
                .await
                .map_err(|e| answer(e.into()))?;
            if dead.len() != expected {
                return Err(ApiError::Conflict(format!(
                    "{} dead rows now, not the {expected} confirmed; look again",
                    dead.len()
                ))
                .into());
            }
            DeadSelection::Ids(dead.into_iter().map(|r| r.event_id).collect())
        }
        (false, false) => DeadSelection::Ids(body.event_ids.clone()),
        _ => {
            return Err(
                ApiError::BadRequest("give either event_ids or all (with expected)".into()).into(),
            )
        }
    };
    let acted = crate::outbox::retry(&service.operator, &selection, &by, &body.reason, false)
        .await
        .map_err(answer)?;
    crate::outbox::not_dead(&selection, &acted).map_err(answer)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "retried": acted })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SkipRequest {
    schema: String,
    event_id: Uuid,
    reason: String,
    operator: String,
}

async fn skip(
    req: HttpRequest,
    _: WriteAccess,
    body: web::Json<SkipRequest>,
) -> Result<HttpResponse, actix_web::Error> {
    let (console, by) = acting(&req, &body.operator)?;
    let service = console
        .service(&body.schema)
        .map_err(|r| answer(r.into()))?;
    let acted = crate::outbox::skip(
        &service.operator,
        &body.schema,
        body.event_id,
        &by,
        &body.reason,
    )
    .await
    .map_err(answer)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "skipped": acted })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseRequest {
    schema: String,
    group: String,
    key: String,
    skip_to: Option<i64>,
    reason: String,
    operator: String,
}

async fn release(
    req: HttpRequest,
    _: WriteAccess,
    body: web::Json<ReleaseRequest>,
) -> Result<HttpResponse, actix_web::Error> {
    let (console, by) = acting(&req, &body.operator)?;
    let service = console
        .service(&body.schema)
        .map_err(|r| answer(r.into()))?;
    let release = Release {
        consumer_group: body.group.clone(),
        routing_key: body.key.clone(),
        skip_to: body.skip_to,
        by,
        reason: body.reason.clone(),
    };
    let released =
        crate::parked::release_key(&service.config, &service.versions, &service.pool, &release)
            .await
            .map_err(answer)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "released": released })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RepublishRequest {
    subscription: String,
    /// Dead letters by their message id in the keeper.
    #[serde(default)]
    message_ids: Vec<String>,
    /// A whole group, as the page shows it.
    group: Option<GroupKey>,
    /// How many dead letters the operator confirmed (a whole group).
    expected: Option<usize>,
    reason: String,
    operator: String,
}

async fn republish(
    req: HttpRequest,
    _: WriteAccess,
    body: web::Json<RepublishRequest>,
) -> Result<HttpResponse, actix_web::Error> {
    let (console, by) = acting(&req, &body.operator)?;
    let body = body.into_inner();
    let selection = LetterSelection {
        message_ids: body.message_ids,
        group: body.group,
    };
    let republished = console
        .dead_letters
        .republish(
            &body.subscription,
            &selection,
            body.expected,
            &by,
            &body.reason,
        )
        .await
        .map_err(answer)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "republished": republished })))
}
