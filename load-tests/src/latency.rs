//! `latency`: writes scheduled at a fixed rate (open loop; default half the end-to-end maximum
//! measured on the same pipeline just before), each write's latency measured from the instant it was
//! due, so a stalled pipeline cannot hide its stalls (no coordinated omission). Reports
//! p50/p90/p99/p99.9/max commit → projection beside the emulator's own publish → receive
//! latency at the same rate.

use crate::drive::{self, Load, Pace};
use crate::limits;
use crate::pipeline::Pipeline;
use crate::report::{Goal, Rate, Report};
use crate::rig::{PipelineArgs, Rig};
use courier_testkit::TestPubSub;
use std::path::Path;
use std::time::Duration;

#[derive(clap::Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Writes per second (default: --load × the end-to-end maximum measured first).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub rate: Option<u64>,
    /// Share of the measured maximum to run at when --rate is not given.
    #[arg(long, default_value_t = 0.5)]
    pub load: f64,
    /// How long the writers write.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub seconds: u64,
    /// How long the maximum probe and the emulator's own latency probe run.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub probe_seconds: u64,
    /// Give up waiting for the projection to catch up after this long.
    #[arg(long, default_value_t = 600)]
    pub drain_timeout_secs: u64,
}

/// p99 may exceed the emulator's own p99 by this much.
const P99_BUDGET_MS: f64 = 40.0;

pub async fn run(args: LatencyArgs, dir: &Path) -> anyhow::Result<Report> {
    anyhow::ensure!(
        args.load > 0.0 && args.load <= 1.0,
        "--load must be in (0, 1], got {}",
        args.load
    );
    let pubsub = TestPubSub::get().await?;
    let p = &args.pipeline;
    let drain_timeout = Duration::from_secs(args.drain_timeout_secs);
    let rig = Rig::create(dir, None, &pubsub.host, p, 30).await?;
    let mut pipeline = Pipeline::start(rig, dir, 1, Duration::from_millis(500)).await?;
    let (rate, max) = match args.rate {
        Some(rate) => (rate as f64, None),
        None => {
            let max = pipeline
                .probe_max(p.writers, p.keys, args.probe_seconds, drain_timeout)
                .await?;
            (args.load * max, Some(max))
        }
    };
    let rate = rate.max(1.0);
    let raw = limits::raw_latency(&pubsub, rate.round() as u64, args.probe_seconds).await?;
    let measured_from = pipeline.origin.seconds();
    eprintln!("writing {rate:.0}/s for {} s (open loop)", args.seconds);
    let (write, _) = pipeline
        .write_and_drain(
            Load {
                writers: p.writers,
                keys: p.keys,
                pace: Pace::OpenLoop { per_second: rate },
                duration: Duration::from_secs(args.seconds),
            },
            drain_timeout,
        )
        .await?;
    let run = pipeline
        .conclude(
            &format!("commit → projection at {rate:.0}/s (open loop)"),
            measured_from,
        )
        .await?;
    let latency = run.latency;

    let above = latency.p99_ms - raw.p99_ms;
    let goal = Goal {
        name: "p99 above the emulator's own p99".into(),
        value: format!("{above:.1} ms"),
        goal: format!("≤ {P99_BUDGET_MS} ms"),
        met: above <= P99_BUDGET_MS,
    };
    Ok(Report {
        benchmark: "latency: commit → projection at a fixed rate".into(),
        parameters: vec![
            ("rate_per_second".into(), format!("{rate:.0}")),
            (
                "measured_end_to_end_max".into(),
                max.map_or("not measured (--rate given)".into(), |m| {
                    format!("{m:.0}/s")
                }),
            ),
            ("seconds".into(), args.seconds.to_string()),
            ("writers".into(), p.writers.to_string()),
            ("keys".into(), p.keys.to_string()),
            ("streams".into(), p.streams.to_string()),
            (
                "failed_write_attempts".into(),
                write.failed_attempts.to_string(),
            ),
        ],
        rates: vec![Rate::new(
            "committed writes (open loop)",
            write.committed,
            write.seconds,
        )],
        goals: vec![goal],
        latency: Some(latency),
        reference_latencies: vec![raw],
        verdict: Some(run.verdict),
        panels: drive::panels(&run.samples),
        ..Default::default()
    })
}
