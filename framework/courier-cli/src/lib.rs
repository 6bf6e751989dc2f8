//! `courier`: the operator's command for a Courier deployment (a library too, so tests can run
//! its commands in-process beside services), and [`service::main`], the command line every
//! service binary shares. All of Courier's command-line dependencies (clap, indicatif, anyhow)
//! live in this crate, not in the `courier` framework crate.
//!
//! - `migrate` applies the framework's migrations.
//! - `relay` runs the outbox relay until SIGINT/SIGTERM, then drains in-flight batches.
//! - `provision` creates a consumer's topic, subscription and dead-letter topic, idempotently.
//! - `outbox stats | dead list | dead retry | dead skip`: the backlog and its dead rows.
//! - `offsets show | reset`, `replay`: consumer positions, audited resets, Seek.
//! - `status`: one service's pipeline on one screen.
//! - `dlq peek | republish`: a subscription's dead letters, and sending them back.
//! - `console`: the pipeline on one web page with the actions above behind a token
//!   ([`console`]; a service can mount its routes too).
//! - `verify` checks a deployment's write side end to end: append events, watch them arrive
//!   in order on a subscription of its own.

pub mod console;
mod dlq;
mod offsets;
mod outbox;
mod output;
mod parked;
mod provision;
mod refusal;
mod relay;
pub mod service;
mod status;
mod verify;

use clap::{Parser, Subcommand};
use courier::CourierConfig;
use std::path::PathBuf;

// `--help` shows the fields' doc comments as they are: `COURIER_<SECTION>__<KEY>` is no HTML tag.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Parser)]
#[command(
    name = "courier",
    version,
    about = "Transactional outbox → Pub/Sub → projections: migrate, provision, relay, verify"
)]
pub struct Cli {
    /// Deployment config (TOML); COURIER_<SECTION>__<KEY> variables and PUBSUB_EMULATOR_HOST
    /// override its keys.
    #[arg(
        long,
        env = "COURIER_CONFIG",
        default_value = "deploy/local/courier.toml",
        global = true
    )]
    pub config: PathBuf,
    /// Log as JSON lines instead of text (level from RUST_LOG; default info, warn for verify).
    #[arg(long, global = true)]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Apply the framework's migrations to the configured database and schema.
    #[command(after_help = "Example:\n  courier migrate --config deploy/local/courier.toml")]
    Migrate {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run the outbox relay until SIGINT or SIGTERM.
    #[command(after_help = "Example:\n  courier relay --migrate --grace-secs 10")]
    Relay(relay::RelayArgs),
    /// Create a consumer's topic, subscription, dead-letter topic and its keeper (idempotent).
    #[command(
        after_help = "Example:\n  courier provision --topic catalog.video.events --consumer engagement --role reader"
    )]
    Provision(provision::ProvisionArgs),
    /// The outbox backlog and its dead rows (list, retry, skip).
    #[command(subcommand)]
    Outbox(outbox::OutboxCommand),
    /// Consumer groups' offsets: show, reset (audited, then Seek).
    #[command(subcommand)]
    Offsets(offsets::OffsetsCommand),
    /// Seek a subscription to a time: retained messages since then are delivered again.
    #[command(after_help = "Example:
  courier replay --subscription catalog.video.events.engagement-reader --to-time 2026-11-23T10:00:00Z")]
    Replay(offsets::ReplayArgs),
    /// Dead letters of a subscription: peek, republish to the main topic.
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
    /// Keys of delta projections parked behind a missing version: list, release.
    #[command(subcommand)]
    Parked(parked::ParkedCommand),
    /// One screen per service: backlog, publish rate, relays, dead letters, consumer lag.
    Status(status::StatusArgs),
    /// Serve the operator console: the pipeline on one web page, with the CLI's actions
    /// (retry, skip, release, republish) behind the bearer token, audited.
    Console(console::ConsoleArgs),
    /// Check the write side end to end: append events through the outbox, watch them arrive
    /// on a subscription of its own, every one and each key in order.
    #[command(
        after_help = "Example (after a deploy, against its config):\n  courier --config /etc/courier/courier.toml verify --events 2000 --keys 100"
    )]
    Verify(verify::VerifyArgs),
}

/// Runs one parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let config = load_config(&cli.config)?;
    match cli.command {
        Command::Migrate { json } => {
            let report = migrate(&config).await?;
            if json {
                return output::print_json(&serde_json::json!({
                    "schema": config.database.schema,
                    "applied": report.applied,
                    "already_applied": report.already_applied,
                }));
            }
            println!("{}", describe(&config, &report));
            Ok(())
        }
        Command::Relay(args) => relay::run(config, args).await,
        Command::Provision(args) => provision::run(config, args).await,
        Command::Verify(args) => verify::run(config, args).await,
        Command::Outbox(command) => outbox::run(config, command).await,
        Command::Offsets(command) => offsets::run(config, command).await,
        Command::Replay(args) => offsets::replay(config, args).await,
        Command::Status(args) => status::run(config, args).await,
        Command::Dlq(command) => dlq::run(config, command).await,
        Command::Parked(command) => parked::run(config, command).await,
        Command::Console(args) => console::run(config, args).await,
    }
}

pub(crate) fn load_config(path: &std::path::Path) -> anyhow::Result<CourierConfig> {
    use anyhow::Context as _;
    CourierConfig::load(path).with_context(|| format!("--config {}", path.display()))
}

/// Applies the framework's migrations and records the config's `relay.shard_count` for the
/// SQL appends (docs/sql-producers.md), as a service's `migrate` does.
async fn migrate(config: &CourierConfig) -> anyhow::Result<courier::migrate::MigrationReport> {
    use anyhow::Context as _;
    let pool = courier::db::pool(&config.database, "courier-cli")?;
    let report =
        courier::migrate::migrate(&pool, &config.database.schema, &[courier::migrate::COURIER])
            .await?;
    let conn = pool.get().await.context("record the shard count")?;
    courier::outbox::record_shard_count(&conn, config).await?;
    Ok(report)
}

/// What a migration run did, in one line.
fn describe(config: &CourierConfig, report: &courier::migrate::MigrationReport) -> String {
    let applied = if report.applied.is_empty() {
        "none to apply".to_string()
    } else {
        format!("applied {}", report.applied.join(", "))
    };
    format!(
        "migrations in schema {}: {applied}; {} were already applied",
        config.database.schema, report.already_applied
    )
}

impl Cli {
    /// The log level when `RUST_LOG` is unset: verify's own output tells the story, the
    /// relay's info logs would bury it.
    pub fn default_log_level(&self) -> &'static str {
        match self.command {
            Command::Verify(_) => "warn",
            _ => "info",
        }
    }
}
