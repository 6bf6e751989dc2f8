//! Versioned SQL migrations.
//!
//! Each migration runs in its own transaction together with the row that records it, under a
//! session advisory lock, so running the migrator twice, or from two processes at once, applies
//! every migration exactly once. A recorded migration whose text changed is refused: the
//! database would no longer match the code.

use crate::db::{DbError, PgPool};
use crate::outbox::stable_hash;

/// One migration, named like its file: `NNNN_verb_noun.sql`.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// An ordered set of migrations applied into one schema (`search_path` is set to it).
#[derive(Debug, Clone, Copy)]
pub struct MigrationSet {
    /// Names the set in the record table, so several sets can share a schema.
    pub set: &'static str,
    pub migrations: &'static [Migration],
}

/// The framework's own tables (outbox, relay state, inbox, consumer offsets, backfill runs).
pub const COURIER: MigrationSet = MigrationSet {
    set: "courier",
    migrations: &[
        Migration {
            version: 1,
            name: "0001_create_outbox",
            sql: include_str!("../../../migrations/courier/0001_create_outbox.sql"),
        },
        Migration {
            version: 2,
            name: "0002_create_relay_state",
            sql: include_str!("../../../migrations/courier/0002_create_relay_state.sql"),
        },
        Migration {
            version: 3,
            name: "0003_create_inbox_and_offsets",
            sql: include_str!("../../../migrations/courier/0003_create_inbox_and_offsets.sql"),
        },
        Migration {
            version: 4,
            name: "0004_create_outbox_operator_actions",
            sql: include_str!(
                "../../../migrations/courier/0004_create_outbox_operator_actions.sql"
            ),
        },
        Migration {
            version: 5,
            name: "0005_create_dead_letter_log",
            sql: include_str!("../../../migrations/courier/0005_create_dead_letter_log.sql"),
        },
        Migration {
            version: 6,
            name: "0006_create_backfill_runs",
            sql: include_str!("../../../migrations/courier/0006_create_backfill_runs.sql"),
        },
        Migration {
            version: 7,
            name: "0007_index_only_unpublished_handles",
            sql: include_str!(
                "../../../migrations/courier/0007_index_only_unpublished_handles.sql"
            ),
        },
        Migration {
            version: 8,
            name: "0008_hot_claims",
            sql: include_str!("../../../migrations/courier/0008_hot_claims.sql"),
        },
        Migration {
            version: 9,
            name: "0009_index_ready_and_retrying_rows",
            sql: include_str!("../../../migrations/courier/0009_index_ready_and_retrying_rows.sql"),
        },
        Migration {
            version: 10,
            name: "0010_relay_publish_limit",
            sql: include_str!("../../../migrations/courier/0010_relay_publish_limit.sql"),
        },
        Migration {
            version: 11,
            name: "0011_contiguous_versions",
            sql: include_str!("../../../migrations/courier/0011_contiguous_versions.sql"),
        },
        Migration {
            version: 12,
            name: "0012_index_unpublished_versions",
            sql: include_str!("../../../migrations/courier/0012_index_unpublished_versions.sql"),
        },
        Migration {
            version: 13,
            name: "0013_drop_unpublished_by_shard",
            sql: include_str!("../../../migrations/courier/0013_drop_unpublished_by_shard.sql"),
        },
        Migration {
            version: 14,
            name: "0014_unique_ids_among_unpublished",
            sql: include_str!("../../../migrations/courier/0014_unique_ids_among_unpublished.sql"),
        },
        Migration {
            version: 15,
            name: "0015_versions_ledger",
            sql: include_str!("../../../migrations/courier/0015_versions_ledger.sql"),
        },
        Migration {
            version: 16,
            name: "0016_relay_keys_out",
            sql: include_str!("../../../migrations/courier/0016_relay_keys_out.sql"),
        },
        Migration {
            version: 17,
            name: "0017_log_shard_idle_flags",
            sql: include_str!("../../../migrations/courier/0017_log_shard_idle_flags.sql"),
        },
        Migration {
            version: 18,
            name: "0018_append_offsets",
            sql: include_str!("../../../migrations/courier/0018_append_offsets.sql"),
        },
        Migration {
            version: 19,
            name: "0019_append_key_versions",
            sql: include_str!("../../../migrations/courier/0019_append_key_versions.sql"),
        },
        Migration {
            version: 20,
            name: "0020_sql_append",
            sql: include_str!("../../../migrations/courier/0020_sql_append.sql"),
        },
        Migration {
            version: 21,
            name: "0021_caused_appends",
            sql: include_str!("../../../migrations/courier/0021_caused_appends.sql"),
        },
        Migration {
            version: 22,
            name: "0022_dead_letter_republishes",
            sql: include_str!("../../../migrations/courier/0022_dead_letter_republishes.sql"),
        },
        Migration {
            version: 23,
            name: "0023_faster_sql_append",
            sql: include_str!("../../../migrations/courier/0023_faster_sql_append.sql"),
        },
        Migration {
            version: 24,
            name: "0024_recorded_backlog_floors",
            sql: include_str!("../../../migrations/courier/0024_recorded_backlog_floors.sql"),
        },
        Migration {
            version: 25,
            name: "0025_scalar_append_event",
            sql: include_str!("../../../migrations/courier/0025_scalar_append_event.sql"),
        },
    ],
};

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("schema name {0:?} is not a plain lowercase identifier")]
    BadSchema(String),
    #[error("role name {0:?} is not a plain lowercase identifier")]
    BadRole(String),
    #[error("migration {set}/{name} was applied with different text; the database and the code disagree")]
    Changed { set: String, name: String },
}

/// What a run did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MigrationReport {
    pub applied: Vec<String>,
    pub already_applied: usize,
}

/// Applies `sets` into `schema`, creating the schema if needed.
pub async fn migrate(
    pool: &PgPool,
    schema: &str,
    sets: &[MigrationSet],
) -> Result<MigrationReport, MigrateError> {
    migrate_owned(pool, schema, None, sets).await
}

/// Like [`migrate`]; with an `owner` role, first creates that role (if missing) and makes it
/// the schema's owner, then applies the migrations as that role, so every table belongs to it.
/// A service connecting as its owner role can then use its schema and no other: nobody else
/// holds rights on it. `pool` must connect as a role that may create roles and `SET ROLE`.
pub async fn migrate_owned(
    pool: &PgPool,
    schema: &str,
    owner: Option<&str>,
    sets: &[MigrationSet],
) -> Result<MigrationReport, MigrateError> {
    if !crate::config::is_identifier(schema) {
        return Err(MigrateError::BadSchema(schema.into()));
    }
    if let Some(role) = owner.filter(|role| !crate::config::is_identifier(role)) {
        return Err(MigrateError::BadRole(role.into()));
    }
    let mut conn = pool.get().await.map_err(DbError::pool("migrate"))?;
    // Serialize migrators of this schema across processes; the key is derived from the name.
    let lock_key =
        i64::from_ne_bytes(stable_hash(&format!("courier-migrate:{schema}")).to_ne_bytes());
    conn.execute("SELECT pg_advisory_lock($1)", &[&lock_key])
        .await
        .map_err(DbError::query("take migration lock"))?;
    let result = match owner {
        Some(role) => match become_owner(&conn, schema, role).await {
            Ok(()) => apply_all(&mut conn, schema, false, sets).await,
            Err(e) => Err(e.into()),
        },
        None => apply_all(&mut conn, schema, true, sets).await,
    };
    // Unlock and drop the role even after a failure; if this fails the session ends with the
    // pooled connection.
    let _ = conn
        .batch_execute(&format!(
            "RESET ROLE; SELECT pg_advisory_unlock({lock_key})"
        ))
        .await;
    result
}

/// Creates `role` and `schema` owned by it when missing, then switches the session to `role`.
async fn become_owner(
    conn: &tokio_postgres::Client,
    schema: &str,
    role: &str,
) -> Result<(), DbError> {
    // Two migrators of different schemas may create the same role at once: the loser's
    // duplicate is fine.
    conn.batch_execute(&format!(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN
                 CREATE ROLE {role} LOGIN;
             END IF;
             -- The role producers in other languages are made members of (0020_sql_append.sql).
             IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{schema}_producer') THEN
                 CREATE ROLE {schema}_producer NOLOGIN;
             END IF;
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
         END $$;
         CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION {role};
         ALTER SCHEMA {schema} OWNER TO {role};
         SET ROLE {role};"
    ))
    .await
    .map_err(DbError::query(format!(
        "create role {role} owning schema {schema}"
    )))
}

/// `create_schema` is false when the schema was created for its owner already (the owner
/// may not create schemas, and `IF NOT EXISTS` checks that right first).
async fn apply_all(
    conn: &mut tokio_postgres::Client,
    schema: &str,
    create_schema: bool,
    sets: &[MigrationSet],
) -> Result<MigrationReport, MigrateError> {
    if create_schema {
        conn.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .await
            .map_err(DbError::query(format!("create schema {schema}")))?;
    }
    conn.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
             migration_set text NOT NULL,
             version integer NOT NULL,
             name text NOT NULL,
             checksum bigint NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now(),
             PRIMARY KEY (migration_set, version));"
    ))
    .await
    .map_err(DbError::query("create migration table"))?;
    let mut report = MigrationReport::default();
    for set in sets {
        for migration in set.migrations {
            let checksum = i64::from_ne_bytes(stable_hash(migration.sql).to_ne_bytes());
            let tx = conn
                .transaction()
                .await
                .map_err(DbError::query("begin migration"))?;
            let recorded = tx
                .query_opt(
                    &format!(
                        "SELECT checksum FROM {schema}.schema_migrations
                         WHERE migration_set = $1 AND version = $2"
                    ),
                    &[&set.set, &migration.version],
                )
                .await
                .map_err(DbError::query("read migration record"))?;
            if let Some(row) = recorded {
                if row.get::<_, i64>(0) != checksum {
                    return Err(MigrateError::Changed {
                        set: set.set.into(),
                        name: migration.name.into(),
                    });
                }
                report.already_applied += 1;
                continue;
            }
            tx.batch_execute(&format!(
                "SET LOCAL search_path TO {schema}; {}",
                migration.sql
            ))
            .await
            .map_err(DbError::query(format!(
                "apply migration {}",
                migration.name
            )))?;
            tx.execute(
                &format!(
                    "INSERT INTO {schema}.schema_migrations (migration_set, version, name, checksum)
                     VALUES ($1, $2, $3, $4)"
                ),
                &[&set.set, &migration.version, &migration.name, &checksum],
            )
            .await
            .map_err(DbError::query("record migration"))?;
            tx.commit().await.map_err(DbError::query(format!(
                "commit migration {}",
                migration.name
            )))?;
            tracing::info!(schema, migration = migration.name, "migration applied");
            report
                .applied
                .push(format!("{}/{}", set.set, migration.name));
        }
    }
    Ok(report)
}
