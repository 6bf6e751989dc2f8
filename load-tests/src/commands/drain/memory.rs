//! `--relay-only`: the relay's drain and this process's memory while it drains.

use super::relay_drain;
use super::{relay_config, DrainArgs};
use crate::harness::cpu::CpuMeter;
use crate::harness::fixtures::{event_stream, fill_from, set_shards_idle};
use crate::harness::pipeline::MEMORY_DRIFT_LIMIT;
use crate::report::chart::Panel;
use crate::report::measures::Goal;
use crate::report::Report;
use courier_testkit::{TestDb, TestPubSub};
use std::time::{Duration, Instant};

/// With `--relay-only`, memory is compared after this share of the drain (warm-up).
pub(super) const MEMORY_WARM_UP: f64 = 0.2;

/// With `--relay-only`, drift compares the means of the first and the last of these shares of
/// the drain after warm-up. Halves, not the soak's tenths: the relay's RSS swings as batches
/// of rows come and go (2,000,000 unique keys: between 230 and 550 MiB for minutes, no
/// trend), and a tenth of a short drain (4 s of 200,000 rows) reads a peak or a trough; a
/// leak still shows, at half its size.
pub(super) const MEMORY_WINDOW: f64 = 0.5;

/// `--relay-only`: the relay drains the filled outbox while this process's resident memory
/// is sampled every 250 ms (and charted). The events are written as they are made, so what
/// the process holds beyond its pools is the relay's. Memory drift: the mean of the drain's
/// second half after warm-up (the first 20 %) against its first half, held to the soak's
/// limit.
pub(super) async fn relay_memory(args: &DrainArgs) -> anyhow::Result<Report> {
    let pubsub = TestPubSub::get().await?;
    let topic = pubsub.topic("bench.relay").await?;
    let relay_db = TestDb::new().await?;
    let config = relay_config(&relay_db, &pubsub, args);
    // Made as they are written: with the events held in one vector (1.3 GB for 2,000,000),
    // the allocator returned it during the drain and the drift read −13 %.
    let stream = event_stream(&topic, args.events, args.keys);
    fill_from(
        &relay_db,
        &config,
        stream,
        args.events,
        "rows for the relay",
    )
    .await?;
    set_shards_idle(&relay_db, args.shards, true).await?;
    let own_rss =
        || crate::harness::processes::read_process(std::process::id()).map_or(0, |r| r.rss_bytes);
    let before = own_rss();
    let started = Instant::now();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(async move {
        let mut samples: Vec<(f64, u64)> = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = tick.tick() => samples.push((started.elapsed().as_secs_f64(), own_rss())),
                _ = stopped.changed() => return samples,
            }
        }
    });
    let meter = CpuMeter::start(&pubsub.host);
    let relay = relay_drain(&relay_db, &config, args.events, args.timeout_secs).await;
    let relay_cpu = meter.stop();
    let _ = stop.send(true);
    let samples = sampler.await?;
    let relay = relay?;
    let mib = |bytes: f64| bytes / (1024.0 * 1024.0);
    let points: Vec<(f64, f64)> = samples.iter().map(|(t, rss)| (*t, *rss as f64)).collect();
    let (from, to) = (relay.seconds * MEMORY_WARM_UP, relay.seconds);
    let goal = match crate::harness::drive::first_and_last_share(&points, from, to, MEMORY_WINDOW) {
        Some((first, last)) => Goal {
            name: "process RSS drift while the relay drains, after warm-up".into(),
            value: format!(
                "{:+.1} % ({:.0} → {:.0} MiB; {:.0} MiB before the relay started)",
                (last / first - 1.0) * 100.0,
                mib(first),
                mib(last),
                mib(before as f64)
            ),
            goal: format!("within ±{:.0} %", MEMORY_DRIFT_LIMIT * 100.0),
            met: (last / first - 1.0).abs() <= MEMORY_DRIFT_LIMIT,
        },
        None => anyhow::bail!(
            "the drain was too short to sample memory ({:.1} s)",
            relay.seconds
        ),
    };
    let peak = samples.iter().map(|(_, rss)| *rss).max().unwrap_or(0);
    let memory = Panel::new("this process's resident memory", "MiB").with(
        "RSS",
        points.iter().map(|(t, rss)| (*t, mib(*rss))).collect(),
    );
    Ok(Report {
        benchmark: "drain --relay-only: the relay's drain and this process's memory".into(),
        parameters: vec![
            ("events".into(), args.events.to_string()),
            ("keys".into(), args.keys.to_string()),
            ("shards".into(), args.shards.to_string()),
            ("batch".into(), args.batch.to_string()),
        ],
        rates: vec![relay],
        goals: vec![goal],
        notes: vec![
            relay_cpu.describe("relay drain", args.events),
            format!("peak RSS {:.0} MiB", mib(peak as f64)),
        ],
        timeline: vec![(from, "warm-up ends".into())],
        panels: vec![memory],
        ..Default::default()
    })
}
