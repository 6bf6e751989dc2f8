//! A running pipeline under test: the rig, its relay and consumer processes, the faults struck
//! at it, the xmin pin held on it and the sampler watching it; what every pipeline command
//! (throughput, latency, soak, chaos) starts with, and how each ends: drained (or stalled),
//! stopped, and judged by the independent checker.

mod strike;

use crate::harness::canary::{Canary, CanaryReading};
use crate::harness::checker::{judge, read_facts, Scope, Verdict};
use crate::harness::drive::{
    self, Load, Origin, Sample, Sampler, Watched, WriteOutcome, WritePhase,
};
use crate::harness::faults::{FaultPlan, FaultStack, Strikes};
use crate::harness::pg_statements::{self, Snapshot, HARNESS_TAG};
use crate::harness::pin::{Baseline, Pin, PinReading, PinSchedule};
use crate::harness::processes::{emulator_process, Role, Workers};
use crate::harness::rig::{PipelineArgs, Place, Rig, Takeover};
use crate::harness::workload::KeySpace;
use crate::report::measures::{Goal, Latency};
use crate::report::Report;
use anyhow::Context as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strike::strike;

pub struct Pipeline {
    pub rig: Rig,
    pub workers: Workers,
    pub origin: Origin,
    pub watched: Watched,
    /// What the faults need around the pipeline (own PostgreSQL, own emulator, broker proxy).
    pub stack: FaultStack,
    pub plan: FaultPlan,
    /// What the faults did so far.
    pub strikes: Strikes,
    /// `pg_stat_statements` can be read in the run's database.
    statements: bool,
    /// The emulator's own publish → receive, timed throughout the run.
    canary: Option<Canary>,
    sampler: Option<Sampler>,
    /// `(label, pid)` watched besides the workers (the emulator, this process).
    others: Vec<(String, u32)>,
    /// The xmin pin held now (the `pin-xmin` fault's, or `--pin-xmin-at`'s).
    pin: Option<Pin>,
    /// `--pin-xmin-at`: the pin to hold during the next write phase.
    pin_asked: Option<PinSchedule>,
    /// That pin once its write phase started: when it is due, seconds from the origin.
    pin_due: Option<(f64, PinSchedule)>,
    /// Where the next pin's "before" statement counts start.
    pin_baseline: Baseline,
    /// What each released pin read.
    pins: Vec<PinReading>,
    /// Every write phase so far (a probe's too).
    write_phases: Vec<WritePhase>,
}

/// How a pipeline is set up: its rig, its processes, its faults.
pub struct Setup<'a> {
    pub args: &'a PipelineArgs,
    pub plan: FaultPlan,
    /// Relay processes.
    pub relays: u32,
    pub sample_every: Duration,
    /// The subscription's ack deadline (and the consumer's lease extension).
    pub ack_deadline_secs: i32,
    /// The emulator to use unless the plan needs one of its own.
    pub shared_emulator: Option<&'a str>,
}

impl<'a> Setup<'a> {
    /// One relay process, the deployment's 30 s ack deadline, the shared emulator.
    pub fn one_relay(
        args: &'a PipelineArgs,
        plan: FaultPlan,
        shared_emulator: &'a str,
        sample_every: Duration,
    ) -> Self {
        Self {
            args,
            plan,
            relays: 1,
            sample_every,
            ack_deadline_secs: 30,
            shared_emulator: Some(shared_emulator),
        }
    }
}

impl Pipeline {
    /// Starts what the faults need, the rig, `relays` relay processes, the consumer process
    /// (unless relay only) and the sampler.
    pub async fn launch(dir: &Path, setup: Setup<'_>) -> anyhow::Result<Self> {
        let scope = setup.args.scope();
        if scope == Scope::RelayOnly {
            use crate::harness::faults::Fault::{HandlerTransient, KillConsumer};
            anyhow::ensure!(
                !setup
                    .plan
                    .faults
                    .iter()
                    .any(|f| matches!(f, HandlerTransient | KillConsumer)),
                "--relay-only runs no consumer: kill-consumer and handler-transient do not apply"
            );
        }
        let mut stack = FaultStack::start(&setup.plan, dir).await?;
        let emulator_host = match (&stack.emulator, setup.shared_emulator) {
            (Some(own), _) => own.host.clone(),
            (None, Some(shared)) => shared.to_string(),
            (None, None) => anyhow::bail!("no emulator for the pipeline"),
        };
        let place = Place {
            database_server: stack.database_server(),
            workers_emulator_host: stack
                .workers_emulator_host(&setup.plan, &emulator_host)
                .await?,
            emulator_host,
        };
        let takeover = if setup.plan.faults.is_empty() {
            Takeover::Deployment
        } else {
            Takeover::Quick
        };
        let mut rig =
            Rig::create(dir, &place, setup.args, setup.ack_deadline_secs, takeover).await?;
        let statements = pg_statements::enable(&rig.client().await?).await;
        let canary = Canary::start(&rig.pubsub(), &format!("{}.canary", rig.topic)).await?;
        rig.consumer_lock_timeout = setup.plan.consumer_lock_timeout();
        let mut workers = Workers::new(&rig, dir)?;
        for _ in 0..setup.relays {
            workers.start(Role::Relay)?;
        }
        if scope == Scope::EndToEnd {
            workers.start(Role::Consumer)?;
        }
        let mut others = vec![("harness".to_string(), std::process::id())];
        if let Some(pid) = emulator_process(&rig.emulator_host) {
            others.push(("emulator".into(), pid));
        }
        let watched: Watched = Arc::new(Mutex::new(Vec::new()));
        let origin = Origin::now();
        let mut pipeline = Self {
            sampler: Some(Sampler::start(
                rig.db.pool.clone(),
                origin,
                setup.sample_every,
                watched.clone(),
                scope,
                rig.config.relay.shard_count,
            )),
            rig,
            workers,
            origin,
            watched,
            stack,
            plan: setup.plan,
            strikes: Strikes::default(),
            statements,
            canary: Some(canary),
            others,
            pin: None,
            pin_asked: None,
            pin_due: None,
            pin_baseline: Baseline {
                at: 0.0,
                counts: statements.then(Snapshot::default),
                backends: Vec::new(),
            },
            pins: Vec::new(),
            write_phases: Vec::new(),
        };
        pipeline.refresh_watched();
        Ok(pipeline)
    }

    /// Points the sampler at the current worker pids (after a restart).
    pub fn refresh_watched(&mut self) {
        let mut list = self.workers.pids();
        list.extend(self.others.iter().cloned());
        if let Ok(mut watched) = self.watched.lock() {
            *watched = list;
        }
    }

    /// Restarts workers that exited on their own; call periodically during a run.
    pub fn keep_workers_up(&mut self) -> anyhow::Result<()> {
        let before = self.workers.unexpected_exits.len();
        self.workers.restart_exited()?;
        if self.workers.unexpected_exits.len() != before {
            self.refresh_watched();
        }
        Ok(())
    }

    /// Pins the xmin horizon during the next write phase as `schedule` says (from its start).
    pub fn pin_xmin_in_next_writes(&mut self, schedule: PinSchedule) {
        self.pin_asked = Some(schedule);
    }

    /// Whether the xmin horizon is pinned now.
    pub fn xmin_pinned(&self) -> bool {
        self.pin.is_some()
    }

    /// Pins the xmin horizon now until `release_at` (seconds from the origin; `None`: the
    /// run's conclusion).
    pub async fn pin_xmin(&mut self, cause: String, release_at: Option<f64>) -> anyhow::Result<()> {
        anyhow::ensure!(self.pin.is_none(), "the xmin horizon is pinned already");
        let pin = Pin::hold(
            &self.rig,
            self.origin,
            cause,
            release_at,
            self.pin_baseline.clone(),
        )
        .await?;
        self.pin = Some(pin);
        Ok(())
    }

    /// Releases the pin held, if any, and keeps what it read; the next pin's "before" starts
    /// here.
    pub async fn release_xmin(&mut self) {
        let Some(pin) = self.pin.take() else {
            return;
        };
        let reading = pin.release(&self.rig, self.origin).await;
        eprintln!(
            "{:>7.1} s  xmin released after {:.0} s",
            reading.to,
            reading.to - reading.from
        );
        self.strikes.timeline.push((
            reading.to,
            format!(
                "xmin released after {:.0} s ({})",
                reading.to - reading.from,
                reading.cause
            ),
        ));
        self.pin_baseline = Baseline {
            at: reading.to,
            counts: reading.statements.as_ref().map(|[_, _, end]| end.clone()),
            backends: reading.backends[2].clone(),
        };
        self.pins.push(reading);
    }

    /// Releases a pin whose time is up and starts the one `--pin-xmin-at` asked for once it
    /// is due (after the pin held, if another is); call periodically during a run.
    pub async fn tend_pin(&mut self) -> anyhow::Result<()> {
        if let Some(pin) = &mut self.pin {
            pin.observe_backends().await;
        }
        let now = self.origin.seconds();
        if self
            .pin
            .as_ref()
            .and_then(|pin| pin.release_at)
            .is_some_and(|at| now >= at)
        {
            self.release_xmin().await;
        }
        if self.pin.is_none() && self.pin_due.is_some_and(|(at, _)| now >= at) {
            if let Some((_, schedule)) = self.pin_due.take() {
                let cause = schedule.describe();
                self.pin_xmin(cause.clone(), schedule.hold.map(|hold| now + hold))
                    .await?;
                eprintln!("{now:>7.1} s  xmin pinned ({cause})");
                self.strikes
                    .timeline
                    .push((now, format!("xmin pinned ({cause})")));
            }
        }
        Ok(())
    }

    /// Runs `load` while the plan's faults strike (and the xmin pin asked for is held), then
    /// waits (up to `drain_timeout`, or until progress stalls) until every write committed so
    /// far is projected (relay only: published) and the outbox is empty.
    pub async fn write_and_drain(
        &mut self,
        load: Load,
        drain_timeout: Duration,
    ) -> anyhow::Result<Drained> {
        let (config, topic, origin) =
            (self.rig.config.clone(), self.rig.topic.clone(), self.origin);
        let writes_from = origin.seconds();
        if let Some(schedule) = self.pin_asked.take() {
            self.pin_due = Some((writes_from + schedule.after, schedule));
        }
        let write = if self.plan.is_empty() && self.pin_due.is_none() && self.pin.is_none() {
            drive::write_for(&config, &topic, origin, load).await?
        } else {
            let until = Instant::now() + load.duration;
            let (write, strikes) = tokio::join!(
                drive::write_for(&config, &topic, origin, load),
                strike(self, until),
            );
            self.strikes.append(strikes?);
            write?
        };
        let writes_to = origin.seconds();
        self.write_phases.push(WritePhase {
            from: writes_from,
            to: writes_to,
            committed: write.committed,
        });
        let total = drive::committed_writes(&self.rig).await?;
        let (converged, unpublished) = self.converge(total, drain_timeout).await?;
        Ok(Drained {
            write,
            total,
            converged,
            unpublished,
            scope: self.rig.scope,
            key_space: self.rig.key_space,
            writes: (writes_from, writes_to),
        })
    }

    /// The end-to-end maximum: `writers` write as fast as they can for `seconds`, then the
    /// rate is what committed divided by the time until all of it was projected.
    pub async fn probe_max(
        &mut self,
        args: &PipelineArgs,
        seconds: u64,
        drain_timeout: Duration,
    ) -> anyhow::Result<f64> {
        eprintln!("measuring the end-to-end maximum for {seconds} s");
        let started = self.origin.seconds();
        let before = drive::committed_writes(&self.rig).await?;
        let probe = Load {
            writers: args.writers,
            shape: args.shape(),
            pace: drive::Pace::ClosedLoop,
            duration: Duration::from_secs(seconds),
        };
        // The probe runs without faults: it measures what the pipeline can do.
        let plan = std::mem::replace(&mut self.plan, FaultPlan::none());
        let drained = self.write_and_drain(probe, drain_timeout).await;
        self.plan = plan;
        let drained = drained?;
        drained
            .converged
            .context("the maximum probe did not drain")?;
        Ok((drained.total - before) as f64 / (self.origin.seconds() - started))
    }

    /// Waits until `total` writes are applied (relay only: published) and the outbox holds
    /// nothing unpublished, restarting workers that exit meanwhile. Fails after `timeout`, or
    /// once nothing moved for [`STALL`]. Returns the seconds since the run's origin (or why it
    /// never got there) and the outbox rows still unpublished at the end.
    async fn converge(
        &mut self,
        total: u64,
        timeout: Duration,
    ) -> anyhow::Result<(anyhow::Result<f64>, i64)> {
        let deadline = Instant::now() + timeout;
        let what = match self.rig.scope {
            Scope::EndToEnd => "applied by the projection",
            Scope::RelayOnly => "published by the relay",
        };
        let bar = crate::harness::fixtures::progress(total, what);
        let mut last = (0, -1);
        let mut progressed_at = Instant::now();
        loop {
            self.keep_workers_up()?;
            self.tend_pin().await?;
            if let Some((done, pending)) = progress(&self.rig, total).await {
                if (done, pending) != last {
                    progressed_at = Instant::now();
                }
                last = (done, pending);
                bar.set_position(done);
                if done >= total && pending == 0 {
                    bar.finish_and_clear();
                    return Ok((Ok(self.origin.seconds()), 0));
                }
            }
            if Instant::now() >= deadline || progressed_at.elapsed() >= STALL {
                bar.finish_and_clear();
                if last.1 < 0 {
                    if let Ok(conn) = self.rig.db.pool.get().await {
                        last.1 = unpublished(&conn).await.unwrap_or(-1);
                    }
                }
                let stall = anyhow::anyhow!(
                    "{} of {total} {what}, {} outbox rows unpublished; nothing moved for {} s",
                    last.0,
                    last.1,
                    progressed_at.elapsed().as_secs()
                );
                return Ok((Err(stall), last.1));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Due → projection latency of the writes due `from..to` seconds into the run (→ marked
    /// published in a relay-only run); read before [`Pipeline::conclude`].
    pub async fn latency_between(&self, name: &str, from: f64, to: f64) -> anyhow::Result<Latency> {
        let (from, to) = (self.origin.wall_after(from), self.origin.wall_after(to));
        drive::latency(&self.rig, name, (from, to)).await
    }

    /// Releases the xmin pin still held, reads the commit → projection latency of the writes
    /// meant to start `from` seconds into the run or later (and the canary's over the same
    /// time), stops, reads the dead letters, and judges the whole run.
    pub async fn conclude(mut self, latency_name: &str, from: f64) -> anyhow::Result<Concluded> {
        self.release_xmin().await;
        let measured_from = self.origin.instant + Duration::from_secs_f64(from.max(0.0));
        let from = self.origin.wall_after(from);
        let name = match self.rig.scope {
            Scope::EndToEnd => latency_name,
            Scope::RelayOnly => "commit → publish acknowledged (relay only)",
        };
        let latency = drive::latency(
            &self.rig,
            name,
            (from, chrono::DateTime::<chrono::Utc>::MAX_UTC),
        )
        .await?;
        let hops = crate::harness::hops::read(&self.rig, from, self.origin.wall).await?;
        let dead_letters = match self.rig.scope {
            Scope::EndToEnd => read_dead_letters(&self.rig, self.strikes.poison.len()).await?,
            Scope::RelayOnly => Vec::new(),
        };
        let canary = match self.canary.take() {
            Some(canary) => Some(canary.stop(measured_from, Instant::now()).await),
            None => None,
        };
        let (finished, strikes) = self.finish().await?;
        let mut facts = finished.facts;
        facts.dead_letters = dead_letters;
        facts.injected_poison = strikes.poison.clone();
        Ok(Concluded {
            latency,
            hops,
            canary,
            statements: finished.statements,
            events_per_transaction: finished.events_per_transaction,
            verdict: judge(&facts),
            samples: finished.samples,
            unexpected_exits: finished.unexpected_exits,
            strikes,
            pins: finished.pins,
            write_phases: finished.write_phases,
        })
    }

    /// Stops the sampler and the workers; returns the samples, the checker's facts and the
    /// statement costs read from the database, and the strikes.
    async fn finish(mut self) -> anyhow::Result<(Finished, Strikes)> {
        let samples = match self.sampler.take() {
            Some(sampler) => sampler.finish().await?,
            None => Vec::new(),
        };
        self.workers.stop_all(Duration::from_secs(10)).await;
        // Read while the run's database exists: it is dropped with the rig.
        let client = self.rig.client().await?;
        let facts = read_facts(&client, self.rig.scope).await?;
        let statements = if self.statements {
            pg_statements::top(&client, facts.writes.len() as u64).await
        } else {
            None
        };
        let events_per_transaction = match self.rig.scope {
            Scope::EndToEnd => client
                .query_one(
                    "SELECT count(*)::float8 / nullif(count(DISTINCT tx), 0) FROM load.applied",
                    &[],
                )
                .await?
                .get(0),
            Scope::RelayOnly => None,
        };
        Ok((
            Finished {
                samples,
                facts,
                statements,
                events_per_transaction,
                unexpected_exits: std::mem::take(&mut self.workers.unexpected_exits),
                pins: std::mem::take(&mut self.pins),
                write_phases: std::mem::take(&mut self.write_phases),
            },
            std::mem::take(&mut self.strikes),
        ))
    }
}

/// The framework's processes may drift this much in memory after warm-up (P7).
pub const MEMORY_DRIFT_LIMIT: f64 = 0.10;

/// Progress stalled this long means it will not resume (a dead-lettered event never arrives;
/// the emulator's subscription can break, see `chaos`).
const STALL: Duration = Duration::from_secs(90);

/// `(done, outbox rows unpublished)`, or `None` when the database cannot answer now. Polled
/// every 100 ms while the run drains, so it must cost PostgreSQL next to nothing: end to
/// end, the unpublished rows (a count that visits each) are counted only once every effect
/// is in, and are `-1` (not counted) before.
async fn progress(rig: &Rig, total: u64) -> Option<(u64, i64)> {
    let conn = rig.db.pool.get().await.ok()?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    match rig.scope {
        Scope::EndToEnd => {
            // The effect log's last sequence number (one index probe) is at least the effects
            // applied; only once it reaches the total are the distinct effects counted.
            let row = conn
                .query_one("SELECT coalesce(max(seq), 0) FROM load.applied", &[])
                .await
                .ok()?;
            let last: i64 = row.get(0);
            if count(last) < total {
                return Some((count(last), -1));
            }
            let distinct: i64 = conn
                .query_one(
                    "SELECT count(DISTINCT (aggregate_id, version)) FROM load.applied",
                    &[],
                )
                .await
                .ok()?
                .get(0);
            Some((count(distinct), unpublished(&conn).await?))
        }
        // Every committed write has its row: counting the few unpublished ones (a partial
        // index) is cheap where counting the published history is not.
        Scope::RelayOnly => {
            let pending = unpublished(&conn).await?;
            Some((total.saturating_sub(count(pending)), pending))
        }
    }
}

/// Outbox rows not yet published, or `None` when the database cannot answer now.
async fn unpublished(conn: &tokio_postgres::Client) -> Option<i64> {
    conn.query_one(
        &format!("{HARNESS_TAG} SELECT count(*) FROM courier.outbox WHERE published_at IS NULL"),
        &[],
    )
    .await
    .ok()
    .map(|row| row.get(0))
}

/// The `event_id`s on the dead-letter keeper subscription: one stream (opened now, after the
/// run), read until `expected` distinct ids arrived and 3 s passed without another, or 60 s
/// passed.
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

/// What the writes did and whether the pipeline caught up with them.
pub struct Drained {
    pub write: WriteOutcome,
    /// Writes committed in the run so far.
    pub total: u64,
    /// Seconds from the run's origin until everything was through, or why it never was.
    pub converged: anyhow::Result<f64>,
    /// Outbox rows left unpublished when the drain ended.
    pub unpublished: i64,
    scope: Scope,
    key_space: KeySpace,
    /// When the writes ran, seconds from the run's origin.
    pub writes: (f64, f64),
}

impl Drained {
    /// The part of the write phase after `warm_up` (a share of it): where memory is judged.
    pub fn after_warm_up(&self, warm_up: f64) -> (f64, f64) {
        let (from, to) = self.writes;
        (from + warm_up * (to - from), to)
    }

    /// A goal naming the stall, when the pipeline did not catch up.
    /// Into `report`: a goal naming the stall when the pipeline did not catch up, and, when
    /// the relay had published everything, where the events stopped.
    pub fn judge_convergence(&self, report: &mut Report) {
        report.goals.extend(Goal::not_converged(&self.converged));
        if self.converged.is_ok() || self.unpublished > 0 || self.scope == Scope::RelayOnly {
            return;
        }
        let mut note = "the relay published every event; delivery to the projection stopped \
                        short (see the dead letters and the consumer's log)"
            .to_string();
        if self.key_space == KeySpace::Unique {
            note += ": with a new ordering key per aggregate on an ordered subscription the \
                     emulator stops delivering within a minute or so (docs/emulator.md), which real \
                     Pub/Sub does not; measure the framework with --relay-only or a smaller run";
        }
        report.notes.push(note);
    }
}

/// A stopped pipeline's record.
struct Finished {
    samples: Vec<Sample>,
    facts: crate::harness::checker::Facts,
    statements: Option<Vec<crate::report::measures::StatementCost>>,
    events_per_transaction: Option<f64>,
    unexpected_exits: Vec<String>,
    pins: Vec<PinReading>,
    write_phases: Vec<WritePhase>,
}

/// A judged run: what the pipeline commands' reports are made of.
pub struct Concluded {
    /// Commit → projection (→ publish acknowledged in a relay-only run).
    pub latency: Latency,
    /// Where that time went, hop by hop (the relay's hops alone in a relay-only run).
    pub hops: crate::harness::hops::Hops,
    /// What the emulator's own hop did during the run.
    pub canary: Option<CanaryReading>,
    /// The run database's top statements (`None`: `pg_stat_statements` not loaded).
    pub statements: Option<Vec<crate::report::measures::StatementCost>>,
    /// Effects per projection transaction that had any (end to end only).
    pub events_per_transaction: Option<f64>,
    pub verdict: Verdict,
    pub samples: Vec<Sample>,
    pub unexpected_exits: Vec<String>,
    pub strikes: Strikes,
    /// What each xmin pin read, in the order they were released.
    pub pins: Vec<PinReading>,
    pub write_phases: Vec<WritePhase>,
}

impl Concluded {
    /// What each process spent in CPU per committed write over the whole run (the write phase,
    /// the drain, and any probe before them).
    fn cpu_per_event(&self) -> String {
        let to = self.samples.last().map_or(0.0, |s| s.t);
        let cpu = drive::cpu_seconds(&self.samples, 0.0, to);
        let events = self.verdict.committed.max(1) as f64;
        let total: f64 = cpu.iter().map(|(_, seconds)| seconds).sum();
        let each: Vec<String> = cpu
            .iter()
            .map(|(label, seconds)| format!("{label} {:.0}", seconds * 1e6 / events))
            .collect();
        format!(
            "CPU per committed write, µs: {} (together {:.0}); whole run, {} writes",
            each.join(", "),
            total * 1e6 / events,
            self.verdict.committed
        )
    }

    /// Puts what every pipeline report shows into `report`: the checker's verdict, the
    /// latency, the faults on the timeline, the panels, the workers that exited, and each
    /// process's memory drift over `memory_window` (seconds from the run's origin; the
    /// framework's processes held to ±10 %, a restarted one over its longest life).
    pub fn fill(self, report: &mut Report, memory_window: (f64, f64)) {
        let (from, to) = memory_window;
        report.notes.push(self.cpu_per_event());
        if let Some(per_transaction) = self.events_per_transaction {
            report.notes.push(format!(
                "projection: {per_transaction:.1} events per transaction (effects over the \
                 distinct transactions that wrote them)"
            ));
        }
        for process in drive::memory_drift(&self.samples, from, to) {
            let framework =
                process.label.starts_with("relay") || process.label.starts_with("consumer");
            let label = &process.label;
            let Some(span) = process.judged else {
                report.notes.push(format!(
                    "{label}: started again {} time(s) during the memory window and no life of \
                     it covered half of it, so its RSS drift is not judged (the soaks judge \
                     memory)",
                    process.restarts
                ));
                continue;
            };
            let over = if process.restarts > 0 {
                format!(
                    ", over its longest life, {:.0}–{:.0} s (started again {} time(s))",
                    span.from, span.to, process.restarts
                )
            } else {
                String::new()
            };
            let change = format!(
                "{:+.1} % ({:.0} → {:.0} MiB){over}",
                span.drift() * 100.0,
                span.first / 1_048_576.0,
                span.last / 1_048_576.0
            );
            if framework {
                report.goals.push(Goal {
                    name: format!("{label} RSS drift after warm-up"),
                    value: change,
                    goal: format!("within ±{:.0} %", MEMORY_DRIFT_LIMIT * 100.0),
                    met: span.drift().abs() <= MEMORY_DRIFT_LIMIT,
                });
            } else {
                report.notes.push(format!(
                    "{label}: RSS {change} after warm-up (reference, not held to the goal)"
                ));
            }
        }
        report
            .parameters
            .push(("faults_struck".into(), self.strikes.faults.to_string()));
        report.parameters.push((
            "worker_exits_restarted".into(),
            self.unexpected_exits.len().to_string(),
        ));
        report.notes.extend(
            self.unexpected_exits
                .iter()
                .map(|exit| format!("{exit}; restarted")),
        );
        report.timeline.extend(self.strikes.timeline);
        // Pins are released outside the strikes' own record.
        report.timeline.sort_by(|a, b| a.0.total_cmp(&b.0));
        report.panels = drive::panels(&self.samples);
        if !self.pins.is_empty() {
            report.panels.extend(drive::horizon_panels(&self.samples));
        }
        for reading in self.pins {
            let phase = self
                .write_phases
                .iter()
                .rev()
                .find(|phase| phase.from <= reading.from)
                .copied();
            let (window, goals) = reading.judge(&self.samples, phase);
            report.goals.extend(goals);
            report.pins.push(window);
        }
        report.latency = Some(self.latency);
        report.hops = self.hops.hops;
        report.panels.push(self.hops.panel);
        if let Some(canary) = self.canary {
            report.notes.push(canary.note());
            report.reference_latencies.push(canary.latency);
        }
        report.verdict = Some(self.verdict);
        match self.statements {
            Some(statements) => report.statements = statements,
            None => report.notes.push(pg_statements::NOT_LOADED.into()),
        }
    }
}
