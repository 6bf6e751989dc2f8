//! The inbox: one row per (consumer group, event) applied, written in the projection's
//! transaction, so a redelivered or duplicated event is recognised and has no second effect.

use crate::db::{render, DbError, PgTransaction};
use chrono::{DateTime, Utc};
use std::collections::HashSet;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct Inbox {
    insert: String,
}

impl Inbox {
    pub fn new(schema: &str) -> Self {
        Self {
            insert: render(include_str!("queries/insert_inbox.sql"), schema),
        }
    }

    /// Records `events` (id, publish time) for `group` in `tx`; returns the ids that were not
    /// recorded before: only those may take effect.
    pub async fn record(
        &self,
        tx: &PgTransaction<'_>,
        group: &str,
        events: &[(Uuid, DateTime<Utc>)],
    ) -> Result<HashSet<Uuid>, DbError> {
        let ids: Vec<Uuid> = events.iter().map(|e| e.0).collect();
        let times: Vec<DateTime<Utc>> = events.iter().map(|e| e.1).collect();
        let context = || format!("record inbox rows of group {group}");
        let insert = tx
            .prepared(&self.insert)
            .await
            .map_err(DbError::query(context()))?;
        let rows = tx
            .query(&insert, &[&group, &ids, &times])
            .await
            .map_err(DbError::query(context()))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}
