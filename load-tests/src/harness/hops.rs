//! Where each event's time goes, hop by hop, read after a run from the timestamps the databases
//! and the messages carry (not from counters), so a regression names its hop:
//!
//! - due → committed: the writer (`load.writes.committed_at` against the time the write was due);
//! - committed → claimed: the outbox row waiting for its shard's claimer (`outbox.locked_at`);
//! - claimed → at the broker: the relay's publish (the message's `publish_time`, stamped by the
//!   broker when it accepts the publish);
//! - at the broker → received: the broker's delivery (`EventMeta::received_at`, when the
//!   consumer's receiver parsed the message);
//! - received → applied: routing, the committer's gathering and the projection's transaction
//!   (`load.applied.applied_at`);
//! - beside the path, at the broker → acknowledged (`outbox.published_at`: the instant the relay
//!   had the broker's acknowledgement, which the mark records), which a key's next row waits for
//!   (with the mark) before it may be claimed.
//!
//! A relay-only run has no consumer: its hops are the first two and claimed → acknowledged.
//! Every event's hops (microseconds) go to `hops.csv` beside the report (up to 200,000 events).

use crate::harness::checker::Scope;
use crate::harness::rig::Rig;
use crate::report::chart::Panel;
use crate::report::measures::{new_histogram, Latency};
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;

/// Runs of more events (a soak's half million) write no `hops.csv`: ~80 bytes an event.
const CSV_MAX_EVENTS: usize = 200_000;

/// Width of the chart's time buckets, seconds of due times.
const BUCKET_SECS: f64 = 5.0;

/// The hops of an end-to-end event, in the order of its path (then the one beside it).
const END_TO_END: [&str; 6] = [
    "due → committed (writer)",
    "committed → claimed (outbox.locked_at)",
    "claimed → at the broker (publish_time)",
    "at the broker → received (consumer)",
    "received → applied (projection transaction)",
    "at the broker → acknowledged (outbox.published_at)",
];

/// Microseconds of each end-to-end hop, and the due time's offset from the run's origin.
const END_TO_END_SQL: &str = "
    SELECT a.aggregate_id, a.version, extract(epoch FROM a.intended_at - $2)::float8,
           (extract(epoch FROM w.committed_at - a.intended_at) * 1e6)::int8,
           (extract(epoch FROM o.locked_at - w.committed_at) * 1e6)::int8,
           (extract(epoch FROM a.publish_time - o.locked_at) * 1e6)::int8,
           (extract(epoch FROM a.received_at - a.publish_time) * 1e6)::int8,
           (extract(epoch FROM a.applied_at - a.received_at) * 1e6)::int8,
           (extract(epoch FROM o.published_at - a.publish_time) * 1e6)::int8
    FROM load.applied a
    JOIN load.writes w ON w.aggregate_id = a.aggregate_id AND w.version = a.version
    JOIN courier.outbox o ON o.aggregate_id = a.aggregate_id AND o.version = a.version
    WHERE a.intended_at >= $1 AND o.locked_at IS NOT NULL AND a.received_at IS NOT NULL";

const RELAY_ONLY: [&str; 3] = [
    "due → committed (writer)",
    "committed → claimed (outbox.locked_at)",
    "claimed → acknowledged (publish + ack)",
];

const RELAY_ONLY_SQL: &str = "
    SELECT w.aggregate_id, w.version, extract(epoch FROM w.intended_at - $2)::float8,
           (extract(epoch FROM w.committed_at - w.intended_at) * 1e6)::int8,
           (extract(epoch FROM o.locked_at - w.committed_at) * 1e6)::int8,
           (extract(epoch FROM o.published_at - o.locked_at) * 1e6)::int8
    FROM load.writes w
    JOIN courier.outbox o ON o.aggregate_id = w.aggregate_id AND o.version = w.version
    WHERE w.intended_at >= $1 AND o.locked_at IS NOT NULL AND o.published_at IS NOT NULL";

/// Each hop's distribution over the run, and its p99 over time.
pub struct Hops {
    pub hops: Vec<Latency>,
    pub panel: Panel,
}

/// The hops of the events due at `from` or later; `origin` is the run's start, the chart's 0.
pub async fn read(rig: &Rig, from: DateTime<Utc>, origin: DateTime<Utc>) -> anyhow::Result<Hops> {
    let (names, sql): (&[&str], &str) = match rig.scope {
        Scope::EndToEnd => (&END_TO_END, END_TO_END_SQL),
        Scope::RelayOnly => (&RELAY_ONLY, RELAY_ONLY_SQL),
    };
    let rows = rig
        .client()
        .await?
        .query(sql, &[&from, &origin])
        .await
        .context("read each event's hops")?;
    // A hop is NULL where its end was not reached when the run ended: an event applied whose
    // row the relay had not marked published yet (a run stopped at its drain timeout).
    let events = rows
        .iter()
        .map(|r| {
            let hops = (3..3 + names.len())
                .map(|i| r.try_get::<_, Option<i64>>(i))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((r.try_get::<_, f64>(2)?, hops))
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .context("read each event's hops")?;
    // Every event's hops, for a look at what the slow ones have in common.
    if events.len() <= CSV_MAX_EVENTS {
        let mut csv = format!("aggregate_id,version,due_s,{}\n", names.join(","));
        for (row, (t, hops)) in rows.iter().zip(&events) {
            let hops: Vec<String> = hops
                .iter()
                .map(|hop| hop.map(|us| us.to_string()).unwrap_or_default())
                .collect();
            let (key, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
            csv += &format!("{key},{version},{t:.6},{}\n", hops.join(","));
        }
        let path = rig.config_path.with_file_name("hops.csv");
        std::fs::write(&path, csv).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(summarize(names, &events))
}

/// The distributions and the chart's panel of `events`: (due time in seconds from the origin,
/// microseconds of each hop, `None` where not reached). A hop that came out negative (clocks of
/// two processes a little apart) counts as 0.
fn summarize(names: &[&str], events: &[(f64, Vec<Option<i64>>)]) -> Hops {
    let micros = |us: i64| u64::try_from(us).unwrap_or(0);
    let mut hops = Vec::with_capacity(names.len());
    let mut panel = Panel::new("p99 of each hop (events due in each 5 s)", "ms");
    for (hop, name) in names.iter().enumerate() {
        let mut whole = new_histogram();
        let mut buckets: std::collections::BTreeMap<i64, Histogram<u64>> = Default::default();
        for (t, values) in events {
            let Some(value) = values[hop].map(micros) else {
                continue;
            };
            whole.saturating_record(value);
            buckets
                .entry((t / BUCKET_SECS).floor() as i64)
                .or_insert_with(new_histogram)
                .saturating_record(value);
        }
        hops.push(Latency::from_histogram(name, &whole));
        let points = buckets
            .into_iter()
            .map(|(bucket, h)| {
                let t = (bucket as f64 + 1.0) * BUCKET_SECS;
                (t, h.value_at_quantile(0.99) as f64 / 1_000.0)
            })
            .collect();
        panel = panel.with(name, points);
    }
    Hops { hops, panel }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hop_has_its_own_distribution_and_series() {
        let events: Vec<(f64, Vec<Option<i64>>)> = (0..100)
            .map(|i| {
                (
                    i as f64 / 10.0,
                    vec![Some(1_000), Some(i * 1_000), Some(-5)],
                )
            })
            .collect();
        let hops = summarize(&RELAY_ONLY, &events);
        assert_eq!(hops.hops.len(), 3);
        assert_eq!(hops.hops[0].p50_ms, 1.0);
        assert!(
            (hops.hops[1].max_ms - 99.0).abs() < 0.1,
            "{:?}",
            hops.hops[1]
        );
        assert_eq!(hops.hops[2].max_ms, 0.0, "a negative hop counts as 0");
        // Due times 0–9.9 s: two 5-second buckets per hop.
        assert_eq!(hops.panel.series.len(), 3);
        assert_eq!(hops.panel.series[1].points.len(), 2);
        assert!(hops.panel.series[1].points[1].1 > hops.panel.series[1].points[0].1);
    }

    #[test]
    fn a_hop_not_reached_is_left_out_of_its_distribution_only() {
        let events: Vec<(f64, Vec<Option<i64>>)> = (0..10)
            .map(|i| {
                let marked = (i % 2 == 0).then_some(50_000);
                (i as f64, vec![Some(1_000), Some(2_000), marked])
            })
            .collect();
        let hops = summarize(&RELAY_ONLY, &events);
        assert_eq!(hops.hops[0].count, 10);
        assert_eq!(hops.hops[2].count, 5);
        assert!(
            (hops.hops[2].p50_ms - 50.0).abs() < 0.1,
            "no unmarked event counts as 0: {:?}",
            hops.hops[2]
        );
    }
}
