//! What an operator does with an outbox: look at its backlog per shard, list the dead rows
//! that block their keys, retry them, or skip one (never sent, key unblocked). Retries and
//! skips are recorded in `outbox_operator_actions` and wake the shard's claimer.

use crate::db::{render, DbError, PgPool, PooledClient};
use crate::outbox::wake_channel;
use crate::relay::backlog::BacklogGauge;
use crate::relay::notify_listener::RESCAN;
use crate::relay::store::OutboxStore;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::time::Duration;
use uuid::Uuid;

/// The backlog of one shard (only shards with unpublished rows are listed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardStats {
    pub shard: i32,
    /// Unpublished rows that will be published (in flight included).
    pub pending: i64,
    /// Claimed under a live lease: being published now.
    pub in_flight: i64,
    /// Out of attempts or failed permanently; each blocks its key until retried or skipped.
    pub dead: i64,
    pub oldest_pending_secs: f64,
}

/// A dead row, as an operator needs to judge it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadRow {
    pub event_id: Uuid,
    pub shard: i32,
    pub topic: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub version: i64,
    pub publish_attempts: i32,
    pub last_error: Option<String>,
    pub dead_at: DateTime<Utc>,
}

/// A row an operator action changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActedOn {
    pub event_id: Uuid,
    pub aggregate_id: String,
    pub version: i64,
}

/// Which dead rows to retry.
#[derive(Debug, Clone, PartialEq)]
pub enum DeadSelection {
    Ids(Vec<Uuid>),
    All,
}

/// Who acts and why, for the audit table.
#[derive(Debug, Clone)]
pub struct Audit<'a> {
    pub actor: &'a str,
    pub reason: &'a str,
}

pub struct OutboxOperator {
    pool: PgPool,
    /// The relay's statements, for the backlog read from the shards' floors.
    store: OutboxStore,
    channel: String,
    dead_rows: String,
    retry_dead: String,
    skip_dead: String,
}

impl OutboxOperator {
    pub fn new(pool: PgPool, schema: &str) -> Self {
        Self {
            store: OutboxStore::new(pool.clone(), schema),
            pool,
            channel: wake_channel(schema),
            dead_rows: render(include_str!("queries/dead_rows.sql"), schema),
            retry_dead: render(include_str!("queries/retry_dead.sql"), schema),
            skip_dead: render(include_str!("queries/skip_dead.sql"), schema),
        }
    }

    async fn client(&self, context: &str) -> Result<PooledClient<'_>, DbError> {
        self.pool.get().await.map_err(DbError::pool(context))
    }

    /// Backlog per shard of the `shard_count` shards, counted from each shard's floor as the
    /// relay's gauge counts (so a pinned horizon does not make it walk every row published
    /// since the pin); `claim_lease` tells live claims from expired ones.
    pub async fn shard_stats(
        &self,
        shard_count: u32,
        claim_lease: Duration,
    ) -> Result<Vec<ShardStats>, DbError> {
        let parts = BacklogGauge::read_once(&self.store, shard_count, claim_lease).await?;
        let mut stats: Vec<ShardStats> = Vec::new();
        for part in parts {
            match stats.last_mut() {
                Some(s) if s.shard == part.shard => {
                    s.pending += part.pending;
                    s.in_flight += part.in_flight;
                    s.dead += part.dead;
                    s.oldest_pending_secs = s.oldest_pending_secs.max(part.oldest_pending_secs);
                }
                _ => stats.push(ShardStats {
                    shard: part.shard,
                    pending: part.pending,
                    in_flight: part.in_flight,
                    dead: part.dead,
                    oldest_pending_secs: part.oldest_pending_secs,
                }),
            }
        }
        Ok(stats)
    }

    /// Dead rows, oldest first, at most `limit`.
    pub async fn dead_rows(&self, limit: i64) -> Result<Vec<DeadRow>, DbError> {
        let client = self.client("list dead outbox rows").await?;
        let rows = client
            .query(&self.dead_rows, &[&limit])
            .await
            .map_err(DbError::query("list dead outbox rows"))?;
        Ok(rows
            .iter()
            .map(|r| DeadRow {
                event_id: r.get("id"),
                shard: r.get("shard"),
                topic: r.get("topic"),
                aggregate_id: r.get("aggregate_id"),
                event_type: r.get("event_type"),
                version: r.get("version"),
                publish_attempts: r.get("publish_attempts"),
                last_error: r.get("last_error"),
                dead_at: r.get("dead_at"),
            })
            .collect())
    }

    /// Makes the selected dead rows publishable again (attempts reset), audited; ids that
    /// are not dead rows are left alone and missing from the answer.
    pub async fn retry(
        &self,
        selection: &DeadSelection,
        audit: &Audit<'_>,
    ) -> Result<Vec<ActedOn>, DbError> {
        let (ids, all) = match selection {
            DeadSelection::Ids(ids) => (ids.clone(), false),
            DeadSelection::All => (Vec::new(), true),
        };
        self.act(
            "retry dead outbox rows",
            &self.retry_dead,
            &[&ids, &all, &audit.actor, &audit.reason],
        )
        .await
    }

    /// Marks one dead row skipped (never sent; its key flows again), audited. `None` when
    /// `event_id` is not a dead row.
    pub async fn skip(
        &self,
        event_id: Uuid,
        audit: &Audit<'_>,
    ) -> Result<Option<ActedOn>, DbError> {
        let acted = self
            .act(
                "skip dead outbox row",
                &self.skip_dead,
                &[&event_id, &audit.actor, &audit.reason],
            )
            .await?;
        Ok(acted.into_iter().next())
    }

    /// Runs an audited action in one transaction with a wake-up of the shards it touched.
    async fn act(
        &self,
        context: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<ActedOn>, DbError> {
        let mut client = self.client(context).await?;
        let tx = client
            .transaction()
            .await
            .map_err(DbError::query(context))?;
        let rows = tx
            .query(sql, params)
            .await
            .map_err(DbError::query(context))?;
        let shards: Vec<i32> = rows.iter().map(|r| r.get("shard")).collect();
        // Retried rows and rows behind a skipped one lie below where claims look: the wake
        // asks for a scan from the shard's start.
        tx.execute(
            "SELECT pg_notify($1, s::text || ' ' || $3) FROM unnest($2::integer[]) s",
            &[&self.channel, &shards, &RESCAN],
        )
        .await
        .map_err(DbError::query(context))?;
        tx.commit().await.map_err(DbError::query(context))?;
        Ok(rows
            .iter()
            .map(|r| ActedOn {
                event_id: r.get("id"),
                aggregate_id: r.get("aggregate_id"),
                version: r.get("version"),
            })
            .collect())
    }
}
