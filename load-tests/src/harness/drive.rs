//! Driving a run: the writers (closed loop at full speed, or open loop at a fixed rate), the
//! sampler recording throughput, backlog, latency and process memory over time, and the
//! wait for the pipeline to drain.

use crate::harness::checker::Scope;
use crate::harness::processes::{read_all_named, read_process, ticks_per_second, ProcessReading};
use crate::harness::rig::Rig;
use crate::harness::workload::{KeyPicker, Shape, Writer};
use crate::report::chart::Panel;
use crate::report::measures::{new_histogram, Latency};
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use courier::db::PgPool;
use courier::operations::OutboxStore;
use courier::operations::{Backlog, BacklogGauge};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The run's clock: an instant and the wall time it stands for, so instants can be written
/// to the database and compared with PostgreSQL's `clock_timestamp()`.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    pub instant: Instant,
    pub wall: DateTime<Utc>,
}

impl Origin {
    pub fn now() -> Self {
        Self {
            instant: Instant::now(),
            wall: Utc::now(),
        }
    }

    pub fn wall_at(&self, instant: Instant) -> DateTime<Utc> {
        let offset = instant.saturating_duration_since(self.instant);
        self.wall + chrono::Duration::from_std(offset).unwrap_or_default()
    }

    /// The wall-clock time `seconds` after the origin.
    pub fn wall_after(&self, seconds: f64) -> DateTime<Utc> {
        self.wall + chrono::Duration::milliseconds((seconds * 1_000.0) as i64)
    }

    pub fn seconds(&self) -> f64 {
        self.instant.elapsed().as_secs_f64()
    }
}

/// How the writers pace themselves.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// Each writer commits as fast as it can.
    ClosedLoop,
    /// Writes are scheduled at this many per second whatever the pipeline does; latency is
    /// measured from the scheduled instant (no coordinated omission).
    OpenLoop { per_second: f64 },
}

/// What the writers did.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteOutcome {
    pub committed: u64,
    /// Writes that failed (PostgreSQL restarting) and were retried.
    pub failed_attempts: u64,
    pub seconds: f64,
}

/// The writes of a run.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Concurrent writers, each on its own pooled connection.
    pub writers: u32,
    /// Which aggregates the writes go to and what their events carry.
    pub shape: Shape,
    pub pace: Pace,
    pub duration: Duration,
}

/// Runs `load` against the database of `config` and `topic` (a rig's).
pub async fn write_for(
    config: &courier::CourierConfig,
    topic: &str,
    origin: Origin,
    load: Load,
) -> anyhow::Result<WriteOutcome> {
    let Load {
        writers,
        shape,
        pace,
        duration,
    } = load;
    let committed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + duration;
    let failed = Arc::new(AtomicU64::new(0));
    // Open loop: a scheduler hands out due instants; a writer that falls behind takes them
    // late, and the latency it records starts at the due instant.
    let (due_tx, due_rx) = async_channel(writers as usize * 4);
    let scheduler = match pace {
        Pace::ClosedLoop => None,
        Pace::OpenLoop { per_second } => Some(tokio::spawn(async move {
            let interval = Duration::from_secs_f64(1.0 / per_second.max(0.001));
            let mut due = started;
            while due < until {
                tokio::time::sleep_until(due.into()).await;
                if due_tx.send(due).await.is_err() {
                    break;
                }
                due += interval;
            }
        })),
    };
    // One pool with a connection per writer, as a service's handlers share theirs: each
    // writer's statements are prepared once on its connection, not parsed for every write.
    let mut database = config.database.clone();
    database.pool_size = writers.max(2);
    let pool = courier::db::pool(&database, "courier-load writer")?;
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let writer = Writer::new(config, topic, shape);
        let mut keys = KeyPicker::new(shape);
        let pool = pool.clone();
        let due_rx = due_rx.clone();
        let committed = committed.clone();
        let failed = failed.clone();
        let open = matches!(pace, Pace::OpenLoop { .. });
        tasks.push(tokio::spawn(async move {
            let mut conn = None;
            loop {
                let intended = if open {
                    match due_rx.recv().await {
                        Ok(due) => due,
                        Err(_) => break,
                    }
                } else {
                    let now = Instant::now();
                    if now >= until {
                        break;
                    }
                    now
                };
                let key = keys.next(&mut rand::thread_rng());
                // A write that fails (the database restarting) is retried on another
                // connection, keeping its intended instant.
                loop {
                    if conn.is_none() {
                        conn = pool.get_owned().await.ok();
                    }
                    let Some(c) = conn.as_mut() else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    match writer.write(c, &key, origin.wall_at(intended)).await {
                        Ok(_) => {
                            committed.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            conn = None;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        }));
    }
    drop(due_rx);
    if let Some(scheduler) = scheduler {
        scheduler.await.context("the scheduler panicked")?;
    }
    for task in tasks {
        task.await.context("a writer panicked")?;
    }
    Ok(WriteOutcome {
        committed: committed.load(Ordering::Relaxed),
        failed_attempts: failed.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A bounded multi-consumer channel of due instants (tokio's mpsc has one consumer).
fn async_channel(capacity: usize) -> (tokio::sync::mpsc::Sender<Instant>, SharedReceiver) {
    let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
    (tx, SharedReceiver(Arc::new(tokio::sync::Mutex::new(rx))))
}

#[derive(Clone)]
struct SharedReceiver(Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Instant>>>);

impl SharedReceiver {
    async fn recv(&self) -> Result<Instant, ()> {
        self.0.lock().await.recv().await.ok_or(())
    }
}

/// One reading of the pipeline.
#[derive(Debug, Clone)]
pub struct Sample {
    pub t: f64,
    pub written: i64,
    /// Unpublished, not dead rows, as `courier outbox stats` counts them: from the per-shard
    /// floors the relays record with their heartbeats, so the count walks no dead index entry
    /// a pinned horizon keeps (`count(*)` of the unpublished rows took 284 ms and 11,000 pages
    /// a sample 13 minutes into a pin at 600 writes/s), and the sampler runs no floor look of
    /// its own (its looks, the framework's statement, were most of that statement's calls in
    /// a run, and counted as the framework's). Counted every [`OUTBOX_COUNT_EVERY`] samples
    /// end to end.
    pub outbox_pending: Option<i64>,
    pub applied: i64,
    /// p99 commit → projection of the effects recorded since the previous sample.
    pub window_p99_ms: Option<f64>,
    /// The outbox's dead tuples (`pg_stat_user_tables`: backends report their counts about
    /// once a second, so this lags by as much).
    pub outbox_dead_tuples: Option<i64>,
    /// The age of the oldest snapshot held in the run's database, seconds (the sampler's own
    /// apart); `None` when no session holds one.
    pub oldest_snapshot_secs: Option<f64>,
    pub processes: Vec<(String, ProcessReading)>,
}

#[cfg(test)]
impl Sample {
    /// A sample of `written` committed and `applied` effects at `t`, nothing else read.
    pub fn for_test(t: f64, written: i64, applied: i64) -> Self {
        Self {
            t,
            written,
            outbox_pending: Some(0),
            applied,
            window_p99_ms: None,
            outbox_dead_tuples: None,
            oldest_snapshot_secs: None,
            processes: Vec::new(),
        }
    }
}

/// One `write_and_drain`'s writes: when they ran, seconds from the origin, and how many
/// committed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WritePhase {
    pub from: f64,
    pub to: f64,
    pub committed: u64,
}

impl WritePhase {
    /// Committed writes per second.
    pub fn rate(&self) -> f64 {
        if self.to > self.from {
            self.committed as f64 / (self.to - self.from)
        } else {
            0.0
        }
    }
}

/// Processes whose memory and CPU are sampled: `(label, pid)`, kept current by the driver.
pub type Watched = Arc<Mutex<Vec<(String, u32)>>>;

/// End to end, the sampler counts the unpublished outbox rows only every this many samples:
/// the count visits every such row from the shards' floors (a large backlog is tens of
/// milliseconds of PostgreSQL), work the pipeline under measurement would otherwise share its
/// database with. Relay only, the count is what the run measures: every sample.
const OUTBOX_COUNT_EVERY: usize = 4;

/// Samples the pipeline every `every` until finished.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub fn start(
        pool: PgPool,
        origin: Origin,
        every: Duration,
        watched: Watched,
        scope: Scope,
        shards: u32,
    ) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut last_seq = 0i64;
            let outbox = OutboxStore::new(pool.clone(), "courier");
            for n in 0.. {
                let count_outbox = scope == Scope::RelayOnly || n % OUTBOX_COUNT_EVERY == 0;
                let gauge = count_outbox.then_some((&outbox, shards));
                let reading = sample(&pool, origin, &mut last_seq, &watched, scope, gauge);
                if let Ok(sample) = reading.await {
                    samples.push(sample);
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stopped.changed() => break,
                }
            }
            samples
        });
        Self { stop, task }
    }

    pub async fn finish(self) -> anyhow::Result<Vec<Sample>> {
        let _ = self.stop.send(true);
        self.task.await.context("the sampler panicked")
    }
}

async fn sample(
    pool: &PgPool,
    origin: Origin,
    last_seq: &mut i64,
    watched: &Watched,
    scope: Scope,
    backlog: Option<(&OutboxStore, u32)>,
) -> anyhow::Result<Sample> {
    let conn = pool.get().await.context("sampler connection")?;
    // max(seq) instead of count(*): constant time however long the run; a rolled-back write
    // leaves a gap, which only matters during a fault. The dead tuples and the oldest snapshot
    // are a statistics lookup and a scan of the backends' slots: next to nothing.
    let row = conn
        .query_one(
            "SELECT (SELECT coalesce(max(seq), 0) FROM load.writes),
                    (SELECT coalesce(max(seq), 0) FROM load.applied),
                    (SELECT n_dead_tup FROM pg_stat_user_tables
                     WHERE relid = 'courier.outbox'::regclass),
                    (SELECT extract(epoch FROM max(now() - xact_start))::float8
                     FROM pg_stat_activity
                     WHERE datname = current_database() AND backend_xmin IS NOT NULL
                       AND pid <> pg_backend_pid())",
            &[],
        )
        .await?;
    let outbox_pending = match backlog {
        Some((outbox, shards)) => BacklogGauge::read_once(outbox, shards, Duration::ZERO)
            .await
            .ok()
            .map(|parts| Backlog::of(&parts).pending),
        None => None,
    };
    let window = conn
        .query(
            "SELECT seq, (extract(epoch FROM applied_at - intended_at) * 1000000)::bigint
             FROM load.applied WHERE seq > $1 ORDER BY seq LIMIT 100000",
            &[&*last_seq],
        )
        .await?;
    let mut histogram = new_histogram();
    for r in &window {
        *last_seq = r.get(0);
        histogram.saturating_record(u64::try_from(r.get::<_, i64>(1)).unwrap_or(0));
    }
    let mut processes: Vec<(String, ProcessReading)> = watched
        .lock()
        .map(|list| list.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(label, pid)| Some((label, read_process(pid)?)))
        .collect();
    processes.push(("postgres (all)".into(), read_all_named("postgres")));
    let written: i64 = row.get(0);
    Ok(Sample {
        t: origin.seconds(),
        written,
        outbox_pending,
        // Relay only: what left the outbox.
        applied: match scope {
            Scope::EndToEnd => row.get(1),
            Scope::RelayOnly => (written - outbox_pending.unwrap_or(written)).max(0),
        },
        window_p99_ms: (!histogram.is_empty())
            .then(|| histogram.value_at_quantile(0.99) as f64 / 1_000.0),
        outbox_dead_tuples: row.get(2),
        oldest_snapshot_secs: row.get(3),
        processes,
    })
}

/// The committed writes, counted from the database (the source of truth).
pub async fn committed_writes(rig: &Rig) -> anyhow::Result<u64> {
    let n: i64 = rig
        .client()
        .await?
        .query_one("SELECT count(*) FROM load.writes", &[])
        .await
        .context("count the committed writes")?
        .get(0);
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Due → projection latency of every effect of a write meant to start in `from..to` (due →
/// publish acknowledged in a relay-only run).
pub async fn latency(
    rig: &Rig,
    name: &str,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> anyhow::Result<Latency> {
    let sql = match rig.scope {
        Scope::EndToEnd => {
            "SELECT (extract(epoch FROM applied_at - intended_at) * 1000000)::bigint
             FROM load.applied WHERE intended_at >= $1 AND intended_at < $2"
        }
        // No consumer: until the broker acknowledged the row's publish (the instant the mark wrote
        // into `published_at`).
        Scope::RelayOnly => {
            "SELECT (extract(epoch FROM o.published_at - w.intended_at) * 1000000)::bigint
             FROM load.writes w
             JOIN courier.outbox o ON o.aggregate_id = w.aggregate_id AND o.version = w.version
             WHERE w.intended_at >= $1 AND w.intended_at < $2 AND o.published_at IS NOT NULL"
        }
    };
    let rows = rig
        .client()
        .await?
        .query(sql, &[&from, &to])
        .await
        .context("read the latencies")?;
    let mut histogram = new_histogram();
    for r in rows {
        histogram.saturating_record(u64::try_from(r.get::<_, i64>(0)).unwrap_or(0));
    }
    Ok(Latency::from_histogram(name, &histogram))
}

/// Rates between consecutive samples of `value`, per second.
pub fn rates(samples: &[Sample], value: impl Fn(&Sample) -> i64) -> Vec<(f64, f64)> {
    samples
        .windows(2)
        .filter(|w| w[1].t > w[0].t)
        .map(|w| {
            let delta = (value(&w[1]) - value(&w[0])).max(0) as f64;
            (w[1].t, delta / (w[1].t - w[0].t))
        })
        .collect()
}

/// The chart panels every pipeline run shows: throughput, backlog, latency, and (when
/// processes were watched) memory.
pub fn panels(samples: &[Sample]) -> Vec<Panel> {
    let mut panels = vec![
        Panel::new("throughput", "events/s")
            .with("committed", rates(samples, |s| s.written))
            .with("projected", rates(samples, |s| s.applied)),
        Panel::new("backlog", "events")
            .with(
                "committed, not projected",
                samples
                    .iter()
                    .map(|s| (s.t, (s.written - s.applied).max(0) as f64))
                    .collect(),
            )
            .with(
                "outbox unpublished",
                samples
                    .iter()
                    .filter_map(|s| Some((s.t, s.outbox_pending? as f64)))
                    .collect(),
            ),
        Panel::new("commit → projection p99", "ms").with(
            "p99 per sample",
            samples
                .iter()
                .filter_map(|s| Some((s.t, s.window_p99_ms?)))
                .collect(),
        ),
    ];
    let mut memory = Panel::new("resident memory", "MiB");
    let mut cpu = Panel::new("CPU", "% of one core");
    let labels = process_labels(samples);
    for label in labels {
        let readings: Vec<(f64, ProcessReading)> = samples
            .iter()
            .filter_map(|s| {
                let (_, r) = s.processes.iter().find(|(l, _)| l == label)?;
                Some((s.t, *r))
            })
            .collect();
        if readings.iter().any(|(_, r)| r.rss_bytes > 0) {
            memory = memory.with(
                label,
                readings
                    .iter()
                    .map(|(t, r)| (*t, r.rss_bytes as f64 / 1_048_576.0))
                    .collect(),
            );
        }
        cpu = cpu.with(
            label,
            readings
                .windows(2)
                .filter(|w| {
                    w[1].0 > w[0].0
                        && w[1].1.pid == w[0].1.pid
                        && w[1].1.cpu_ticks >= w[0].1.cpu_ticks
                })
                .map(|w| {
                    let ticks = (w[1].1.cpu_ticks - w[0].1.cpu_ticks) as f64;
                    (
                        w[1].0,
                        100.0 * ticks / ticks_per_second() / (w[1].0 - w[0].0),
                    )
                })
                .collect(),
        );
    }
    if !memory.series.is_empty() {
        panels.push(memory);
        panels.push(cpu);
    }
    panels
}

/// The panels a run that pinned the xmin horizon adds: the outbox's dead tuples and the age of
/// the oldest snapshot in the run's database.
pub fn horizon_panels(samples: &[Sample]) -> Vec<Panel> {
    vec![
        Panel::new("outbox dead tuples", "rows").with(
            "n_dead_tup",
            samples
                .iter()
                .filter_map(|s| Some((s.t, s.outbox_dead_tuples? as f64)))
                .collect(),
        ),
        Panel::new("oldest snapshot", "s").with(
            "age",
            samples
                .iter()
                .map(|s| (s.t, s.oldest_snapshot_secs.unwrap_or(0.0)))
                .collect(),
        ),
    ]
}

/// Every process label seen in `samples`, sorted, once each.
fn process_labels(samples: &[Sample]) -> Vec<&String> {
    let mut labels: Vec<&String> = samples
        .iter()
        .flat_map(|s| s.processes.iter().map(|(l, _)| l))
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

/// Per process: CPU-seconds spent between `from` and `to` (seconds from the origin), summed
/// over consecutive samples so a restarted process (whose counters start again: a new pid
/// counts all its ticks) and PostgreSQL backends that exited (taking their ticks with them)
/// count only what was spent.
pub fn cpu_seconds(samples: &[Sample], from: f64, to: f64) -> Vec<(String, f64)> {
    let labels = process_labels(samples);
    labels
        .into_iter()
        .map(|label| {
            let readings: Vec<ProcessReading> = samples
                .iter()
                .filter(|s| s.t >= from && s.t <= to)
                .filter_map(|s| s.processes.iter().find(|(l, _)| l == label))
                .map(|(_, r)| *r)
                .collect();
            let ticks: u64 = readings
                .windows(2)
                .map(|w| match (w[0].pid, w[1].pid) {
                    // Started again since the last reading: all it spent is new.
                    (before, now) if before != now && now != 0 => w[1].cpu_ticks,
                    _ => w[1].cpu_ticks.saturating_sub(w[0].cpu_ticks),
                })
                .sum();
            (label.clone(), ticks as f64 / ticks_per_second())
        })
        .collect()
}

/// The share of a write phase after which memory is judged, unless a command says otherwise;
/// a process started again during the window is allowed the same share of its own life.
pub const WARM_UP_SHARE: f64 = 0.2;

/// A process's resident memory over a window: the means of its first and last tenth.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryDrift {
    pub label: String,
    /// Times the process was started again (its pid changed) within the window.
    pub restarts: usize,
    /// The part of the window judged: all of it, or for a restarted process its longest
    /// life there after that life's own warm-up; `None` when no life covers half the window
    /// (memory compared across two processes says nothing about either).
    pub judged: Option<JudgedSpan>,
}

/// The span a drift was judged over and the mean RSS of its first and last tenth, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JudgedSpan {
    pub from: f64,
    pub to: f64,
    pub first: f64,
    pub last: f64,
}

impl JudgedSpan {
    /// `last / first − 1`.
    pub fn drift(&self) -> f64 {
        self.last / self.first - 1.0
    }
}

/// Per process: its memory drift over `[from, to]` (seconds from the origin, after the
/// run's warm-up). A process killed and started again in the window is judged over its
/// longest life there, never across two lives.
pub fn memory_drift(samples: &[Sample], from: f64, to: f64) -> Vec<MemoryDrift> {
    let labels = process_labels(samples);
    labels
        .into_iter()
        .filter_map(|label| {
            let readings: Vec<(f64, ProcessReading)> = samples
                .iter()
                .filter(|s| s.t >= from && s.t <= to)
                .filter_map(|s| {
                    let (_, r) = s.processes.iter().find(|(l, _)| l == label)?;
                    Some((s.t, *r))
                })
                .collect();
            let lives: Vec<&[(f64, ProcessReading)]> =
                readings.chunk_by(|a, b| a.1.pid == b.1.pid).collect();
            let restarts = lives.len().saturating_sub(1);
            let span_of = |life: &[(f64, ProcessReading)]| life[life.len() - 1].0 - life[0].0;
            let (index, longest) = lives
                .iter()
                .enumerate()
                .max_by(|a, b| span_of(a.1).total_cmp(&span_of(b.1)))?;
            let (start, end) = (longest[0].0, longest[longest.len() - 1].0);
            let span = if restarts == 0 {
                Some((from, to))
            } else {
                // The first life ran before the window, past the run's warm-up; a later one
                // warms up again.
                let judged_from = if index == 0 {
                    from
                } else {
                    start + (end - start) * WARM_UP_SHARE
                };
                (end - judged_from >= (to - from) / 2.0).then_some((judged_from, end))
            };
            let points: Vec<(f64, f64)> = longest
                .iter()
                .map(|(t, r)| (*t, r.rss_bytes as f64))
                .collect();
            let judged = match span {
                Some((a, b)) => {
                    let (first, last) = first_and_last_tenth(&points, a, b)?;
                    Some(JudgedSpan {
                        from: a,
                        to: b,
                        first,
                        last,
                    })
                }
                None => None,
            };
            Some(MemoryDrift {
                label: label.clone(),
                restarts,
                judged,
            })
        })
        .collect()
}

/// The means of the `(t, value)` points in the first and the last tenth of `[from, to]`;
/// `None` when either tenth has no point or the first mean is not positive (no drift can be
/// computed against it).
pub fn first_and_last_tenth(points: &[(f64, f64)], from: f64, to: f64) -> Option<(f64, f64)> {
    first_and_last_share(points, from, to, 0.1)
}

/// The means of the `(t, value)` points in the first and the last `share` of `[from, to]`,
/// as [`first_and_last_tenth`].
pub fn first_and_last_share(
    points: &[(f64, f64)],
    from: f64,
    to: f64,
    share: f64,
) -> Option<(f64, f64)> {
    let window = (to - from) * share;
    let mean = |a: f64, b: f64| {
        let values: Vec<f64> = points
            .iter()
            .filter(|(t, _)| *t >= a && *t <= b)
            .map(|(_, v)| *v)
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    };
    let first = mean(from, from + window).filter(|v| *v > 0.0)?;
    Some((first, mean(to - window, to)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_deltas_over_time_between_samples() {
        let samples = [
            Sample::for_test(0.0, 0, 0),
            Sample::for_test(0.5, 500, 100),
            Sample::for_test(1.5, 1_500, 1_100),
        ];
        assert_eq!(
            rates(&samples, |s| s.written),
            vec![(0.5, 1_000.0), (1.5, 1_000.0)]
        );
        assert_eq!(
            rates(&samples, |s| s.applied),
            vec![(0.5, 200.0), (1.5, 1_000.0)]
        );
    }

    #[test]
    fn the_origin_maps_instants_to_wall_time() {
        let origin = Origin::now();
        let later = origin.instant + Duration::from_millis(1_500);
        assert_eq!(
            (origin.wall_at(later) - origin.wall).num_milliseconds(),
            1_500
        );
        assert_eq!(
            origin.wall_at(origin.instant - Duration::from_secs(1)),
            origin.wall
        );
    }

    fn rss_sample(t: f64, rss_mib: u64) -> Sample {
        life_sample(t, 1, rss_mib, 0)
    }

    /// A reading of relay-1 at `t`, while process `pid` is relay-1.
    fn life_sample(t: f64, pid: u32, rss_mib: u64, cpu_ticks: u64) -> Sample {
        Sample {
            t,
            written: 0,
            outbox_pending: Some(0),
            applied: 0,
            window_p99_ms: None,
            outbox_dead_tuples: None,
            oldest_snapshot_secs: None,
            processes: vec![(
                "relay-1".into(),
                ProcessReading {
                    pid,
                    rss_bytes: rss_mib * 1_048_576,
                    cpu_ticks,
                },
            )],
        }
    }

    #[test]
    fn halves_read_a_swinging_flat_series_as_flat_and_a_leak_as_growth() {
        let swinging: Vec<(f64, f64)> = (0..400)
            .map(|t| (f64::from(t), if t % 40 < 20 { 250.0 } else { 550.0 }))
            .collect();
        let (first, last) =
            first_and_last_share(&swinging, 0.0, 400.0, 0.5).expect("both halves have points");
        assert!((last / first - 1.0).abs() < 0.01, "{first} → {last}");
        let leaking: Vec<(f64, f64)> = (0..400)
            .map(|t| (f64::from(t), 100.0 + f64::from(t)))
            .collect();
        let (first, last) =
            first_and_last_share(&leaking, 0.0, 400.0, 0.5).expect("both halves have points");
        assert!(last / first - 1.0 > 0.5, "{first} → {last}");
    }

    #[test]
    fn drift_compares_the_first_and_last_tenth_after_warm_up() {
        // Warm-up (t < 10) grows from 10 to 100 MiB; then 100 MiB flat, 110 at the very end.
        let mut samples: Vec<Sample> = (0..10u32)
            .map(|t| rss_sample(f64::from(t), 10 + 10 * u64::from(t)))
            .collect();
        samples.extend(
            (10..=100u32).map(|t| rss_sample(f64::from(t), if t >= 91 { 110 } else { 100 })),
        );
        let drift = memory_drift(&samples, 10.0, 100.0);
        assert_eq!(drift.len(), 1);
        assert_eq!(drift[0].label, "relay-1");
        assert_eq!(drift[0].restarts, 0);
        let span = drift[0].judged.expect("judged");
        assert_eq!((span.from, span.to), (10.0, 100.0));
        assert!((span.first / 1_048_576.0 - 100.0).abs() < 1e-9);
        assert!(
            (span.last / 1_048_576.0 - 110.0).abs() < 1e-9,
            "{}",
            span.last
        );
        assert!((span.drift() - 0.10).abs() < 1e-9, "{}", span.drift());
    }

    #[test]
    fn a_process_started_again_is_judged_over_its_longest_life_never_across_two() {
        // Flat at 100 MiB until killed at t = 80; its successor starts fresh at 40 MiB. Across
        // the two lives the window would read −60 %; the first life is flat.
        let killed_late: Vec<Sample> = (10..=100u32)
            .map(|t| match t {
                ..=80 => life_sample(f64::from(t), 7, 100, 0),
                _ => life_sample(f64::from(t), 8, 40, 0),
            })
            .collect();
        let drift = memory_drift(&killed_late, 10.0, 100.0);
        assert_eq!(drift[0].restarts, 1);
        let span = drift[0]
            .judged
            .expect("the first life covers most of the window");
        assert_eq!((span.from, span.to), (10.0, 80.0));
        assert!(span.drift().abs() < 1e-9, "{}", span.drift());

        // Killed at t = 20: the successor is judged after its own warm-up, and its leak shows.
        let killed_early: Vec<Sample> = (10..=100u32)
            .map(|t| match t {
                ..=20 => life_sample(f64::from(t), 7, 100, 0),
                _ => life_sample(f64::from(t), 8, u64::from(t), 0),
            })
            .collect();
        let span = memory_drift(&killed_early, 10.0, 100.0)[0]
            .judged
            .expect("the second life covers most of the window");
        assert!((span.from - 36.8).abs() < 1e-9, "{}", span.from);
        assert_eq!(span.to, 100.0);
        assert!(span.drift() > 0.5, "{}", span.drift());

        // Killed near the middle and again near the end: no life covers half the window.
        let killed_twice: Vec<Sample> = (10..=100u32)
            .map(|t| {
                life_sample(
                    f64::from(t),
                    7 + u32::from(t > 50) + u32::from(t > 90),
                    100,
                    0,
                )
            })
            .collect();
        let drift = memory_drift(&killed_twice, 10.0, 100.0);
        assert_eq!(drift[0].restarts, 2);
        assert_eq!(drift[0].judged, None);
    }

    #[test]
    fn cpu_is_summed_over_the_window_across_a_restart_and_exited_backends() {
        // 100 ticks, a restart (a new pid: its 10 ticks since it started count), 50 more;
        // the last sample is outside the window.
        let samples = [
            life_sample(0.0, 7, 1, 1_000),
            life_sample(1.0, 7, 1, 1_100),
            life_sample(2.0, 8, 1, 10),
            life_sample(3.0, 8, 1, 60),
            life_sample(9.0, 8, 1, 5_000),
        ];
        let cpu = cpu_seconds(&samples, 0.0, 3.0);
        assert_eq!(
            cpu,
            vec![("relay-1".to_string(), 160.0 / ticks_per_second())]
        );
        // A sum over many processes (pid 0) whose backends exited: a drop counts nothing.
        let summed = [
            life_sample(0.0, 0, 0, 1_000),
            life_sample(1.0, 0, 0, 900),
            life_sample(2.0, 0, 0, 950),
        ];
        assert_eq!(
            cpu_seconds(&summed, 0.0, 2.0),
            vec![("relay-1".to_string(), 50.0 / ticks_per_second())]
        );
    }
}
