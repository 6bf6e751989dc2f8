//! The search service's HTTP API.

mod search;

use actix_web::web;

/// Registers the search route (the framework adds health, readiness and metrics).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/search", web::get().to(search::search));
}
