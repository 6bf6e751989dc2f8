//! `courier offsets …` and `courier replay`: where consumer groups are, an audited reset that
//! replays from a point (offsets moved, inbox rows since then forgotten, subscription sought),
//! and a bare replay (Seek only: the inbox keeps replayed events from applying twice).

use crate::output::print_json;
use crate::service::audit_actor;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use courier::inbound::OffsetStore;
use courier::pubsub::PubSub;
use courier::CourierConfig;

#[derive(Subcommand)]
pub enum OffsetsCommand {
    /// Where each consumer group of the schema is (or one group).
    #[command(
        after_help = "Example:\n  courier --config deploy/local/catalog.toml offsets show --json"
    )]
    Show {
        /// Only this consumer group.
        #[arg(long)]
        group: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Move a group back to a time or message and replay from there (audited, then Seek).
    #[command(
        after_help = "Examples:\n  courier offsets reset --group catalog_projector \\\n    --subscription engagement.video.events.catalog-projector \\\n    --to-time 2026-11-23T10:00:00Z --reason \"rebuild after bug #12\""
    )]
    Reset(ResetArgs),
}

#[derive(Args)]
pub struct ResetArgs {
    /// The consumer group (`<service>_<role>`).
    #[arg(long)]
    group: String,
    /// The group's subscription id, sought after the reset.
    #[arg(long)]
    subscription: String,
    /// Replay what was published since this time (RFC 3339, e.g. 2026-11-23T10:00:00Z).
    #[arg(
        long,
        conflicts_with = "to_message",
        required_unless_present = "to_message"
    )]
    to_time: Option<String>,
    /// Replay from the publish time saved with this message id.
    #[arg(long)]
    to_message: Option<String>,
    /// Why, for the audit table.
    #[arg(long)]
    reason: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ReplayArgs {
    /// Subscription id to seek.
    #[arg(long)]
    subscription: String,
    /// Deliver again what was published since this time (RFC 3339).
    #[arg(long)]
    to_time: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_time(flag: &str, value: &str) -> anyhow::Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .with_context(|| {
            format!("{flag} {value:?} is not an RFC 3339 time like 2026-11-23T10:00:00Z")
        })
}

pub async fn run(config: CourierConfig, command: OffsetsCommand) -> anyhow::Result<()> {
    let pool = courier::db::pool(&config.database, "courier-cli")?;
    let store = OffsetStore::new(&config.database.schema, config.consumer.offset_lanes);
    match command {
        OffsetsCommand::Show { group, json } => {
            let groups = match group {
                Some(group) => vec![group],
                None => store.groups(&pool).await?,
            };
            let mut shown = Vec::new();
            for group in groups {
                let offset = store.load(&pool, &group).await?.ok_or_else(|| {
                    anyhow::anyhow!(
                        "--group {group:?}: no saved offset in schema {}",
                        config.database.schema
                    )
                })?;
                shown.push(serde_json::json!({ "group": group, "offset": offset }));
                if !json {
                    println!(
                        "{group}: {} up to {} (slowest lane {}), last message {}, lag {} ms, {} lane(s), updated {}",
                        offset.subscription,
                        offset.newest_publish_time.to_rfc3339(),
                        offset.oldest_publish_time.to_rfc3339(),
                        offset.message_id.as_deref().unwrap_or("-"),
                        offset.max_lag_millis,
                        offset.lanes,
                        offset.updated_at.to_rfc3339()
                    );
                }
            }
            if json {
                return print_json(&shown);
            }
            if shown.is_empty() {
                println!("no consumer offsets in schema {}", config.database.schema);
            }
        }
        OffsetsCommand::Reset(args) => {
            anyhow::ensure!(!args.reason.trim().is_empty(), "--reason must say why");
            let to = match (&args.to_time, &args.to_message) {
                (Some(time), _) => parse_time("--to-time", time)?,
                (None, Some(message)) => store
                    .publish_time_of(&pool, &args.group, message)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!(
                        "--to-message {message:?} is not a saved offset of group {}; use --to-time", args.group
                    ))?,
                (None, None) => anyhow::bail!("give --to-time or --to-message"),
            };
            let reset = store
                .reset(
                    &pool,
                    &args.group,
                    &args.subscription,
                    to,
                    &audit_actor(),
                    &args.reason,
                )
                .await?;
            seek(&config, &args.subscription, to).await?;
            if args.json {
                return print_json(&reset);
            }
            println!(
                "group {} reset from {} to {} (audit #{}), {} inbox row(s) forgotten; {} sought: events since then are delivered again",
                args.group,
                reset.old_publish_time.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into()),
                reset.new_publish_time.to_rfc3339(),
                reset.audit_id,
                reset.inbox_rows_forgotten,
                args.subscription
            );
        }
    }
    Ok(())
}

async fn seek(config: &CourierConfig, subscription: &str, to: DateTime<Utc>) -> anyhow::Result<()> {
    let pubsub = PubSub::new(config.pubsub.clone());
    let admin = pubsub.subscription_admin().await?;
    pubsub
        .seek(&admin, subscription, to)
        .await
        .with_context(|| format!("--subscription {subscription:?}"))
}

pub async fn replay(config: CourierConfig, args: ReplayArgs) -> anyhow::Result<()> {
    let to = parse_time("--to-time", &args.to_time)?;
    seek(&config, &args.subscription, to).await?;
    if args.json {
        return print_json(&serde_json::json!({
            "subscription": args.subscription,
            "sought_to": to.to_rfc3339(),
        }));
    }
    println!(
        "{} sought to {}: retained messages published since then are delivered again (the inbox keeps applied ones from a second effect)",
        args.subscription,
        to.to_rfc3339()
    );
    Ok(())
}
