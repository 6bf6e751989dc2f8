//! `courier status`: the pipeline on one screen, per service — backlog, publish rate, relays
//! (restarts), what holds the database's xmin horizon back, dead letters, and per consumer
//! group how far it is and how far behind.

use crate::output::print_json;
use chrono::Utc;
use courier::db::{render, PgPool};
use courier::inbound::OffsetStore;
use courier::operations::{BacklogGauge, Horizon, HorizonQuery, OutboxStore, ShardBacklog};
use courier::CourierConfig;
use serde::Serialize;

/// When a transaction holding the xmin horizon becomes a warning by default: five minutes of
/// dead tuples is noticeable on a busy outbox, and the alert fires at ten.
pub(crate) const HORIZON_WARN_SECS: u64 = 300;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  courier --config deploy/local/catalog.toml status\n  courier status --service deploy/local/catalog.toml --service deploy/local/engagement.toml --json"
)]
pub struct StatusArgs {
    /// A service's config; repeat for several services [default: the global --config].
    #[arg(long = "service", value_name = "CONFIG")]
    services: Vec<std::path::PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Warn when a transaction has held the xmin horizon back this long (seconds): vacuum
    /// cannot clean the outbox meanwhile.
    #[arg(long, value_name = "SECS", default_value_t = HORIZON_WARN_SECS)]
    horizon_warn_secs: u64,
}

/// One service's pipeline: what `courier status` prints and the console shows.
#[derive(Serialize)]
pub(crate) struct Status {
    schema: String,
    pending: i64,
    dead: i64,
    oldest_pending_secs: f64,
    published_per_sec: f64,
    live_relays: i64,
    relays_started_last_hour: i64,
    applied_per_sec: f64,
    relays: Vec<RelayStatus>,
    /// Unpublished rows per topic and shard.
    backlog: Vec<ShardBacklog>,
    horizon: HorizonStatus,
    consumers: Vec<ConsumerStatus>,
    /// Dead letters not republished yet, per consumer group.
    dead_letters: Vec<courier::operations::OpenDeadLetters>,
    /// Keys of delta projections parked behind a missing version.
    parked_keys: Vec<courier::operations::ParkedKey>,
}

/// One live relay at its last heartbeat.
#[derive(Serialize)]
struct RelayStatus {
    instance: String,
    shards: i32,
    /// The shards it owns (by advisory lock).
    owned_shards: Vec<i32>,
    /// Seconds since its last heartbeat; past the claim lease its shards go to other relays.
    heartbeat_age_secs: f64,
    /// The adaptive limit on publishes in flight (None before the first heartbeat).
    publish_limit: Option<i32>,
    publishes_in_flight: Option<i32>,
    /// Recent acknowledgement latency.
    publish_latency_ms: Option<f64>,
    /// Ordering keys among the rows in flight: the publish requests asked of the connection.
    publish_keys_out: Option<i32>,
}

/// What holds the database's xmin horizon back (`courier::horizon`).
#[derive(Serialize)]
struct HorizonStatus {
    #[serde(flatten)]
    report: Horizon,
    /// Seconds the oldest open transaction has held it (0: none); `None` when its start is
    /// not visible to this role.
    held_secs: Option<f64>,
    /// `--horizon-warn-secs`.
    warn_after_secs: u64,
    /// A transaction held it past `warn_after_secs`, or an inactive slot holds it.
    warning: bool,
}

impl HorizonStatus {
    fn new(report: Horizon, warn_after_secs: u64) -> Self {
        let over = |secs: f64| secs > warn_after_secs as f64;
        let warning = report
            .oldest_session
            .as_ref()
            .and_then(|s| s.age_secs)
            .is_some_and(over)
            || report
                .oldest_prepared
                .as_ref()
                .is_some_and(|p| over(p.age_secs))
            || report.oldest_slot.as_ref().is_some_and(|s| !s.active);
        Self {
            held_secs: report.held_secs(),
            report,
            warn_after_secs,
            warning,
        }
    }

    /// Who holds the horizon and for how long, and the outbox's dead tuples; with a WARNING
    /// prefix and what to do once past the threshold.
    fn line(&self) -> String {
        let over = |secs: f64| secs > self.warn_after_secs as f64;
        let report = &self.report;
        let mut holders = Vec::new();
        let mut advice = Vec::new();
        if let Some(s) = &report.oldest_session {
            let held = match s.age_secs {
                Some(secs) => format!("held {}", duration(secs)),
                None => "held (how long is not visible: grant this role pg_monitor)".into(),
            };
            let mut about = vec![s
                .state
                .clone()
                .unwrap_or_else(|| "state not visible".into())];
            if let Some(app) = s.application_name.as_deref().filter(|a| !a.is_empty()) {
                about.push(format!("app {app:?}"));
            }
            about.push(format!("{} xids", thousands(s.xid_age.into())));
            holders.push(format!("{held} by pid {} ({})", s.pid, about.join(", ")));
            if s.age_secs.is_some_and(over) {
                advice.push(format!(
                    "end that session: SELECT pg_terminate_backend({})",
                    s.pid
                ));
            }
        }
        if let Some(p) = &report.oldest_prepared {
            holders.push(format!(
                "prepared transaction {:?} held {} ({} xids)",
                p.gid,
                duration(p.age_secs),
                thousands(p.xid_age.into())
            ));
            if over(p.age_secs) {
                advice.push(format!("COMMIT PREPARED or ROLLBACK PREPARED '{}'", p.gid));
            }
        }
        if let Some(slot) = &report.oldest_slot {
            holders.push(format!(
                "{} slot {:?}{} {} xids back",
                slot.slot_type,
                slot.name,
                if slot.active { "" } else { " (inactive)" },
                thousands(slot.xid_age().into())
            ));
            if !slot.active {
                advice.push(format!(
                    "drop a stale slot: SELECT pg_drop_replication_slot('{}')",
                    slot.name
                ));
            }
        }
        let holders = if holders.is_empty() {
            "not held (no open transaction, slot or prepared transaction)".to_string()
        } else {
            holders.join("; ")
        };
        let dead = report
            .outbox
            .as_ref()
            .map_or_else(|| "unknown".into(), |o| thousands(o.dead));
        let line = format!("xmin horizon: {holders}; outbox dead tuples {dead}");
        if self.warning {
            format!(
                "WARNING {line}: vacuum cannot clean the outbox meanwhile; {}",
                advice.join("; ")
            )
        } else {
            line
        }
    }
}

/// `42s`, `12m 03s`, `2h 05m 09s`.
fn duration(secs: f64) -> String {
    let secs = secs.max(0.0) as u64;
    match (secs / 3600, secs / 60 % 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s:02}s"),
        (h, m, s) => format!("{h}h {m:02}m {s:02}s"),
    }
}

/// `768,112`.
fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    if n < 0 {
        format!("-{grouped}")
    } else {
        grouped
    }
}

#[derive(Serialize)]
struct ConsumerStatus {
    group: String,
    subscription: String,
    /// Publish time of the newest message the group applied (its offset).
    offset_publish_time: chrono::DateTime<Utc>,
    /// Lag (publish → projection commit) at the group's last save.
    lag_millis: i64,
    /// Seconds since the group last saved an offset.
    idle_secs: i64,
    /// Events the group applied per second over the last minute.
    applied_per_sec: f64,
}

pub async fn run(config: CourierConfig, args: StatusArgs) -> anyhow::Result<()> {
    let configs = if args.services.is_empty() {
        vec![config]
    } else {
        args.services
            .iter()
            .map(|path| crate::load_config(path).map_err(|e| anyhow::anyhow!("--service: {e:#}")))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let mut statuses = Vec::new();
    for config in &configs {
        let pool = courier::db::pool(&config.database, "courier-cli")?;
        statuses.push(status_of(config, &pool, args.horizon_warn_secs).await?);
    }
    if args.json {
        return match statuses.len() {
            1 => print_json(&statuses[0]),
            _ => print_json(&statuses),
        };
    }
    statuses.iter().for_each(print);
    Ok(())
}

/// Reads one service's pipeline from its schema. `courier status` prints it; the console
/// serves it.
pub(crate) async fn status_of(
    config: &CourierConfig,
    pool: &PgPool,
    horizon_warn_secs: u64,
) -> anyhow::Result<Status> {
    let schema = &config.database.schema;
    let conn = pool.get().await?;
    let lease = config.relay.claim_lease().as_secs_f64();
    let row = conn
        .query_one(
            &render(include_str!("queries/status.sql"), schema),
            &[&lease],
        )
        .await?;
    let relays = conn
        .query(
            &render(include_str!("queries/relays.sql"), schema),
            &[&lease],
        )
        .await?
        .iter()
        .map(|r| RelayStatus {
            instance: r.get("instance"),
            shards: r.get("shards"),
            owned_shards: r.get("owned_shards"),
            heartbeat_age_secs: r.get("heartbeat_age_secs"),
            publish_limit: r.get("publish_limit"),
            publishes_in_flight: r.get("publishes_in_flight"),
            publish_latency_ms: r.get("publish_latency_ms"),
            publish_keys_out: r.get("publish_keys_out"),
        })
        .collect();
    // From the shards' floors, as the relay's gauge counts: a pinned horizon does not make
    // the page walk every row published since the pin (P9).
    let parts = BacklogGauge::read_once(
        &OutboxStore::new(pool.clone(), schema),
        config.relay.shard_count,
        config.relay.claim_lease(),
    )
    .await?;
    let totals = courier::operations::Backlog::of(&parts);
    let applied: std::collections::HashMap<String, i64> = conn
        .query(
            &render(include_str!("queries/applied_by_group.sql"), schema),
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get("consumer_group"), r.get("applied")))
        .collect();
    drop(conn);
    let per_sec = |n: i64| n as f64 / 60.0;
    let horizon = HorizonStatus::new(
        HorizonQuery::new(schema).read(pool).await?,
        horizon_warn_secs,
    );
    let offsets = OffsetStore::new(schema, config.consumer.offset_lanes);
    let mut consumers = Vec::new();
    for group in offsets.groups(pool).await? {
        if let Some(offset) = offsets.load(pool, &group).await? {
            consumers.push(ConsumerStatus {
                applied_per_sec: per_sec(applied.get(&group).copied().unwrap_or(0)),
                group,
                subscription: offset.subscription,
                offset_publish_time: offset.newest_publish_time,
                lag_millis: offset.max_lag_millis,
                idle_secs: (Utc::now() - offset.updated_at).num_seconds(),
            });
        }
    }
    let status = Status {
        schema: schema.clone(),
        pending: totals.pending,
        dead: totals.dead,
        oldest_pending_secs: totals.oldest_pending_secs,
        published_per_sec: per_sec(row.get("published_last_minute")),
        live_relays: row.get("live_relays"),
        relays_started_last_hour: row.get("relays_started_last_hour"),
        applied_per_sec: per_sec(row.get("applied_last_minute")),
        relays,
        backlog: parts,
        horizon,
        consumers,
        dead_letters: courier::operations::DeadLetterLog::new(schema)
            .open(pool)
            .await?,
        parked_keys: courier::operations::KeyVersions::new(schema)
            .list(pool)
            .await?,
    };
    Ok(status)
}

impl Status {
    /// The subscriptions the schema's consumers read or dead-lettered from.
    pub(crate) fn subscriptions(&self) -> Vec<String> {
        let mut subscriptions: Vec<String> = self
            .consumers
            .iter()
            .map(|c| c.subscription.clone())
            .chain(self.dead_letters.iter().map(|d| d.subscription.clone()))
            .collect();
        subscriptions.sort();
        subscriptions.dedup();
        subscriptions
    }
}

fn print(status: &Status) {
    println!("schema {}", status.schema);
    println!(
        "  outbox   {} pending (oldest {:.1} s), {} dead, publishing {:.1}/s",
        status.pending, status.oldest_pending_secs, status.dead, status.published_per_sec
    );
    println!(
        "  relays   {} alive, {} started in the last hour",
        status.live_relays, status.relays_started_last_hour
    );
    for r in &status.relays {
        match (r.publish_limit, r.publishes_in_flight, r.publish_latency_ms) {
            (Some(limit), Some(in_flight), Some(latency)) => println!(
                "  relay    {} ({} shards): {} of {} publishes in flight ({} ordering keys), \
                 latency {:.0} ms",
                r.instance,
                r.shards,
                in_flight,
                limit,
                r.publish_keys_out.unwrap_or(0),
                latency
            ),
            _ => println!(
                "  relay    {} ({} shards): no publish figures yet",
                r.instance, r.shards
            ),
        }
    }
    println!("  {}", status.horizon.line());
    println!("  applying {:.1} events/s", status.applied_per_sec);
    for d in &status.dead_letters {
        println!(
            "  dlq      {} dead letter(s) of {} not republished ({}.dlq)",
            d.open, d.consumer_group, d.subscription
        );
    }
    for p in &status.parked_keys {
        println!(
            "  parked   key {} of {} waits for v{} with {} event(s) held (`courier parked`)",
            p.routing_key, p.consumer_group, p.expected_version, p.held_events
        );
    }
    for c in &status.consumers {
        println!(
            "  consumer {} on {}: lag {} ms at last save, last save {} s ago",
            c.group, c.subscription, c.lag_millis, c.idle_secs
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier::operations::{OutboxTuples, PreparedHolder, SessionHolder, SlotHolder};

    fn report() -> Horizon {
        Horizon {
            sees_all_sessions: true,
            oldest_session: None,
            oldest_slot: None,
            slots_holding: 0,
            oldest_prepared: None,
            prepared_holding: 0,
            outbox: Some(OutboxTuples {
                dead: 768_112,
                live: 12,
                last_autovacuum: None,
            }),
        }
    }

    fn psql(age_secs: Option<f64>) -> SessionHolder {
        SessionHolder {
            pid: 4242,
            state: age_secs.map(|_| "idle in transaction".into()),
            application_name: Some("psql".into()),
            database: Some("catalog".into()),
            user: Some("alice".into()),
            xid_age: 1_204,
            age_secs,
        }
    }

    #[test]
    fn durations_and_counts_read_as_an_operator_writes_them() {
        assert_eq!(duration(0.4), "0s");
        assert_eq!(duration(42.9), "42s");
        assert_eq!(duration(723.0), "12m 03s");
        assert_eq!(duration(7509.0), "2h 05m 09s");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(768_112), "768,112");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
    }

    #[test]
    fn nothing_open_is_no_warning() {
        let status = HorizonStatus::new(report(), 300);
        assert!(!status.warning);
        assert_eq!(status.held_secs, Some(0.0));
        assert_eq!(
            status.line(),
            "xmin horizon: not held (no open transaction, slot or prepared transaction); \
             outbox dead tuples 768,112"
        );
    }

    #[test]
    fn a_session_past_the_threshold_is_a_warning_saying_how_to_end_it() {
        let young = HorizonStatus::new(
            Horizon {
                oldest_session: Some(psql(Some(299.0))),
                ..report()
            },
            300,
        );
        assert!(!young.warning);
        assert_eq!(
            young.line(),
            "xmin horizon: held 4m 59s by pid 4242 (idle in transaction, app \"psql\", 1,204 \
             xids); outbox dead tuples 768,112"
        );
        let old = HorizonStatus::new(
            Horizon {
                oldest_session: Some(psql(Some(723.0))),
                ..report()
            },
            300,
        );
        assert!(old.warning);
        assert_eq!(
            old.line(),
            "WARNING xmin horizon: held 12m 03s by pid 4242 (idle in transaction, app \"psql\", \
             1,204 xids); outbox dead tuples 768,112: vacuum cannot clean the outbox meanwhile; \
             end that session: SELECT pg_terminate_backend(4242)"
        );
    }

    #[test]
    fn a_hidden_start_reads_as_not_visible_never_as_zero() {
        let status = HorizonStatus::new(
            Horizon {
                sees_all_sessions: false,
                oldest_session: Some(psql(None)),
                ..report()
            },
            0,
        );
        assert!(!status.warning);
        assert_eq!(status.held_secs, None);
        assert!(
            status.line().contains(
                "held (how long is not visible: grant this role pg_monitor) by pid 4242 \
                 (state not visible"
            ),
            "{}",
            status.line()
        );
    }

    #[test]
    fn an_inactive_slot_or_an_old_prepared_transaction_is_a_warning() {
        let status = HorizonStatus::new(
            Horizon {
                oldest_slot: Some(SlotHolder {
                    name: "standby_1".into(),
                    slot_type: "physical".into(),
                    active: false,
                    xmin_age: Some(52_000),
                    catalog_xmin_age: None,
                }),
                slots_holding: 1,
                oldest_prepared: Some(PreparedHolder {
                    gid: "tx-7".into(),
                    owner: "catalog".into(),
                    xid_age: 3,
                    age_secs: 400.0,
                }),
                prepared_holding: 1,
                ..report()
            },
            300,
        );
        assert!(status.warning);
        assert_eq!(
            status.line(),
            "WARNING xmin horizon: prepared transaction \"tx-7\" held 6m 40s (3 xids); physical \
             slot \"standby_1\" (inactive) 52,000 xids back; outbox dead tuples 768,112: vacuum \
             cannot clean the outbox meanwhile; COMMIT PREPARED or ROLLBACK PREPARED 'tx-7'; drop \
             a stale slot: SELECT pg_drop_replication_slot('standby_1')"
        );
    }
}
