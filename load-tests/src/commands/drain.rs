//! `drain`: how fast the relay empties a filled outbox into the emulator, against the two
//! ceilings measured in the same run on the same rows and messages:
//! - the emulator's raw publish rate through the official client, all messages in flight up to
//!   a bound, with the same ordering keys and attributes, after warming the emulator's JVM up
//!   on the same messages (cold, it publishes at half its warm rate or less); with unique keys
//!   also through a new client every 1,000 keys, as the relay's bounded memory has it publish
//!   (faster on this machine than one client keeping every key's state), with the bound, with
//!   what the relay's connection carries in flight and with 400 (faster still with a key per
//!   row), and the ceiling is the one with the highest median rate over the pairs;
//! - PostgreSQL's raw claim-and-mark: one statement claiming 200 rows `FOR UPDATE SKIP LOCKED`
//!   and marking them published, no publishing.
//!
//! Each phase also reports what it cost the machine in CPU per event. The ceilings are
//! measured with the machine to themselves; the relay does the work of both on the same
//! cores, so the report adds the bound that sets: the cores divided by the two ceilings' CPU
//! per event together. A further phase runs the relay's own claim and mark statements without
//! publishing (two statements and a lock token where the ceiling has one statement); the same
//! bound computed with it is what the relay's design can reach on this machine.
//!
//! The raw publish and the relay drain are measured `--pairs` times in alternating order and
//! the median pair reported (of an even number, the lower middle one): the emulator's pace
//! drifts between minutes by more than the differences worth measuring. With unique keys
//! (`--keys` ≥ `--events`) the relay is held to 0.8 of the raw publish, otherwise to 0.7.
//!
//! With `--history N` it also drains the same events from an outbox that already holds N
//! published rows (what the table looks like between retention runs), after the drain of an
//! outbox without history, and reports the ratio: the claim must not slow down as history
//! grows (goal ≥ 0.9).

use crate::harness::cpu::{cores, shared_machine_bound, CpuMeter, CpuUse};
use crate::harness::fixtures::{
    event_stream, events, fill, fill_from, poll_until_done, progress, publish_bounded_with,
    set_shards_idle, warm_up_emulator, warm_up_note, WARM_UP_MAX_ROUNDS,
};
use crate::harness::middle::Milestones;
use crate::harness::pipeline::MEMORY_DRIFT_LIMIT;
use crate::report::chart::Panel;
use crate::report::measures::{Goal, Rate, Ratio};
use crate::report::Report;
use anyhow::Context as _;
use courier::outbox::NewEvent;
use courier::relay::publisher::CLIENT_BATCH_DELAY;
use courier::relay::store::{OutboxStore, PublishedRows};
use courier::relay::topic_clients::{
    TopicClients, KEYS_PER_CLIENT, REQUESTS_THE_CONNECTION_CARRIES,
};
use courier::relay::{Relay, RelayOptions};
use courier_testkit::{test_config, TestDb, TestPubSub};
use google_cloud_pubsub::model::Message;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use uuid::Uuid;

#[derive(clap::Args)]
pub struct DrainArgs {
    /// Events in the outbox.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=5_000_000))]
    events: u64,
    /// Aggregates (ordering keys) they are spread over.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=5_000_000))]
    keys: u64,
    /// Outbox shards (one claimer each).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    shards: u32,
    /// Rows per claim, for the relay and the raw claim-and-mark alike.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: u32,
    /// Run the relay with `retention.outbox_hours = 0`: its mark deletes each published row
    /// instead of keeping it with `published_at` set.
    #[arg(long)]
    delete_published: bool,
    /// Rounds of the same messages published to a scratch topic before the raw publish ceiling
    /// is measured, stopping early once a round is less than 10 % faster than the one before
    /// (0: measure the cold emulator, whose JVM publishes at a fraction of its warm rate).
    #[arg(long, default_value_t = WARM_UP_MAX_ROUNDS, value_parser = clap::value_parser!(u32).range(0..=20))]
    warm_up_rounds: u32,
    /// Raw publishes and relay drains measured in alternating order (raw first, then relay
    /// first, …), each drain on a freshly filled outbox; the pair with the median ratio is
    /// reported (of an even number, the lower of the middle two). The emulator's and the
    /// machine's pace drift by ±10 % between minutes, more than a single pair can tell from a
    /// change in the relay.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=9))]
    pairs: u32,
    /// Give up on the relay after this long.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Also drain the same events from an outbox already holding this many published rows,
    /// and compare with the drain of the outbox without history (0: skip).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=50_000_000))]
    history: u64,
    /// With --history: drains per outbox, alternating which goes first (ABBA…) so drift of
    /// the emulator or the machine falls on both alike.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10))]
    rounds: u32,
    /// Measure no ceiling: only the relay's drain and this process's memory while it drains
    /// (P7: with `--keys` equal to `--events` every row is an aggregate of its own, and the
    /// memory must stay flat after warm-up).
    #[arg(long, conflicts_with = "history")]
    relay_only: bool,
}

/// With `--relay-only`, memory is compared after this share of the drain (warm-up).
const MEMORY_WARM_UP: f64 = 0.2;

/// Concurrent sessions running the raw claim-and-mark ceiling.
const CLAIM_SESSIONS: u32 = 4;

/// Unacknowledged publishes allowed at once in the raw publish ceiling (with unique keys the
/// raw publish through a client per 1,000 keys also runs at what the relay's connection
/// carries, 1,124, and at 400, and the fastest over all pairs counts).
const RAW_PUBLISH_IN_FLIGHT: usize = 10_000;

/// With `--relay-only`, drift compares the means of the first and the last of these shares of
/// the drain after warm-up. Halves, not the soak's tenths: the relay's RSS swings as batches
/// of rows come and go (2,000,000 unique keys: between 230 and 550 MiB for minutes, no
/// trend), and a tenth of a short drain (4 s of 200,000 rows) reads a peak or a trough; a
/// leak still shows, at half its size.
const MEMORY_WINDOW: f64 = 0.5;

pub async fn run(args: DrainArgs) -> anyhow::Result<Report> {
    if args.relay_only {
        return relay_memory(&args).await;
    }
    let pubsub = TestPubSub::get().await?;
    let relay_topic = pubsub.topic("bench.relay").await?;
    let raw_topic = pubsub.topic("bench.raw").await?;
    let events = events(&relay_topic, args.events, args.keys);

    let claim_db = TestDb::new().await?;
    let mut config = test_config(&claim_db, &pubsub);
    config.relay.shard_count = args.shards;
    fill(&claim_db, &config, &events, "rows for claim-and-mark").await?;
    let meter = CpuMeter::start(&pubsub.host);
    let claim_and_mark = raw_claim_and_mark(
        &claim_db,
        args.shards,
        args.batch,
        CLAIM_SESSIONS,
        events.len() as u64,
    )
    .await?;
    let claim_cpu = meter.stop();
    drop(claim_db);

    let statements_db = TestDb::new().await?;
    let config = relay_config(&statements_db, &pubsub, &args);
    fill(
        &statements_db,
        &config,
        &events,
        "rows for claim, then mark",
    )
    .await?;
    let meter = CpuMeter::start(&pubsub.host);
    let claim_then_mark =
        raw_claim_then_mark(&statements_db, &config, CLAIM_SESSIONS, events.len() as u64).await?;
    let statements_cpu = meter.stop();
    drop(statements_db);

    let warm_up = warm_up_emulator(
        &pubsub,
        || messages(&events),
        events.len() as u64,
        args.warm_up_rounds,
    )
    .await?;
    let Measured {
        median: pair,
        middle,
        note: pairs_note,
        relay_db,
        config,
    } = ceiling_pairs(&args, &pubsub, &raw_topic, &events).await?;
    let raw_ceiling = pair.raw_ceiling().clone();
    let Pair {
        raw_publish,
        publish_cpu,
        per_generation,
        relay,
        relay_cpu,
        ceiling: _,
    } = pair;
    let relay = relay.whole;

    let total = events.len() as u64;
    let bound = |name: &str, database_cpu: &CpuUse| {
        let per_event = [publish_cpu.per_event(total), database_cpu.per_event(total)];
        let rate = shared_machine_bound(cores(), &per_event);
        Rate::new(name, total, total as f64 / rate)
    };
    let machine_bound = bound(
        &format!(
            "bound on this machine: {} cores ÷ (raw publish + claim-and-mark CPU per event)",
            cores()
        ),
        &claim_cpu,
    );
    let design_bound = bound(
        "bound of the relay's statements: the same with claim, then mark",
        &statements_cpu,
    );
    let ceilings = [&raw_ceiling, &claim_and_mark];
    let mut ratios = vec![
        Ratio::to_lowest(
            "relay / lower ceiling",
            &relay,
            &ceilings,
            relay_goal(&args),
        ),
        Ratio::to_lowest(
            "bound on this machine / lower ceiling",
            &machine_bound,
            &ceilings,
            0.0,
        ),
        Ratio::to_lowest(
            "bound of the relay's statements / lower ceiling",
            &design_bound,
            &ceilings,
            0.0,
        ),
        Ratio::to_lowest(
            "relay / bound of the relay's statements",
            &relay,
            &[&design_bound],
            0.0,
        ),
    ];
    let mut report_rates = vec![
        raw_publish.whole,
        claim_and_mark.clone(),
        claim_then_mark.clone(),
        relay,
        machine_bound,
        design_bound,
    ];
    report_rates.extend(per_generation.into_iter().map(|p| p.whole));
    let mut middle_notes = Vec::new();
    if let Some(((raw_middle, relay_middle), relay_milestones)) = middle {
        ratios.push(Ratio::to_lowest(
            "relay / raw publish, middle 90 % of events (the pair with the median of these)",
            &relay_middle,
            &[&raw_middle],
            0.0,
        ));
        middle_notes.push(relay_start_note(&relay_milestones));
        report_rates.extend([raw_middle, relay_middle]);
    }
    let mut notes = vec![
        warm_up_note(&warm_up, total),
        pairs_note,
        publish_cpu.describe("emulator raw publish", total),
        claim_cpu.describe("PostgreSQL raw claim-and-mark", total),
        statements_cpu.describe("PostgreSQL claim, then mark", total),
        relay_cpu.describe("relay drain", total),
    ];
    notes.extend(middle_notes);
    notes.push(
        "bound on this machine: the most a relay could drain if each event cost the machine \
         just what the raw publish and the raw claim-and-mark cost per event, measured alone, \
         both done on the same cores; bound of the relay's statements: the same with the \
         relay's claim and mark (two statements, a lock token, nothing in flight) instead of \
         the single claim-and-mark"
            .into(),
    );
    if claim_and_mark.per_second < claim_then_mark.per_second {
        // One statement doing less than the relay's two cannot be slower unless its plan is
        // wrong; the bound on this machine it sets is then no bound.
        notes.push(format!(
            "SUSPECT CEILING: the raw claim-and-mark ({:.0}/s) ran slower than the relay's own \
             claim, then mark ({:.0}/s); see its plan",
            claim_and_mark.per_second, claim_then_mark.per_second
        ));
    }
    if args.history > 0 {
        let (rates, ratio) = history_rounds(&args, &config, &relay_db, &events).await?;
        report_rates.extend(rates);
        ratios.push(ratio);
    }
    drop(relay_db);
    Ok(Report {
        benchmark: "drain: relay vs raw ceilings".into(),
        parameters: vec![
            ("events".into(), args.events.to_string()),
            ("keys".into(), args.keys.to_string()),
            ("shards".into(), args.shards.to_string()),
            ("batch".into(), args.batch.to_string()),
            ("delete_published".into(), args.delete_published.to_string()),
            ("pairs".into(), args.pairs.to_string()),
            ("history".into(), args.history.to_string()),
            ("rounds".into(), args.rounds.to_string()),
            ("warm_up_rounds".into(), args.warm_up_rounds.to_string()),
        ],
        rates: report_rates,
        ratios,
        notes,
        ..Default::default()
    })
}

/// The relay's config: deployment defaults with the benchmark's shards, batch and retention.
fn relay_config(db: &TestDb, pubsub: &TestPubSub, args: &DrainArgs) -> courier::CourierConfig {
    let mut config = courier::CourierConfig {
        database: db.config.clone(),
        pubsub: pubsub.config(),
        ..Default::default()
    };
    config.relay.shard_count = args.shards;
    config.relay.claim_batch_size = args.batch;
    if args.delete_published {
        config.retention.outbox_hours = 0;
    }
    config.database.pool_size = args.shards * 2 + 4;
    config
}

/// What the relay drain is held to against the raw publish: 0.8 when every row is an ordering
/// key of its own (then raw publish, too, makes one request per message), 0.7 otherwise.
fn relay_goal(args: &DrainArgs) -> f64 {
    if args.keys >= args.events {
        0.8
    } else {
        0.7
    }
}

/// A phase's rate over all its events, and when its count crossed the bounds of their middle.
#[derive(Debug, Clone)]
struct Phase {
    whole: Rate,
    milestones: Milestones,
}

impl Phase {
    fn middle(&self) -> Option<Rate> {
        self.milestones.middle_rate(&self.whole.name)
    }
}

/// A raw publish and a relay drain measured next to each other, with what each cost.
struct Pair {
    raw_publish: Phase,
    publish_cpu: CpuUse,
    /// With a key per row: the raw publish through a new client every
    /// `KEYS_PER_CLIENT` keys (see [`raw_publish_per_generation`]), at each of
    /// [`per_generation_windows`]; the relay is held to the fastest raw publish.
    per_generation: Vec<Phase>,
    relay: Phase,
    relay_cpu: CpuUse,
    /// Which of [`Pair::raw_phases`] is the ceiling: the one fastest over all pairs (see
    /// [`fastest_raw_phase`]), the same in every pair.
    ceiling: usize,
}

impl Pair {
    fn raw_phases(&self) -> impl Iterator<Item = &Phase> {
        std::iter::once(&self.raw_publish).chain(&self.per_generation)
    }

    /// The fastest raw publish: the ceiling the relay is held to.
    fn raw_ceiling(&self) -> &Rate {
        self.raw_phases()
            .nth(self.ceiling)
            .map_or(&self.raw_publish.whole, |p| &p.whole)
    }

    fn ratio(&self) -> f64 {
        self.relay.whole.per_second / self.raw_ceiling().per_second.max(f64::MIN_POSITIVE)
    }

    /// The relay against the fastest raw publish of this pair alone: the max of several noisy
    /// rates, so higher than any one of them would be on average (shown, not judged).
    fn ratio_to_pair_fastest(&self) -> f64 {
        let fastest = self
            .raw_phases()
            .map(|p| p.whole.per_second)
            .fold(0.0, f64::max);
        self.relay.whole.per_second / fastest.max(f64::MIN_POSITIVE)
    }

    /// The ceiling's middle 90 % against the relay's: what each sustains, without the relay's
    /// start, which the raw publish (connection open, emulator warm) does not pay.
    fn middle_rates(&self) -> Option<(Rate, Rate)> {
        let raw = self.raw_phases().nth(self.ceiling)?.middle()?;
        Some((raw, self.relay.middle()?))
    }

    fn middle_ratio(&self) -> f64 {
        self.middle_rates().map_or(0.0, |(raw, relay)| {
            relay.per_second / raw.per_second.max(f64::MIN_POSITIVE)
        })
    }

    /// The one-client raw publish's machine CPU per event over the relay drain's: both carry
    /// the same events, so their machine CPU totals compare as they are.
    fn cpu_ratio(&self) -> f64 {
        self.publish_cpu.machine / self.relay_cpu.machine.max(f64::MIN_POSITIVE)
    }
}

/// `--pairs` raw publishes and relay drains in alternating order.
async fn ceiling_pairs(
    args: &DrainArgs,
    pubsub: &TestPubSub,
    raw_topic: &str,
    events: &[NewEvent],
) -> anyhow::Result<Measured> {
    let total = events.len() as u64;
    let mut pairs = Vec::new();
    let mut last = None;
    for round in 0..args.pairs {
        let relay_first = round % 2 == 1;
        let mut raw = None;
        if !relay_first {
            raw = Some(metered_raw_publish(pubsub, raw_topic, events).await?);
        }
        let mut per_generation = Vec::new();
        if args.keys >= args.events {
            for in_flight in per_generation_windows() {
                per_generation
                    .push(raw_publish_per_generation(pubsub, raw_topic, events, in_flight).await?);
            }
        }
        drop(last.take());
        let relay_db = TestDb::new().await?;
        let config = relay_config(&relay_db, pubsub, args);
        fill(&relay_db, &config, events, "rows for the relay").await?;
        set_shards_idle(&relay_db, args.shards, true).await?;
        let meter = CpuMeter::start(&pubsub.host);
        let relay = relay_drain_phase(&relay_db, &config, total, args.timeout_secs).await?;
        let relay_cpu = meter.stop();
        last = Some((relay_db, config));
        let (raw_publish, publish_cpu) = match raw {
            Some(raw) => raw,
            None => metered_raw_publish(pubsub, raw_topic, events).await?,
        };
        pairs.push(Pair {
            raw_publish,
            publish_cpu,
            per_generation,
            relay,
            relay_cpu,
            ceiling: 0,
        });
    }
    hold_to_fastest_raw_phase(&mut pairs);
    let against_each_fastest = lower_median(
        pairs.iter().map(Pair::ratio_to_pair_fastest).collect(),
        |r| *r,
    )
    .unwrap_or(0.0);
    let listed = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let per_generation = p
                .per_generation
                .iter()
                .map(|r| format!(" ({}: {:.0}/s)", r.whole.name, r.whole.per_second))
                .collect::<String>();
            format!(
                "{}: raw {:.0}/s{per_generation}, relay {:.0}/s = {:.2} (by CPU {:.2}, \
                 middle 90 % {:.2})",
                i + 1,
                p.raw_publish.whole.per_second,
                p.relay.whole.per_second,
                p.ratio(),
                p.cpu_ratio(),
                p.middle_ratio()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let pooled = pooled_cpu_ratio(&pairs);
    let middle = lower_median(pairs.iter().collect(), |p| p.middle_ratio())
        .and_then(|p| Some((p.middle_rates()?, p.relay.milestones.clone())));
    let median = lower_median(pairs, Pair::ratio).context("at least one pair is measured")?;
    let note = format!(
        "raw publish and relay drain measured in {} alternating pairs (the median pair is \
         reported; of an even number, the lower of the middle two; \"by CPU\": the raw \
         publish's CPU per event over the relay drain's, what the ratio would be with both \
         keeping the cores equally busy, so it moves with the relay's cost and not with the \
         emulator's pace; \"middle 90 %\": the same rates timed from the 5 % to the 95 % \
         mark of each phase's events): {listed}; by CPU over all pairs: {pooled:.3}; the \
         ceiling is the raw publish with the highest median rate over the pairs ({}); against \
         each pair's own fastest raw publish instead (the highest of several noisy rates) the \
         median ratio reads {against_each_fastest:.2}",
        args.pairs,
        median.raw_ceiling().name,
    );
    let (relay_db, config) = last.context("at least one pair is measured")?;
    Ok(Measured {
        median,
        middle,
        note,
        relay_db,
        config,
    })
}

/// What [`ceiling_pairs`] found.
struct Measured {
    /// The pair with the median ratio of whole rates.
    median: Pair,
    /// The raw publish's and the relay's middle 90 % in the pair with the median ratio of
    /// those, and that relay drain's milestones.
    middle: Option<((Rate, Rate), Milestones)>,
    note: String,
    /// The last relay drain's database and config (for the history rounds).
    relay_db: TestDb,
    config: courier::CourierConfig,
}

/// What the relay's start cost in the drain whose middle is reported: the raw publish is timed
/// with its connection open and the emulator warm, the relay from its spawn.
fn relay_start_note(relay: &Milestones) -> String {
    let seconds = |s: Option<f64>| s.map_or("?".into(), |s| format!("{s:.2} s"));
    format!(
        "the relay's start, in the drain whose middle 90 % is reported: its first row marked \
         published {} after it was spawned; the drain took {} longer than its events at the \
         middle's rate (its start and its tail)",
        seconds(relay.first_seconds()),
        seconds(relay.start_and_tail_seconds()),
    )
}

/// Which raw publish is the ceiling: the one whose median rate over the pairs is highest
/// (index into [`Pair::raw_phases`]). Not each pair's fastest: with three windows measured
/// per pair, the highest of three rates that swing ±5–10 % with the emulator's pace is above
/// what any one window sustains, and the relay, measured once per pair, would be held to that.
fn fastest_raw_phase(pairs: &[Pair]) -> usize {
    let phases = pairs.first().map_or(0, |p| p.raw_phases().count());
    let median_rates: Vec<f64> = (0..phases)
        .map(|i| {
            let rates = pairs
                .iter()
                .filter_map(|p| p.raw_phases().nth(i))
                .map(|p| p.whole.per_second)
                .collect();
            lower_median(rates, |r| *r).unwrap_or(0.0)
        })
        .collect();
    (0..phases)
        .max_by(|&a, &b| median_rates[a].total_cmp(&median_rates[b]))
        .unwrap_or(0)
}

/// Holds every pair to the same ceiling, [`fastest_raw_phase`].
fn hold_to_fastest_raw_phase(pairs: &mut [Pair]) {
    let ceiling = fastest_raw_phase(pairs);
    for pair in pairs {
        pair.ceiling = ceiling;
    }
}

/// The raw publishes' machine CPU over the relay drains', summed over all pairs: the by-CPU
/// ratio with every pair's events counted once, steadier than any one pair's (medians of 3–5
/// pairs swing ±0.05 with the emulator's pace: docs/benchmarks-history.md).
fn pooled_cpu_ratio(pairs: &[Pair]) -> f64 {
    let sum = |cpu: fn(&Pair) -> f64| pairs.iter().map(cpu).sum::<f64>();
    sum(|p| p.publish_cpu.machine) / sum(|p| p.relay_cpu.machine).max(f64::MIN_POSITIVE)
}

/// The item with the median `ratio`; of an even number, the lower of the middle two, so an
/// even `--pairs` never reports the more flattering one.
fn lower_median<T>(mut items: Vec<T>, ratio: impl Fn(&T) -> f64) -> Option<T> {
    if items.is_empty() {
        return None;
    }
    items.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    Some(items.swap_remove((items.len() - 1) / 2))
}

async fn metered_raw_publish(
    pubsub: &TestPubSub,
    topic: &str,
    events: &[NewEvent],
) -> anyhow::Result<(Phase, CpuUse)> {
    let meter = CpuMeter::start(&pubsub.host);
    let phase = raw_publish(pubsub, topic, events, RAW_PUBLISH_IN_FLIGHT).await?;
    Ok((phase, meter.stop()))
}

/// `--relay-only`: the relay drains the filled outbox while this process's resident memory
/// is sampled every 250 ms (and charted). The events are written as they are made, so what
/// the process holds beyond its pools is the relay's. Memory drift: the mean of the drain's
/// second half after warm-up (the first 20 %) against its first half, held to the soak's
/// limit.
async fn relay_memory(args: &DrainArgs) -> anyhow::Result<Report> {
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

/// The relay's drain of `events` from `empty` (no history) and from a second outbox holding
/// `--history` published rows, `--rounds` times each in ABBA order. Before each drain the
/// previous round's rows are deleted, the events filled in, the table vacuumed and analyzed
/// and a CHECKPOINT taken, so no drain pays for the setup's writes. Returns each drain's rate,
/// the two totals and their ratio (goal ≥ 0.9).
async fn history_rounds(
    args: &DrainArgs,
    config: &courier::CourierConfig,
    empty: &TestDb,
    events: &[NewEvent],
) -> anyhow::Result<(Vec<Rate>, Ratio)> {
    let history = TestDb::new().await?;
    insert_history(&history, &events[0].topic, args.history, args.shards).await?;
    let total = events.len() as u64;
    let mut rates = Vec::new();
    let mut seconds = [0.0f64; 2];
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_history in order {
            let db = if with_history { &history } else { empty };
            let mut config = config.clone();
            config.database = courier::config::DatabaseConfig {
                pool_size: config.database.pool_size,
                ..db.config.clone()
            };
            let conn = db.client().await?;
            conn.batch_execute(
                "DELETE FROM courier.outbox WHERE aggregate_id NOT LIKE 'history-%'",
            )
            .await
            .context("delete the previous round's rows")?;
            fill(db, &config, events, "rows for the relay").await?;
            conn.batch_execute("CHECKPOINT")
                .await
                .context("checkpoint")?;
            set_shards_idle(db, args.shards, true).await?;
            let rate = relay_drain(db, &config, total, args.timeout_secs).await?;
            seconds[usize::from(with_history)] += rate.seconds;
            let name = if with_history {
                format!(
                    "round {}: relay drain, {} published rows in the table",
                    round + 1,
                    args.history
                )
            } else {
                format!("round {}: relay drain, no history", round + 1)
            };
            rates.push(Rate::new(&name, total, rate.seconds));
        }
    }
    let drained = total * u64::from(args.rounds);
    let without = Rate::new("relay drain, no history (all rounds)", drained, seconds[0]);
    let with = Rate::new(
        &format!("relay drain, {} published rows (all rounds)", args.history),
        drained,
        seconds[1],
    );
    let ratio = Ratio::to_lowest(
        "relay with history / relay without",
        &with,
        &[&without],
        0.9,
    );
    rates.push(without);
    rates.push(with);
    Ok((rates, ratio))
}

/// `count` published rows in one statement (keys `history-…`, apart from the benchmark's),
/// published a day ago, ~200-byte payloads like the events; then VACUUM ANALYZE, as
/// autovacuum would have done to a table that grew this way.
async fn insert_history(db: &TestDb, topic: &str, count: u64, shards: u32) -> anyhow::Result<()> {
    const INSERT: &str = "
        INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                                    version, schema_version, payload, occurred_at, created_at,
                                    published_at, publish_attempts)
        SELECT gen_random_uuid(), (i % $3::int)::int, $1, 'video', 'history-' || (i / 100),
               'video.updated', i % 100 + 1, 1, convert_to(repeat('h', 200), 'UTF8'),
               now() - interval '1 day', now() - interval '1 day', now() - interval '1 day', 1
        FROM generate_series(0::bigint, $2::bigint - 1) i";
    let conn = db.client().await?;
    let started = Instant::now();
    eprintln!("inserting {count} published rows of history…");
    conn.execute(INSERT, &[&topic, &(count as i64), &(shards as i32)])
        .await
        .context("insert the published history")?;
    conn.batch_execute("VACUUM ANALYZE courier.outbox")
        .await
        .context("vacuum the history")?;
    eprintln!(
        "history in place after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One statement claiming a shard's first `$1` rows and marking them published: the relay's
/// index, no head-of-line check, no publishing. It names `outbox_ready`'s whole predicate, as
/// the claim does, and marks the rows at the addresses it locked them at: without
/// `next_retry_at IS NULL` no index keeps the shard's rows in seq order (0013 dropped the one
/// that did), and each statement read and sorted the shard's whole backlog, a ceiling 3-8x
/// below the relay's own two statements.
const CLAIM_AND_MARK: &str = "
    WITH claimed AS (
        SELECT ctid FROM courier.outbox
        WHERE shard = $2 AND published_at IS NULL AND dead_at IS NULL
          AND next_retry_at IS NULL
        ORDER BY seq
        LIMIT $1
        FOR UPDATE SKIP LOCKED)
    UPDATE courier.outbox o
    SET published_at = now(), publish_attempts = o.publish_attempts + 1
    FROM claimed WHERE o.ctid = claimed.ctid AND o.published_at IS NULL";

/// PostgreSQL's ceiling: `sessions` sessions, each owning every `sessions`-th shard, repeating
/// [`CLAIM_AND_MARK`] per shard until their shards are empty.
async fn raw_claim_and_mark(
    db: &TestDb,
    shards: u32,
    batch: u32,
    sessions: u32,
    total: u64,
) -> anyhow::Result<Rate> {
    let mut database = db.config.clone();
    database.pool_size = sessions.max(2);
    let pool = courier::db::pool(&database, "courier-load claim-and-mark")?;
    let step = move |shard: u32| {
        let pool = pool.clone();
        async move {
            let conn = pool.get().await.context("claim-and-mark connection")?;
            let statement = conn.prepared(CLAIM_AND_MARK).await?;
            let shard = i32::try_from(shard)?;
            Ok(conn
                .execute(&statement, &[&i64::from(batch), &shard])
                .await?)
        }
    };
    let what = "PostgreSQL raw claim-and-mark";
    drain_shards(shards, sessions, total, what, step).await
}

/// What the relay's own statements cost PostgreSQL without publishing: `sessions` sessions of
/// the relay's pool settings, each owning every `sessions`-th shard, claiming a batch with a
/// lock token (`OutboxStore::claim`, head-of-line check included) and marking it published
/// at once (`OutboxStore::mark_published`), until their shards are empty. No rows wait
/// between claim and mark, so this is the least the relay's database work can cost.
async fn raw_claim_then_mark(
    db: &TestDb,
    config: &courier::CourierConfig,
    sessions: u32,
    total: u64,
) -> anyhow::Result<Rate> {
    let mut database = db.config.clone();
    database.pool_size = sessions.max(2);
    let pool = courier::db::relay_pool(&database, "courier-load claim-then-mark")?;
    let published = PublishedRows::from_config(&config.retention);
    let store = Arc::new(OutboxStore::with_published_rows(
        pool,
        &database.schema,
        published,
    ));
    let (lease, batch) = (config.relay.claim_lease(), config.relay.claim_batch_size);
    let token = Uuid::new_v4();
    let step = move |shard: u32| {
        let store = store.clone();
        async move {
            let rows = store.claim(shard, token, lease, batch).await?;
            let addresses: Vec<_> = rows.iter().map(|r| r.address).collect();
            Ok(store.mark_published(&addresses, token).await?)
        }
    };
    let what = "PostgreSQL claim, then mark (the relay's statements)";
    drain_shards(config.relay.shard_count, sessions, total, what, step).await
}

/// Runs `sessions` workers at once, each owning every `sessions`-th shard and calling
/// `step(shard)` on its shards in turn until a call returns 0 rows (that shard is empty);
/// checks that `total` rows were done and returns the rate.
async fn drain_shards<F, Fut>(
    shards: u32,
    sessions: u32,
    total: u64,
    what: &str,
    step: F,
) -> anyhow::Result<Rate>
where
    F: Fn(u32) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<u64>> + Send,
{
    let bar = progress(total, what);
    let started = Instant::now();
    let mut workers = Vec::new();
    for session in 0..sessions {
        let (bar, step) = (bar.clone(), step.clone());
        let mut mine: Vec<u32> = (session..shards).step_by(sessions as usize).collect();
        workers.push(tokio::spawn(async move {
            let mut done = 0u64;
            while !mine.is_empty() {
                let mut still_busy = Vec::with_capacity(mine.len());
                for shard in mine {
                    let n = step(shard).await?;
                    if n > 0 {
                        still_busy.push(shard);
                    }
                    done += n;
                    bar.inc(n);
                }
                mine = still_busy;
            }
            anyhow::Ok(done)
        }));
    }
    let mut done = 0;
    for worker in workers {
        done += worker.await.context("shard worker panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    anyhow::ensure!(done == total, "{what}: {done} of {total} rows");
    Ok(Rate::new(what, done, seconds))
}

/// The emulator's ceiling: the same messages published straight through the official client.
async fn raw_publish(
    pubsub: &TestPubSub,
    topic: &str,
    events: &[NewEvent],
    in_flight: usize,
) -> anyhow::Result<Phase> {
    let publisher = pubsub.client().publisher(topic, CLIENT_BATCH_DELAY).await?;
    timed_publish(
        |m| publisher.publish(m),
        events,
        in_flight,
        "published (raw client)",
        "emulator raw publish (1 client, ordering keys)",
    )
    .await
}

/// `events`' messages handed to `publish` (see `publish_bounded_with`), timed as a phase named
/// `name` from the first message on.
async fn timed_publish(
    publish: impl FnMut(Message) -> google_cloud_pubsub::publisher::PublishFuture,
    events: &[NewEvent],
    in_flight: usize,
    what: &str,
    name: &str,
) -> anyhow::Result<Phase> {
    let total = events.len() as u64;
    let mut milestones = Milestones::start(total);
    let acknowledged = publish_bounded_with(
        publish,
        messages(events),
        total,
        in_flight,
        what,
        &mut milestones,
    )
    .await?;
    Ok(Phase {
        whole: Rate::new(name, acknowledged, milestones.elapsed_seconds()),
        milestones,
    })
}

/// Unacknowledged publishes of the narrowest raw window: four times the requests the crate's
/// channel sends at once (100), so it always has requests ready to send.
const NARROW_RAW_WINDOW: usize = 400;

/// The windows of unacknowledged publishes [`raw_publish_per_generation`] runs at:
/// [`RAW_PUBLISH_IN_FLIGHT`], what the relay's connection carries (see
/// `courier::relay::topic_clients`), where the relay's limit settles with a key per row, and
/// [`NARROW_RAW_WINDOW`]. With a key per row a raw publish is faster at the narrower windows,
/// so a ceiling measured at 10,000 alone flattered a relay holding 1,124
/// (docs/benchmarks-history.md).
fn per_generation_windows() -> Vec<usize> {
    let mut windows = vec![
        RAW_PUBLISH_IN_FLIGHT,
        REQUESTS_THE_CONNECTION_CARRIES,
        NARROW_RAW_WINDOW,
    ];
    windows.sort_unstable();
    windows.dedup();
    windows
}

/// The raw publish as a publisher whose memory is bounded must run it with this crate: through
/// the relay's own topic clients (`relay::topic_clients`), a new client on one connection every
/// [`KEYS_PER_CLIENT`] keys, each dropped once its last message is handed over, so the crate's
/// per-key state is built and torn down within the measurement, as in the relay. A single
/// client, as in [`raw_publish`], keeps every key's state to the end (~17 KB a key) and frees
/// it after. The relay is held to the faster of the two (see [`Pair::raw_ceiling`]).
async fn raw_publish_per_generation(
    pubsub: &TestPubSub,
    topic: &str,
    events: &[NewEvent],
    in_flight: usize,
) -> anyhow::Result<Phase> {
    let clients = TopicClients::new(pubsub.client(), Handle::current(), CLIENT_BATCH_DELAY);
    // Opens the connection before the clock starts; its client serves the first message.
    let mut first = Some(clients.for_new_key(topic).await?);
    let publish = |message| {
        // Every message is a key of its own, taken as a new key publisher takes its client.
        let client = first
            .take()
            .or_else(|| clients.for_new_key_now(topic))
            .expect("the connection exists once the first client was made");
        client.publisher.publish(message)
    };
    timed_publish(
        publish,
        events,
        in_flight,
        &format!("published (raw, a client per {KEYS_PER_CLIENT} keys, {in_flight} in flight)"),
        &format!(
            "emulator raw publish, a new client every {KEYS_PER_CLIENT} keys, {in_flight} in flight"
        ),
    )
    .await
}

/// The messages the relay would publish for `events`: same data, ordering keys and attributes.
fn messages(events: &[NewEvent]) -> impl Iterator<Item = Message> + '_ {
    events.iter().map(|e| {
        Message::new()
            .set_data(e.payload.clone())
            .set_ordering_key(e.aggregate_id.clone())
            .set_attributes(e.attributes())
    })
}

/// The relay's rate: start it on the filled outbox and wait until every row is published.
pub(crate) async fn relay_drain(
    db: &TestDb,
    config: &courier::CourierConfig,
    total: u64,
    timeout_secs: u64,
) -> anyhow::Result<Rate> {
    Ok(relay_drain_phase(db, config, total, timeout_secs)
        .await?
        .whole)
}

/// [`relay_drain`], with when its count crossed the bounds of the middle 90 %.
/// Progress comes from the relay's own count of marked rows: counting the outbox as it drains
/// cost PostgreSQL a third of a core, which the relay then lacked. The database is asked once
/// at the end, so the count cannot flatter the relay. The count is read every 20 ms (an
/// atomic load), so the end and the middle's bounds are known to within a poll.
async fn relay_drain_phase(
    db: &TestDb,
    config: &courier::CourierConfig,
    total: u64,
    timeout_secs: u64,
) -> anyhow::Result<Phase> {
    let conn = db.client().await?;
    let started = Instant::now();
    let mut milestones = Milestones::started_at(started, total);
    let relay = Relay::spawn(config, RelayOptions::default())?;
    let relay_ref = &relay;
    let milestones_ref = &mut milestones;
    let seconds = poll_until_done(
        started,
        total,
        "published by the relay",
        Duration::from_secs(timeout_secs),
        Duration::from_millis(20),
        || {
            let published = relay_ref.published();
            milestones_ref.observe(published);
            async move { Ok(published) }
        },
    )
    .await;
    relay.shutdown(Duration::from_secs(5)).await;
    let seconds = seconds?;
    let row = conn
        .query_one(
            "SELECT count(*) FILTER (WHERE dead_at IS NULL),
                    count(*) FILTER (WHERE dead_at IS NOT NULL)
             FROM courier.outbox WHERE published_at IS NULL",
            &[],
        )
        .await
        .context("count what the relay left")?;
    let (pending, dead): (i64, i64) = (row.get(0), row.get(1));
    anyhow::ensure!(
        pending == 0 && dead == 0,
        "the relay reported {total} rows published but {pending} are pending and {dead} dead; see its log"
    );
    Ok(Phase {
        whole: Rate::new("relay drain (outbox → emulator)", total, seconds),
        milestones,
    })
}

#[cfg(test)]
mod tests {
    use super::{
        fastest_raw_phase, hold_to_fastest_raw_phase, lower_median, pooled_cpu_ratio, Pair, Phase,
        CLAIM_AND_MARK,
    };
    use crate::harness::cpu::CpuUse;
    use crate::harness::middle::Milestones;
    use crate::report::measures::Rate;
    use courier_testkit::{generic_plan, TestDb};

    /// The ceiling reads a shard's rows in seq order from an index, whatever the backlog:
    /// no sort of the shard's rows, no scan of another index (which it once did, unnoticed).
    #[tokio::test]
    async fn the_raw_claim_and_mark_walks_outbox_ready_in_seq_order() -> anyhow::Result<()> {
        let db = TestDb::new().await?;
        let client = db.client().await?;
        client
            .batch_execute(
                "INSERT INTO courier.outbox (id, shard, topic, aggregate_type, aggregate_id,
                                             event_type, version, schema_version, payload,
                                             occurred_at)
                 SELECT gen_random_uuid(), i % 8, 't', 'video', 'k' || i, 'e', 1, 1, '\\x00',
                        now()
                 FROM generate_series(1, 20000) i;
                 ANALYZE courier.outbox",
            )
            .await?;
        let plan = generic_plan(&client, CLAIM_AND_MARK, "bigint, integer", "200, 3").await?;
        assert!(
            plan.contains("Index Scan using outbox_ready") && !plan.contains("Sort"),
            "the raw claim-and-mark does not walk outbox_ready in seq order:\n{plan}"
        );
        Ok(())
    }

    #[test]
    fn the_pooled_cpu_ratio_weighs_every_pair_by_its_cpu() {
        let pair = |publish: f64, relay: f64| {
            let cpu = |machine| CpuUse {
                seconds: 1.0,
                machine,
                own: 0.0,
                emulator: 0.0,
            };
            let phase = Phase {
                whole: Rate::new("r", 1, 1.0),
                milestones: Milestones::start(1),
            };
            Pair {
                raw_publish: phase.clone(),
                publish_cpu: cpu(publish),
                per_generation: Vec::new(),
                relay: phase,
                relay_cpu: cpu(relay),
                ceiling: 0,
            }
        };
        // 0.9 and 0.5 per pair; pooled (9 + 10) / (10 + 20), not their mean 0.7.
        let pairs = [pair(9.0, 10.0), pair(10.0, 20.0)];
        assert!((pooled_cpu_ratio(&pairs) - 19.0 / 30.0).abs() < 1e-9);
        assert_eq!(pooled_cpu_ratio(&[]), 0.0);
    }

    #[test]
    fn the_relay_is_held_to_the_raw_publish_fastest_over_all_pairs() {
        let phase = |name: &str, per_second: f64| Phase {
            whole: Rate::new(name, per_second as u64, 1.0),
            milestones: Milestones::start(1),
        };
        let cpu = CpuUse {
            seconds: 1.0,
            machine: 1.0,
            own: 0.0,
            emulator: 0.0,
        };
        let pair = |narrow: f64, wide: f64| Pair {
            raw_publish: phase("one client", 12_000.0),
            publish_cpu: cpu,
            per_generation: vec![phase("400", narrow), phase("1124", wide)],
            relay: phase("relay", 12_800.0),
            relay_cpu: cpu,
            ceiling: 0,
        };
        // 400 is fastest in one pair only (by noise); 1,124 has the higher median.
        let mut pairs = vec![
            pair(17_000.0, 16_000.0),
            pair(15_000.0, 16_000.0),
            pair(14_000.0, 15_000.0),
        ];
        hold_to_fastest_raw_phase(&mut pairs);
        assert_eq!(
            pairs[0].raw_ceiling().name,
            "1124",
            "not pair 1's fastest, 400"
        );
        assert!((pairs[0].ratio() - 0.8).abs() < 1e-9);
        assert!((pairs[0].ratio_to_pair_fastest() - 12_800.0 / 17_000.0).abs() < 1e-9);
        // A raw publish that is fastest in every pair is the ceiling whatever its name.
        let single = vec![pair(18_000.0, 16_000.0), pair(17_500.0, 16_000.0)];
        assert_eq!(fastest_raw_phase(&single), 1);
        assert_eq!(fastest_raw_phase(&[]), 0);
    }

    #[test]
    fn an_even_number_of_pairs_reports_the_lower_middle_one() {
        let ratio = |r: &f64| *r;
        assert_eq!(lower_median(vec![0.89, 0.75], ratio), Some(0.75));
        assert_eq!(lower_median(vec![0.9, 0.7, 0.8, 0.6], ratio), Some(0.7));
        assert_eq!(lower_median(vec![0.9, 0.7, 0.8], ratio), Some(0.8));
        assert_eq!(lower_median(vec![0.7], ratio), Some(0.7));
        assert_eq!(lower_median(Vec::<f64>::new(), ratio), None);
    }
}
