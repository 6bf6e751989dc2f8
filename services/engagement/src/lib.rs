//! The engagement service: owns users' engagement with videos (views, likes, watch
//! progress). Every write stores the engagement row and its event in one transaction, and is
//! refused for a video its replica of the catalog does not know or knows as deleted.
//!
//! # Layout
//! - [`api`]: HTTP routes — views, likes, watch progress.
//! - [`events`]: how a change of an engagement becomes an outbox event
//!   (`engagement.video.events`).
//! - [`projections`]: `videos_replica`, fed by `catalog.video.events`.

pub mod api;
pub mod events;
pub mod projections;

use courier::migrate::{Migration, MigrationSet};
use courier::service::{Inbound, Service};

pub const NAME: &str = "engagement";

/// The engagement service's own tables (`migrations/engagement/`), applied into its schema.
pub const MIGRATIONS: MigrationSet = MigrationSet {
    set: "engagement",
    migrations: &[
        Migration {
            version: 1,
            name: "0001_create_engagements",
            sql: include_str!("../../../migrations/engagement/0001_create_engagements.sql"),
        },
        Migration {
            version: 2,
            name: "0002_create_videos_replica",
            sql: include_str!("../../../migrations/engagement/0002_create_videos_replica.sql"),
        },
    ],
};

/// The service as the framework runs it.
pub fn service() -> Service {
    Service {
        name: NAME,
        migrations: MIGRATIONS,
        outbound_topics: &[courier_proto::engagement::TOPIC],
        inbound: vec![Inbound::new(
            courier_proto::catalog::TOPIC,
            "reader",
            &["videos_replica"],
            projections::VideosReplica::new(),
        )],
        routes: api::routes,
        backfills: Vec::new(),
    }
}
