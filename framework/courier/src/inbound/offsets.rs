//! Consumer offsets: how far a consumer group is, saved in every projection transaction,
//! loaded for operators, and reset (audited) to replay from a point in time with a Seek.

use crate::db::{render, DbError, PgPool, PgTransaction};
use crate::outbox::shard::shard_of;
use chrono::{DateTime, Utc};

/// Where a consumer group is.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupOffset {
    pub subscription: String,
    /// The message processed last (by publish time), unless a reset cleared it.
    pub message_id: Option<String>,
    pub newest_publish_time: DateTime<Utc>,
    /// The lane that is furthest behind.
    pub oldest_publish_time: DateTime<Utc>,
    pub max_lag_millis: i64,
    pub updated_at: DateTime<Utc>,
    pub lanes: i64,
}

/// The result of a reset.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OffsetReset {
    /// Row id in `consumer_offset_resets`.
    pub audit_id: i64,
    pub old_publish_time: Option<DateTime<Utc>>,
    pub new_publish_time: DateTime<Utc>,
    /// Inbox rows deleted so that the replayed events apply again.
    pub inbox_rows_forgotten: i64,
}

/// One position to save: the newest message of a projection transaction.
#[derive(Debug, Clone)]
pub struct Position<'a> {
    pub routing_key: &'a str,
    pub message_id: &'a str,
    pub publish_time: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct OffsetStore {
    schema: String,
    lanes: u32,
    save: String,
    load: String,
    reset: String,
}

impl OffsetStore {
    pub fn new(schema: &str, lanes: u32) -> Self {
        Self {
            schema: schema.into(),
            lanes,
            save: render(include_str!("queries/save_offset.sql"), schema),
            load: render(include_str!("queries/load_offset.sql"), schema),
            reset: render(include_str!("queries/reset_offset.sql"), schema),
        }
    }

    /// Saves `position` for `group` in `tx` (the projection's transaction), with the lag
    /// from its publish time to now. A lane never moves backwards.
    pub async fn save(
        &self,
        tx: &PgTransaction<'_>,
        group: &str,
        subscription: &str,
        position: Position<'_>,
        instance: &str,
    ) -> Result<i64, DbError> {
        let lane = i32::try_from(shard_of(position.routing_key, self.lanes)).unwrap_or(0);
        let lag_millis = (Utc::now() - position.publish_time)
            .num_milliseconds()
            .max(0);
        let context = || format!("save offset of group {group}");
        let save = tx
            .prepared(&self.save)
            .await
            .map_err(DbError::query(context()))?;
        tx.execute(
            &save,
            &[
                &group,
                &lane,
                &subscription,
                &position.message_id,
                &position.publish_time,
                &lag_millis,
                &instance,
            ],
        )
        .await
        .map_err(DbError::query(context()))?;
        Ok(lag_millis)
    }

    /// The group's position, or `None` before its first event.
    pub async fn load(&self, pool: &PgPool, group: &str) -> Result<Option<GroupOffset>, DbError> {
        let client = pool
            .get()
            .await
            .map_err(DbError::pool(format!("load offset of group {group}")))?;
        let row = client
            .query_opt(&self.load, &[&group])
            .await
            .map_err(DbError::query(format!("load offset of group {group}")))?;
        Ok(row.map(|r| GroupOffset {
            subscription: r.get("subscription"),
            message_id: r.get("message_id"),
            newest_publish_time: r.get("newest_publish_time"),
            oldest_publish_time: r.get("oldest_publish_time"),
            max_lag_millis: r.get("max_lag_millis"),
            updated_at: r.get("updated_at"),
            lanes: r.get("lanes"),
        }))
    }

    /// Every consumer group with a saved offset in this schema.
    pub async fn groups(&self, pool: &PgPool) -> Result<Vec<String>, DbError> {
        let context = format!("list consumer groups in schema {}", self.schema);
        let client = pool.get().await.map_err(DbError::pool(&context))?;
        let rows = client
            .query(
                &format!(
                    "SELECT DISTINCT consumer_group FROM {}.consumer_offsets ORDER BY 1",
                    self.schema
                ),
                &[],
            )
            .await
            .map_err(DbError::query(&context))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The publish time saved with `message_id` in one of `group`'s lanes, to reset to a
    /// message instead of a time (Pub/Sub seeks to times).
    pub async fn publish_time_of(
        &self,
        pool: &PgPool,
        group: &str,
        message_id: &str,
    ) -> Result<Option<DateTime<Utc>>, DbError> {
        let context = format!("find message {message_id} in the offsets of group {group}");
        let client = pool.get().await.map_err(DbError::pool(&context))?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT max(publish_time) FROM {}.consumer_offsets
                     WHERE consumer_group = $1 AND message_id = $2",
                    self.schema
                ),
                &[&group, &message_id],
            )
            .await
            .map_err(DbError::query(&context))?;
        Ok(row.and_then(|r| r.get(0)))
    }

    /// Moves every lane of `group` to `to`, forgets the inbox rows of events published since
    /// then, and records who did it and why. The caller then seeks the subscription to `to`
    /// ([`crate::pubsub::PubSub::seek`]) so those events are delivered and applied again.
    pub async fn reset(
        &self,
        pool: &PgPool,
        group: &str,
        subscription: &str,
        to: DateTime<Utc>,
        by: &str,
        reason: &str,
    ) -> Result<OffsetReset, DbError> {
        let context = format!("reset offset of group {group} in schema {}", self.schema);
        let client = pool.get().await.map_err(DbError::pool(&context))?;
        let row = client
            .query_one(&self.reset, &[&group, &subscription, &to, &by, &reason])
            .await
            .map_err(DbError::query(&context))?;
        Ok(OffsetReset {
            audit_id: row.get("id"),
            old_publish_time: row.get("old_publish_time"),
            new_publish_time: to,
            inbox_rows_forgotten: row.get("inbox_rows_forgotten"),
        })
    }
}
