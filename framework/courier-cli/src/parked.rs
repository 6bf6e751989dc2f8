//! `courier parked list | release`: keys of delta projections parked behind a version that did
//! not come (its events kept in the database), and letting one go on — after republishing the
//! missing event (`courier dlq republish`), or skipping the gap for good (audited).

use crate::output::print_json;
use crate::refusal::{require_reason, Refusal};
use crate::service::audit_actor;
use clap::{Args, Subcommand};
use courier::db::PgPool;
use courier::operations::{KeyVersions, ParkedKey, Release, ReleaseError, Released};
use courier::pubsub::PubSub;
use courier::CourierConfig;

#[derive(Subcommand)]
pub enum ParkedCommand {
    /// Parked keys of the schema's consumer groups, oldest first, with what they hold.
    #[command(
        after_help = "Example:\n  courier --config deploy/local/engagement.toml parked list"
    )]
    List {
        /// Only this consumer group.
        #[arg(long)]
        group: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Unpark a key and republish its held events to its topic in version order (audited).
    #[command(
        after_help = "Examples:\n  courier parked release --group engagement_reader --key 0190a8d4-… --reason \"v2 republished from the DLQ\"\n  courier parked release --group engagement_reader --key 0190a8d4-… --skip-to 3 --reason \"v2 is lost for good\""
    )]
    Release(ReleaseArgs),
}

#[derive(Args)]
pub struct ReleaseArgs {
    /// The consumer group (`<service>_<role>`).
    #[arg(long)]
    group: String,
    /// The parked key (the aggregate id).
    #[arg(long)]
    key: String,
    /// Treat every version below this one as applied: the gap is skipped for good.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    skip_to: Option<i64>,
    /// Why, for the audit table.
    #[arg(long)]
    reason: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(config: CourierConfig, command: ParkedCommand) -> anyhow::Result<()> {
    let pool = courier::db::pool(&config.database, "courier-cli")?;
    let versions = KeyVersions::new(&config.database.schema);
    match command {
        ParkedCommand::List { group, json } => {
            let parked = list(&versions, &pool, group.as_deref()).await?;
            if json {
                return print_json(&parked);
            }
            for p in &parked {
                let held = match (p.first_held_version, p.last_held_version) {
                    (Some(first), Some(last)) => format!("v{first}..v{last}"),
                    _ => "nothing".into(),
                };
                println!(
                    "{} key {} waits for v{} since {}, holds {} event(s) ({held}): {}",
                    p.consumer_group,
                    p.routing_key,
                    p.expected_version,
                    p.parked_at.format("%Y-%m-%d %H:%M:%S UTC"),
                    p.held_events,
                    p.reason
                );
            }
            if parked.is_empty() {
                println!("no parked keys in schema {}", config.database.schema);
            }
            Ok(())
        }
        ParkedCommand::Release(args) => {
            let release = Release {
                consumer_group: args.group.clone(),
                routing_key: args.key.clone(),
                skip_to: args.skip_to,
                by: audit_actor(),
                reason: args.reason.clone(),
            };
            let released = release_key(&config, &versions, &pool, &release).await?;
            if args.json {
                return print_json(&released);
            }
            let skipped = released
                .skipped_to
                .map(|v| format!(", versions below v{v} skipped"))
                .unwrap_or_default();
            println!(
                "released key {} of {} (it waited for v{}{skipped}): {} held event(s) republished to {} (audit #{})",
                args.key,
                args.group,
                released.expected_version,
                released.republished,
                released.topic,
                released.audit_id
            );
            Ok(())
        }
    }
}

/// Parked keys of the schema, of one consumer group when `group` is given. `courier parked
/// list` and the console both read them through it.
pub(crate) async fn list(
    versions: &KeyVersions,
    pool: &PgPool,
    group: Option<&str>,
) -> anyhow::Result<Vec<ParkedKey>> {
    Ok(versions
        .list(pool)
        .await?
        .into_iter()
        .filter(|p| group.is_none_or(|g| g == p.consumer_group))
        .collect())
}

/// Releases a parked key (audited) and republishes its held events to its topic in version
/// order. `courier parked release` and the console both act through it.
pub(crate) async fn release_key(
    config: &CourierConfig,
    versions: &KeyVersions,
    pool: &PgPool,
    release: &Release,
) -> anyhow::Result<Released> {
    require_reason(&release.reason, "the key is released")?;
    match versions
        .release(pool, &PubSub::new(config.pubsub.clone()), release)
        .await
    {
        Ok(released) => Ok(released),
        Err(e @ ReleaseError::NotParked { .. }) => Err(Refusal::NotFound(e.to_string()).into()),
        Err(e @ ReleaseError::BadSkip(_)) => Err(Refusal::BadInput(e.to_string()).into()),
        Err(e) => Err(e.into()),
    }
}
