//! What holds back PostgreSQL's xmin horizon, and the outbox's dead row versions waiting for it.
//!
//! While a transaction or snapshot stays open (a `pg_dump`, a report, a session idle in
//! transaction), a replication slot keeps an old `xmin`, or a prepared transaction waits,
//! vacuum may not remove any row version that became dead after it began, so a queue table
//! like the outbox bloats and every scan of it slows down. The relay samples this with its
//! backlog gauges (`courier_postgres_xmin_horizon_age_seconds`, …); `courier status` shows it.
//!
//! Another role's session start and state are visible only to superusers and members of
//! `pg_read_all_stats` (granted by `pg_monitor`): grant the relay's role `pg_monitor`, or the
//! age of a holder such as an operator's `psql` reads as not visible (never as 0).

use crate::db::{render, DbError, PgPool};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Held back this long, the horizon keeps dead row versions that scans of the outbox's
/// unpublished rows meet (a few seconds of open transactions are ordinary).
const HELD_AFTER_SECS: f64 = 60.0;

/// Held back by this many transactions, when the holder's start is not visible (or for a
/// replication slot, which has none).
const HELD_AFTER_XIDS: i32 = 100_000;

/// The session holding the oldest snapshot of the database.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionHolder {
    pub pid: i32,
    /// `active`, `idle in transaction`, …; `None` when not visible to this role.
    pub state: Option<String>,
    pub application_name: Option<String>,
    /// `None` for a walsender (it holds every database).
    pub database: Option<String>,
    pub user: Option<String>,
    /// Transactions begun since its snapshot's xmin (`age(backend_xmin)`).
    pub xid_age: i32,
    /// Seconds since its transaction began (since it connected, for a walsender); `None` when
    /// this role may not see it.
    pub age_secs: Option<f64>,
}

/// The replication slot holding the oldest `xmin` or `catalog_xmin`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotHolder {
    pub name: String,
    /// `physical` or `logical`.
    pub slot_type: String,
    /// Whether a receiver is connected: an inactive slot holding the horizon is usually stale.
    pub active: bool,
    /// Transactions since the slot's `xmin` (a standby's `hot_standby_feedback`): holds every
    /// table.
    pub xmin_age: Option<i32>,
    /// Transactions since its `catalog_xmin` (logical decoding): holds the system catalogs.
    pub catalog_xmin_age: Option<i32>,
}

impl SlotHolder {
    /// The larger of its two ages.
    pub fn xid_age(&self) -> i32 {
        self.xmin_age.max(self.catalog_xmin_age).unwrap_or(0)
    }
}

/// The database's oldest prepared transaction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreparedHolder {
    pub gid: String,
    pub owner: String,
    pub xid_age: i32,
    /// Seconds since it was prepared.
    pub age_secs: f64,
}

/// The outbox table's row versions as the statistics collector last counted them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxTuples {
    /// Dead row versions vacuum has not removed yet.
    pub dead: i64,
    pub live: i64,
    pub last_autovacuum: Option<DateTime<Utc>>,
}

/// What holds the xmin horizon back, each kind's oldest, and what the outbox carries meanwhile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Horizon {
    /// Whether this role sees other roles' sessions whole (superuser, `pg_read_all_stats`,
    /// `pg_monitor`). Without it, another role's session shows its pid and xid age only.
    pub sees_all_sessions: bool,
    pub oldest_session: Option<SessionHolder>,
    pub oldest_slot: Option<SlotHolder>,
    /// Slots holding an `xmin` or `catalog_xmin`.
    pub slots_holding: i64,
    pub oldest_prepared: Option<PreparedHolder>,
    /// Prepared transactions of this database.
    pub prepared_holding: i64,
    /// `None` if the statistics have no row for the outbox.
    pub outbox: Option<OutboxTuples>,
}

impl Horizon {
    /// Seconds the oldest open transaction (a session's or a prepared one) has held the
    /// horizon: 0 when none does, `None` when the oldest session's start is not visible.
    pub fn held_secs(&self) -> Option<f64> {
        let session = match &self.oldest_session {
            Some(session) => session.age_secs?,
            None => 0.0,
        };
        let prepared = self.oldest_prepared.as_ref().map_or(0.0, |p| p.age_secs);
        Some(session.max(prepared))
    }

    /// Transactions begun since the oldest xmin a session or prepared transaction holds.
    pub fn held_xids(&self) -> i32 {
        let session = self.oldest_session.as_ref().map_or(0, |s| s.xid_age);
        let prepared = self.oldest_prepared.as_ref().map_or(0, |p| p.xid_age);
        session.max(prepared)
    }

    /// Whether the horizon is held back long enough that vacuum leaves dead row versions
    /// behind it: by a transaction open over `HELD_AFTER_SECS` (or, its start hidden, over
    /// `HELD_AFTER_XIDS` transactions old), or by a replication slot that old.
    pub fn is_held(&self) -> bool {
        let open = match self.held_secs() {
            Some(secs) => secs > HELD_AFTER_SECS,
            None => self.held_xids() > HELD_AFTER_XIDS,
        };
        open || self
            .oldest_slot
            .as_ref()
            .is_some_and(|slot| slot.xid_age() > HELD_AFTER_XIDS)
    }
}

/// Whether the horizon was held back when last sampled ([`Horizon::is_held`]): the relay's
/// shard owner sets it, its claimers read it. Not held until a sample says so.
#[derive(Debug, Clone, Default)]
pub struct HeldFlag(Arc<AtomicBool>);

impl HeldFlag {
    pub fn set(&self, held: bool) {
        self.0.store(held, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The horizon query, rendered once for a schema.
#[derive(Debug, Clone)]
pub struct HorizonQuery {
    sql: String,
}

impl HorizonQuery {
    pub fn new(schema: &str) -> Self {
        Self {
            sql: render(include_str!("queries/horizon.sql"), schema),
        }
    }

    /// Reads what holds the horizon of the pool's database back.
    pub async fn read(&self, pool: &PgPool) -> Result<Horizon, DbError> {
        let context = "read what holds the xmin horizon";
        let client = pool.get().await.map_err(DbError::pool(context))?;
        let row = client
            .query_one(&self.sql, &[])
            .await
            .map_err(DbError::query(context))?;
        let oldest_session = row
            .get::<_, Option<i32>>("session_pid")
            .map(|pid| SessionHolder {
                pid,
                state: row.get("session_state"),
                application_name: row.get("session_application"),
                database: row.get("session_database"),
                user: row.get("session_user"),
                xid_age: row.get("session_xid_age"),
                age_secs: row.get("session_age_secs"),
            });
        let oldest_slot = row
            .get::<_, Option<String>>("slot_name")
            .map(|name| SlotHolder {
                name,
                slot_type: row.get("slot_type"),
                active: row.get("slot_active"),
                xmin_age: row.get("slot_xmin_age"),
                catalog_xmin_age: row.get("slot_catalog_xmin_age"),
            });
        let oldest_prepared =
            row.get::<_, Option<String>>("prepared_gid")
                .map(|gid| PreparedHolder {
                    gid,
                    owner: row.get("prepared_owner"),
                    xid_age: row.get("prepared_xid_age"),
                    age_secs: row.get("prepared_age_secs"),
                });
        let outbox = row
            .get::<_, Option<i64>>("outbox_dead_tuples")
            .map(|dead| OutboxTuples {
                dead,
                live: row.get("outbox_live_tuples"),
                last_autovacuum: row.get("outbox_last_autovacuum"),
            });
        Ok(Horizon {
            sees_all_sessions: row.get("sees_all_sessions"),
            oldest_session,
            oldest_slot,
            slots_holding: row.get("slots_holding"),
            oldest_prepared,
            prepared_holding: row.get("prepared_holding"),
            outbox,
        })
    }
}

/// Set once the missing `pg_monitor` grant was logged, so it is logged once per process.
static NOT_VISIBLE_LOGGED: AtomicBool = AtomicBool::new(false);

/// Reads the horizon, sets its gauges and `held`; a failure is logged and leaves them as they
/// were. The relay calls it with its backlog gauges, once per shard-owner tick.
pub async fn sample(query: &HorizonQuery, pool: &PgPool, held: &HeldFlag) {
    match query.read(pool).await {
        Ok(horizon) => {
            if !horizon.sees_all_sessions && !NOT_VISIBLE_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "this role cannot see when other roles' transactions began: grant it \
                     pg_monitor, or {} reads NaN while another role's session holds the xmin \
                     horizon",
                    crate::metrics::POSTGRES_XMIN_HORIZON_AGE_SECONDS
                );
            }
            publish_gauges(&horizon);
            held.set(horizon.is_held());
        }
        Err(e) => tracing::warn!(error = %e, "could not sample the xmin horizon"),
    }
}

fn publish_gauges(horizon: &Horizon) {
    use crate::metrics as m;
    // NaN, not 0, when the holder's start is not visible: an alert on it must not read "fine".
    metrics::gauge!(m::POSTGRES_XMIN_HORIZON_AGE_SECONDS)
        .set(horizon.held_secs().unwrap_or(f64::NAN));
    metrics::gauge!(m::POSTGRES_XMIN_HORIZON_AGE_TRANSACTIONS).set(f64::from(horizon.held_xids()));
    metrics::gauge!(m::POSTGRES_REPLICATION_SLOT_XMIN_AGE_TRANSACTIONS).set(f64::from(
        horizon.oldest_slot.as_ref().map_or(0, SlotHolder::xid_age),
    ));
    if let Some(outbox) = &horizon.outbox {
        metrics::gauge!(m::OUTBOX_DEAD_TUPLES).set(outbox.dead as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(age_secs: Option<f64>, xid_age: i32) -> SessionHolder {
        SessionHolder {
            pid: 4242,
            state: Some("idle in transaction".into()),
            application_name: Some("psql".into()),
            database: Some("courier".into()),
            user: Some("postgres".into()),
            xid_age,
            age_secs,
        }
    }

    fn horizon() -> Horizon {
        Horizon {
            sees_all_sessions: true,
            oldest_session: None,
            oldest_slot: None,
            slots_holding: 0,
            oldest_prepared: None,
            prepared_holding: 0,
            outbox: None,
        }
    }

    #[test]
    fn nothing_open_holds_for_zero_seconds() {
        assert_eq!(horizon().held_secs(), Some(0.0));
        assert_eq!(horizon().held_xids(), 0);
    }

    #[test]
    fn the_older_of_session_and_prepared_transaction_counts() {
        let h = Horizon {
            oldest_session: Some(session(Some(30.0), 5)),
            oldest_prepared: Some(PreparedHolder {
                gid: "g".into(),
                owner: "o".into(),
                xid_age: 9,
                age_secs: 90.0,
            }),
            ..horizon()
        };
        assert_eq!(h.held_secs(), Some(90.0));
        assert_eq!(h.held_xids(), 9);
    }

    #[test]
    fn a_session_whose_start_is_hidden_is_not_read_as_zero() {
        let h = Horizon {
            sees_all_sessions: false,
            oldest_session: Some(session(None, 12)),
            ..horizon()
        };
        assert_eq!(h.held_secs(), None);
        assert_eq!(h.held_xids(), 12);
    }

    #[test]
    fn held_means_open_over_a_minute_or_by_a_slot_far_behind() {
        let open = |age_secs, xid_age| Horizon {
            oldest_session: Some(session(age_secs, xid_age)),
            ..horizon()
        };
        assert!(!horizon().is_held());
        assert!(
            !open(Some(5.0), 2_000_000).is_held(),
            "a short busy transaction"
        );
        assert!(open(Some(61.0), 3).is_held());
        assert!(!open(None, 5).is_held(), "start hidden, young");
        assert!(open(None, 200_000).is_held(), "start hidden, old");
        let slot = SlotHolder {
            name: "standby".into(),
            slot_type: "physical".into(),
            active: true,
            xmin_age: Some(200_000),
            catalog_xmin_age: None,
        };
        let behind = Horizon {
            oldest_slot: Some(slot),
            ..horizon()
        };
        assert!(behind.is_held());
    }

    #[test]
    fn a_slot_is_as_old_as_the_older_of_its_two_horizons() {
        let slot = SlotHolder {
            name: "standby".into(),
            slot_type: "physical".into(),
            active: false,
            xmin_age: Some(7),
            catalog_xmin_age: None,
        };
        assert_eq!(slot.xid_age(), 7);
        let logical = SlotHolder {
            xmin_age: None,
            catalog_xmin_age: Some(40),
            ..slot
        };
        assert_eq!(logical.xid_age(), 40);
    }
}
