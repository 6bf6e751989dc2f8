//! What a service implements to consume events: a [`Projection`], and the
//! [`VersionedUpsert`] helper that makes applying an event idempotent and order-safe.

use crate::config::is_identifier;
use crate::db::{DbError, PgTransaction};
use crate::inbound::delivery::EventMeta;
use crate::outbox::AppendError;
use std::future::Future;
use tokio_postgres::types::ToSql;

/// A failed handler call, split the way the projector must react.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Retrying later can succeed: the transaction is retried in place with backoff
    /// (`consumer.transient_retries`), then the message is nacked and redelivered.
    #[error("transient: {0}")]
    Transient(String),
    /// Retrying cannot succeed: the message goes to the dead-letter topic with this reason.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The database could not be reached or the connection broke: not the event's fault, so
    /// the projector retries in place and spends no delivery attempt.
    #[error("database unavailable: {0}")]
    Unavailable(String),
}

impl HandlerError {
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            HandlerError::Transient(_) | HandlerError::Unavailable(_)
        )
    }

    pub fn is_unavailable(&self) -> bool {
        matches!(self, HandlerError::Unavailable(_))
    }
}

impl From<DbError> for HandlerError {
    fn from(error: DbError) -> Self {
        if error.is_unavailable() {
            HandlerError::Unavailable(error.to_string())
        } else if error.is_transient() {
            HandlerError::Transient(error.to_string())
        } else {
            HandlerError::Permanent(error.to_string())
        }
    }
}

/// An append in the projection's transaction (a projection that emits events) that failed.
/// The database's trouble keeps its class (unavailable, transient, permanent); an event the
/// projection built wrong can never be appended, so it is permanent. So is a conflict: the
/// version ledger already holds that `(aggregate_id, version)`, as after a replay of an
/// emitting projection (appends idempotent by cause are not built yet).
impl From<AppendError> for HandlerError {
    fn from(error: AppendError) -> Self {
        if error.is_conflict() {
            return HandlerError::Permanent(format!("event already appended: {error}"));
        }
        match error {
            AppendError::Db(e) => e.into(),
            invalid => HandlerError::Permanent(format!("event refused by the outbox: {invalid}")),
        }
    }
}

impl From<tokio_postgres::Error> for HandlerError {
    fn from(error: tokio_postgres::Error) -> Self {
        DbError::Query {
            context: "projection handler".into(),
            error,
        }
        .into()
    }
}

/// An id field of an event that must be a UUID. A malformed one can never be applied, so the
/// error is permanent (the event is dead-lettered with this reason).
pub fn uuid_field(name: &str, value: &str) -> Result<uuid::Uuid, HandlerError> {
    uuid::Uuid::parse_str(value)
        .map_err(|e| HandlerError::Permanent(format!("{name} {value:?} is not a UUID: {e}")))
}

/// A read model fed by one subscription. The framework decodes the payload, deduplicates
/// through the inbox, calls [`Projection::apply`] inside the transaction that also saves the
/// offset, commits, and only then acks.
pub trait Projection: Send + Sync + 'static {
    /// The protobuf message the payload decodes to (the service's event envelope).
    type Event: prost::Message + Default + Unpin + 'static;

    /// Schema versions this projection understands; others are dead-lettered.
    fn supports_schema_version(&self, schema_version: i32) -> bool {
        schema_version == 1
    }

    /// Whether this projection's events are deltas: version n+1 applies only on top of n
    /// (an update carrying just the changed fields, a counter increment). Then the framework
    /// keeps each key's version and applies a key's events strictly one after another: a gap
    /// (v3 when v1 is stored) holds the key for `consumer.gap_wait_secs`, then parks it with
    /// its waiting events until an operator releases it (`courier parked`). A projection whose
    /// events each carry the whole state (a versioned upsert) needs none of this.
    fn contiguous_versions(&self) -> bool {
        false
    }

    /// With contiguous versions: whether `event` carries the aggregate's whole state (a
    /// create, a snapshot from a backfill), and so applies whatever version its key stands at,
    /// superseding the versions before it instead of waiting for them.
    fn is_whole_state(&self, _meta: &EventMeta, _event: &Self::Event) -> bool {
        false
    }

    /// Whether the handlers of different aggregates write disjoint rows (each its key's own;
    /// a shared row only in single statements such as `n = n + 1`). Then the keys of a shared
    /// transaction are applied together, their statements pipelined on its connection, instead
    /// of each key waiting for the one before: a round trip per statement of the longest key
    /// rather than of every key. Leave it false when a handler reads a row other keys also
    /// write and writes it back from Rust: interleaved with another key's handler, one of the
    /// two updates would be lost. Each key's events still apply one after another, in order.
    fn independent_keys(&self) -> bool {
        false
    }

    /// Applies one event in `tx`. Must be idempotent by effect for replays (use
    /// [`VersionedUpsert`]); must not commit or roll back. Run fixed statements through
    /// [`PgTransaction::prepared`]: they are then parsed and planned once per connection.
    fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Self::Event,
    ) -> impl Future<Output = Result<(), HandlerError>>;

    /// Applies the new events of one aggregate that share a transaction, oldest first (up to
    /// `consumer.max_events_per_transaction`). The default applies each with
    /// [`Projection::apply`]. A projection whose events each carry the aggregate's whole state
    /// may write only the newest: a versioned upsert would keep only that one anyway, and the
    /// group then costs one statement instead of one per event.
    fn apply_group(
        &self,
        tx: &PgTransaction<'_>,
        events: &[(&EventMeta, &Self::Event)],
    ) -> impl Future<Output = Result<(), HandlerError>> {
        async move {
            for (meta, event) in events {
                self.apply(tx, meta, event).await?;
            }
            Ok(())
        }
    }
}

/// An `INSERT … ON CONFLICT DO UPDATE` that only overwrites a row when the incoming version is
/// newer than the stored one, so replays and late duplicates never move a row backwards.
///
/// The table needs a `version bigint` column; `key_columns` must be its primary key (or a
/// unique constraint).
#[derive(Debug, Clone)]
pub struct VersionedUpsert {
    sql: String,
    params: usize,
    /// Label of the version-lag gauge (a fixed, small set: the service's tables).
    table: String,
}

/// What a versioned upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpsertOutcome {
    /// The row was inserted or overwritten.
    pub applied: bool,
    /// The stored version before this upsert, if a row existed.
    pub previous_version: Option<i64>,
}

impl VersionedUpsert {
    /// Builds the statement; names must be plain lowercase identifiers (`table` may be
    /// schema-qualified as `schema.table`).
    pub fn new(table: &str, key_columns: &[&str], value_columns: &[&str]) -> Result<Self, String> {
        let table_ok = table.split('.').count() <= 2 && table.split('.').all(is_identifier);
        if !table_ok {
            return Err(format!("table name {table:?} is not a plain identifier"));
        }
        if key_columns.is_empty() {
            return Err("at least one key column is needed".into());
        }
        if let Some(bad) = key_columns
            .iter()
            .chain(value_columns)
            .find(|c| !is_identifier(c) || **c == "version")
        {
            return Err(format!(
                "column {bad:?} is not a plain identifier (or is `version`, which is implied)"
            ));
        }
        let columns: Vec<&str> = key_columns
            .iter()
            .chain(value_columns)
            .copied()
            .chain(["version"])
            .collect();
        let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
        let updates: Vec<String> = value_columns
            .iter()
            .chain(&["version"])
            .map(|c| format!("{c} = EXCLUDED.{c}"))
            .collect();
        let key_match: Vec<String> = key_columns
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c} = ${}", i + 1))
            .collect();
        // The CTE reads the stored version from the statement's snapshot (before the upsert);
        // the projector serializes one aggregate's events, so nothing changes it in between.
        let sql = format!(
            "WITH previous AS (SELECT version FROM {table} WHERE {keys}), \
             upserted AS (INSERT INTO {table} ({cols}) VALUES ({vals}) \
             ON CONFLICT ({key_cols}) DO UPDATE SET {updates} \
             WHERE {table}.version < EXCLUDED.version RETURNING 1) \
             SELECT (SELECT count(*) FROM upserted) > 0, (SELECT version FROM previous)",
            keys = key_match.join(" AND "),
            cols = columns.join(", "),
            vals = placeholders.join(", "),
            key_cols = key_columns.join(", "),
            updates = updates.join(", "),
        );
        Ok(Self {
            sql,
            params: columns.len(),
            table: table.into(),
        })
    }

    /// Runs the upsert in `tx` with `values` (key columns, then value columns) at `version`.
    /// Records the version lag (incoming − stored) of the table.
    pub async fn execute(
        &self,
        tx: &PgTransaction<'_>,
        values: &[&(dyn ToSql + Sync)],
        version: i64,
    ) -> Result<UpsertOutcome, HandlerError> {
        if values.len() + 1 != self.params {
            return Err(HandlerError::Permanent(format!(
                "versioned upsert on {} takes {} values, got {}",
                self.table,
                self.params - 1,
                values.len()
            )));
        }
        // Prepared once per connection: one round trip per event, no parse or plan.
        let statement = tx.prepared(&self.sql).await?;
        let params: Vec<&(dyn ToSql + Sync)> = values
            .iter()
            .copied()
            .chain([&version as &(dyn ToSql + Sync)])
            .collect();
        let rows = tx.query(&statement, &params).await?;
        let row = rows.first().ok_or_else(|| {
            HandlerError::Permanent(format!(
                "versioned upsert on {} returned no row",
                self.table
            ))
        })?;
        let outcome = UpsertOutcome {
            applied: row.get(0),
            previous_version: row.get(1),
        };
        if let Some(previous) = outcome.previous_version {
            #[allow(clippy::cast_precision_loss)]
            metrics::gauge!(crate::metrics::PROJECTION_VERSION_LAG, "table" => self.table.clone())
                .set((version - previous) as f64);
        }
        Ok(outcome)
    }

    /// The statement, for logs and tests.
    pub fn sql(&self) -> &str {
        &self.sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::InvalidEvent;

    #[test]
    fn an_append_the_outbox_refuses_is_the_events_fault_and_an_outage_is_not() {
        let invalid = HandlerError::from(AppendError::Invalid(InvalidEvent {
            field: "event_type",
            reason: "must be lowercase".into(),
        }));
        assert!(
            matches!(invalid, HandlerError::Permanent(ref r) if r.contains("event_type")),
            "{invalid:?}"
        );
        let duplicate = HandlerError::from(AppendError::DuplicateVersion {
            aggregate_id: "v-1".into(),
            version: 2,
            first: uuid::Uuid::nil(),
            second: uuid::Uuid::max(),
        });
        assert!(
            matches!(duplicate, HandlerError::Permanent(_)),
            "{duplicate:?}"
        );
        let pool = HandlerError::from(AppendError::Db(DbError::Pool {
            context: "append".into(),
            error: bb8::RunError::TimedOut,
        }));
        assert!(matches!(pool, HandlerError::Unavailable(_)), "{pool:?}");
        assert!(pool.is_transient());
    }

    #[test]
    fn builds_a_guarded_upsert() {
        let upsert = VersionedUpsert::new("app.videos", &["video_id"], &["title"]).expect("valid");
        assert!(upsert.sql().contains("ON CONFLICT (video_id) DO UPDATE SET title = EXCLUDED.title, version = EXCLUDED.version"));
        assert!(upsert
            .sql()
            .contains("WHERE app.videos.version < EXCLUDED.version"));
        assert_eq!(upsert.params, 3);
    }

    #[test]
    fn refuses_names_that_are_not_identifiers() {
        assert!(VersionedUpsert::new("videos; drop", &["id"], &[]).is_err());
        assert!(VersionedUpsert::new("videos", &[], &["title"]).is_err());
        assert!(VersionedUpsert::new("videos", &["id"], &["Title"]).is_err());
        assert!(VersionedUpsert::new("videos", &["id"], &["version"]).is_err());
    }
}
