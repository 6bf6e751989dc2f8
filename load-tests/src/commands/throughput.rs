//! `throughput`: writers commit as fast as they can through the framework's outbox API while a
//! relay process and a consumer process carry every event into the projection. Reports the
//! end-to-end rate (first commit → last projection commit), the backlog over time, and the
//! ratio to the ceilings measured in the same run: PostgreSQL's raw insert rate with the same
//! number of clients, and the emulator's raw receive rate with the same number of streams.

use crate::commands::limits;
use crate::harness::cpu::{self, CpuMeter};
use crate::harness::drive::{Load, Pace, WARM_UP_SHARE};
use crate::harness::faults::FaultArgs;
use crate::harness::pin::PinArgs;
use crate::harness::pipeline::{Pipeline, Setup};
use crate::harness::rig::PipelineArgs;
use crate::harness::stages::{self, Stage};
use crate::report::measures::{Rate, Ratio};
use crate::report::Report;
use anyhow::Context as _;
use courier_testkit::{TestDb, TestPubSub};
use std::path::Path;
use std::time::Duration;

/// What the writers write through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    /// The framework's `Outbox` API in the harness's own transactions.
    Outbox,
    /// The services' HTTP APIs (catalog `POST /videos` → engagement's replica).
    Http,
}

#[derive(clap::Args)]
pub struct ThroughputArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Write through the outbox API or through the services' HTTP APIs.
    #[arg(long, value_enum, default_value_t = Via::Outbox)]
    pub via: Via,
    /// How long the writers write.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub seconds: u64,
    /// How long each ceiling probe runs (PostgreSQL inserts; the receive backlog is sized to
    /// take about this long).
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

/// The ceilings end to end is held to, measured now, and what each stage costs alone.
pub struct Ceilings {
    pub postgres: Rate,
    pub receive: Rate,
    pub stages: Vec<Stage>,
    /// What the emulator burns at rest once the probes are done (see [`emulator_at_rest`]).
    pub emulator_at_rest: String,
}

/// How long the emulator is watched at rest after the probes.
const AT_REST: Duration = Duration::from_secs(3);

impl Ceilings {
    /// End to end against the lower ceiling; the goal is 0.6.
    pub fn ratio(&self, end_to_end: &Rate) -> Ratio {
        Ratio::to_lowest(
            "end to end / lower ceiling",
            end_to_end,
            &[&self.postgres, &self.receive],
            0.6,
        )
    }

    /// Into a report: the ceilings, the machine bound, `writes` and `end_to_end`; the goal
    /// ratio and the ratio to the bound; the stages' CPU as notes.
    pub fn report(self, benchmark: &str, writes: Rate, end_to_end: Rate) -> Report {
        let ratio = self.ratio(&end_to_end);
        let (bound, to_bound) = stages::machine_bound(&self.stages, &end_to_end);
        let mut notes = stages::describe(&self.stages);
        notes.push(self.emulator_at_rest);
        Report {
            benchmark: benchmark.into(),
            notes,
            rates: vec![self.postgres, self.receive, bound, writes, end_to_end],
            ratios: vec![ratio, to_bound],
            ..Default::default()
        }
    }
}

/// PostgreSQL's raw insert rate moves with this machine's disk (each commit waits for the
/// WAL's fsync): over one session a single 5 s probe read anywhere from 3.0k to 7.2k/s, and a
/// dip made it the lower ceiling and flattered the ratio (0.32 for 964/s end to end). A
/// ceiling is the best the database does, so it is the fastest of this many probes.
const PG_PROBES: usize = 3;

/// The fastest of `rates`, named with how many it was chosen from.
fn fastest(rates: Vec<Rate>) -> Option<Rate> {
    let count = rates.len();
    let mut best = rates
        .into_iter()
        .max_by(|a, b| a.per_second.total_cmp(&b.per_second))?;
    best.name = format!("{} (fastest of {count})", best.name);
    Some(best)
}

/// PostgreSQL's raw insert rate with the pipeline's writers and the emulator's raw receive
/// rate with its streams; and each stage alone: the write transaction of the pipeline's
/// shape, raw publish and receive (the receive backlog's), a projection transaction.
pub async fn measure_ceilings(
    pubsub: &TestPubSub,
    p: &PipelineArgs,
    probe_seconds: u64,
) -> anyhow::Result<Ceilings> {
    let db = TestDb::new().await?;
    let mut probes = Vec::with_capacity(PG_PROBES);
    for _ in 0..PG_PROBES {
        probes.push(limits::pg_insert_rate(&db, p.writers, 1, probe_seconds).await?);
    }
    let postgres = fastest(probes).context("no PostgreSQL probe")?;
    drop(db);
    // The emulator paces each stream at ~2k msg/s: size the backlog to the probe's length.
    let backlog = 2_000 * u64::from(p.streams) * probe_seconds;
    let (receive, [publish, received]) =
        limits::raw_receive_rate_metered(pubsub, p.streams, backlog, 1_000).await?;
    let write = stages::write_transaction(pubsub, p.writers, p.shape(), probe_seconds).await?;
    let mut stages = vec![write, publish];
    if !p.relay_only {
        stages.push(received);
        stages.push(stages::projection_transaction(pubsub, p.writers, probe_seconds).await?);
    }
    Ok(Ceilings {
        postgres,
        receive,
        stages,
        emulator_at_rest: emulator_at_rest(pubsub).await,
    })
}

/// The emulator's CPU with nothing to do, after the probes. It keeps a thread for every
/// ordering key it was ever sent (the receive probe's 1,000 among them) and their upkeep goes
/// on during the pipeline that follows on the same emulator: CPU the pipeline lacks, which
/// real Pub/Sub would not take from it.
async fn emulator_at_rest(pubsub: &TestPubSub) -> String {
    let meter = CpuMeter::start(&pubsub.host);
    tokio::time::sleep(AT_REST).await;
    let cpu = meter.stop();
    let threads = meter
        .emulator_threads()
        .map_or_else(|| "?".to_string(), |n| n.to_string());
    format!(
        "emulator at rest after the probes: {:.2} of a core busy, {threads} threads (a thread per ordering key it has been sent, kept for its life)",
        cpu.emulator / cpu.seconds.max(1e-9)
    )
}

pub async fn run(args: ThroughputArgs, dir: &Path) -> anyhow::Result<Report> {
    let pin = args
        .pin
        .schedule(args.seconds as f64, "the writes (--seconds)")?;
    anyhow::ensure!(
        args.via == Via::Outbox,
        "--via http runs through http_path::run (main.rs dispatches it)"
    );
    let pubsub = TestPubSub::get().await?;
    let p = &args.pipeline;
    let ceilings = measure_ceilings(&pubsub, p, args.probe_seconds).await?;

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
    if let Some(pin) = pin {
        pipeline.pin_xmin_in_next_writes(pin);
    }
    eprintln!("writing for {} s with {} writers", args.seconds, p.writers);
    let drained = pipeline
        .write_and_drain(
            Load {
                writers: p.writers,
                shape: p.shape(),
                pace: Pace::ClosedLoop,
                duration: Duration::from_secs(args.seconds),
            },
            Duration::from_secs(args.drain_timeout_secs),
        )
        .await?;
    let run = pipeline
        .conclude("commit → projection (closed loop, queueing included)", 0.0)
        .await?;

    let total = drained.total;
    let writes = Rate::new(
        "committed writes (outbox API, closed loop)",
        total,
        drained.write.seconds,
    );
    let end_to_end = Rate::new(
        if p.relay_only {
            "relay only (first commit → last publish)"
        } else {
            "end to end (first commit → last projection)"
        },
        total,
        *drained.converged.as_ref().unwrap_or(&f64::INFINITY),
    );
    let mut report = ceilings.report(
        "throughput: outbox API → relay → emulator → projection",
        writes,
        end_to_end,
    );
    drained.judge_convergence(&mut report);
    report.parameters = p.parameters();
    report.parameters.extend([
        ("seconds".into(), args.seconds.to_string()),
        ("faults".into(), faults),
        (
            "failed_write_attempts".into(),
            drained.write.failed_attempts.to_string(),
        ),
    ]);
    if let Some(pin) = pin {
        report.parameters.push(("pin_xmin".into(), pin.describe()));
    }
    run.fill(&mut report, drained.after_warm_up(WARM_UP_SHARE));
    report.notes.extend(cpu::emulator_jit(&pubsub.host));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_is_the_fastest_probe_and_says_of_how_many() {
        let probes = vec![
            Rate::new("raw insert", 30_000, 5.0),
            Rate::new("raw insert", 36_000, 5.0),
            Rate::new("raw insert", 15_000, 5.0),
        ];
        let best = fastest(probes).expect("a probe");
        assert_eq!(best.per_second, 7_200.0);
        assert_eq!(best.name, "raw insert (fastest of 3)");
        assert!(fastest(Vec::new()).is_none());
    }
}
