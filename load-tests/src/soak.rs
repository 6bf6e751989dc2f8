//! `soak`: a long run at a fixed share (default 80 %) of the end-to-end maximum measured on
//! the same rig just before, sampling the resident memory and CPU of every process (relay,
//! consumer, emulator, this harness). The framework's processes must keep their memory flat:
//! the mean RSS of the run's last tenth within ±10 % of its first tenth after warm-up.

use crate::drive::{self, Load, Pace, Sample};
use crate::pipeline::Pipeline;
use crate::report::{Goal, Rate, Report};
use crate::rig::{PipelineArgs, Rig};
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
}

/// The framework's processes may drift this much.
const MEMORY_DRIFT_LIMIT: f64 = 0.10;

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
    let pubsub = TestPubSub::get().await?;
    let p = &args.pipeline;
    let rig = Rig::create(dir, None, &pubsub.host, p, 30).await?;
    let mut pipeline = Pipeline::start(rig, dir, 1, Duration::from_secs(1)).await?;
    let load = |pace, seconds: f64| Load {
        writers: p.writers,
        keys: p.keys,
        pace,
        duration: Duration::from_secs_f64(seconds),
    };
    let drain_timeout = Duration::from_secs(args.drain_timeout_secs);
    let rate = match args.rate {
        Some(rate) => rate as f64,
        None => {
            let max = pipeline
                .probe_max(p.writers, p.keys, args.probe_seconds, drain_timeout)
                .await?;
            args.load * max
        }
    };
    let soak_from = pipeline.origin.seconds();
    eprintln!("soaking at {rate:.0}/s for {} min", args.minutes);
    let soak = load(Pace::OpenLoop { per_second: rate }, args.minutes * 60.0);
    let soak_to = soak_from + soak.duration.as_secs_f64();
    let (write, _) = pipeline.write_and_drain(soak, drain_timeout).await?;
    let run = pipeline
        .conclude("commit → projection (the soak)", soak_from)
        .await?;

    let from = soak_from + args.warm_up * (soak_to - soak_from);
    let mut goals = Vec::new();
    let mut notes = Vec::new();
    for (label, drift, first, last) in memory_drift(&run.samples, from, soak_to) {
        let framework = label.starts_with("relay") || label.starts_with("consumer");
        let line = format!(
            "{label}: RSS {:.0} → {:.0} MiB ({:+.1} %)",
            first / 1_048_576.0,
            last / 1_048_576.0,
            drift * 100.0
        );
        if framework {
            goals.push(Goal {
                name: format!("{label} memory drift"),
                value: format!("{:+.1} %", drift * 100.0),
                goal: format!("within ±{:.0} %", MEMORY_DRIFT_LIMIT * 100.0),
                met: drift.abs() <= MEMORY_DRIFT_LIMIT,
            });
        } else {
            notes.push(format!("{line} (reference, not held to the goal)"));
        }
    }
    Ok(Report {
        benchmark: "soak: a long run at a fixed share of the maximum".into(),
        parameters: vec![
            ("minutes".into(), args.minutes.to_string()),
            ("rate_per_second".into(), format!("{rate:.0}")),
            ("writers".into(), p.writers.to_string()),
            ("keys".into(), p.keys.to_string()),
            ("warm_up_share".into(), args.warm_up.to_string()),
            (
                "worker_exits".into(),
                run.unexpected_exits.len().to_string(),
            ),
        ],
        rates: vec![Rate::new(
            "committed writes (soak)",
            write.committed,
            write.seconds,
        )],
        goals,
        notes,
        panels: drive::panels(&run.samples),
        latency: Some(run.latency),
        verdict: Some(run.verdict),
        ..Default::default()
    })
}

/// Per process: `(label, drift, first, last)` where `first` and `last` are the mean RSS of
/// the first and last tenth of `[from, to]` and `drift = last / first − 1`.
pub fn memory_drift(samples: &[Sample], from: f64, to: f64) -> Vec<(String, f64, f64, f64)> {
    let tenth = (to - from) / 10.0;
    let mut labels: Vec<&String> = samples
        .iter()
        .flat_map(|s| s.processes.iter().map(|(l, _)| l))
        .collect();
    labels.sort();
    labels.dedup();
    labels
        .into_iter()
        .filter_map(|label| {
            let mean = |a: f64, b: f64| {
                let values: Vec<f64> = samples
                    .iter()
                    .filter(|s| s.t >= a && s.t <= b)
                    .filter_map(|s| s.processes.iter().find(|(l, _)| l == label))
                    .map(|(_, r)| r.rss_bytes as f64)
                    .collect();
                (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
            };
            let first = mean(from, from + tenth).filter(|rss| *rss > 0.0)?;
            let last = mean(to - tenth, to)?;
            Some((label.clone(), last / first - 1.0, first, last))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processes::ProcessReading;

    fn sample(t: f64, rss_mib: u64) -> Sample {
        Sample {
            t,
            written: 0,
            outbox_pending: 0,
            applied: 0,
            window_p99_ms: None,
            processes: vec![(
                "relay-1".into(),
                ProcessReading {
                    rss_bytes: rss_mib * 1_048_576,
                    cpu_ticks: 0,
                },
            )],
        }
    }

    #[test]
    fn drift_compares_the_first_and_last_tenth_after_warm_up() {
        // Warm-up (t < 10) grows from 10 to 100 MiB; then 100 MiB flat, 110 at the very end.
        let mut samples: Vec<Sample> = (0..10u32)
            .map(|t| sample(f64::from(t), 10 + 10 * u64::from(t)))
            .collect();
        samples
            .extend((10..=100u32).map(|t| sample(f64::from(t), if t >= 91 { 110 } else { 100 })));
        let drift = memory_drift(&samples, 10.0, 100.0);
        assert_eq!(drift.len(), 1);
        let (label, d, first, last) = &drift[0];
        assert_eq!(label, "relay-1");
        assert!((first / 1_048_576.0 - 100.0).abs() < 1e-9);
        assert!((last / 1_048_576.0 - 110.0).abs() < 1e-9, "{last}");
        assert!((d - 0.10).abs() < 1e-9, "{d}");
    }
}
