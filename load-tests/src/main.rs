//! `courier-load`: benchmarks of the pipeline against this machine's own limits, measured in
//! the same run (real PostgreSQL, the real Pub/Sub emulator).
//!
//! - `drain`: the relay's drain rate for a filled outbox, beside the raw ceilings it is bound
//!   by (the emulator's publish rate through the client directly, PostgreSQL's claim-and-mark).
//! - `append`: the write path's appends per second with and without the wake-up NOTIFY.
//! - `project`: the read side's projection rate for a subscription backlog, beside the
//!   emulator's raw receive-and-ack rate on the same number of streams.

mod append;
mod drain;
mod fixtures;
mod project;
mod report;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "courier-load",
    version,
    about = "Benchmarks against this machine's measured limits (DATABASE_URL, PUBSUB_EMULATOR_HOST honoured)"
)]
struct Cli {
    /// Print the report as JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Relay drain rate vs raw emulator publish and raw PostgreSQL claim-and-mark.
    #[command(after_help = "Example:\n  courier-load drain --events 200000 --keys 1000")]
    Drain(drain::DrainArgs),
    /// Outbox appends per second (1-event transactions) with and without NOTIFY.
    #[command(after_help = "Example:\n  courier-load append --clients 4 --seconds 10")]
    Append(append::AppendArgs),
    /// Projection rate (committed and acked) vs raw receive-and-ack on the same streams.
    #[command(
        after_help = "Example:\n  courier-load project --events 200000 --keys 1000 --streams 4"
    )]
    Project(project::ProjectArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let report = match cli.command {
            Command::Drain(args) => drain::run(args).await?,
            Command::Append(args) => append::run(args).await?,
            Command::Project(args) => project::run(args).await?,
        };
        anyhow::Ok(report)
    });
    match result {
        Ok(report) => {
            if cli.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
