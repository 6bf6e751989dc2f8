//! `scale`: the same filled outbox drained by 1, 2 and 3 relay processes on one database, and
//! how fast the shards are owned again when one relay stops gracefully and one is killed.

use crate::harness::fixtures::{events, fill, poll_until_done, set_shards_idle};
use crate::harness::processes::{Role, Workers};
use crate::harness::rig::{PipelineArgs, Place, Rig, Takeover};
use crate::harness::workload::{AppRows, KeySpace, Workload};
use crate::report::measures::{Goal, Rate, Ratio};
use crate::report::Report;
use anyhow::Context as _;
use courier_testkit::TestPubSub;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct ScaleArgs {
    /// Events in the outbox for each relay count.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=5_000_000))]
    pub events: u64,
    /// Aggregates (ordering keys) they are spread over.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub keys: u64,
    /// Outbox shards (a multiple of 6 splits evenly over 1, 2 and 3 relays).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shards: u32,
    /// The most relay processes to try.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=16))]
    pub max_relays: u32,
    /// Give up on a drain or a takeover after this long.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
}

/// How long a takeover may take: the dead relay's heartbeat must expire (the claim lease)
/// before the others recompute their share, then one tick.
const TAKEOVER_GOAL: Duration = Duration::from_secs(10);

pub async fn run(args: ScaleArgs, dir: &Path) -> anyhow::Result<Report> {
    let pubsub = TestPubSub::get().await?;
    // Relays only: nothing reads the topic.
    let pipeline = PipelineArgs {
        shards: args.shards,
        streams: 1,
        keys: args.keys,
        key_space: KeySpace::Reused,
        updates: 0,
        workload: Workload::Whole,
        app_rows: AppRows::InPlace,
        relay_only: true,
        writers: 1,
    };
    let mut rates = Vec::new();
    let mut goals = Vec::new();
    let mut notes = Vec::new();
    for relays in 1..=args.max_relays {
        let run_dir = dir.join(format!("{relays}-relays"));
        std::fs::create_dir_all(&run_dir)?;
        // Relays are killed and their shards taken over.
        let place = Place::shared(&pubsub.host);
        let rig = Rig::create(&run_dir, &place, &pipeline, 30, Takeover::Quick).await?;
        let batch = events(&rig.topic, args.events, args.keys);
        fill(
            &rig.db,
            &rig.config,
            &batch,
            &format!("rows for {relays} relay(s)"),
        )
        .await?;
        set_shards_idle(&rig.db, args.shards, true).await?;
        let mut workers = Workers::new(&rig, &run_dir)?;
        let started = Instant::now();
        for _ in 0..relays {
            workers.start(Role::Relay)?;
        }
        let seconds = wait_published(&rig, args.events, started, args.timeout_secs).await?;
        rates.push(Rate::new(
            &format!("drain with {relays} relay process(es)"),
            args.events,
            seconds,
        ));
        if relays == args.max_relays {
            // Stop one gracefully (the others take its shards), start it again (shares are
            // recomputed), then kill another one: the one started again must take over.
            let relay_indices = workers.indices(Role::Relay);
            let (first, second) = (relay_indices[0], relay_indices[1]);
            let since = Instant::now();
            workers.stop(first, Duration::from_secs(10)).await;
            let graceful = wait_all_owned(&rig, args.shards, since, args.timeout_secs).await?;
            notes.push(format!(
                "{} stopped (SIGTERM): every shard owned again after {graceful:.1} s",
                workers.label(first)
            ));
            workers.restart(first)?;
            let since = Instant::now();
            workers.kill(second).await?;
            let crash = wait_all_owned(&rig, args.shards, since, args.timeout_secs).await?;
            notes.push(format!(
                "{} killed (SIGKILL): every shard owned again after {crash:.1} s",
                workers.label(second)
            ));
            for (name, seconds) in [
                ("takeover after a graceful stop", graceful),
                ("takeover after kill -9", crash),
            ] {
                goals.push(Goal {
                    name: name.into(),
                    value: format!("{seconds:.1} s"),
                    goal: format!("≤ {} s", TAKEOVER_GOAL.as_secs()),
                    met: seconds <= TAKEOVER_GOAL.as_secs_f64(),
                });
            }
        }
        workers.stop_all(Duration::from_secs(10)).await;
    }
    let ratios = rates
        .iter()
        .skip(1)
        .map(|rate| Ratio::to_lowest(&format!("{} / 1 relay", rate.name), rate, &[&rates[0]], 0.0))
        .collect();
    Ok(Report {
        benchmark: "scale: relay processes sharing one outbox".into(),
        parameters: vec![
            ("events".into(), args.events.to_string()),
            ("keys".into(), args.keys.to_string()),
            ("shards".into(), args.shards.to_string()),
        ],
        rates,
        ratios,
        goals,
        notes,
        ..Default::default()
    })
}

async fn wait_published(
    rig: &Rig,
    total: u64,
    started: Instant,
    timeout_secs: u64,
) -> anyhow::Result<f64> {
    let client = rig.client().await?;
    let client = &client;
    poll_until_done(
        started,
        total,
        "published",
        Duration::from_secs(timeout_secs),
        Duration::from_millis(200),
        || async move {
            let pending: i64 = client
                .query_one(
                    "SELECT count(*) FROM courier.outbox WHERE published_at IS NULL",
                    &[],
                )
                .await
                .context("count unpublished rows")?
                .get(0);
            Ok(total.saturating_sub(u64::try_from(pending).unwrap_or(0)))
        },
    )
    .await
}

/// Seconds from `since` (a relay stopping) until every shard's advisory lock is held again,
/// after first seeing the stopped relay's locks released (or 2 s passing).
async fn wait_all_owned(
    rig: &Rig,
    shards: u32,
    since: Instant,
    timeout_secs: u64,
) -> anyhow::Result<f64> {
    let client = rig.client().await?;
    let client = &client;
    let held = || async move {
        let owned: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .context("count held shard locks")?
            .get(0);
        anyhow::Ok(u64::try_from(owned).unwrap_or(0))
    };
    let released_by = Instant::now() + Duration::from_secs(2);
    while held().await? >= u64::from(shards) && Instant::now() < released_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    poll_until_done(
        since,
        u64::from(shards),
        "shards owned",
        Duration::from_secs(timeout_secs),
        Duration::from_millis(100),
        held,
    )
    .await
}
