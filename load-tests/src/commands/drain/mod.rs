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

mod ceilings;
mod history;
mod memory;
mod pairs;

use crate::harness::cpu::{cores, shared_machine_bound, CpuMeter, CpuUse};
use crate::harness::fixtures::{events, fill, warm_up_emulator, warm_up_note, WARM_UP_MAX_ROUNDS};
use crate::report::measures::{Rate, Ratio};
use crate::report::Report;
use ceilings::{messages, raw_claim_and_mark, raw_claim_then_mark, CLAIM_SESSIONS};
use courier_testkit::{test_config, TestDb, TestPubSub};
use history::history_rounds;
use memory::relay_memory;
use pairs::{ceiling_pairs, relay_drain_phase, relay_start_note, Measured, Pair};

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

#[cfg(test)]
mod tests {
    use super::ceilings::{Phase, CLAIM_AND_MARK};
    use super::pairs::{
        fastest_raw_phase, hold_to_fastest_raw_phase, lower_median, pooled_cpu_ratio, Pair,
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
