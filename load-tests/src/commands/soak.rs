//! `soak`: a long run at a fixed share (default 80 %) of the end-to-end maximum measured on
//! the same rig just before, sampling the resident memory and CPU of every process (relay,
//! consumer, emulator, this harness). The framework's processes must keep their memory flat:
//! the mean RSS of the run's last tenth within ±10 % of its first tenth after warm-up.
//!
//! With `--pin-xmin-at`, a transaction of the harness's pins PostgreSQL's xmin horizon from
//! then on, and the report compares each framework statement before and while pinned (`pin`).

use crate::harness::drive::{Load, Pace};
use crate::harness::emulator_heap;
use crate::harness::faults::FaultArgs;
use crate::harness::pin::PinArgs;
use crate::harness::pipeline::{Pipeline, Setup};
use crate::harness::rig::PipelineArgs;
use crate::report::measures::Rate;
use crate::report::Report;
use courier_testkit::TestPubSub;
use std::path::Path;
use std::time::Duration;

#[derive(clap::Args)]
pub struct SoakArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// How long the soak runs, minutes.
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Share of the measured end-to-end maximum to write at.
    #[arg(long, default_value_t = 0.8)]
    pub load: f64,
    /// Writes per second instead of a share of the measured maximum.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub rate: Option<u64>,
    /// How long the closed-loop probe measuring the maximum runs.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub probe_seconds: u64,
    /// Memory is compared after this warm-up share of the run.
    #[arg(long, default_value_t = 0.2)]
    pub warm_up: f64,
    /// Give up waiting for the projection to catch up after this long.
    #[arg(long, default_value_t = 600)]
    pub drain_timeout_secs: u64,
    #[command(flatten)]
    pub faults: FaultArgs,
    #[command(flatten)]
    pub pin: PinArgs,
}

pub async fn run(args: SoakArgs, dir: &Path) -> anyhow::Result<Report> {
    anyhow::ensure!(args.minutes > 0.0, "--minutes must be positive");
    anyhow::ensure!(
        args.load > 0.0 && args.load <= 1.0,
        "--load must be in (0, 1]"
    );
    anyhow::ensure!(
        (0.0..0.9).contains(&args.warm_up),
        "--warm-up must be in [0, 0.9)"
    );
    let pin = args
        .pin
        .schedule(args.minutes * 60.0, "the soak's writes")?;
    // The emulator keeps every message: a heap for the soak's writes when the rate is given,
    // else as much as the machine can spare (the rate comes from a probe on this emulator).
    let soak_writes = args
        .rate
        .map(|rate| (rate as f64 * args.minutes * 60.0 * 1.1) as u64);
    let pubsub = TestPubSub::get_with_heap(emulator_heap::heap_mib(soak_writes)).await?;
    let p = &args.pipeline;
    let mut pipeline = Pipeline::launch(
        dir,
        Setup::one_relay(p, args.faults.plan()?, &pubsub.host, Duration::from_secs(1)),
    )
    .await?;
    let faults = pipeline.plan.describe();
    let drain_timeout = Duration::from_secs(args.drain_timeout_secs);
    let rate = match args.rate {
        Some(rate) => rate as f64,
        None => {
            let max = pipeline
                .probe_max(p, args.probe_seconds, drain_timeout)
                .await?;
            args.load * max
        }
    };
    let soak_from = pipeline.origin.seconds();
    if let Some(pin) = pin {
        pipeline.pin_xmin_in_next_writes(pin);
    }
    eprintln!("soaking at {rate:.0}/s for {} min", args.minutes);
    let soak = Load {
        writers: p.writers,
        shape: p.shape(),
        pace: Pace::OpenLoop { per_second: rate },
        duration: Duration::from_secs_f64(args.minutes * 60.0),
    };
    let drained = pipeline.write_and_drain(soak, drain_timeout).await?;
    let run = pipeline
        .conclude("commit → projection (the soak)", soak_from)
        .await?;
    let mut report = Report {
        benchmark: if p.relay_only {
            "soak (relay only): a long run at a fixed rate, nothing reading the topic".into()
        } else {
            "soak: a long run at a fixed share of the maximum".into()
        },
        parameters: p.parameters(),
        rates: vec![Rate::new(
            "committed writes (soak)",
            drained.write.committed,
            drained.write.seconds,
        )],
        ..Default::default()
    };
    report.parameters.extend([
        ("minutes".into(), args.minutes.to_string()),
        ("rate_per_second".into(), format!("{rate:.0}")),
        ("warm_up_share".into(), args.warm_up.to_string()),
        ("faults".into(), faults),
        (
            "emulator_heap".into(),
            pubsub
                .heap_mib
                .map_or("PUBSUB_EMULATOR_HOST's".into(), |mib| format!("{mib} MiB")),
        ),
    ]);
    if let Some(pin) = pin {
        report.parameters.push(("pin_xmin".into(), pin.describe()));
    }
    drained.judge_convergence(&mut report);
    run.fill(&mut report, drained.after_warm_up(args.warm_up));
    Ok(report)
}
