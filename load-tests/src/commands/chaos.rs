//! `chaos`: while writes run at a fixed rate, faults strike at random moments — a relay or
//! the consumer killed with SIGKILL and started again, PostgreSQL restarted immediately (as
//! after a crash), the emulator frozen (every connection hangs), projection rows held locked
//! so handlers time out, Pub/Sub slowed or silenced — and poison messages are published
//! beside the real events. Afterwards the independent checker reads the database and the
//! dead-letter subscription and reports every violation. The faults are in `faults`.
//!
//! PostgreSQL and the emulator are the run's own when the faults restart or freeze them, so
//! nothing else on the machine is disturbed. The emulator is frozen rather than restarted: it
//! keeps messages in memory only, so a restart would lose what real Pub/Sub keeps durably.

use crate::harness::drive::{Load, Pace, WARM_UP_SHARE};
use crate::harness::faults::{Fault, FaultPlan};
use crate::harness::pipeline::{Pipeline, Setup};
use crate::harness::rig::PipelineArgs;
use crate::report::measures::{Goal, Rate};
use crate::report::Report;
use courier_testkit::TestPubSub;
use std::path::Path;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ChaosArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// How long writes (and faults) go on.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub seconds: u64,
    /// Writes per second (open loop).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rate: u64,
    /// Relay processes (killing one makes the others take its shards over).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub relays: u32,
    /// Faults to draw from.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Fault::KillRelay, Fault::KillConsumer, Fault::RestartPostgres, Fault::FreezeEmulator])]
    pub faults: Vec<Fault>,
    /// Shortest pause between two faults, seconds.
    #[arg(long, default_value_t = 5)]
    pub min_gap_secs: u64,
    /// Longest pause between two faults, seconds.
    #[arg(long, default_value_t = 15)]
    pub max_gap_secs: u64,
    /// Poison messages (undecodable, unknown schema version) published during the run.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(0..=1_000))]
    pub poison: u32,
    /// Seed of the fault schedule (default: random; printed in the report).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Give up waiting for the pipeline to converge after this long.
    #[arg(long, default_value_t = 300)]
    pub drain_timeout_secs: u64,
}

/// The subscription's ack deadline: a killed consumer's messages come back after it (the
/// emulator holds them on the dead stream until then).
const ACK_DEADLINE_SECS: i32 = 10;

pub async fn run(args: ChaosArgs, dir: &Path) -> anyhow::Result<Report> {
    anyhow::ensure!(
        !args.faults.is_empty(),
        "--faults must name at least one fault"
    );
    let plan = FaultPlan::new(
        args.faults.clone(),
        args.min_gap_secs,
        args.max_gap_secs,
        args.seed,
        if args.pipeline.relay_only {
            0
        } else {
            args.poison
        },
    )?;
    // A run whose faults bring their own PostgreSQL and emulator needs no shared one.
    let needs_shared = !plan.faults.contains(&Fault::FreezeEmulator);
    let shared = if needs_shared {
        Some(TestPubSub::get().await?)
    } else {
        None
    };
    let mut pipeline = Pipeline::launch(
        dir,
        Setup {
            args: &args.pipeline,
            plan,
            relays: args.relays,
            sample_every: Duration::from_millis(500),
            ack_deadline_secs: ACK_DEADLINE_SECS,
            shared_emulator: shared.as_ref().map(|p| p.host.as_str()),
        },
    )
    .await?;
    let faults = pipeline.plan.describe();
    eprintln!(
        "writing {}/s for {} s under faults ({faults})",
        args.rate, args.seconds
    );
    let drained = pipeline
        .write_and_drain(
            Load {
                writers: args.pipeline.writers,
                shape: args.pipeline.shape(),
                pace: Pace::OpenLoop {
                    per_second: args.rate as f64,
                },
                duration: Duration::from_secs(args.seconds),
            },
            Duration::from_secs(args.drain_timeout_secs),
        )
        .await?;
    let run = pipeline
        .conclude("commit → projection (under faults)", 0.0)
        .await?;
    let verdict = run.verdict.clone();
    let zero = |name: &str, n: u64| Goal {
        name: name.into(),
        value: n.to_string(),
        goal: "0".into(),
        met: n == 0,
    };
    let mut report = Report {
        benchmark: "chaos: faults under load, then the independent checker".into(),
        parameters: args.pipeline.parameters(),
        rates: vec![Rate::new(
            "committed writes",
            drained.total,
            drained.write.seconds,
        )],
        goals: vec![
            zero("lost events", verdict.lost),
            zero("double effects", verdict.double_effects),
            zero("out-of-order effects", verdict.order_violations),
            zero("all violations", verdict.violations()),
        ],
        ..Default::default()
    };
    drained.judge_convergence(&mut report);
    report.parameters.extend([
        ("seconds".into(), args.seconds.to_string()),
        ("rate".into(), args.rate.to_string()),
        ("relays".into(), args.relays.to_string()),
        ("faults".into(), faults),
        ("poison".into(), run.strikes.poison.len().to_string()),
        (
            "failed_write_attempts".into(),
            drained.write.failed_attempts.to_string(),
        ),
    ]);
    let unknown = emulator_breakage(dir);
    if unknown > 0 {
        report.notes.push(format!(
            "the emulator failed {unknown} StreamingPull streams with UNKNOWN: its subscription \
             breaks after abrupt client disconnects (see README, load tests); events it then \
             never delivers show as lost"
        ));
    }
    run.fill(&mut report, drained.after_warm_up(WARM_UP_SHARE));
    Ok(report)
}

/// How many times the consumer's streams failed with UNKNOWN, from its log: the emulator's
/// answer once a subscription broke (its gRPC server throws `NoSuchMethodError` when a
/// client's streams close abruptly, and from then on fails every stream of the
/// subscription). Real Pub/Sub has no such state.
fn emulator_breakage(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("logs"))
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .map(|log| log.matches("code UNKNOWN").count())
        .sum()
}
