//! Why a service could not be migrated, provisioned, started or asked for a backfill.

use crate::db::DbError;
use crate::inbound::ConsumerError;
use crate::migrate::MigrateError;
use crate::pubsub::PubSubError;
use crate::relay::tree::RelayError;
use crate::system_thread::ThreadStartError;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    PubSub(#[from] PubSubError),
    #[error(transparent)]
    Relay(#[from] RelayError),
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    #[error("cannot serve HTTP on {listen}: {reason}")]
    Http { listen: String, reason: String },
    #[error(transparent)]
    Start(#[from] ThreadStartError),
    #[error("no projection {role:?}; this service has: {known}")]
    UnknownProjection { role: String, known: String },
    #[error("--aggregate {aggregate_type:?} is not one this service backfills ({known})")]
    UnknownAggregate {
        aggregate_type: String,
        known: String,
    },
    #[error("--aggregate is needed: this service backfills {known}")]
    AggregateRequired { known: String },
    #[error("this service declares no backfill")]
    NoBackfill,
}
