//! Pinning PostgreSQL's xmin horizon, as a long transaction does in production (`pg_dump`, a
//! report, a session left idle in transaction), and what the pipeline pays for it.
//!
//! A [`Pin`] is a connection of its own to the run's database holding a repeatable-read
//! transaction open, idle, after one read of the outbox: while its snapshot lives, vacuum
//! removes no tuple that died after it, so the outbox's claimed and published versions, the
//! relay's heartbeats and the consumer's offsets pile up as dead tuples, and statements that
//! walk dead index entries or HOT chains slow down with what changed since. A pin comes from
//! the `pin-xmin` fault or from `--pin-xmin-at` ([`PinArgs`]).
//!
//! Each pinned window's report ([`PinnedWindow`]) holds each statement's mean execution time
//! before and while pinned (from `pg_stat_statements` snapshots at the pin's start and
//! release), the framework tables' dead tuples, the oldest snapshot's age, and the outbox's
//! unpublished backlog before and while pinned; and two goals:
//! - every framework statement called at least [`MIN_CALLS`] times in both windows keeps its
//!   mean while pinned within [`PINNED_MEAN_LIMIT`] × its mean before;
//! - the backlog's peak while pinned stays within 2 × its peak before + 5 s of writes.

use crate::harness::drive::WritePhase;
use crate::harness::drive::{Origin, Sample};
use crate::harness::pg_statements::{self, Snapshot, StatementCount, HARNESS_TAG};
use crate::harness::rig::Rig;
use crate::harness::run_queue::{self, BackendTimes, RunQueueWait};
use crate::report::measures::Goal;
use anyhow::Context as _;
use serde::Serialize;
use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

/// Seconds the `pin-xmin` fault holds its pin (cut short at the end of the writes): long
/// enough for the relay's updates to leave thousands of dead versions behind it.
pub const FAULT_HOLD_SECS: RangeInclusive<u64> = 30..=120;

/// A framework statement's mean while the horizon is pinned may be this many times its mean
/// before (issue 53).
pub const PINNED_MEAN_LIMIT: f64 = 1.5;

/// Calls a statement needs in each window to be judged: fewer make a mean of a handful of
/// executions, which one slow plan or a checkpoint moves by more than the limit.
pub const MIN_CALLS: i64 = 100;

/// The backlog's peak while pinned may be this many times its peak before the pin …
const BACKLOG_FACTOR: f64 = 2.0;

/// … plus this many seconds of writes: a pipeline that keeps up has a peak of a few rows,
/// which doubled says nothing.
const BACKLOG_SLACK_SECS: f64 = 5.0;

/// The schema of the harness's own tables (`workload.rs`).
const APP_SCHEMA: &str = "load";

/// `--pin-xmin-at` and `--pin-xmin-for`, for the pipeline commands.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PinArgs {
    /// Pin PostgreSQL's xmin horizon this many seconds after the writes start (after the
    /// probe, if any): a transaction of the harness's takes a repeatable-read snapshot and
    /// stays open, idle, until the run ends (or --pin-xmin-for passes). The report compares
    /// each framework statement's mean time before and while pinned, and all of them together
    /// per committed write.
    #[arg(long, value_name = "SECS")]
    pub pin_xmin_at: Option<f64>,
    /// Release the pin this many seconds after it started, not at the end of the run.
    #[arg(long, value_name = "SECS", requires = "pin_xmin_at")]
    pub pin_xmin_for: Option<f64>,
}

impl PinArgs {
    /// The pin asked for, checked against writes lasting `write_secs`; `writes` names them in
    /// an error ("the soak's writes").
    pub fn schedule(&self, write_secs: f64, writes: &str) -> anyhow::Result<Option<PinSchedule>> {
        let Some(after) = self.pin_xmin_at else {
            anyhow::ensure!(
                self.pin_xmin_for.is_none(),
                "--pin-xmin-for needs --pin-xmin-at"
            );
            return Ok(None);
        };
        anyhow::ensure!(
            after.is_finite() && after >= 0.0,
            "--pin-xmin-at must be seconds ≥ 0, got {after}"
        );
        anyhow::ensure!(
            after < write_secs,
            "--pin-xmin-at {after} is beyond {writes} ({write_secs} s): the pin must start while \
             they run"
        );
        if let Some(hold) = self.pin_xmin_for {
            anyhow::ensure!(
                hold.is_finite() && hold > 0.0,
                "--pin-xmin-for must be seconds > 0, got {hold}"
            );
        }
        Ok(Some(PinSchedule {
            after,
            hold: self.pin_xmin_for,
        }))
    }
}

/// When to pin, from the start of a write phase.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PinSchedule {
    /// Seconds after the writes start.
    pub after: f64,
    /// Seconds to hold it; `None`: until the run's conclusion.
    pub hold: Option<f64>,
}

impl PinSchedule {
    /// The flags that asked for it.
    pub fn describe(&self) -> String {
        match self.hold {
            Some(hold) => format!("--pin-xmin-at {} --pin-xmin-for {hold}", self.after),
            None => format!("--pin-xmin-at {}", self.after),
        }
    }
}

/// Live and dead tuples of one table (`pg_stat_user_tables`).
#[derive(Debug, Clone, PartialEq)]
pub struct TupleCount {
    pub table: String,
    pub live: i64,
    pub dead: i64,
}

/// Where a pin's "before" window starts: the run's launch (the statement counts were reset
/// then) or the previous pin's release, with the counts at that instant.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// Seconds from the run's origin.
    pub at: f64,
    /// `None`: `pg_stat_statements` cannot be read.
    pub counts: Option<Snapshot>,
    /// The run database's backends then (none at the launch: every backend starts later).
    pub backends: Vec<BackendTimes>,
}

/// A pinned horizon: the transaction holding it and what was read as it started.
pub struct Pin {
    holder: tokio_postgres::Client,
    pub cause: String,
    /// When the pin took its snapshot, seconds from the run's origin.
    pub from: f64,
    /// When to release it, seconds from the run's origin (`None`: at the run's conclusion).
    pub release_at: Option<f64>,
    baseline: Baseline,
    at_start: Option<Snapshot>,
    backends_at_start: Vec<BackendTimes>,
    /// Reads the backends while pinned ([`Pin::observe_backends`]).
    observer: tokio_postgres::Client,
    observed_at: Instant,
    backends_seen: run_queue::Seen,
    tuples_at_start: Vec<TupleCount>,
    schema: String,
}

/// How often [`Pin::observe_backends`] reads the backends: a backend that ends counts up to
/// its last reading.
const OBSERVE_BACKENDS_EVERY: Duration = Duration::from_secs(2);

impl Pin {
    /// Reads the statement counts and the framework tables' tuples, then opens the pinning
    /// transaction on a connection of its own.
    pub async fn hold(
        rig: &Rig,
        origin: Origin,
        cause: String,
        release_at: Option<f64>,
        baseline: Baseline,
    ) -> anyhow::Result<Self> {
        let schema = rig.config.database.schema.clone();
        let reader = rig
            .client()
            .await
            .context("connect to read before pinning")?;
        let at_start = match baseline.counts {
            Some(_) => pg_statements::snapshot(&reader).await,
            None => None,
        };
        let backends_at_start = run_queue::read(&reader).await;
        let tuples_at_start = tuples(&reader, &schema).await?;
        let holder = rig.client().await.context("connect the xmin pin")?;
        // A server-wide idle timeout would end the pin early: this session is idle on purpose.
        holder
            .batch_execute(
                "SET idle_in_transaction_session_timeout = 0;
                 BEGIN ISOLATION LEVEL REPEATABLE READ",
            )
            .await
            .context("begin the pinning transaction")?;
        // The first read takes the transaction's snapshot, held until COMMIT.
        holder
            .query(
                &format!("{HARNESS_TAG} SELECT 1 FROM {schema}.outbox LIMIT 1"),
                &[],
            )
            .await
            .context("take the pin's snapshot")?;
        let mut backends_seen = run_queue::Seen::default();
        backends_seen.add(backends_at_start.clone());
        Ok(Self {
            holder,
            cause,
            from: origin.seconds(),
            release_at,
            baseline,
            at_start,
            backends_at_start,
            observer: reader,
            observed_at: Instant::now(),
            backends_seen,
            tuples_at_start,
            schema,
        })
    }

    /// Reads the run database's backends again, at most every [`OBSERVE_BACKENDS_EVERY`]
    /// (call it while pinned), so those that end before the release still count.
    pub async fn observe_backends(&mut self) {
        if self.observed_at.elapsed() < OBSERVE_BACKENDS_EVERY {
            return;
        }
        self.observed_at = Instant::now();
        self.backends_seen
            .add(run_queue::read(&self.observer).await);
    }

    /// Reads again while still pinned (statement counts, tuples, the oldest snapshot), then
    /// commits. A failed reading or a session already gone is noted, not an error: the run
    /// goes on.
    pub async fn release(self, rig: &Rig, origin: Origin) -> PinReading {
        let mut notes = Vec::new();
        let (at_end, backends_at_end, tuples_at_end, oldest) = match rig.client().await {
            Ok(reader) => {
                let at_end = match &self.at_start {
                    Some(_) => pg_statements::snapshot(&reader).await,
                    None => None,
                };
                let backends_at_end = run_queue::read(&reader).await;
                let tuples_at_end = tuples(&reader, &self.schema).await.unwrap_or_else(|e| {
                    notes.push(format!("tuples at the pin's release not read: {e:#}"));
                    Vec::new()
                });
                (
                    at_end,
                    backends_at_end,
                    tuples_at_end,
                    oldest_snapshot(&reader).await,
                )
            }
            Err(e) => {
                notes.push(format!("nothing read at the pin's release: {e:#}"));
                (None, Vec::new(), Vec::new(), None)
            }
        };
        if self.holder.is_closed() || self.holder.batch_execute("COMMIT").await.is_err() {
            notes.push(
                "the pin's session had ended before its release (a PostgreSQL restart ends it): \
                 the horizon may have moved on earlier"
                    .into(),
            );
        }
        let statements = match (self.baseline.counts, self.at_start, at_end) {
            (Some(baseline), Some(start), Some(end)) => Some([baseline, start, end]),
            _ => None,
        };
        PinReading {
            cause: self.cause,
            from: self.from,
            to: origin.seconds(),
            statements_from: self.baseline.at,
            schema: self.schema,
            statements,
            backends: [self.baseline.backends, self.backends_at_start, {
                let mut seen = self.backends_seen;
                seen.add(backends_at_end);
                seen.into_vec()
            }],
            tuples_at_start: self.tuples_at_start,
            tuples_at_end,
            oldest_snapshot_at_release: oldest,
            notes,
        }
    }
}

/// The live and dead tuples of every table of `schema`, by name.
async fn tuples(client: &tokio_postgres::Client, schema: &str) -> anyhow::Result<Vec<TupleCount>> {
    let rows = client
        .query(
            "SELECT relname::text, n_live_tup, n_dead_tup FROM pg_stat_user_tables
             WHERE schemaname = $1 ORDER BY relname",
            &[&schema],
        )
        .await
        .context("read pg_stat_user_tables")?;
    Ok(rows
        .iter()
        .map(|r| TupleCount {
            table: r.get(0),
            live: r.get(1),
            dead: r.get(2),
        })
        .collect())
}

/// The age in seconds of the oldest snapshot held in the current database by another session
/// than this one; `None` when none is held or it cannot be read.
async fn oldest_snapshot(client: &tokio_postgres::Client) -> Option<f64> {
    client
        .query_one(
            "SELECT extract(epoch FROM max(now() - xact_start))::float8 FROM pg_stat_activity
             WHERE datname = current_database() AND backend_xmin IS NOT NULL
               AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .ok()?
        .get(0)
}

/// What a released pin read, judged once the run is over ([`PinReading::judge`]).
#[derive(Debug, Clone)]
pub struct PinReading {
    pub cause: String,
    /// When the pin held its snapshot, seconds from the run's origin.
    pub from: f64,
    pub to: f64,
    /// Where the "before" statement counts start.
    pub statements_from: f64,
    /// The framework's schema.
    pub schema: String,
    /// The statement counts at `statements_from`, at the pin's start and at its release;
    /// `None` when `pg_stat_statements` could not be read at one of them.
    pub statements: Option<[Snapshot; 3]>,
    /// The run database's backends at `statements_from`, at the pin's start, and each one's
    /// last reading while pinned (at the release, or before it ended); empty where not read.
    pub backends: [Vec<BackendTimes>; 3],
    pub tuples_at_start: Vec<TupleCount>,
    pub tuples_at_end: Vec<TupleCount>,
    pub oldest_snapshot_at_release: Option<f64>,
    pub notes: Vec<String>,
}

impl PinReading {
    /// The window's report and its goals, from the run's `samples` and the write `phase` the
    /// pin started in (its pre-pin backlog and its write rate).
    pub fn judge(self, samples: &[Sample], phase: Option<WritePhase>) -> (PinnedWindow, Vec<Goal>) {
        let label = format!("{:.0}–{:.0} s", self.from, self.to);
        let mut notes = self.notes;
        let mut goals = Vec::new();
        let tables: Vec<&str> = self
            .tuples_at_start
            .iter()
            .chain(&self.tuples_at_end)
            .map(|t| t.table.as_str())
            .collect();
        let mut per_write = None;
        let statements = match &self.statements {
            None => {
                notes.push(
                    "pg_stat_statements could not be read: no statement compared before and \
                     while pinned"
                        .into(),
                );
                None
            }
            Some([baseline, start, end]) => {
                let compared = compare(
                    &baseline.counts,
                    &start.counts,
                    &end.counts,
                    &self.schema,
                    &tables,
                );
                match compared {
                    Ok(Compared {
                        statements,
                        went_back,
                    }) => {
                        notes.extend(eviction_note(went_back, [baseline, start, end]));
                        goals.push(statements_goal(&statements, &label));
                        goals.push(pages_goal(&statements, &label));
                        per_write = writes_between(samples, self.statements_from, self.from)
                            .zip(writes_between(samples, self.from, self.to))
                            .and_then(|(before, pinned)| PerWrite::of(&statements, before, pinned));
                        match &per_write {
                            Some(per_write) => goals.push(per_write.goal(&label)),
                            None => notes.push(
                                "no writes sampled in a window: the time per write is not judged"
                                    .into(),
                            ),
                        }
                        Some(statements)
                    }
                    Err(why) => {
                        notes.push(why);
                        None
                    }
                }
            }
        };
        let phase = phase.unwrap_or(WritePhase {
            from: 0.0,
            to: self.from,
            committed: 0,
        });
        let pending: Vec<(f64, i64)> = samples
            .iter()
            .filter_map(|s| Some((s.t, s.outbox_pending?)))
            .collect();
        let backlog = BacklogPeaks::of(&pending, phase.from, self.from, self.to, phase.rate());
        match backlog.goal(&label) {
            Some(goal) => goals.push(goal),
            None => notes.push(
                "the outbox backlog was not sampled while pinned: its goal is not judged".into(),
            ),
        }
        let oldest_snapshot_max_s = samples
            .iter()
            .filter_map(|s| s.oldest_snapshot_secs)
            .max_by(f64::total_cmp);
        let [baseline, start, end] = &self.backends;
        let run_queue = run_queue::compare([baseline, start, end]);
        let window = PinnedWindow {
            cause: self.cause,
            from_s: self.from,
            to_s: self.to,
            statements_from_s: self.statements_from,
            statements,
            per_write,
            tables: pair_tuples(&self.tuples_at_start, &self.tuples_at_end),
            oldest_snapshot_at_release_s: self.oldest_snapshot_at_release,
            oldest_snapshot_max_s,
            backlog,
            run_queue,
            notes,
        };
        (window, goals)
    }
}

/// Whose a statement is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    /// It names a table of the framework's schema and none of the harness's.
    Framework,
    /// It names a table of the harness's (`load`) schema, or carries [`HARNESS_TAG`].
    Harness,
}

/// Whose `query` is, from the tables it names (`schema.table`: the framework's statements
/// name their tables so, as the harness does); `None` when it names none of either (`BEGIN`,
/// `SET`, catalog reads).
pub fn owner(query: &str, schema: &str, framework_tables: &[&str]) -> Option<Owner> {
    if query.contains(HARNESS_TAG) {
        return Some(Owner::Harness);
    }
    let text = strip_comments(query);
    let mut framework = false;
    for token in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')) {
        let Some((prefix, table)) = token.rsplit_once('.') else {
            continue;
        };
        if prefix.eq_ignore_ascii_case(APP_SCHEMA) {
            return Some(Owner::Harness);
        }
        if prefix.eq_ignore_ascii_case(schema) && framework_tables.contains(&table) {
            framework = true;
        }
    }
    framework.then_some(Owner::Framework)
}

/// `query` without its `--` and `/* */` comments (the framework's statements are files that
/// start with a comment, which a collapsed one-line text would run into the statement).
fn strip_comments(query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    let mut rest = query;
    loop {
        let (line, block) = (rest.find("--"), rest.find("/*"));
        let is_block = match (line, block) {
            (Some(l), Some(b)) => b < l,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        let Some(at) = (if is_block { block } else { line }) else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..at]);
        if is_block {
            out.push(' ');
            let body = &rest[at + 2..];
            rest = body.find("*/").map_or("", |end| &body[end + 2..]);
        } else {
            rest = rest[at..].find('\n').map_or("", |end| &rest[at + end..]);
        }
    }
}

/// One statement before and while pinned.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PinnedStatement {
    /// `pg_stat_statements`' id: the same statement has the same id in every run on a server
    /// of the same major version.
    pub queryid: i64,
    /// Comments removed, whitespace collapsed, cut to 160 characters.
    pub query: String,
    pub owner: Owner,
    pub calls_before: i64,
    pub calls_pinned: i64,
    pub mean_ms_before: Option<f64>,
    pub mean_ms_pinned: Option<f64>,
    /// Shared buffers hit or read per call: the work a call did, whatever the CPU's load
    /// (on a saturated machine the time per call grows with the wait for a core).
    pub pages_before: Option<f64>,
    pub pages_pinned: Option<f64>,
    /// Mean while pinned over mean before, when both windows called it.
    pub ratio: Option<f64>,
    /// Held to the goal: the framework's, with [`MIN_CALLS`] calls in each window.
    pub judged: bool,
}

impl PinnedStatement {
    /// Its execution time summed over the calls before the pin, milliseconds.
    pub fn ms_before(&self) -> f64 {
        self.mean_ms_before.unwrap_or(0.0) * self.calls_before as f64
    }

    /// Its execution time summed over the calls while pinned, milliseconds.
    pub fn ms_pinned(&self) -> f64 {
        self.mean_ms_pinned.unwrap_or(0.0) * self.calls_pinned as f64
    }

    /// Pages a call while pinned over pages a call before, when both windows called it.
    pub fn pages_ratio(&self) -> Option<f64> {
        pinned_over_before(self.pages_before, self.pages_pinned)
    }
}

/// A figure while pinned over the same before, when both windows have it and before is above 0.
fn pinned_over_before(before: Option<f64>, pinned: Option<f64>) -> Option<f64> {
    match (before, pinned) {
        (Some(before), Some(pinned)) if before > 0.0 => Some(pinned / before),
        _ => None,
    }
}

/// The statements compared before and while pinned, and how many were left out because their
/// counts went back.
#[derive(Debug)]
pub struct Compared {
    pub statements: Vec<PinnedStatement>,
    pub went_back: usize,
}

/// A statement's calls, execution time and pages, cumulative or over a window.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    calls: i64,
    ms: f64,
    pages: i64,
}

impl Totals {
    fn of(count: &StatementCount) -> Self {
        Self {
            calls: count.calls,
            ms: count.total_ms,
            pages: count.pages,
        }
    }

    /// What was added from `earlier` to these.
    fn since(self, earlier: Totals) -> Totals {
        Totals {
            calls: self.calls - earlier.calls,
            ms: self.ms - earlier.ms,
            pages: self.pages - earlier.pages,
        }
    }

    /// `total` over the calls, `None` without calls.
    fn per_call(self, total: f64) -> Option<f64> {
        (self.calls > 0).then(|| total / self.calls as f64)
    }
}

/// Each statement's calls, mean and pages a call before (`start − baseline`) and while pinned
/// (`end − start`), the framework's first, each group by its time while pinned; statements of no one
/// and statements not called in either window are left out, and so is a statement whose count
/// went back (`pg_stat_statements` evicted it: a busy server, such as a test run's many
/// databases, sees more distinct statements than it keeps). `Err` when every statement counted
/// before went back: a PostgreSQL restart or a reset cleared them, and the windows cannot be
/// told apart.
pub fn compare(
    baseline: &[StatementCount],
    start: &[StatementCount],
    end: &[StatementCount],
    schema: &str,
    framework_tables: &[&str],
) -> Result<Compared, String> {
    let by_id = |counts: &[StatementCount]| -> HashMap<i64, Totals> {
        counts.iter().map(|c| (c.queryid, Totals::of(c))).collect()
    };
    let (at_baseline, at_start, at_end) = (by_id(baseline), by_id(start), by_id(end));
    let mut out = Vec::new();
    let mut went_back = 0;
    // Statements counted at the start (or the baseline) whose counts did not go back.
    let mut kept = 0;
    let mut seen = std::collections::HashSet::new();
    for count in end.iter().chain(start) {
        if !seen.insert(count.queryid) {
            continue;
        }
        let Some(owner) = owner(&count.query, schema, framework_tables) else {
            continue;
        };
        let of =
            |counts: &HashMap<i64, Totals>| counts.get(&count.queryid).copied().unwrap_or_default();
        let (at_baseline, at_start, at_end) = (of(&at_baseline), of(&at_start), of(&at_end));
        let (before, pinned) = (at_start.since(at_baseline), at_end.since(at_start));
        if before.calls < 0 || pinned.calls < 0 {
            went_back += 1;
            continue;
        }
        if at_start.calls > 0 || at_baseline.calls > 0 {
            kept += 1;
        }
        if before.calls == 0 && pinned.calls == 0 {
            continue;
        }
        let (mean_before, mean_pinned) = (before.per_call(before.ms), pinned.per_call(pinned.ms));
        let ratio = pinned_over_before(mean_before, mean_pinned);
        out.push(PinnedStatement {
            queryid: count.queryid,
            query: pg_statements::collapse(&strip_comments(&count.query), 160),
            owner,
            calls_before: before.calls,
            calls_pinned: pinned.calls,
            mean_ms_before: mean_before,
            mean_ms_pinned: mean_pinned,
            pages_before: before.per_call(before.pages as f64),
            pages_pinned: pinned.per_call(pinned.pages as f64),
            ratio,
            judged: owner == Owner::Framework
                && before.calls >= MIN_CALLS
                && pinned.calls >= MIN_CALLS
                && ratio.is_some(),
        });
    }
    if went_back > 0 && kept == 0 {
        return Err(format!(
            "pg_stat_statements counts of all {went_back} statement(s) went back during the pin \
             (a PostgreSQL restart or a reset cleared them): no statement compared before and \
             while pinned"
        ));
    }
    out.sort_by(|a, b| {
        (a.owner != Owner::Framework)
            .cmp(&(b.owner != Owner::Framework))
            .then(b.ms_pinned().total_cmp(&a.ms_pinned()))
    });
    Ok(Compared {
        statements: out,
        went_back,
    })
}

/// Says what `pg_stat_statements` evicted over the windows: the statements a comparison left
/// out, and the eviction passes when it could read them (an entry evicted and called again
/// counts from zero, and only a count that went back shows it); `None` when neither happened.
pub fn eviction_note(went_back: usize, [baseline, start, end]: [&Snapshot; 3]) -> Option<String> {
    let passes = |from: &Snapshot, to: &Snapshot| Some(to.evictions? - from.evictions?);
    let passes = passes(baseline, end).or_else(|| passes(start, end));
    let cause = "the server saw more distinct statements than pg_stat_statements.max keeps and \
                 evicted the least-used";
    match (went_back, passes) {
        (0, None | Some(0)) => None,
        (0, Some(n)) => Some(format!(
            "pg_stat_statements made {n} eviction pass(es) over the windows ({cause}); no \
             statement's count went back, but one evicted and called again would count only \
             from then on"
        )),
        (_, passes) => Some(format!(
            "pg_stat_statements counts of {went_back} statement(s) went back ({}; {cause}): left \
             out of the comparison and of the time per write",
            passes.map_or("eviction passes not read".into(), |n| format!(
                "{n} eviction pass(es) over the windows"
            ))
        )),
    }
}

/// Every judged framework statement's mean while pinned within [`PINNED_MEAN_LIMIT`] × its
/// mean before; not met when none could be judged (a goal nothing tested is no result).
pub fn statements_goal(statements: &[PinnedStatement], label: &str) -> Goal {
    worst_goal(
        statements,
        |s| s.ratio,
        format!("framework statements' mean while xmin pinned ({label})"),
        format!("each ≤ {PINNED_MEAN_LIMIT}× its mean before (≥ {MIN_CALLS} calls in each window)"),
    )
}

/// The same for pages a call, the work a call did: on a machine whose CPU the run saturates
/// (the application's own hot rows slow down under a pin, run D2) every statement's time grows
/// with the wait for a core, its pages do not.
pub fn pages_goal(statements: &[PinnedStatement], label: &str) -> Goal {
    worst_goal(
        statements,
        PinnedStatement::pages_ratio,
        format!("framework statements' pages a call while xmin pinned ({label})"),
        format!("each ≤ {PINNED_MEAN_LIMIT}× its pages a call before (≥ {MIN_CALLS} calls in each window)"),
    )
}

/// The judged statements' worst `ratio` (a statement without one counts as 0) against
/// [`PINNED_MEAN_LIMIT`].
fn worst_goal(
    statements: &[PinnedStatement],
    ratio: impl Fn(&PinnedStatement) -> Option<f64>,
    name: String,
    goal: String,
) -> Goal {
    let ratio = |s: &PinnedStatement| ratio(s).unwrap_or(0.0);
    let judged: Vec<&PinnedStatement> = statements.iter().filter(|s| s.judged).collect();
    let worst = judged.iter().max_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let over = judged
        .iter()
        .filter(|s| ratio(s) > PINNED_MEAN_LIMIT)
        .count();
    Goal {
        name,
        value: match worst {
            Some(worst) => format!(
                "worst {:.2}× ({over} of {} over): {}",
                ratio(worst),
                judged.len(),
                worst.query.chars().take(60).collect::<String>()
            ),
            None => format!("no framework statement had {MIN_CALLS} calls in both windows"),
        },
        goal,
        met: !judged.is_empty() && over == 0,
    }
}

/// The framework's PostgreSQL time per committed write before and while pinned: P9 promises
/// the same cost per event. It weighs each statement by how often a write makes it run, which
/// a mean per call does not: a statement that runs once a second per shard (the claim's floor
/// look) can double its mean and add a few hundredths of a millisecond a write.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PerWrite {
    pub writes_before: i64,
    pub writes_pinned: i64,
    /// Milliseconds of the framework's statements per committed write.
    pub ms_before: f64,
    pub ms_pinned: f64,
}

impl PerWrite {
    /// Every framework statement's time in each window over the writes committed in it;
    /// `None` when a window committed nothing.
    pub fn of(
        statements: &[PinnedStatement],
        writes_before: i64,
        writes_pinned: i64,
    ) -> Option<Self> {
        if writes_before <= 0 || writes_pinned <= 0 {
            return None;
        }
        let framework = || statements.iter().filter(|s| s.owner == Owner::Framework);
        Some(Self {
            writes_before,
            writes_pinned,
            ms_before: framework().map(PinnedStatement::ms_before).sum::<f64>()
                / writes_before as f64,
            ms_pinned: framework().map(PinnedStatement::ms_pinned).sum::<f64>()
                / writes_pinned as f64,
        })
    }

    pub fn ratio(&self) -> f64 {
        self.ms_pinned / self.ms_before
    }

    pub fn goal(&self, label: &str) -> Goal {
        Goal {
            name: format!(
                "framework statements' time per committed write while xmin pinned ({label})"
            ),
            value: format!(
                "{:.3} → {:.3} ms ({:.2}×; {} and {} writes)",
                self.ms_before,
                self.ms_pinned,
                self.ratio(),
                self.writes_before,
                self.writes_pinned
            ),
            goal: format!("≤ {PINNED_MEAN_LIMIT}× before (P9: the same cost per event)"),
            met: self.ms_before > 0.0 && self.ratio() <= PINNED_MEAN_LIMIT,
        }
    }
}

/// Writes committed in `[from, to]` by the run's samples of its cumulative count (the last
/// sample at or before each instant); `None` when no sample lies at or before `from`.
pub fn writes_between(samples: &[Sample], from: f64, to: f64) -> Option<i64> {
    let at = |t: f64| {
        samples
            .iter()
            .filter(|s| s.t <= t)
            .max_by(|a, b| a.t.total_cmp(&b.t))
            .map(|s| s.written)
    };
    match (at(from), at(to)) {
        (Some(a), Some(b)) => Some(b - a),
        // The run's first sample comes a moment after its writes start, which start at 0.
        (None, Some(b)) if from <= 0.0 => Some(b),
        _ => None,
    }
}

/// The outbox's unpublished rows at their highest before and while pinned.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BacklogPeaks {
    /// Where the pre-pin window starts: the start of the writes the pin came in (a probe's
    /// full-speed backlog before them is no comparison).
    pub before_from_s: f64,
    /// `None`: not sampled in the window.
    pub peak_before: Option<i64>,
    pub peak_pinned: Option<i64>,
    /// Committed writes per second in the pin's write phase.
    pub write_rate: f64,
    /// What the peak while pinned may reach: 2 × the peak before + 5 s of writes.
    pub limit: f64,
}

impl BacklogPeaks {
    /// From `(t, unpublished)` samples: the peak in `[before_from, from)` and in `[from, to]`.
    pub fn of(
        pending: &[(f64, i64)],
        before_from: f64,
        from: f64,
        to: f64,
        write_rate: f64,
    ) -> Self {
        let peak = |a: f64, b: f64, closed: bool| {
            pending
                .iter()
                .filter(|(t, _)| *t >= a && (*t < b || (closed && *t <= b)))
                .map(|(_, n)| *n)
                .max()
        };
        let peak_before = peak(before_from, from, false);
        Self {
            before_from_s: before_from,
            peak_before,
            peak_pinned: peak(from, to, true),
            write_rate,
            limit: BACKLOG_FACTOR * peak_before.unwrap_or(0) as f64
                + BACKLOG_SLACK_SECS * write_rate,
        }
    }

    /// The goal, unless nothing was sampled while pinned.
    pub fn goal(&self, label: &str) -> Option<Goal> {
        let pinned = self.peak_pinned?;
        let before = self
            .peak_before
            .map_or("none sampled".to_string(), |n| n.to_string());
        Some(Goal {
            name: format!("outbox backlog peak while xmin pinned ({label})"),
            value: format!("{pinned} rows (before: {before})"),
            goal: format!(
                "≤ {BACKLOG_FACTOR} × peak before + {BACKLOG_SLACK_SECS} s × {:.0}/s = {:.0}",
                self.write_rate, self.limit
            ),
            met: pinned as f64 <= self.limit,
        })
    }
}

/// One framework table's tuples at the pin's start and release.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TableTuples {
    pub table: String,
    pub live_at_start: i64,
    pub dead_at_start: i64,
    pub live_at_end: i64,
    pub dead_at_end: i64,
}

/// Each table read at either instant, with zero where the other did not read it.
fn pair_tuples(start: &[TupleCount], end: &[TupleCount]) -> Vec<TableTuples> {
    let mut names: Vec<&str> = start.iter().chain(end).map(|t| t.table.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let find = |list: &[TupleCount], name: &str| {
        list.iter()
            .find(|t| t.table == name)
            .map_or((0, 0), |t| (t.live, t.dead))
    };
    names
        .into_iter()
        .map(|name| {
            let ((live_at_start, dead_at_start), (live_at_end, dead_at_end)) =
                (find(start, name), find(end, name));
            TableTuples {
                table: name.to_string(),
                live_at_start,
                dead_at_start,
                live_at_end,
                dead_at_end,
            }
        })
        .collect()
}

/// A pinned window as the report shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PinnedWindow {
    /// What pinned the horizon (`pin-xmin fault`, `--pin-xmin-at 90`).
    pub cause: String,
    /// When the pin held its snapshot, seconds from the run's origin.
    pub from_s: f64,
    pub to_s: f64,
    /// Where the "before" statement counts start: the launch, or the previous pin's release.
    pub statements_from_s: f64,
    /// `None`: not compared (the notes say why).
    pub statements: Option<Vec<PinnedStatement>>,
    /// `None`: not compared, or a window committed no write.
    pub per_write: Option<PerWrite>,
    /// The framework's tables.
    pub tables: Vec<TableTuples>,
    /// The oldest snapshot in the run's database as the pin was released (the pin's own,
    /// unless another is older).
    pub oldest_snapshot_at_release_s: Option<f64>,
    /// The oldest snapshot's age at its highest over the run, as sampled.
    pub oldest_snapshot_max_s: Option<f64>,
    pub backlog: BacklogPeaks,
    /// Seconds each application's backends waited for a core per second of CPU, before and
    /// while pinned: what a statement's time holds besides its work on a busy machine.
    pub run_queue: Vec<RunQueueWait>,
    pub notes: Vec<String>,
}

/// Harness statements listed per window (they are not judged).
const HARNESS_LISTED: usize = 5;

impl PinnedWindow {
    fn heading(&self) -> String {
        format!(
            "xmin pinned {:.1}–{:.1} s ({}); statements before: {:.1}–{:.1} s",
            self.from_s, self.to_s, self.cause, self.statements_from_s, self.from_s
        )
    }

    /// The rows a report lists: every framework statement, then the harness's costliest.
    fn listed(&self) -> Vec<&PinnedStatement> {
        let all = self.statements.iter().flatten();
        all.clone()
            .filter(|s| s.owner == Owner::Framework)
            .chain(
                all.filter(|s| s.owner == Owner::Harness)
                    .take(HARNESS_LISTED),
            )
            .collect()
    }

    fn oldest(&self) -> String {
        let secs = |s: Option<f64>| s.map_or("none".to_string(), |s| format!("{s:.1} s"));
        format!(
            "oldest snapshot in the run's database: {} at the release, {} at most as sampled \
             over the run",
            secs(self.oldest_snapshot_at_release_s),
            secs(self.oldest_snapshot_max_s)
        )
    }

    fn per_write_line(&self) -> Option<String> {
        let p = self.per_write?;
        Some(format!(
            "the framework's statements per committed write: {:.3} ms before ({} writes), {:.3} \
             ms while pinned ({} writes): {:.2}×",
            p.ms_before,
            p.writes_before,
            p.ms_pinned,
            p.writes_pinned,
            p.ratio()
        ))
    }

    fn run_queue_line(&self) -> Option<String> {
        run_queue::describe(&self.run_queue).map(|waits| {
            format!(
                "PostgreSQL backends' run-queue wait per second of CPU, before → pinned \
                 (/proc/<pid>/schedstat): {waits}"
            )
        })
    }

    fn backlog_line(&self) -> String {
        let peak = |p: Option<i64>| p.map_or("none sampled".to_string(), |n| n.to_string());
        format!(
            "outbox unpublished at its peak: {} before the pin (from {:.1} s), {} while pinned",
            peak(self.backlog.peak_before),
            self.backlog.before_from_s,
            peak(self.backlog.peak_pinned)
        )
    }

    pub fn to_text(&self) -> String {
        let mut out = format!("  {}\n", self.heading());
        if self.statements.is_some() {
            out += &format!(
                "    {:>9} {:>9} {:>9} {:>9} {:>7} {:>13}  statement (pg_stat_statements; \
                 ratio in parentheses: not judged, < {MIN_CALLS} calls in a window)\n",
                "calls bef", "calls pin", "ms before", "ms pinned", "ratio", "pages a call"
            );
            let mut harness_heading = false;
            for st in self.listed() {
                if st.owner == Owner::Harness && !harness_heading {
                    out += "    the harness's own statements (not judged):\n";
                    harness_heading = true;
                }
                out += &format!(
                    "    {:>9} {:>9} {:>9} {:>9} {:>7} {:>13}  {}\n",
                    st.calls_before,
                    st.calls_pinned,
                    ms(st.mean_ms_before),
                    ms(st.mean_ms_pinned),
                    ratio(st),
                    pages(st),
                    st.query.chars().take(90).collect::<String>()
                );
            }
        }
        for line in self
            .per_write_line()
            .into_iter()
            .chain(self.run_queue_line())
        {
            out += &format!("    {line}\n");
        }
        out += "    dead tuples (live) at the pin's start → release:";
        let changed: Vec<String> = self
            .tables
            .iter()
            .filter(|t| t.live_at_start + t.dead_at_start + t.live_at_end + t.dead_at_end > 0)
            .map(|t| {
                format!(
                    "{} {} → {} ({} → {})",
                    t.table, t.dead_at_start, t.dead_at_end, t.live_at_start, t.live_at_end
                )
            })
            .collect();
        out += &if changed.is_empty() {
            " every table empty\n".to_string()
        } else {
            format!("\n      {}\n", changed.join("\n      "))
        };
        out += &format!("    {}\n    {}\n", self.oldest(), self.backlog_line());
        for note in &self.notes {
            out += &format!("    note: {note}\n");
        }
        out
    }

    pub fn to_markdown(&self) -> String {
        let mut out = format!("\n## {}\n\n", self.heading());
        if self.statements.is_some() {
            out += &format!(
                "Mean execution time per statement before and while pinned (pg_stat_statements); \
                 a ratio in parentheses is not judged (fewer than {MIN_CALLS} calls in a \
                 window, or the harness's own). Pages a call (shared buffers hit or read) are \
                 the work a call did, which a saturated CPU does not inflate.\n\n\
                 | whose | calls before | calls pinned | mean ms before | mean ms pinned | ratio | pages a call | statement |\n\
                 |---|---:|---:|---:|---:|---:|---:|---|\n"
            );
            for st in self.listed() {
                out += &format!(
                    "| {} | {} | {} | {} | {} | {} | {} | `{}` |\n",
                    match st.owner {
                        Owner::Framework => "framework",
                        Owner::Harness => "harness",
                    },
                    st.calls_before,
                    st.calls_pinned,
                    ms(st.mean_ms_before),
                    ms(st.mean_ms_pinned),
                    ratio(st),
                    pages(st),
                    st.query.replace('|', "\\|").replace('`', "'")
                );
            }
        }
        for line in self
            .per_write_line()
            .into_iter()
            .chain(self.run_queue_line())
        {
            out += &format!("\n{line}.\n");
        }
        out += "\n| table | dead at start | dead at release | live at start | live at release |\n\
                |---|---:|---:|---:|---:|\n";
        for t in &self.tables {
            out += &format!(
                "| {} | {} | {} | {} | {} |\n",
                t.table, t.dead_at_start, t.dead_at_end, t.live_at_start, t.live_at_end
            );
        }
        out += &format!("\n- {}\n- {}\n", self.oldest(), self.backlog_line());
        for note in &self.notes {
            out += &format!("- {note}\n");
        }
        out
    }
}

/// A figure of a window to `decimals` places, or `—` when the window did not call the
/// statement.
fn per_call(value: Option<f64>, decimals: usize) -> String {
    value.map_or("—".to_string(), |v| format!("{v:.decimals$}"))
}

/// A mean in milliseconds.
fn ms(mean: Option<f64>) -> String {
    per_call(mean, 3)
}

/// Pages a call before → while pinned (`12.0 → 13.5`).
fn pages(st: &PinnedStatement) -> String {
    let (before, pinned) = (per_call(st.pages_before, 1), per_call(st.pages_pinned, 1));
    format!("{before} → {pinned}")
}

/// `1.23×`, `(1.23×)` when not judged, `new` when not called before, `—` when not called while
/// pinned.
fn ratio(st: &PinnedStatement) -> String {
    match (st.ratio, st.calls_before, st.calls_pinned) {
        (Some(r), _, _) if st.judged => format!("{r:.2}×"),
        (Some(r), _, _) => format!("({r:.2}×)"),
        (None, 0, _) => "new".into(),
        _ => "—".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLES: [&str; 3] = ["outbox", "outbox_versions", "relay_instances"];

    /// A statement's counts reading 2 pages a call.
    fn count(queryid: i64, query: &str, calls: i64, total_ms: f64) -> StatementCount {
        StatementCount {
            queryid,
            query: query.into(),
            calls,
            total_ms,
            pages: 2 * calls,
        }
    }

    const CLAIM: &str =
        "-- Claims a batch.\nUPDATE courier.outbox SET locked_at = now() WHERE id = $1";

    const MARK: &str = "UPDATE courier.outbox SET published_at = now() WHERE id = $1";

    #[test]
    fn statements_are_the_frameworks_when_they_name_only_its_tables() {
        let owner = |q: &str| owner(q, "courier", &TABLES);
        assert_eq!(owner(CLAIM), Some(Owner::Framework));
        assert_eq!(
            owner("INSERT INTO courier.relay_instances (id) VALUES ($1)"),
            Some(Owner::Framework)
        );
        // The harness's tables, alone or beside the framework's; a tagged read of the outbox.
        assert_eq!(
            owner("SELECT max(seq) FROM load.writes, courier.outbox"),
            Some(Owner::Harness)
        );
        assert_eq!(
            owner(&format!(
                "{HARNESS_TAG} SELECT count(*) FROM courier.outbox"
            )),
            Some(Owner::Harness)
        );
        // No table of either; a name in a comment or a column of that name is no table.
        assert_eq!(owner("BEGIN"), None);
        assert_eq!(owner("SELECT outbox FROM pg_class"), None);
        assert_eq!(owner("-- see courier.outbox\nSELECT $1"), None);
        assert_eq!(owner("SELECT o.id FROM other.outbox o"), None);
    }

    #[test]
    fn comments_are_stripped_before_the_text_is_collapsed() {
        assert_eq!(
            pg_statements::collapse(&strip_comments(CLAIM), 160),
            "UPDATE courier.outbox SET locked_at = now() WHERE id = $1"
        );
        assert_eq!(strip_comments("a /* b */ c -- d\ne"), "a   c \ne");
        assert_eq!(strip_comments("a /* unterminated"), "a  ");
    }

    #[test]
    fn before_is_start_minus_baseline_and_pinned_is_end_minus_start() {
        let baseline = [count(1, CLAIM, 50, 50.0)];
        let start = [count(1, CLAIM, 250, 250.0)];
        let end = [count(1, CLAIM, 450, 550.0)];
        let compared = compare(&baseline, &start, &end, "courier", &TABLES)
            .expect("no reset")
            .statements;
        assert_eq!(compared.len(), 1);
        let claim = &compared[0];
        assert_eq!((claim.calls_before, claim.calls_pinned), (200, 200));
        assert_eq!(claim.mean_ms_before, Some(1.0));
        assert_eq!(claim.mean_ms_pinned, Some(1.5));
        assert_eq!(claim.ratio, Some(1.5));
        assert!(claim.judged);
        assert!(statements_goal(&compared, "w").met, "1.5× is within 1.5×");
    }

    #[test]
    fn pages_a_call_are_counted_and_judged_per_window_apart_from_the_time() {
        let with_pages = |calls, ms, pages| StatementCount {
            pages,
            ..count(1, CLAIM, calls, ms)
        };
        let baseline = [with_pages(50, 50.0, 500)];
        let start = [with_pages(250, 250.0, 2_500)];
        // Twice the time a call while pinned (a busy CPU), the same pages a call.
        let end = [with_pages(450, 650.0, 4_500)];
        let compared = compare(&baseline, &start, &end, "courier", &TABLES).expect("no reset");
        let claim = &compared.statements[0];
        assert_eq!(
            (claim.pages_before, claim.pages_pinned),
            (Some(10.0), Some(10.0))
        );
        assert_eq!(claim.ratio, Some(2.0));
        assert_eq!(pages(claim), "10.0 → 10.0");
        assert!(!statements_goal(&compared.statements, "w").met);
        let goal = pages_goal(&compared.statements, "w");
        assert!(goal.met, "the same pages a call: {goal:?}");
        assert!(
            goal.value.starts_with("worst 1.00× (0 of 1 over)"),
            "{}",
            goal.value
        );
        // The same time a call, 1.6× the pages.
        let end = [with_pages(450, 450.0, 2_500 + 200 * 16)];
        let compared = compare(&baseline, &start, &end, "courier", &TABLES).expect("no reset");
        assert!(statements_goal(&compared.statements, "w").met);
        let goal = pages_goal(&compared.statements, "w");
        assert!(!goal.met, "1.6× the pages: {goal:?}");
        assert!(
            goal.value.starts_with("worst 1.60× (1 of 1 over)"),
            "{}",
            goal.value
        );
    }

    #[test]
    fn new_rare_and_harness_statements_are_listed_but_not_judged() {
        let park = "INSERT INTO courier.outbox_versions (k) VALUES ($1)";
        let sampler = "SELECT count(*) FROM load.writes";
        let start = [
            count(1, CLAIM, 500, 500.0),
            count(2, MARK, 99, 99.0),
            count(4, sampler, 500, 50.0),
        ];
        let end = [
            count(1, CLAIM, 1_000, 1_100.0),
            // Under the call threshold before: 10× slower, but not judged.
            count(2, MARK, 299, 2_099.0),
            // Seen only while pinned.
            count(3, park, 300, 30.0),
            count(4, sampler, 1_000, 5_050.0),
            count(5, "BEGIN", 9_000, 1.0),
        ];
        let compared = compare(&[], &start, &end, "courier", &TABLES)
            .expect("no reset")
            .statements;
        let find = |q: &str| {
            compared
                .iter()
                .find(|s| s.query == q)
                .unwrap_or_else(|| panic!("{q} not listed: {compared:?}"))
        };
        assert_eq!(compared.len(), 4, "BEGIN names no table: {compared:?}");
        assert!(!find(MARK).judged);
        assert_eq!(find(MARK).ratio, Some(10.0));
        let new = find(park);
        assert_eq!(
            (new.calls_before, new.mean_ms_before, new.ratio),
            (0, None, None)
        );
        assert!(!new.judged);
        assert_eq!(ratio(new), "new");
        let harness = find(sampler);
        assert_eq!(harness.owner, Owner::Harness);
        assert!(!harness.judged, "100× slower, but the harness's");
        // The framework's first, the harness's last.
        assert_eq!(compared[3].owner, Owner::Harness);
        // Only the claim is judged, at 1.2×.
        let goal = statements_goal(&compared, "40–100 s");
        assert!(goal.met, "{goal:?}");
        assert!(
            goal.value.starts_with("worst 1.20× (0 of 1 over)"),
            "{}",
            goal.value
        );
    }

    #[test]
    fn one_slow_framework_statement_misses_the_goal_and_none_judged_is_no_success() {
        let start = [count(1, CLAIM, 500, 500.0)];
        let end = [count(1, CLAIM, 1_000, 1_300.0)];
        let compared = compare(&[], &start, &end, "courier", &TABLES)
            .expect("no reset")
            .statements;
        let goal = statements_goal(&compared, "w");
        assert!(!goal.met, "1.6× is over 1.5×: {goal:?}");
        assert!(goal.value.contains("(1 of 1 over)"), "{}", goal.value);
        let goal = statements_goal(&[], "w");
        assert!(!goal.met);
        assert!(
            goal.value.contains("no framework statement"),
            "{}",
            goal.value
        );
    }

    #[test]
    fn counts_that_all_went_back_are_no_comparison() {
        let start = [count(1, CLAIM, 500, 500.0), count(2, MARK, 300, 30.0)];
        // A restart: every count from zero, and a statement not called since is gone.
        let end = [count(1, CLAIM, 20, 30.0)];
        let why = compare(&[], &start, &end, "courier", &TABLES).expect_err("a reset");
        assert!(why.contains("all 2 statement(s) went back"), "{why}");
        // A reset between the baseline and the pin's start goes back as well.
        let baseline = [count(1, CLAIM, 500, 500.0)];
        let start = [count(1, CLAIM, 20, 30.0)];
        let end = [count(1, CLAIM, 220, 230.0)];
        assert!(compare(&baseline, &start, &end, "courier", &TABLES).is_err());
    }

    #[test]
    fn a_statement_evicted_while_others_kept_their_counts_is_left_out_and_said() {
        let gauge = "SELECT count(*) FROM courier.outbox";
        let start = [
            count(1, CLAIM, 500, 500.0),
            count(2, MARK, 300, 30.0),
            count(3, gauge, 9, 9.0),
        ];
        // The gauge's entry evicted and called again; the mark's evicted and not called since.
        let end = [count(1, CLAIM, 1_000, 1_100.0), count(3, gauge, 2, 2.0)];
        let Compared {
            statements,
            went_back,
        } = compare(&[], &start, &end, "courier", &TABLES).expect("an eviction, not a reset");
        assert_eq!(went_back, 2);
        assert_eq!(statements.len(), 1, "{statements:?}");
        assert_eq!(statements[0].ratio, Some(1.2));
        let snapshot = |evictions| Snapshot {
            counts: Vec::new(),
            evictions,
        };
        let (launch, start, end) = (snapshot(None), snapshot(Some(4)), snapshot(Some(7)));
        let note = eviction_note(went_back, [&launch, &start, &end]).expect("a note");
        assert!(
            note.contains("2 statement(s) went back (3 eviction pass(es)")
                && note.contains("pg_stat_statements.max"),
            "{note}"
        );
        let note = eviction_note(0, [&launch, &start, &end]).expect("passes alone are said");
        assert!(note.contains("made 3 eviction pass(es)"), "{note}");
        assert_eq!(eviction_note(0, [&launch, &start, &start]), None);
        let unread = eviction_note(1, [&launch, &launch, &launch]).expect("a note");
        assert!(unread.contains("eviction passes not read"), "{unread}");
    }

    #[test]
    fn the_backlog_may_reach_twice_its_peak_before_plus_five_seconds_of_writes() {
        let pending = [
            (0.0, 9_000), // a probe, before the writes the pin came in
            (10.0, 40),
            (20.0, 60),
            (30.0, 500), // the pin's start
            (40.0, 1_600),
            (50.0, 300),
            (60.0, 99_999), // after the release
        ];
        let peaks = BacklogPeaks::of(&pending, 5.0, 30.0, 50.0, 300.0);
        assert_eq!(peaks.peak_before, Some(60));
        assert_eq!(peaks.peak_pinned, Some(1_600));
        assert_eq!(peaks.limit, 2.0 * 60.0 + 5.0 * 300.0);
        let goal = peaks.goal("30–50 s").expect("sampled while pinned");
        assert!(goal.met, "1,600 ≤ 1,620: {goal:?}");
        let over = BacklogPeaks::of(&[(10.0, 60), (40.0, 1_621)], 5.0, 30.0, 50.0, 300.0);
        assert!(!over.goal("w").expect("sampled").met);
        // Nothing sampled before: the allowance is the five seconds of writes alone.
        let early = BacklogPeaks::of(&[(31.0, 1_400)], 30.0, 30.0, 50.0, 300.0);
        assert_eq!(early.peak_before, None);
        assert!(early.goal("w").expect("sampled").met);
        // Nothing sampled while pinned: no goal.
        assert!(BacklogPeaks::of(&[(10.0, 1)], 5.0, 30.0, 31.0, 300.0)
            .goal("w")
            .is_none());
    }

    #[test]
    fn the_pin_flags_are_checked_against_the_writes() {
        let args = |at: Option<f64>, hold: Option<f64>| PinArgs {
            pin_xmin_at: at,
            pin_xmin_for: hold,
        };
        assert_eq!(
            args(None, None).schedule(600.0, "the soak's writes").ok(),
            Some(None)
        );
        assert_eq!(
            args(Some(90.0), None)
                .schedule(600.0, "the soak's writes")
                .expect("valid"),
            Some(PinSchedule {
                after: 90.0,
                hold: None
            })
        );
        let error = |a: PinArgs| {
            a.schedule(600.0, "the soak's writes")
                .expect_err("invalid")
                .to_string()
        };
        let beyond = error(args(Some(600.0), None));
        assert!(
            beyond.contains("--pin-xmin-at 600") && beyond.contains("the soak's writes (600 s)"),
            "{beyond}"
        );
        assert!(error(args(Some(-1.0), None)).contains("--pin-xmin-at"));
        assert!(error(args(Some(f64::NAN), None)).contains("--pin-xmin-at"));
        assert!(error(args(Some(10.0), Some(0.0))).contains("--pin-xmin-for"));
        assert!(error(args(None, Some(10.0))).contains("--pin-xmin-for needs --pin-xmin-at"));
        assert_eq!(
            PinSchedule {
                after: 90.0,
                hold: Some(30.0)
            }
            .describe(),
            "--pin-xmin-at 90 --pin-xmin-for 30"
        );
    }

    #[test]
    fn the_window_lists_the_frameworks_statements_and_the_tables_tuples() {
        let reading = PinReading {
            cause: "--pin-xmin-at 40".into(),
            from: 45.0,
            to: 100.0,
            statements_from: 0.0,
            schema: "courier".into(),
            statements: Some(
                [
                    Vec::new(),
                    vec![count(1, CLAIM, 500, 500.0)],
                    vec![count(1, CLAIM, 1_000, 600.0)],
                ]
                .map(|counts| Snapshot {
                    counts,
                    evictions: None,
                }),
            ),
            backends: [
                Vec::new(),
                vec![BackendTimes {
                    pid: 7,
                    application: "courier-relay".into(),
                    cpu_ns: 1_000,
                    wait_ns: 2_000,
                }],
                vec![BackendTimes {
                    pid: 7,
                    application: "courier-relay".into(),
                    cpu_ns: 2_000,
                    wait_ns: 6_000,
                }],
            ],
            tuples_at_start: vec![TupleCount {
                table: "outbox".into(),
                live: 10,
                dead: 5,
            }],
            tuples_at_end: vec![
                TupleCount {
                    table: "outbox".into(),
                    live: 20,
                    dead: 5_000,
                },
                TupleCount {
                    table: "relay_instances".into(),
                    live: 1,
                    dead: 0,
                },
            ],
            oldest_snapshot_at_release: Some(55.0),
            notes: Vec::new(),
        };
        let (window, goals) = reading.judge(&[], None);
        assert_eq!(
            goals.len(),
            2,
            "time and pages, no backlog sampled: {goals:?}"
        );
        assert!(goals.iter().all(|g| g.met), "{goals:?}");
        assert_eq!(window.tables.len(), 2);
        assert_eq!(window.tables[0].dead_at_end, 5_000);
        assert_eq!(window.tables[1].dead_at_start, 0, "not read at the start");
        let text = window.to_text();
        assert!(
            text.contains("xmin pinned 45.0–100.0 s (--pin-xmin-at 40)"),
            "{text}"
        );
        assert!(text.contains("outbox 5 → 5000 (10 → 20)"), "{text}");
        assert!(text.contains("0.20×"), "{text}");
        assert!(text.contains(" 2.0 → 2.0  UPDATE"), "pages a call: {text}");
        assert!(text.contains("55.0 s at the release"), "{text}");
        let waits = "run-queue wait per second of CPU, before → pinned (/proc/<pid>/schedstat): \
                     courier-relay 2.00 → 4.00";
        assert!(text.contains(waits), "{text}");
        let md = window.to_markdown();
        assert!(md.contains(waits), "{md}");
        assert!(
            md.contains("| framework | 500 | 500 | 1.000 | 0.200 | 0.20× | 2.0 → 2.0 |"),
            "{md}"
        );
        assert!(md.contains("| outbox | 5 | 5000 | 10 | 20 |"), "{md}");
    }

    #[test]
    fn time_per_write_weighs_each_statement_by_its_calls() {
        let floor = "SELECT min(seq) FROM courier.outbox WHERE shard = $1";
        let start = [count(1, CLAIM, 1_000, 100.0), count(2, floor, 100, 10.0)];
        // The claim as before a call; the rare floor look 3× slower: 20 ms more in 1,000
        // writes, 1.18× a write, though its own mean tripled.
        let end = [count(1, CLAIM, 2_000, 200.0), count(2, floor, 200, 40.0)];
        let compared = compare(&[], &start, &end, "courier", &TABLES)
            .expect("no reset")
            .statements;
        assert!(!statements_goal(&compared, "w").met, "3× a call");
        let per_write = PerWrite::of(&compared, 1_000, 1_000).expect("writes in both");
        assert!((per_write.ms_before - 0.110).abs() < 1e-9, "{per_write:?}");
        assert!((per_write.ms_pinned - 0.130).abs() < 1e-9, "{per_write:?}");
        assert!(per_write.goal("w").met, "1.18× a write");
        // Half the writes while pinned for the same time: twice the cost of each.
        let per_write = PerWrite::of(&compared, 1_000, 500).expect("writes in both");
        assert!(!per_write.goal("w").met, "{per_write:?}");
        assert_eq!(PerWrite::of(&compared, 1_000, 0), None);
    }

    #[test]
    fn writes_between_reads_the_last_sample_at_or_before_each_instant() {
        let sample = |t, written| Sample::for_test(t, written, 0);
        let samples = [sample(0.5, 40), sample(1.5, 150), sample(2.5, 260)];
        assert_eq!(writes_between(&samples, 1.5, 2.9), Some(110));
        assert_eq!(writes_between(&samples, 1.0, 2.0), Some(110));
        // Writes start at the origin, a moment before the first sample.
        assert_eq!(writes_between(&samples, 0.0, 2.0), Some(150));
        assert_eq!(writes_between(&samples, 0.2, 2.0), None);
        assert_eq!(writes_between(&[], 0.0, 2.0), None);
    }
}
