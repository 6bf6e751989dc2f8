//! What the console reads and acts on: the services it was given (a config each), the
//! dead-letter keepers it holds, and one snapshot of everything for the page.

use super::dead_letters::{DeadLetterHolds, KeeperView};
use crate::status::{status_of, Status};
use chrono::{DateTime, Utc};
use courier::db::{render, PgPool};
use courier::operations::{DeadRow, KeyVersions, OutboxOperator};
use courier::pubsub::PubSub;
use courier::CourierConfig;
use serde::Serialize;

/// Dead rows listed per service; more are there for `courier outbox dead list`.
const DEAD_ROWS_SHOWN: i64 = 200;
/// Audit entries listed per service.
const AUDIT_SHOWN: i64 = 50;

/// One service the console looks at: its config, pool and the operators the CLI uses.
pub(crate) struct ServiceView {
    pub(crate) config: CourierConfig,
    pub(crate) pool: PgPool,
    pub(crate) operator: OutboxOperator,
    pub(crate) versions: KeyVersions,
    audit_log: String,
}

/// The console's state: what it looks at and the keepers it holds.
pub struct Console {
    pub(crate) services: Vec<ServiceView>,
    /// `--horizon-warn-secs`, as `courier status` takes it.
    horizon_warn_secs: u64,
    pub(crate) dead_letters: DeadLetterHolds,
    /// Actions are refused without a bearer token: none configured.
    pub(crate) writable: bool,
}

/// Everything the page shows, read at once.
#[derive(Serialize)]
pub(crate) struct Snapshot {
    read_at: DateTime<Utc>,
    /// Whether actions are possible at all (a token is configured).
    writable: bool,
    services: Vec<ServiceSnapshot>,
    dead_letters: Vec<KeeperView>,
}

/// One service as read, or why it could not be: one database down (or not migrated yet)
/// leaves the other services on the page.
#[derive(Serialize)]
#[serde(untagged)]
enum ServiceSnapshot {
    Read {
        // Boxed: a status is large beside the error variant.
        #[serde(flatten)]
        status: Box<Status>,
        dead_rows: Vec<DeadRow>,
        audit: Vec<AuditEntry>,
    },
    Unreadable {
        schema: String,
        error: String,
    },
}

/// One operator action from the audit tables.
#[derive(Serialize)]
struct AuditEntry {
    at: DateTime<Utc>,
    by: String,
    action: String,
    reason: String,
    target: String,
}

impl Console {
    /// A console over `configs` (one per service), reading dead letters through `pubsub`.
    /// `writable`: a bearer token is configured (the server checks it); without one the
    /// console is read-only.
    pub fn new(
        configs: Vec<CourierConfig>,
        pubsub: PubSub,
        horizon_warn_secs: u64,
        writable: bool,
    ) -> anyhow::Result<Self> {
        let services = configs
            .into_iter()
            .map(|config| {
                let schema = config.database.schema.clone();
                let pool = courier::db::pool(&config.database, "courier-console")?;
                Ok(ServiceView {
                    operator: OutboxOperator::new(pool.clone(), &schema),
                    versions: KeyVersions::new(&schema),
                    audit_log: render(include_str!("queries/audit_log.sql"), &schema),
                    pool,
                    config,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            services,
            horizon_warn_secs,
            dead_letters: DeadLetterHolds::new(pubsub),
            writable,
        })
    }

    /// The service whose schema is `schema`.
    pub(crate) fn service(&self, schema: &str) -> Result<&ServiceView, crate::refusal::Refusal> {
        self.services
            .iter()
            .find(|s| s.config.database.schema == schema)
            .ok_or_else(|| {
                crate::refusal::Refusal::NotFound(format!(
                    "schema {schema:?} is not one of the console's services"
                ))
            })
    }

    /// Reads every service (as `courier status` does, plus dead rows and the audit log) and
    /// starts holding the dead-letter keeper of every subscription it finds. A service that
    /// cannot be read is shown with its error.
    pub(crate) async fn snapshot(&self) -> Snapshot {
        let mut services = Vec::new();
        for service in &self.services {
            services.push(match self.read(service).await {
                Ok(read) => read,
                Err(e) => ServiceSnapshot::Unreadable {
                    schema: service.config.database.schema.clone(),
                    error: format!("{e:#}"),
                },
            });
        }
        Snapshot {
            read_at: Utc::now(),
            writable: self.writable,
            services,
            dead_letters: self.dead_letters.view(),
        }
    }

    /// One service: its status, dead rows and audit log; holds its keepers from now on.
    async fn read(&self, service: &ServiceView) -> anyhow::Result<ServiceSnapshot> {
        let status = status_of(&service.config, &service.pool, self.horizon_warn_secs).await?;
        for subscription in status.subscriptions() {
            self.dead_letters.hold(&subscription, &service.config);
        }
        let dead_rows = service.operator.dead_rows(DEAD_ROWS_SHOWN).await?;
        let audit = service
            .pool
            .get()
            .await?
            .query(&service.audit_log, &[&AUDIT_SHOWN])
            .await?
            .iter()
            .map(|r| AuditEntry {
                at: r.get("at"),
                by: r.get("by"),
                action: r.get("action"),
                reason: r.get("reason"),
                target: r.get("target"),
            })
            .collect();
        Ok(ServiceSnapshot::Read {
            status: Box::new(status),
            dead_rows,
            audit,
        })
    }
}
