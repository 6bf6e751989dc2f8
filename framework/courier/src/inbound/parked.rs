//! Contiguous projections (delta events): the version each key stands at, keys parked behind
//! a version that did not come, the events they hold, and an operator's release.
//!
//! A parked key's events are acked in Pub/Sub and kept in `parked_events`, so Pub/Sub's own
//! dead-lettering does not cascade through the key's later versions. `courier parked release`
//! (optionally skipping the gap, audited) republishes them to the topic in version order; the
//! consumer then applies them like any delivery.

use crate::db::{render, DbError, PgPool, PgTransaction};
use crate::inbound::delivery::EventMeta;
use crate::pubsub::{PubSub, PubSubError};
use chrono::{DateTime, Utc};
use google_cloud_pubsub::model::Message;
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// A parked key, as `courier parked list` and `courier status` show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ParkedKey {
    pub consumer_group: String,
    pub routing_key: String,
    pub subscription: String,
    /// The version the key waits for.
    pub expected_version: i64,
    pub reason: String,
    pub parked_at: DateTime<Utc>,
    pub held_events: i64,
    pub first_held_version: Option<i64>,
    pub last_held_version: Option<i64>,
}

/// What an operator asks of a parked key.
#[derive(Debug, Clone)]
pub struct Release {
    pub consumer_group: String,
    pub routing_key: String,
    /// Treat every version below this one as applied (the gap is skipped for good).
    pub skip_to: Option<i64>,
    pub by: String,
    pub reason: String,
}

/// What a release did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Released {
    pub expected_version: i64,
    pub skipped_to: Option<i64>,
    /// Held events published back to the topic, in version order.
    pub republished: usize,
    pub topic: String,
    pub audit_id: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    PubSub(#[from] PubSubError),
    #[error("key {key:?} of consumer group {group} is not parked")]
    NotParked { group: String, key: String },
    #[error("--skip-to {0} must be at least 1")]
    BadSkip(i64),
    #[error("republish to {topic} failed (the key stays parked, its events kept): {reason}")]
    Republish { topic: String, reason: String },
}

/// One key's move in a projection transaction ([`KeyVersions::advance`]).
#[derive(Debug, Clone, Copy)]
pub struct KeyMove<'a> {
    pub key: &'a str,
    /// The version the transaction read the key at (0: none, or not read): the move looks for
    /// the entry it replaces from there up first.
    pub from: i64,
    /// Never backwards: a move to a version at or below the key's is no move.
    pub to: i64,
    /// The publish time of the event that starts the key, kept if this is its first move.
    pub first_publish_time: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct KeyVersions {
    schema: String,
    lock: String,
    stored: String,
    advance: String,
    park_key: String,
    park_events: String,
    is_parked: String,
    list: String,
}

impl KeyVersions {
    pub fn new(schema: &str) -> Self {
        let newest = render(include_str!("queries/key_newest.sql"), schema);
        // The read selects the version alone: an index-only scan.
        let with_key_newest = |sql: &str, columns: &str| {
            let newest = newest.trim_end().replace("{columns}", columns);
            render(sql, schema).replace("{newest}", &newest)
        };
        Self {
            schema: schema.into(),
            lock: render(include_str!("queries/lock_key_versions.sql"), schema),
            stored: with_key_newest(include_str!("queries/key_versions.sql"), "l.version"),
            advance: with_key_newest(
                include_str!("queries/advance_key_version.sql"),
                "l.ctid, l.version",
            ),
            park_key: render(include_str!("queries/park_key.sql"), schema),
            park_events: render(include_str!("queries/park_events.sql"), schema),
            is_parked: render(include_str!("queries/key_is_parked.sql"), schema),
            list: render(include_str!("queries/parked_keys.sql"), schema),
        }
    }

    /// The versions `keys` stand at (absent: nothing applied yet), locked until `tx` ends.
    /// Each key comes with the version it is expected at: the read looks from there up first
    /// and passes none of the entries a pinned horizon keeps below (key_versions.sql); a key
    /// elsewhere is still read right, by a second look. The lock and the read are two
    /// statements (the read must see what the lock waited for), sent together: one round trip.
    pub async fn stored(
        &self,
        tx: &PgTransaction<'_>,
        group: &str,
        keys: &[(&str, i64)],
    ) -> Result<HashMap<String, i64>, DbError> {
        let context = || {
            format!(
                "read the versions of {} key(s) of group {group}",
                keys.len()
            )
        };
        let lock = tx
            .prepared(&self.lock)
            .await
            .map_err(DbError::query(context()))?;
        let read = tx
            .prepared(&self.stored)
            .await
            .map_err(DbError::query(context()))?;
        let (names, expected): (Vec<&str>, Vec<i64>) = keys.iter().copied().unzip();
        let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&group, &names];
        let read_params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&group, &names, &expected];
        let (_, rows) = futures::try_join!(
            tx.query_one(&lock, &lock_params),
            tx.query(&read, &read_params)
        )
        .map_err(DbError::query(context()))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Locks `keys` until `tx` ends, as [`KeyVersions::stored`] does, without reading them.
    async fn lock(
        &self,
        tx: &PgTransaction<'_>,
        group: &str,
        keys: &[&str],
    ) -> Result<(), DbError> {
        let context = || format!("lock {} key(s) of group {group}", keys.len());
        let lock = tx
            .prepared(&self.lock)
            .await
            .map_err(DbError::query(context()))?;
        tx.query_one(&lock, &[&group, &keys])
            .await
            .map_err(DbError::query(context()))?;
        Ok(())
    }

    /// Moves each key to its version in `tx`. The caller holds the keys' locks.
    pub async fn advance(
        &self,
        tx: &PgTransaction<'_>,
        group: &str,
        moves: &[KeyMove<'_>],
    ) -> Result<(), DbError> {
        let context = || format!("advance {} key(s) of group {group}", moves.len());
        let statement = tx
            .prepared(&self.advance)
            .await
            .map_err(DbError::query(context()))?;
        let keys: Vec<&str> = moves.iter().map(|m| m.key).collect();
        let versions: Vec<i64> = moves.iter().map(|m| m.to).collect();
        let times: Vec<DateTime<Utc>> = moves.iter().map(|m| m.first_publish_time).collect();
        let read_at: Vec<i64> = moves.iter().map(|m| m.from).collect();
        tx.execute(&statement, &[&group, &keys, &versions, &times, &read_at])
            .await
            .map_err(DbError::query(context()))?;
        Ok(())
    }

    pub async fn is_parked(
        &self,
        tx: &PgTransaction<'_>,
        group: &str,
        key: &str,
    ) -> Result<bool, DbError> {
        let context = || format!("is key {key:?} of group {group} parked");
        let statement = tx
            .prepared(&self.is_parked)
            .await
            .map_err(DbError::query(context()))?;
        let row = tx
            .query_one(&statement, &[&group, &key])
            .await
            .map_err(DbError::query(context()))?;
        Ok(row.get(0))
    }

    /// Parks `key` (waiting for `expected`) with `events` in `tx`; the caller acks them after
    /// the commit.
    #[allow(clippy::too_many_arguments)]
    pub async fn park(
        &self,
        tx: &PgTransaction<'_>,
        group: &str,
        subscription: &str,
        key: &str,
        expected: i64,
        reason: &str,
        events: &[(&EventMeta, &Message)],
    ) -> Result<(), DbError> {
        let context = || format!("park key {key:?} of group {group}");
        tx.execute(
            &self.park_key,
            &[&group, &key, &subscription, &expected, &reason],
        )
        .await
        .map_err(DbError::query(context()))?;
        let ids: Vec<Uuid> = events.iter().map(|(m, _)| m.event_id).collect();
        let versions: Vec<i64> = events.iter().map(|(m, _)| m.version).collect();
        let message_ids: Vec<&str> = events.iter().map(|(m, _)| m.message_id.as_str()).collect();
        let ordering_keys: Vec<&str> = events
            .iter()
            .map(|(_, m)| m.ordering_key.as_str())
            .collect();
        let attributes: Vec<serde_json::Value> = events
            .iter()
            .map(|(_, m)| serde_json::json!(m.attributes))
            .collect();
        let data: Vec<&[u8]> = events.iter().map(|(_, m)| m.data.as_ref()).collect();
        let times: Vec<DateTime<Utc>> = events.iter().map(|(m, _)| m.publish_time).collect();
        tx.execute(
            &self.park_events,
            &[
                &group,
                &key,
                &ids,
                &versions,
                &message_ids,
                &ordering_keys,
                &attributes,
                &data,
                &times,
            ],
        )
        .await
        .map_err(DbError::query(context()))?;
        Ok(())
    }

    /// Every parked key of this schema's consumer groups.
    pub async fn list(&self, pool: &PgPool) -> Result<Vec<ParkedKey>, DbError> {
        let context = format!("list parked keys in schema {}", self.schema);
        let client = pool.get().await.map_err(DbError::pool(&context))?;
        let rows = client
            .query(&self.list, &[])
            .await
            .map_err(DbError::query(&context))?;
        Ok(rows
            .iter()
            .map(|r| ParkedKey {
                consumer_group: r.get("consumer_group"),
                routing_key: r.get("routing_key"),
                subscription: r.get("subscription"),
                expected_version: r.get("expected_version"),
                reason: r.get("reason"),
                parked_at: r.get("parked_at"),
                held_events: r.get("held_events"),
                first_held_version: r.get("first_held_version"),
                last_held_version: r.get("last_held_version"),
            })
            .collect())
    }

    /// Releases a parked key: skips its gap if asked (the key's version moves to
    /// `skip_to - 1`), unparks it (audited), then republishes its held events to the
    /// subscription's topic in version order and forgets them. A failed republish parks the
    /// key again and keeps every event.
    pub async fn release(
        &self,
        pool: &PgPool,
        pubsub: &PubSub,
        release: &Release,
    ) -> Result<Released, ReleaseError> {
        if let Some(skip) = release.skip_to.filter(|s| *s < 1) {
            return Err(ReleaseError::BadSkip(skip));
        }
        let (group, key) = (&release.consumer_group, &release.routing_key);
        let context = format!("release key {key:?} of group {group}");
        let mut client = pool.get().await.map_err(DbError::pool(&context))?;
        let tx = client
            .transaction()
            .await
            .map_err(DbError::query(&context))?;
        // The key first, as its projection transactions take it (then parked_keys): the two
        // cannot wait on each other in a circle.
        self.lock(&tx, group, &[key.as_str()]).await?;
        let s = &self.schema;
        let parked = tx
            .query_opt(
                &format!(
                    "DELETE FROM {s}.parked_keys WHERE consumer_group = $1 AND routing_key = $2
                     RETURNING subscription, expected_version, reason"
                ),
                &[group, key],
            )
            .await
            .map_err(DbError::query(&context))?
            .ok_or_else(|| ReleaseError::NotParked {
                group: group.clone(),
                key: key.clone(),
            })?;
        let subscription: String = parked.get(0);
        let expected: i64 = parked.get(1);
        let parked_reason: String = parked.get(2);
        let held = tx
            .query(
                &format!(
                    "SELECT event_id, ordering_key, attributes, data, now() AS released_at
                     FROM {s}.parked_events WHERE consumer_group = $1 AND routing_key = $2
                     ORDER BY version, event_id"
                ),
                &[group, key],
            )
            .await
            .map_err(DbError::query(&context))?;
        if let Some(skip) = release.skip_to {
            let skip = KeyMove {
                key,
                from: 0,
                to: skip - 1,
                first_publish_time: Utc::now(),
            };
            self.advance(&tx, group, &[skip]).await?;
        }
        let audit_id: i64 = tx
            .query_one(
                &format!(
                    "INSERT INTO {s}.parked_key_releases
                         (consumer_group, routing_key, expected_version, skipped_to,
                          events_republished, released_by, reason)
                     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id"
                ),
                &[
                    group,
                    key,
                    &expected,
                    &release.skip_to,
                    &i32::try_from(held.len()).unwrap_or(i32::MAX),
                    &release.by,
                    &release.reason,
                ],
            )
            .await
            .map_err(DbError::query(&context))?
            .get(0);
        // Unparked (and the gap skipped) before the events come back, so they apply.
        tx.commit().await.map_err(DbError::query(&context))?;

        let topic = crate::pubsub::topic_of_subscription(&subscription)
            .unwrap_or(&subscription)
            .to_string();
        let republished = self.republish(pubsub, &topic, &held).await;
        if let Err(reason) = republished {
            let repark = format!("{parked_reason} (release failed: {reason})");
            let parked_again = client
                .execute(
                    &format!(
                        "INSERT INTO {s}.parked_keys
                             (consumer_group, routing_key, subscription, expected_version, reason)
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING"
                    ),
                    &[group, key, &subscription, &expected, &repark],
                )
                .await;
            if let Err(e) = parked_again {
                tracing::error!(consumer_group = %group, routing_key = %key, error = %e,
                    "a failed release could not park the key again; its events are kept");
            }
            return Err(ReleaseError::Republish { topic, reason });
        }
        let ids: Vec<Uuid> = held.iter().map(|r| r.get("event_id")).collect();
        if let Some(released_at) = held
            .first()
            .map(|r| r.get::<_, DateTime<Utc>>("released_at"))
        {
            // Only rows not parked again since (a gap still open parks them afresh).
            client
                .execute(
                    &format!(
                        "DELETE FROM {s}.parked_events WHERE consumer_group = $1
                         AND routing_key = $2 AND event_id = ANY($3) AND parked_at <= $4"
                    ),
                    &[group, key, &ids, &released_at],
                )
                .await
                .map_err(DbError::query(&context))?;
        }
        Ok(Released {
            expected_version: expected,
            skipped_to: release.skip_to,
            republished: held.len(),
            topic,
            audit_id,
        })
    }

    async fn republish(
        &self,
        pubsub: &PubSub,
        topic: &str,
        held: &[tokio_postgres::Row],
    ) -> Result<(), String> {
        if held.is_empty() {
            return Ok(());
        }
        let publisher = pubsub
            .publisher(topic, Duration::from_millis(5))
            .await
            .map_err(|e| e.to_string())?;
        for row in held {
            let attributes: serde_json::Value = row.get("attributes");
            let attributes: std::collections::HashMap<String, String> =
                serde_json::from_value(attributes).map_err(|e| e.to_string())?;
            let message = Message::new()
                .set_data(bytes::Bytes::from(row.get::<_, Vec<u8>>("data")))
                .set_ordering_key(row.get::<_, String>("ordering_key"))
                .set_attributes(attributes);
            // One at a time: a key's order holds across the whole republish.
            publisher
                .publish(message)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
