//! Consumer offsets: how far a consumer group is, saved in every projection transaction,
//! loaded for operators, and reset (audited) to replay from a point in time with a Seek.
//!
//! A lane's position is the newest of its entries in `consumer_offset_log`: a save that moves
//! the lane appends an entry instead of rewriting a row, and reads the lane from the newest
//! entry its store saw up (queries/lane_newest.sql), so no statement's cost grows with the
//! dead entries a long transaction keeps (P9; 0018_append_offsets.sql). The saves themselves
//! prune a lane's older entries, a range at a time.

use crate::db::{render, DbError, PgPool, PgTransaction};
use crate::outbox::shard_of;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Entries a lane gains through one store between two of its prunes: a prune deletes about
/// this many in the projection transaction that runs it (a fraction of a millisecond), and a
/// lane holds a few times as many at most.
const PRUNE_EVERY: u32 = 64;

/// Sent right before the save, for the rest of the projection's transaction. The log is a
/// page or two while no horizon is pinned, and a plan cached then (a sequential scan) would
/// read every page a pin later keeps; with sequential scans off, the save and the prune are
/// planned through the index whatever the table's size when they were. LOCAL: the handlers'
/// statements, which ran before, and the next transaction on the connection are unaffected.
const PLAN_THROUGH_THE_INDEX: &str = "SET LOCAL enable_seqscan = off";

/// A position in a lane's log: (reset_id, publish time), ordered as the index orders them.
type LogPosition = (i64, DateTime<Utc>);

/// What a store remembers of one lane's log between saves.
#[derive(Debug, Default, Clone, Copy)]
struct LaneLog {
    /// Entries appended through this store since it last pruned the lane.
    appended: u32,
    /// The newest entry this store appended or a prune kept: where the next save and prune
    /// look for the lane's newest entry first (lane_newest.sql).
    newest_seen: Option<LogPosition>,
    /// The newest entries the last two prunes kept, newer first. A prune starts from the
    /// older one: the range of a prune whose transaction rolled back is covered again, and
    /// what a pin keeps further down is not walked again. None: from the lane's start.
    kept: [Option<LogPosition>; 2],
}

impl LaneLog {
    /// Counts an entry this store appended; when the lane is due for a prune, returns where
    /// the prune starts.
    fn appended_to(&mut self, entry: LogPosition) -> Option<Option<LogPosition>> {
        self.saw(entry);
        self.appended += 1;
        if self.appended < PRUNE_EVERY {
            return None;
        }
        self.appended = 0;
        Some(self.kept[1])
    }

    /// A prune kept `newest`, the lane's newest entry.
    fn pruned_below(&mut self, newest: LogPosition) {
        self.saw(newest);
        if self.kept[0].is_none_or(|kept| kept < newest) {
            self.kept = [Some(newest), self.kept[0]];
        }
    }

    /// Entries move forward; one seen in a transaction that rolled back only makes the next
    /// look at the lane read it whole, until a later one passes it.
    fn saw(&mut self, entry: LogPosition) {
        if self.newest_seen.is_none_or(|seen| seen < entry) {
            self.newest_seen = Some(entry);
        }
    }
}

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

/// Clones share what they remember of the lanes (one store per consumer).
#[derive(Debug, Clone)]
pub struct OffsetStore {
    schema: String,
    lanes: u32,
    save: String,
    prune: String,
    load: String,
    groups: String,
    message_time: String,
    reset: String,
    /// Per consumer group, per lane: appends since the lane's last prune, where it was, and
    /// the newest entry seen.
    logs: Arc<Mutex<HashMap<String, Vec<LaneLog>>>>,
}

impl OffsetStore {
    pub fn new(schema: &str, lanes: u32) -> Self {
        let positions = render(include_str!("queries/lane_positions.sql"), schema);
        let with_positions =
            |sql: &str| render(sql, schema).replace("{positions}", positions.trim_end());
        let newest = render(include_str!("queries/lane_newest.sql"), schema);
        // The statement's own parameters for the position last seen (typed: it may be NULL).
        let with_newest = |sql: &str, reset: &str, time: &str| {
            let newest = newest
                .trim_end()
                .replace("{reset}", reset)
                .replace("{time}", time);
            render(sql, schema).replace("{newest}", &newest)
        };
        Self {
            schema: schema.into(),
            lanes,
            save: with_newest(
                include_str!("queries/save_offset.sql"),
                "$8::bigint",
                "$9::timestamptz",
            ),
            prune: with_newest(
                include_str!("queries/prune_offsets.sql"),
                "$5::bigint",
                "$6::timestamptz",
            ),
            load: with_positions(include_str!("queries/load_offset.sql")),
            groups: render(include_str!("queries/offset_groups.sql"), schema),
            message_time: with_positions(include_str!("queries/offset_of_message.sql")),
            reset: with_positions(include_str!("queries/reset_offset.sql")),
            logs: Arc::default(),
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
        let (seen_reset, seen_time) = self.lane(group, lane, |log| log.newest_seen).unzip();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
            &group,
            &lane,
            &subscription,
            &position.message_id,
            &position.publish_time,
            &lag_millis,
            &instance,
            &seen_reset,
            &seen_time,
        ];
        // `join!` polls in order: the SET goes out first, the save right behind it.
        let (planned, appended) = futures::join!(
            tx.batch_execute(PLAN_THROUGH_THE_INDEX),
            tx.query_opt(&save, &params)
        );
        planned.map_err(DbError::query(context()))?;
        if let Some(appended) = appended.map_err(DbError::query(context()))? {
            let entry: LogPosition = (appended.get("reset_id"), appended.get("publish_time"));
            if let Some(from) = self.lane(group, lane, |log| log.appended_to(entry)) {
                self.prune(tx, group, lane, from).await?;
            }
        }
        Ok(lag_millis)
    }

    /// Runs `f` on what this store remembers of `lane` of `group`.
    fn lane<R>(&self, group: &str, lane: i32, f: impl FnOnce(&mut LaneLog) -> R) -> R {
        let mut logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        let lanes = match logs.get_mut(group) {
            Some(lanes) => lanes,
            None => logs.entry(group.to_owned()).or_default(),
        };
        let index = usize::try_from(lane).unwrap_or(0);
        if lanes.len() <= index {
            lanes.resize(index + 1, LaneLog::default());
        }
        f(&mut lanes[index])
    }

    /// Deletes `lane`'s entries below its newest one from `from` up, in `tx`.
    async fn prune(
        &self,
        tx: &PgTransaction<'_>,
        group: &str,
        lane: i32,
        from: Option<LogPosition>,
    ) -> Result<(), DbError> {
        let context = || format!("prune offsets of group {group}, lane {lane}");
        let prune = tx
            .prepared(&self.prune)
            .await
            .map_err(DbError::query(context()))?;
        let (from_reset, from_time) = from.unzip();
        let (seen_reset, seen_time) = self.lane(group, lane, |log| log.newest_seen).unzip();
        let row = tx
            .query_opt(
                &prune,
                &[
                    &group,
                    &lane,
                    &from_reset,
                    &from_time,
                    &seen_reset,
                    &seen_time,
                ],
            )
            .await
            .map_err(DbError::query(context()))?;
        let Some(row) = row else { return Ok(()) };
        let newest: LogPosition = (row.get("reset_id"), row.get("publish_time"));
        self.lane(group, lane, |log| log.pruned_below(newest));
        Ok(())
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
            .query(&self.groups, &[])
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
            .query_opt(&self.message_time, &[&group, &message_id])
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
