//! `latency`: writes scheduled at a fixed rate (open loop; default half the end-to-end maximum
//! measured on the same pipeline just before), each write's latency measured from the instant it was
//! due, so a stalled pipeline cannot hide its stalls (no coordinated omission). Reports
//! p50/p90/p99/p99.9/max commit → projection (→ publish acknowledged with `--relay-only`), and
//! each hop's share (`hops.rs`), beside the emulator's own publish → receive latency (publish →
//! acknowledged with `--relay-only`) at the same rate, for as long, measured after the run on
//! the warmed-up emulator. The writes of a warm-up before the measured ones are reported apart:
//! at 200/s the pipeline's first 300 ms alone were the p99 of a 30-second run.

use crate::commands::limits;
use crate::harness::drive::{Load, Pace, WARM_UP_SHARE};
use crate::harness::faults::FaultArgs;
use crate::harness::pin::PinArgs;
use crate::harness::pipeline::{Pipeline, Setup};
use crate::harness::rig::PipelineArgs;
use crate::harness::workload::KeySpace;
use crate::report::measures::{Goal, Rate};
use crate::report::Report;
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
    /// How long the writers write, after the warm-up.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub seconds: u64,
    /// Writes at the rate before the measured ones, not judged: the pipeline's first second
    /// (connections, the first publishes on each stream) is measured apart, as the emulator's
    /// own hop is measured warmed up.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub warm_up_secs: u64,
    /// How long the maximum probe runs (the emulator's own latency is measured for --seconds).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub probe_seconds: u64,
    /// Give up waiting for the projection to catch up after this long.
    #[arg(long, default_value_t = 600)]
    pub drain_timeout_secs: u64,
    #[command(flatten)]
    pub faults: FaultArgs,
    #[command(flatten)]
    pub pin: PinArgs,
}

/// p99 may exceed the emulator's own p99 by this much.
const P99_BUDGET_MS: f64 = 40.0;

pub async fn run(args: LatencyArgs, dir: &Path) -> anyhow::Result<Report> {
    anyhow::ensure!(
        args.load > 0.0 && args.load <= 1.0,
        "--load must be in (0, 1], got {}",
        args.load
    );
    let p = &args.pipeline;
    let pin = args
        .pin
        .schedule(args.seconds as f64, "the writes (--seconds)")?;
    let pubsub = TestPubSub::get().await?;
    let drain_timeout = Duration::from_secs(args.drain_timeout_secs);
    let mut pipeline = Pipeline::launch(
        dir,
        Setup::one_relay(
            p,
            args.faults.plan()?,
            &pubsub.host,
            Duration::from_millis(500),
        ),
    )
    .await?;
    let faults = pipeline.plan.describe();
    let (rate, max) = match args.rate {
        Some(rate) => (rate as f64, None),
        None => {
            let max = pipeline
                .probe_max(p, args.probe_seconds, drain_timeout)
                .await?;
            (args.load * max, Some(max))
        }
    };
    let rate = rate.max(1.0);
    let warm_up_from = pipeline.origin.seconds();
    let measured_from = warm_up_from + args.warm_up_secs as f64;
    if let Some(pin) = pin {
        pipeline.pin_xmin_in_next_writes(pin);
    }
    eprintln!(
        "writing {rate:.0}/s for {} s (open loop), the first {} s a warm-up",
        args.warm_up_secs + args.seconds,
        args.warm_up_secs
    );
    let drained = pipeline
        .write_and_drain(
            Load {
                writers: p.writers,
                shape: p.shape(),
                pace: Pace::OpenLoop { per_second: rate },
                duration: Duration::from_secs(args.warm_up_secs + args.seconds),
            },
            drain_timeout,
        )
        .await?;
    let warm_up = if args.warm_up_secs > 0 {
        let name = format!("the warm-up's {} s (not judged)", args.warm_up_secs);
        let (from, to) = (warm_up_from, measured_from);
        Some(pipeline.latency_between(&name, from, to).await?)
    } else {
        None
    };
    let run = pipeline
        .conclude(
            &format!("commit → projection at {rate:.0}/s (open loop)"),
            measured_from,
        )
        .await?;
    // The emulator's own hop, at the run's rate for the run's duration on the emulator the
    // run just warmed up, with the machine to itself: a short probe is too noisy to judge a
    // pipeline that contains the hop by.
    // A relay-only run's hop ends at the mark, after the broker acknowledged the publish: its
    // reference ends at the acknowledgement too (a receipt would add the delivery it has not).
    let hop = if p.relay_only {
        limits::RawHop::Acknowledged
    } else {
        limits::RawHop::Received
    };
    eprintln!(
        "measuring the emulator's own publish → {} at {rate:.0}/s for {} s",
        hop.end(),
        args.seconds
    );
    let keys = match p.key_space {
        KeySpace::Reused => Some(p.keys),
        KeySpace::Unique => None,
    };
    let raw = limits::raw_latency(&pubsub, rate.round() as u64, args.seconds, keys, hop).await?;

    let mut report = Report {
        benchmark: "latency: commit → projection at a fixed rate".into(),
        parameters: p.parameters(),
        rates: vec![Rate::new(
            "committed writes (open loop)",
            drained.write.committed,
            drained.write.seconds,
        )],
        reference_latencies: std::iter::once(raw.clone()).chain(warm_up).collect(),
        ..Default::default()
    };
    report.parameters.extend([
        ("rate_per_second".into(), format!("{rate:.0}")),
        (
            "measured_end_to_end_max".into(),
            max.map_or("not measured (--rate given)".into(), |m| {
                format!("{m:.0}/s")
            }),
        ),
        ("seconds".into(), args.seconds.to_string()),
        ("warm_up_secs".into(), args.warm_up_secs.to_string()),
        ("faults".into(), faults),
        (
            "failed_write_attempts".into(),
            drained.write.failed_attempts.to_string(),
        ),
    ]);
    if let Some(pin) = pin {
        report.parameters.push(("pin_xmin".into(), pin.describe()));
    }
    drained.judge_convergence(&mut report);
    run.fill(&mut report, drained.after_warm_up(WARM_UP_SHARE));
    if let Some(latency) = &report.latency {
        let above = latency.p99_ms - raw.p99_ms;
        report.goals.push(Goal {
            name: "p99 above the emulator's own p99".into(),
            value: format!("{above:.1} ms"),
            goal: format!("≤ {P99_BUDGET_MS} ms"),
            met: above <= P99_BUDGET_MS,
        });
    }
    Ok(report)
}
