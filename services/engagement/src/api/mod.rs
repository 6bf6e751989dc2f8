//! The engagement service's HTTP API. Every write answers `{aggregate_id, version}`, where the
//! aggregate is the user's engagement with the video (`<video_id>:<user_id>`).

mod engagements;

use actix_web::web;

/// Registers the engagement routes (the framework adds health, readiness and metrics).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(
        "/videos/{video_id}/views",
        web::post().to(engagements::view),
    )
    .route(
        "/videos/{video_id}/likes/{user_id}",
        web::put().to(engagements::like),
    )
    .route(
        "/videos/{video_id}/likes/{user_id}",
        web::delete().to(engagements::unlike),
    )
    .route(
        "/videos/{video_id}/progress/{user_id}",
        web::put().to(engagements::progress),
    );
}
