//! The dead letters a schema's consumers produced, open until republished: what
//! `dlq_message_count{subscription}` and `courier status` report.

use crate::db::{render, DbError, PgPool};
use crate::inbound::dead_letter::KeptDeadLetter;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OpenDeadLetters {
    pub consumer_group: String,
    pub subscription: String,
    pub open: i64,
}

#[derive(Debug, Clone)]
pub struct DeadLetterLog {
    log: String,
    open: String,
    republished: String,
}

impl DeadLetterLog {
    pub fn new(schema: &str) -> Self {
        Self {
            log: render(include_str!("queries/log_dead_letter.sql"), schema),
            open: render(include_str!("queries/open_dead_letters.sql"), schema),
            republished: render(include_str!("queries/republished_dead_letter.sql"), schema),
        }
    }

    /// Records a dead letter; returns the group's open count.
    pub async fn record(
        &self,
        pool: &PgPool,
        group: &str,
        subscription: &str,
        message_id: &str,
        ordering_key: &str,
        reason: &str,
    ) -> Result<i64, DbError> {
        let context = format!("log dead letter of group {group}");
        let client = pool.get().await.map_err(DbError::pool(&context))?;
        let row = client
            .query_one(
                &self.log,
                &[&group, &message_id, &subscription, &ordering_key, &reason],
            )
            .await
            .map_err(DbError::query(&context))?;
        Ok(row.get(0))
    }

    /// Open dead letters per group.
    pub async fn open(&self, pool: &PgPool) -> Result<Vec<OpenDeadLetters>, DbError> {
        let client = pool
            .get()
            .await
            .map_err(DbError::pool("count open dead letters"))?;
        let rows = client
            .query(&self.open, &[])
            .await
            .map_err(DbError::query("count open dead letters"))?;
        Ok(rows
            .iter()
            .map(|r| OpenDeadLetters {
                consumer_group: r.get("consumer_group"),
                subscription: r.get("subscription"),
                open: r.get("open"),
            })
            .collect())
    }

    /// Records that `letter`, a dead letter of `subscription`, was sent back to its topic by
    /// `actor` for `reason` (dead_letter_republishes), and closes it in the log. Returns whether
    /// it was open there.
    pub async fn republished(
        &self,
        pool: &PgPool,
        subscription: &str,
        letter: &KeptDeadLetter,
        actor: &str,
        reason: &str,
    ) -> Result<bool, DbError> {
        let client = pool
            .get()
            .await
            .map_err(DbError::pool("record a republished dead letter"))?;
        let message_id = letter.original_message_id.as_deref().unwrap_or_default();
        let closed = client
            .execute(
                &self.republished,
                &[
                    &subscription,
                    &message_id,
                    &letter.attributes.get(crate::outbox::attributes::EVENT_ID),
                    &letter.ordering_key,
                    &letter.reason,
                    &actor,
                    &reason,
                ],
            )
            .await
            .map_err(DbError::query("record a republished dead letter"))?;
        Ok(closed > 0)
    }
}
