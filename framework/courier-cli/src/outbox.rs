//! `courier outbox …`: the outbox backlog per shard, and the dead rows that block their keys —
//! list, retry, skip (retries and skips are audited in `outbox_operator_actions`).

use crate::output::print_json;
use crate::refusal::{require_reason, Refusal};
use crate::service::audit_actor;
use clap::{Args, Subcommand};
use courier::operations::{ActedOn, Audit, DeadSelection, OutboxOperator};
use courier::CourierConfig;
use uuid::Uuid;

#[derive(Subcommand)]
pub enum OutboxCommand {
    /// Backlog per shard: pending, in flight, dead, age of the oldest pending row.
    #[command(
        after_help = "Example:\n  courier --config deploy/local/catalog.toml outbox stats --json"
    )]
    Stats(JsonFlag),
    /// Dead rows: out of attempts or failed permanently; each blocks its key.
    #[command(subcommand)]
    Dead(DeadCommand),
}

#[derive(Args)]
pub struct JsonFlag {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum DeadCommand {
    /// List dead rows, oldest first.
    #[command(after_help = "Example:\n  courier outbox dead list --limit 20")]
    List {
        /// At most this many rows.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        limit: i64,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Publish dead rows again (attempts reset), in their keys' order.
    #[command(
        after_help = "Examples:\n  courier outbox dead retry 0190f1c2-…  --reason \"topic recreated\"\n  courier outbox dead retry --all --dry-run"
    )]
    Retry {
        /// Event ids of dead rows.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<Uuid>,
        /// Every dead row.
        #[arg(long)]
        all: bool,
        /// Why, for the audit table.
        #[arg(long, default_value = "operator retry")]
        reason: String,
        /// Show what would be retried; change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Give up on one dead row: never sent, its key's later versions flow again.
    #[command(
        after_help = "Example:\n  courier outbox dead skip 0190f1c2-… --reason \"superseded by v8\""
    )]
    Skip {
        /// Event id of the dead row.
        id: Uuid,
        /// Why, for the audit table (required: skipping loses an event).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        json: JsonFlag,
    },
}

pub async fn run(config: CourierConfig, command: OutboxCommand) -> anyhow::Result<()> {
    let pool = courier::db::pool(&config.database, "courier-cli")?;
    let operator = OutboxOperator::new(pool, &config.database.schema);
    match command {
        OutboxCommand::Stats(JsonFlag { json }) => {
            let stats = operator
                .shard_stats(config.relay.shard_count, config.relay.claim_lease())
                .await?;
            if json {
                return print_json(&stats);
            }
            if stats.is_empty() {
                println!(
                    "outbox of schema {}: nothing pending",
                    config.database.schema
                );
            } else {
                println!(
                    "{:>5} {:>9} {:>9} {:>6} {:>12}",
                    "shard", "pending", "in flight", "dead", "oldest (s)"
                );
                for s in &stats {
                    println!(
                        "{:>5} {:>9} {:>9} {:>6} {:>12.1}",
                        s.shard, s.pending, s.in_flight, s.dead, s.oldest_pending_secs
                    );
                }
            }
        }
        OutboxCommand::Dead(DeadCommand::List { limit, json }) => {
            let rows = operator.dead_rows(limit).await?;
            if json.json {
                return print_json(&rows);
            }
            if rows.is_empty() {
                println!("no dead rows");
            }
            for r in &rows {
                println!(
                    "{} {} v{} {} on {} (shard {}, {} attempts, dead since {}): {}",
                    r.event_id,
                    r.aggregate_id,
                    r.version,
                    r.event_type,
                    r.topic,
                    r.shard,
                    r.publish_attempts,
                    r.dead_at.format("%Y-%m-%d %H:%M:%S"),
                    r.last_error.as_deref().unwrap_or("-")
                );
            }
        }
        OutboxCommand::Dead(DeadCommand::Retry {
            ids,
            all,
            reason,
            dry_run,
            json,
        }) => {
            let selection = if all {
                DeadSelection::All
            } else {
                DeadSelection::Ids(ids)
            };
            let actor = audit_actor();
            let acted = retry(&operator, &selection, &actor, &reason, dry_run).await?;
            if json.json {
                return print_json(&acted);
            }
            let verb = if dry_run { "would retry" } else { "retried" };
            println!("{verb} {} dead row(s)", acted.len());
            for a in &acted {
                println!("  {} {} v{}", a.event_id, a.aggregate_id, a.version);
            }
            not_dead(&selection, &acted)?;
        }
        OutboxCommand::Dead(DeadCommand::Skip { id, reason, json }) => {
            let acted = skip(
                &operator,
                &config.database.schema,
                id,
                &audit_actor(),
                &reason,
            )
            .await?;
            if json.json {
                return print_json(&acted);
            }
            println!(
                "skipped {} ({} v{}): later versions of {} flow again",
                acted.event_id, acted.aggregate_id, acted.version, acted.aggregate_id
            );
        }
    }
    Ok(())
}

/// Retries the selected dead rows as `actor` (audited), or with `dry_run` says which it would
/// retry and changes nothing. `courier outbox dead retry` and the console both act through it.
pub(crate) async fn retry(
    operator: &OutboxOperator,
    selection: &DeadSelection,
    actor: &str,
    reason: &str,
    dry_run: bool,
) -> anyhow::Result<Vec<ActedOn>> {
    require_reason(reason, "the rows are retried")?;
    if !dry_run {
        return Ok(operator.retry(selection, &Audit { actor, reason }).await?);
    }
    let dead = operator.dead_rows(i64::MAX).await?;
    Ok(dead
        .into_iter()
        .filter(|r| match selection {
            DeadSelection::All => true,
            DeadSelection::Ids(ids) => ids.contains(&r.event_id),
        })
        .map(|r| ActedOn {
            event_id: r.event_id,
            aggregate_id: r.aggregate_id,
            version: r.version,
        })
        .collect())
}

/// Fails naming the selected ids that were not dead rows (so nothing was done to them).
pub(crate) fn not_dead(selection: &DeadSelection, acted: &[ActedOn]) -> anyhow::Result<()> {
    if let DeadSelection::Ids(ids) = selection {
        let missing: Vec<String> = ids
            .iter()
            .filter(|id| !acted.iter().any(|a| a.event_id == **id))
            .map(Uuid::to_string)
            .collect();
        if !missing.is_empty() {
            return Err(Refusal::NotFound(format!("not dead rows: {}", missing.join(", "))).into());
        }
    }
    Ok(())
}

/// Gives up on one dead row as `actor` (audited; `reason` is required, since skipping loses an
/// event). `courier outbox dead skip` and the console both act through it.
pub(crate) async fn skip(
    operator: &OutboxOperator,
    schema: &str,
    id: Uuid,
    actor: &str,
    reason: &str,
) -> anyhow::Result<ActedOn> {
    require_reason(reason, "the event is given up")?;
    operator
        .skip(id, &Audit { actor, reason })
        .await?
        .ok_or_else(|| {
            Refusal::NotFound(format!("{id} is not a dead row of schema {schema}")).into()
        })
}
