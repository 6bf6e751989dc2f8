//! `courier-load`: the load harness. Every command measures the pipeline (real PostgreSQL,
//! the real Pub/Sub emulator, the relay and the consumer as processes of their own) against
//! this machine's limits measured in the same run, and writes `report.json`, `summary.md` and
//! `chart.svg` into `--out`.
//!
//! - `limits`: the raw ceilings (PostgreSQL inserts, emulator publish/receive/latency).
//! - `throughput`, `latency`, `soak`: the whole pipeline under closed- or open-loop load.
//! - `baseline`: the seed's one-at-a-time relay loop beside the framework's relay.
//! - `scale`: 1, 2 and 3 relay processes; shards rebalanced when one stops.
//! - `chaos`: processes killed, PostgreSQL and the emulator disrupted under load, then an
//!   independent checker.
//! - `drain`, `append`, `project`: focused benchmarks of one stage each.
//! - `claim-cost`: the claim with and without rows parked for retry.

mod commands;
mod harness;
mod report;

use commands::{
    append, baseline, chaos, claim_cost, drain, http_path, latency, limits, project, scale, soak,
    throughput, worker,
};

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// The relay allocates per row on one thread and its Pub/Sub clients free on others: glibc's
/// malloc spent a quarter of the relay thread's time there (perf, `drain`). Measured ceilings
/// run in this process too, so they get the same allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Directory for report.json, summary.md and chart.svg [default:
    /// load-reports/<command>-<UTC time>].
    #[arg(long, global = true)]
    out: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// This machine's raw ceilings: PostgreSQL inserts, emulator publish, receive, latency.
    #[command(after_help = "Example:\n  courier-load limits --seconds 5 --clients 1,4,16")]
    Limits(limits::LimitsArgs),
    /// End-to-end events/s at full speed, with the backlog over time, vs the ceilings.
    #[command(
        after_help = "Examples:\n  courier-load throughput --seconds 30 --writers 8\n  courier-load throughput --via http --seconds 30"
    )]
    Throughput(throughput::ThroughputArgs),
    /// Commit → projection percentiles at a fixed rate (open loop, no coordinated omission).
    #[command(
        after_help = "Example:\n  courier-load latency --seconds 30            # at 50 % of the measured max"
    )]
    Latency(latency::LatencyArgs),
    /// Kill -9 relays and the consumer, restart PostgreSQL, freeze the emulator under load;
    /// then check every event was applied exactly once. Exits 2 on any violation.
    #[command(
        after_help = "Examples:\n  courier-load chaos --seconds 120 --rate 300\n  courier-load chaos --faults kill-relay,kill-consumer --seed 42"
    )]
    Chaos(chaos::ChaosArgs),
    /// The seed's one-publish-at-a-time relay loop vs the framework's relay, same data.
    #[command(
        after_help = "Example:\n  courier-load baseline --events 20000 --baseline-seconds 20"
    )]
    Baseline(baseline::BaselineArgs),
    /// 1, 2, 3 relay processes on one outbox; shard takeover after a stop and a kill -9.
    #[command(after_help = "Example:\n  courier-load scale --events 60000 --shards 12")]
    Scale(scale::ScaleArgs),
    /// A long run at 80 % of the measured maximum; RSS and CPU of every process over time.
    #[command(
        after_help = "Examples:\n  courier-load soak --minutes 10\n  courier-load soak --minutes 10 --pin-xmin-at 90   # a transaction holds the xmin horizon from 90 s on"
    )]
    Soak(soak::SoakArgs),
    /// Relay drain rate vs raw emulator publish and raw PostgreSQL claim-and-mark.
    #[command(after_help = "Example:\n  courier-load drain --events 200000 --keys 1000")]
    Drain(drain::DrainArgs),
    /// Outbox appends per second (1-event transactions) with and without NOTIFY; `--via sql`:
    /// the SQL function courier.append_event against Outbox::append.
    #[command(
        after_help = "Examples:\n  courier-load append --clients 4 --seconds 10\n  courier-load append --via sql --clients 4 --seconds 10"
    )]
    Append(append::AppendArgs),
    /// Projection rate (committed and acked) vs raw receive-and-ack on the same streams.
    #[command(
        after_help = "Example:\n  courier-load project --events 200000 --keys 1000 --streams 4"
    )]
    Project(project::ProjectArgs),
    /// Claim cost per row with 50,000 rows parked for retry vs none (goal ≤ 2x).
    #[command(after_help = "Example:\n  courier-load claim-cost --parked 50000 --fresh 20000")]
    ClaimCost(claim_cost::ClaimCostArgs),
    /// A relay or consumer process of a run (started by the other commands).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

impl Command {
    fn name(&self) -> &'static str {
        match self {
            Command::Limits(_) => "limits",
            Command::Throughput(_) => "throughput",
            Command::Latency(_) => "latency",
            Command::Chaos(_) => "chaos",
            Command::Baseline(_) => "baseline",
            Command::Scale(_) => "scale",
            Command::Soak(_) => "soak",
            Command::Drain(_) => "drain",
            Command::Append(_) => "append",
            Command::Project(_) => "project",
            Command::ClaimCost(_) => "claim-cost",
            Command::Worker(_) => "worker",
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    // Logs at warn, but spans at info as a service has them: the measured pipeline pays for
    // its trace context (a span per request, per traced publish, per consumed message).
    let logs = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(logs),
        )
        .with(
            courier::telemetry::trace_context_layer()
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = cli.out.clone().unwrap_or_else(|| {
        PathBuf::from("load-reports").join(format!(
            "{}-{}",
            cli.command.name(),
            chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
        ))
    });
    let result = runtime.block_on(async {
        if let Command::Worker(args) = cli.command {
            worker::run(args).await?;
            return anyhow::Ok(None);
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        let report = match cli.command {
            Command::Limits(args) => limits::run(args).await?,
            // Through the services' HTTP APIs: the same arguments, another pipeline.
            Command::Throughput(args) if args.via == throughput::Via::Http => {
                http_path::run(args).await?
            }
            Command::Throughput(args) => throughput::run(args, &dir).await?,
            Command::Latency(args) => latency::run(args, &dir).await?,
            Command::Chaos(args) => chaos::run(args, &dir).await?,
            Command::Baseline(args) => baseline::run(args).await?,
            Command::Scale(args) => scale::run(args, &dir).await?,
            Command::Soak(args) => soak::run(args, &dir).await?,
            Command::Drain(args) => drain::run(args).await?,
            Command::Append(args) => append::run(args).await?,
            Command::Project(args) => project::run(args).await?,
            Command::ClaimCost(args) => claim_cost::run(args).await?,
            Command::Worker(_) => unreachable!("handled above"),
        };
        report.write_to(&dir)?;
        anyhow::Ok(Some(report))
    });
    match result {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(report)) => {
            if cli.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
                println!("  report: {}", dir.display());
            }
            match &report.verdict {
                Some(verdict) if verdict.violations() > 0 => {
                    eprintln!("the checker found {} violation(s)", verdict.violations());
                    ExitCode::from(2)
                }
                _ => ExitCode::SUCCESS,
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
