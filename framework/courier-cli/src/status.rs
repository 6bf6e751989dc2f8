//! `courier status`: the pipeline on one screen, per service — backlog, publish rate, relays
//! (restarts), dead letters, and per consumer group how far it is and how far behind.

use crate::output::print_json;
use chrono::Utc;
use courier::db::render;
use courier::inbound::OffsetStore;
use courier::CourierConfig;
use serde::Serialize;

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
}

#[derive(Serialize)]
struct Status {
    schema: String,
    pending: i64,
    dead: i64,
    oldest_pending_secs: f64,
    published_per_sec: f64,
    live_relays: i64,
    relays_started_last_hour: i64,
    applied_per_sec: f64,
    relays: Vec<RelayStatus>,
    consumers: Vec<ConsumerStatus>,
    /// Dead letters not republished yet, per consumer group.
    dead_letters: Vec<courier::inbound::dead_letter_log::OpenDeadLetters>,
    /// Keys of delta projections parked behind a missing version.
    parked_keys: Vec<courier::inbound::parked::ParkedKey>,
}

/// One live relay at its last heartbeat.
#[derive(Serialize)]
struct RelayStatus {
    instance: String,
    shards: i32,
    /// The adaptive limit on publishes in flight (None before the first heartbeat).
    publish_limit: Option<i32>,
    publishes_in_flight: Option<i32>,
    /// Recent acknowledgement latency.
    publish_latency_ms: Option<f64>,
    /// Ordering keys among the rows in flight: the publish requests asked of the connection.
    publish_keys_out: Option<i32>,
}

#[derive(Serialize)]
struct ConsumerStatus {
    group: String,
    subscription: String,
    /// Lag (publish → projection commit) at the group's last save.
    lag_millis: i64,
    /// Seconds since the group last saved an offset.
    idle_secs: i64,
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
        statuses.push(status_of(config).await?);
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

async fn status_of(config: &CourierConfig) -> anyhow::Result<Status> {
    let schema = &config.database.schema;
    let pool = courier::db::pool(&config.database, "courier-cli")?;
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
            publish_limit: r.get("publish_limit"),
            publishes_in_flight: r.get("publishes_in_flight"),
            publish_latency_ms: r.get("publish_latency_ms"),
            publish_keys_out: r.get("publish_keys_out"),
        })
        .collect();
    drop(conn);
    let offsets = OffsetStore::new(schema, config.consumer.offset_lanes);
    let mut consumers = Vec::new();
    for group in offsets.groups(&pool).await? {
        if let Some(offset) = offsets.load(&pool, &group).await? {
            consumers.push(ConsumerStatus {
                group,
                subscription: offset.subscription,
                lag_millis: offset.max_lag_millis,
                idle_secs: (Utc::now() - offset.updated_at).num_seconds(),
            });
        }
    }
    let per_sec = |n: i64| n as f64 / 60.0;
    let status = Status {
        schema: schema.clone(),
        pending: row.get("pending"),
        dead: row.get("dead"),
        oldest_pending_secs: row.get("oldest_pending_secs"),
        published_per_sec: per_sec(row.get("published_last_minute")),
        live_relays: row.get("live_relays"),
        relays_started_last_hour: row.get("relays_started_last_hour"),
        applied_per_sec: per_sec(row.get("applied_last_minute")),
        relays,
        consumers,
        dead_letters: courier::inbound::dead_letter_log::DeadLetterLog::new(schema)
            .open(&pool)
            .await?,
        parked_keys: courier::inbound::parked::KeyVersions::new(schema)
            .list(&pool)
            .await?,
    };
    Ok(status)
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
