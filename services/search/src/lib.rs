//! The search service: full-text search over the catalog's videos. Its projection of
//! `catalog.video.events` keeps a PostgreSQL `tsvector` per video and, in the same
//! transaction, emits whether the video can be found (`search.video.events`); a redelivered
//! or replayed catalog event changes nothing and emits nothing again.
//!
//! # Layout
//! - [`api`]: `GET /search?q=`.
//! - [`contract`]: the events this service publishes (its own `proto/`).
//! - [`events`]: how a document's state becomes an outbox event.
//! - [`projections`]: `search_documents`, fed by `catalog.video.events`.

pub mod api;
pub mod contract;
pub mod events;
pub mod projections;

use courier::migrate::{Migration, MigrationSet};
use courier::service::{Deployment, Inbound, Service};

pub const NAME: &str = "search";

/// The search service's own tables (`migrations/search/`), applied into its schema.
pub const MIGRATIONS: MigrationSet = MigrationSet {
    set: "search",
    migrations: &[Migration {
        version: 1,
        name: "0001_create_search_documents",
        sql: include_str!("../../../migrations/search/0001_create_search_documents.sql"),
    }],
};

/// The service as the framework runs it. The index emits, so it is built from the deployment
/// (its outbox shards as the deployment's relays do).
pub fn service() -> Service {
    Service {
        name: NAME,
        migrations: MIGRATIONS,
        outbound_topics: &[contract::TOPIC],
        inbound: vec![Inbound::build(
            courier_proto::catalog::TOPIC,
            "indexer",
            &["search_documents"],
            |deployment: &Deployment<'_>| projections::SearchIndex::new(deployment.outbox()),
        )],
        routes: api::routes,
        backfills: Vec::new(),
    }
}
