//! The catalog's HTTP API. Writes answer `{aggregate_id, version}`; reads of the engagement
//! projection take `?min_version=` for read-your-writes.

mod engagement;
mod videos;

use actix_web::web;

/// Registers the catalog's routes (the framework adds health, readiness and metrics).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/videos", web::post().to(videos::create))
        .route("/videos/{video_id}", web::get().to(videos::get))
        .route("/videos/{video_id}", web::patch().to(videos::update))
        .route("/videos/{video_id}", web::delete().to(videos::delete))
        .route(
            "/videos/{video_id}/engagement",
            web::get().to(engagement::summary),
        )
        .route(
            "/videos/{video_id}/engagement/{user_id}",
            web::get().to(engagement::of_user),
        );
}
