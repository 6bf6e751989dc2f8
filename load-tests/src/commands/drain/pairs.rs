//! Raw publishes and relay drains in alternating pairs, the ceiling each pair is held to, and
//! the pair reported.

use super::ceilings::{
    per_generation_windows, raw_publish, raw_publish_per_generation, Phase, RAW_PUBLISH_IN_FLIGHT,
};
use super::{relay_config, DrainArgs};
use crate::harness::cpu::{CpuMeter, CpuUse};
use crate::harness::fixtures::{fill, poll_until_done, set_shards_idle};
use crate::harness::middle::Milestones;
use crate::report::measures::Rate;
use anyhow::Context as _;
use courier::outbox::NewEvent;
use courier::relay::{Relay, RelayOptions};
use courier_testkit::{TestDb, TestPubSub};
use std::time::{Duration, Instant};

/// A raw publish and a relay drain measured next to each other, with what each cost.
pub(super) struct Pair {
    pub(super) raw_publish: Phase,
    pub(super) publish_cpu: CpuUse,
    /// With a key per row: the raw publish through a new client every
    /// `KEYS_PER_CLIENT` keys (see [`raw_publish_per_generation`]), at each of
    /// [`per_generation_windows`]; the relay is held to the fastest raw publish.
    pub(super) per_generation: Vec<Phase>,
    pub(super) relay: Phase,
    pub(super) relay_cpu: CpuUse,
    /// Which of [`Pair::raw_phases`] is the ceiling: the one fastest over all pairs (see
    /// [`fastest_raw_phase`]), the same in every pair.
    pub(super) ceiling: usize,
}

impl Pair {
    pub(super) fn raw_phases(&self) -> impl Iterator<Item = &Phase> {
        std::iter::once(&self.raw_publish).chain(&self.per_generation)
    }

    /// The fastest raw publish: the ceiling the relay is held to.
    pub(super) fn raw_ceiling(&self) -> &Rate {
        self.raw_phases()
            .nth(self.ceiling)
            .map_or(&self.raw_publish.whole, |p| &p.whole)
    }

    pub(super) fn ratio(&self) -> f64 {
        self.relay.whole.per_second / self.raw_ceiling().per_second.max(f64::MIN_POSITIVE)
    }

    /// The relay against the fastest raw publish of this pair alone: the max of several noisy
    /// rates, so higher than any one of them would be on average (shown, not judged).
    pub(super) fn ratio_to_pair_fastest(&self) -> f64 {
        let fastest = self
            .raw_phases()
            .map(|p| p.whole.per_second)
            .fold(0.0, f64::max);
        self.relay.whole.per_second / fastest.max(f64::MIN_POSITIVE)
    }

    /// The ceiling's middle 90 % against the relay's: what each sustains, without the relay's
    /// start, which the raw publish (connection open, emulator warm) does not pay.
    pub(super) fn middle_rates(&self) -> Option<(Rate, Rate)> {
        let raw = self.raw_phases().nth(self.ceiling)?.middle()?;
        Some((raw, self.relay.middle()?))
    }

    pub(super) fn middle_ratio(&self) -> f64 {
        self.middle_rates().map_or(0.0, |(raw, relay)| {
            relay.per_second / raw.per_second.max(f64::MIN_POSITIVE)
        })
    }

    /// The one-client raw publish's machine CPU per event over the relay drain's: both carry
    /// the same events, so their machine CPU totals compare as they are.
    pub(super) fn cpu_ratio(&self) -> f64 {
        self.publish_cpu.machine / self.relay_cpu.machine.max(f64::MIN_POSITIVE)
    }
}

/// `--pairs` raw publishes and relay drains in alternating order.
pub(super) async fn ceiling_pairs(
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
pub(super) struct Measured {
    /// The pair with the median ratio of whole rates.
    pub(super) median: Pair,
    /// The raw publish's and the relay's middle 90 % in the pair with the median ratio of
    /// those, and that relay drain's milestones.
    pub(super) middle: Option<((Rate, Rate), Milestones)>,
    pub(super) note: String,
    /// The last relay drain's database and config (for the history rounds).
    pub(super) relay_db: TestDb,
    pub(super) config: courier::CourierConfig,
}

/// What the relay's start cost in the drain whose middle is reported: the raw publish is timed
/// with its connection open and the emulator warm, the relay from its spawn.
pub(super) fn relay_start_note(relay: &Milestones) -> String {
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
pub(super) fn fastest_raw_phase(pairs: &[Pair]) -> usize {
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
pub(super) fn hold_to_fastest_raw_phase(pairs: &mut [Pair]) {
    let ceiling = fastest_raw_phase(pairs);
    for pair in pairs {
        pair.ceiling = ceiling;
    }
}

/// The raw publishes' machine CPU over the relay drains', summed over all pairs: the by-CPU
/// ratio with every pair's events counted once, steadier than any one pair's (medians of 3–5
/// pairs swing ±0.05 with the emulator's pace: docs/benchmarks-history.md).
pub(super) fn pooled_cpu_ratio(pairs: &[Pair]) -> f64 {
    let sum = |cpu: fn(&Pair) -> f64| pairs.iter().map(cpu).sum::<f64>();
    sum(|p| p.publish_cpu.machine) / sum(|p| p.relay_cpu.machine).max(f64::MIN_POSITIVE)
}

/// The item with the median `ratio`; of an even number, the lower of the middle two, so an
/// even `--pairs` never reports the more flattering one.
pub(super) fn lower_median<T>(mut items: Vec<T>, ratio: impl Fn(&T) -> f64) -> Option<T> {
    if items.is_empty() {
        return None;
    }
    items.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    Some(items.swap_remove((items.len() - 1) / 2))
}

pub(super) async fn metered_raw_publish(
    pubsub: &TestPubSub,
    topic: &str,
    events: &[NewEvent],
) -> anyhow::Result<(Phase, CpuUse)> {
    let meter = CpuMeter::start(&pubsub.host);
    let phase = raw_publish(pubsub, topic, events, RAW_PUBLISH_IN_FLIGHT).await?;
    Ok((phase, meter.stop()))
}

/// [`relay_drain`], with when its count crossed the bounds of the middle 90 %.
/// Progress comes from the relay's own count of marked rows: counting the outbox as it drains
/// cost PostgreSQL a third of a core, which the relay then lacked. The database is asked once
/// at the end, so the count cannot flatter the relay. The count is read every 20 ms (an
/// atomic load), so the end and the middle's bounds are known to within a poll.
pub(super) async fn relay_drain_phase(
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
