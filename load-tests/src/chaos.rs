//! `chaos`: while writes run at a fixed rate, faults strike at random moments — a relay or
//! the consumer killed with SIGKILL and started again, PostgreSQL restarted immediately (as
//! after a crash), the emulator frozen (every connection hangs) — and poison messages are
//! published beside the real events. Afterwards the independent checker reads the database
//! and the dead-letter subscription and reports every violation.
//!
//! PostgreSQL and the emulator are the run's own (see `own_stack`), so restarting them does
//! not disturb anything else on the machine. The emulator is frozen rather than restarted: it
//! keeps messages in memory only, so a restart would lose what real Pub/Sub keeps durably.

use crate::checker::judge;
use crate::drive::{self, Load, Pace};
use crate::own_stack::{OwnEmulator, OwnPostgres};
use crate::pipeline::Pipeline;
use crate::processes::Role;
use crate::report::{Goal, Rate, Report};
use crate::rig::{PipelineArgs, Rig};
use anyhow::Context as _;
use courier::outbox::attributes::{self, RequiredFields};
use google_cloud_pubsub::model::Message;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    KillRelay,
    KillConsumer,
    RestartPostgres,
    FreezeEmulator,
}

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
        args.min_gap_secs <= args.max_gap_secs,
        "--min-gap-secs ({}) must not exceed --max-gap-secs ({})",
        args.min_gap_secs,
        args.max_gap_secs
    );
    anyhow::ensure!(
        !args.faults.is_empty(),
        "--faults must name at least one fault"
    );
    let seed = args.seed.unwrap_or_else(|| rand::thread_rng().gen());
    let mut rng = StdRng::seed_from_u64(seed);
    eprintln!("starting a PostgreSQL cluster and an emulator of this run's own");
    let postgres = Arc::new(OwnPostgres::start()?);
    let emulator = OwnEmulator::start(&dir.join("emulator.log")).await?;
    let rig = Rig::create(
        dir,
        Some(&postgres.url()),
        &emulator.host,
        &args.pipeline,
        ACK_DEADLINE_SECS,
    )
    .await?;
    let mut pipeline = Pipeline::start(rig, dir, args.relays, Duration::from_millis(500)).await?;
    let (config, topic) = (pipeline.rig.config.clone(), pipeline.rig.topic.clone());
    let load = Load {
        writers: args.pipeline.writers,
        keys: args.pipeline.keys,
        pace: Pace::OpenLoop {
            per_second: args.rate as f64,
        },
        duration: Duration::from_secs(args.seconds),
    };
    eprintln!(
        "writing {}/s for {} s under faults (seed {seed})",
        args.rate, args.seconds
    );
    let until = Instant::now() + load.duration;
    let origin = pipeline.origin;
    let (write, chaos) = tokio::join!(
        drive::write_for(&config, &topic, origin, load),
        strike(&mut pipeline, &postgres, &emulator, &args, &mut rng, until),
    );
    let write = write?;
    let Strikes { timeline, poison } = chaos?;
    let total = drive::committed_writes(&pipeline.rig).await?;
    let converged = converge(
        &mut pipeline,
        total,
        Duration::from_secs(args.drain_timeout_secs),
    )
    .await;
    let dead_letters = read_dead_letters(&pipeline.rig, poison.len()).await?;
    let finished = pipeline.finish().await?;
    let mut notes: Vec<String> = finished
        .unexpected_exits
        .iter()
        .map(|exit| format!("{exit}; restarted"))
        .collect();
    let mut facts = finished.facts;
    facts.regressions = finished.poller.regressions.clone();
    facts.dead_letters = dead_letters;
    facts.injected_poison = poison;
    let verdict = judge(&facts);
    let zero = |name: &str, n: u64| Goal {
        name: name.into(),
        value: n.to_string(),
        goal: "0".into(),
        met: n == 0,
    };
    let mut goals = vec![
        zero("lost events", verdict.lost),
        zero("double effects", verdict.double_effects),
        zero("version regressions", verdict.regressions),
        zero("all violations", verdict.violations()),
    ];
    let unknown = emulator_breakage(dir);
    if unknown > 0 {
        notes.push(format!(
            "the emulator failed {unknown} StreamingPull streams with UNKNOWN: its subscription \
             breaks after abrupt client disconnects (see README, load tests); events it then \
             never delivers show as lost"
        ));
    }
    if let Err(e) = &converged {
        goals.push(Goal {
            name: "converged".into(),
            value: format!("{e:#}"),
            goal: "within the drain timeout".into(),
            met: false,
        });
    }
    Ok(Report {
        benchmark: "chaos: faults under load, then the independent checker".into(),
        parameters: vec![
            ("seed".into(), seed.to_string()),
            ("seconds".into(), args.seconds.to_string()),
            ("rate".into(), args.rate.to_string()),
            ("relays".into(), args.relays.to_string()),
            ("writers".into(), args.pipeline.writers.to_string()),
            ("keys".into(), args.pipeline.keys.to_string()),
            ("poison".into(), args.poison.to_string()),
            (
                "failed_write_attempts".into(),
                write.failed_attempts.to_string(),
            ),
            (
                "worker_exits_restarted".into(),
                finished.unexpected_exits.len().to_string(),
            ),
        ],
        rates: vec![Rate::new("committed writes", total, write.seconds)],
        goals,
        verdict: Some(verdict),
        notes,
        timeline,
        panels: drive::panels(&finished.samples),
        ..Default::default()
    })
}

struct Strikes {
    timeline: Vec<(f64, String)>,
    /// Event ids of the poison messages published.
    poison: Vec<String>,
}

/// Until `until`: waits a random gap, strikes a random fault, publishes a poison message now
/// and then, and restarts workers that exited on their own.
async fn strike(
    pipeline: &mut Pipeline,
    postgres: &Arc<OwnPostgres>,
    emulator: &OwnEmulator,
    args: &ChaosArgs,
    rng: &mut StdRng,
    until: Instant,
) -> anyhow::Result<Strikes> {
    let mut timeline = Vec::new();
    let mut poison = Vec::new();
    let publisher = pipeline
        .rig
        .pubsub()
        .publisher(
            &pipeline.rig.topic,
            courier::outbox::publisher::CLIENT_BATCH_DELAY,
        )
        .await?;
    loop {
        let gap = Duration::from_secs(rng.gen_range(args.min_gap_secs..=args.max_gap_secs));
        let next = Instant::now() + gap;
        while Instant::now() < next.min(until) {
            pipeline.keep_workers_up()?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if Instant::now() >= until {
            break;
        }
        if poison.len() < args.poison as usize {
            let id = uuid::Uuid::now_v7();
            publisher
                .publish(poison_message(id, poison.len()))
                .await
                .context("publish a poison message")?;
            poison.push(id.to_string());
            timeline.push((pipeline.origin.seconds(), format!("poison {id}")));
        }
        let fault = args.faults[rng.gen_range(0..args.faults.len())];
        let at = pipeline.origin.seconds();
        let what = match fault {
            Fault::KillRelay | Fault::KillConsumer => {
                let role = if fault == Fault::KillRelay {
                    Role::Relay
                } else {
                    Role::Consumer
                };
                let candidates = pipeline.workers.indices(role);
                let index = candidates[rng.gen_range(0..candidates.len())];
                pipeline.workers.kill(index).await?;
                let down = Duration::from_millis(rng.gen_range(200..2_000));
                tokio::time::sleep(down).await;
                pipeline.workers.restart(index)?;
                pipeline.refresh_watched();
                format!(
                    "kill -9 {}, restarted after {} ms",
                    pipeline.workers.label(index),
                    down.as_millis()
                )
            }
            Fault::RestartPostgres => {
                let postgres = postgres.clone();
                tokio::task::spawn_blocking(move || postgres.restart_immediately())
                    .await
                    .context("the restart task panicked")??;
                "PostgreSQL restarted (immediate stop, crash recovery)".into()
            }
            Fault::FreezeEmulator => {
                let pause = Duration::from_millis(rng.gen_range(1_000..5_000));
                emulator.freeze_for(pause).await;
                format!("emulator frozen for {} ms", pause.as_millis())
            }
        };
        eprintln!("{at:>7.1} s  {what}");
        timeline.push((at, what));
    }
    Ok(Strikes { timeline, poison })
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

/// Garbage that cannot decode, or a valid payload of an unknown schema version: both must
/// end on the dead-letter topic with their reason.
fn poison_message(event_id: uuid::Uuid, n: usize) -> Message {
    let key = format!("poison-{n}");
    let (data, schema_version) = if n.is_multiple_of(2) {
        (vec![0xffu8; 16], 1)
    } else {
        (Vec::new(), 99)
    };
    Message::new()
        .set_data(data)
        .set_ordering_key(key.clone())
        .set_attributes(attributes::build(
            RequiredFields {
                event_id,
                event_type: crate::workload::EVENT_TYPE,
                aggregate_id: &key,
                aggregate_type: crate::workload::AGGREGATE_TYPE,
                version: 1,
                occurred_at: chrono::Utc::now(),
                schema_version,
            },
            [],
        ))
}

/// Waits until every committed write is applied and the outbox is empty, restarting workers
/// that exit meanwhile.
async fn converge(pipeline: &mut Pipeline, total: u64, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let bar = crate::fixtures::progress(total, "applied after the faults");
    let mut last = (0, 0);
    // Progress stalled this long means it will not resume (see `emulator_breakage`).
    const STALL: Duration = Duration::from_secs(90);
    let mut progressed_at = Instant::now();
    loop {
        pipeline.keep_workers_up()?;
        if let Ok(conn) = pipeline.rig.db.pool.get().await {
            if let Ok(row) = conn
                .query_one(
                    "SELECT (SELECT count(DISTINCT (aggregate_id, version)) FROM load.applied),
                            (SELECT count(*) FROM courier.outbox WHERE published_at IS NULL)",
                    &[],
                )
                .await
            {
                let (applied, pending): (i64, i64) = (row.get(0), row.get(1));
                if (applied, pending) != last {
                    progressed_at = Instant::now();
                }
                last = (applied, pending);
                bar.set_position(u64::try_from(applied).unwrap_or(0));
                if u64::try_from(applied).unwrap_or(0) >= total && pending == 0 {
                    bar.finish_and_clear();
                    return Ok(());
                }
            }
        }
        if Instant::now() >= deadline || progressed_at.elapsed() >= STALL {
            bar.finish_and_clear();
            anyhow::bail!(
                "{} of {total} applied, {} outbox rows unpublished; no progress for {} s",
                last.0,
                last.1,
                progressed_at.elapsed().as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The `event_id`s on the dead-letter keeper subscription: one stream (opened now, after the
/// faults), read until `expected` distinct ids arrived and 3 s passed without another, or
/// 60 s passed.
async fn read_dead_letters(rig: &Rig, expected: usize) -> anyhow::Result<Vec<String>> {
    let pubsub = rig.pubsub();
    let subscriber = pubsub.subscriber().await?;
    let mut stream = subscriber
        .subscribe(pubsub.subscription_path(&rig.dead_letter_keeper))
        .build();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1_000);
    // The stream stays open in its task: cancelling a pending `next()` would strand messages.
    tokio::spawn(async move {
        while let Some(Ok((message, handler))) = stream.next().await {
            handler.ack();
            let id = message
                .attributes
                .get("event_id")
                .cloned()
                .unwrap_or_default();
            if tx.send(id).await.is_err() {
                break;
            }
        }
    });
    let mut ids = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let quiet = if ids.len() >= expected {
            Duration::from_secs(3)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        match tokio::time::timeout(quiet, rx.recv()).await {
            Ok(Some(id)) => {
                ids.insert(id);
            }
            Ok(None) | Err(_) => break,
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    Ok(ids.into_iter().collect())
}
