//! The catalog service: owns videos. Every write stores the video row and its event in one
//! transaction (the outbox), and the service reads engagement back from its own projection of
//! the engagement service's events.
//!
//! # Layout
//! - [`api`]: HTTP routes — video writes and reads, engagement reads with read-your-writes.
//! - [`backfill`]: a `VideoSnapshot` of every video, for `catalog backfill`.
//! - [`events`]: how a change of a video becomes an outbox event (`catalog.video.events`).
//! - [`projections`]: `video_user_engagements_projection`, fed by `engagement.video.events`.

pub mod api;
pub mod backfill;
pub mod events;
pub mod projections;

use courier::migrate::{Migration, MigrationSet};
use courier::service::{Inbound, Service};

pub const NAME: &str = "catalog";

/// The catalog's own tables (`migrations/catalog/`), applied into its schema.
pub const MIGRATIONS: MigrationSet = MigrationSet {
    set: "catalog",
    migrations: &[
        Migration {
            version: 1,
            name: "0001_create_videos",
            sql: include_str!("../../../migrations/catalog/0001_create_videos.sql"),
        },
        Migration {
            version: 2,
            name: "0002_create_video_user_engagements_projection",
            sql: include_str!(
                "../../../migrations/catalog/0002_create_video_user_engagements_projection.sql"
            ),
        },
    ],
};

/// The service as the framework runs it.
pub fn service() -> Service {
    Service {
        name: NAME,
        migrations: MIGRATIONS,
        outbound_topics: &[courier_proto::catalog::TOPIC],
        inbound: vec![Inbound::new(
            courier_proto::engagement::TOPIC,
            "projector",
            &["video_user_engagements_projection"],
            projections::VideoUserEngagements::new(),
        )],
        routes: api::routes,
        backfills: vec![std::sync::Arc::new(backfill::VideoSnapshots)],
    }
}
