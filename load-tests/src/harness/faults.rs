//! Faults struck at random moments while a pipeline runs, and what they need around them:
//! - `kill-relay`, `kill-consumer`: SIGKILL, then started again after a short pause;
//! - `restart-postgres`: an immediate restart (crash recovery) of a cluster of the run's own;
//! - `freeze-emulator`: SIGSTOP for a few seconds of an emulator of the run's own (a restart
//!   would lose its in-memory messages, which real Pub/Sub keeps);
//! - `handler-transient`: projection rows with events still on their way held locked for a few
//!   seconds while the consumer's transactions wait at most [`HANDLER_LOCK_TIMEOUT`] for a
//!   row lock, so their handlers fail with a lock timeout, as a long transaction or a
//!   migration holding rows causes in production;
//! - `broker-slow`: Pub/Sub answers late, or not at all, for 10–30 s (a proxy in front of the
//!   emulator holds the workers' traffic; see `courier_testkit::BrokerProxy`);
//! - `pin-xmin`: a repeatable-read transaction holds its snapshot, idle, for 30–120 s (to the
//!   end of the writes at most), as `pg_dump` or a session left idle in transaction does, so
//!   vacuum removes no tuple that died since; other faults go on meanwhile (see `pin`).
//!
//! Poison messages (undecodable, unknown schema version) can be published beside the real
//! events; the checker expects exactly those on the dead-letter topic.

use crate::harness::own_stack::{OwnEmulator, OwnPostgres};
use courier_testkit::BrokerProxy;
use rand::Rng as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    KillRelay,
    KillConsumer,
    RestartPostgres,
    FreezeEmulator,
    HandlerTransient,
    BrokerSlow,
    PinXmin,
}

/// How long the consumer's projection transactions wait for a row lock while
/// `handler-transient` is among the faults (a service's usual `lock_timeout`).
pub const HANDLER_LOCK_TIMEOUT: Duration = Duration::from_millis(300);

/// Faults for the pipeline commands that run without them by default (throughput, latency,
/// soak); `chaos` has its own defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct FaultArgs {
    /// Faults to strike at random moments while the writers write (default: none).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<Fault>,
    /// Shortest pause between two faults, seconds.
    #[arg(long, default_value_t = 5)]
    pub min_gap_secs: u64,
    /// Longest pause between two faults, seconds.
    #[arg(long, default_value_t = 15)]
    pub max_gap_secs: u64,
    /// Seed of the fault schedule (default: random; printed in the report).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl FaultArgs {
    pub fn plan(&self) -> anyhow::Result<FaultPlan> {
        FaultPlan::new(
            self.faults.clone(),
            self.min_gap_secs,
            self.max_gap_secs,
            self.seed,
            0,
        )
    }
}

/// What to strike, how often, and how many poison messages to publish meanwhile.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    pub faults: Vec<Fault>,
    pub min_gap_secs: u64,
    pub max_gap_secs: u64,
    pub seed: u64,
    pub poison: u32,
}

impl FaultPlan {
    pub fn new(
        faults: Vec<Fault>,
        min_gap_secs: u64,
        max_gap_secs: u64,
        seed: Option<u64>,
        poison: u32,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            min_gap_secs <= max_gap_secs,
            "--min-gap-secs ({min_gap_secs}) must not exceed --max-gap-secs ({max_gap_secs})"
        );
        Ok(Self {
            faults,
            min_gap_secs,
            max_gap_secs,
            seed: seed.unwrap_or_else(|| rand::thread_rng().gen()),
            poison,
        })
    }

    /// No faults, no poison.
    pub fn none() -> Self {
        Self {
            faults: Vec::new(),
            min_gap_secs: 0,
            max_gap_secs: 0,
            seed: 0,
            poison: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.faults.is_empty() && self.poison == 0
    }

    fn has(&self, fault: Fault) -> bool {
        self.faults.contains(&fault)
    }

    /// `kill-relay,broker-slow (seed 42)`, or `none`.
    pub fn describe(&self) -> String {
        if self.faults.is_empty() {
            return "none".into();
        }
        let names: Vec<String> = self
            .faults
            .iter()
            .filter_map(|f| clap::ValueEnum::to_possible_value(f).map(|v| v.get_name().to_string()))
            .collect();
        format!("{} (seed {})", names.join(","), self.seed)
    }

    /// The lock timeout the consumer's projection must run with for this plan.
    pub fn consumer_lock_timeout(&self) -> Option<Duration> {
        self.has(Fault::HandlerTransient)
            .then_some(HANDLER_LOCK_TIMEOUT)
    }
}

/// What a plan needs around the pipeline: a PostgreSQL cluster and an emulator of the run's
/// own when it restarts or freezes them, a proxy in front of the emulator when it slows it.
pub struct FaultStack {
    pub postgres: Option<Arc<OwnPostgres>>,
    pub emulator: Option<OwnEmulator>,
    pub proxy: Option<BrokerProxy>,
}

impl FaultStack {
    /// Starts what `plan` needs of its own (the proxy comes later, once the emulator is known).
    pub async fn start(plan: &FaultPlan, dir: &Path) -> anyhow::Result<Self> {
        let postgres = if plan.has(Fault::RestartPostgres) {
            eprintln!("starting a PostgreSQL cluster of this run's own");
            Some(Arc::new(OwnPostgres::start()?))
        } else {
            None
        };
        let emulator = if plan.has(Fault::FreezeEmulator) {
            eprintln!("starting an emulator of this run's own");
            Some(OwnEmulator::start(&dir.join("emulator.log")).await?)
        } else {
            None
        };
        Ok(Self {
            postgres,
            emulator,
            proxy: None,
        })
    }

    /// The database server for the rig (`None`: the default one).
    pub fn database_server(&self) -> Option<String> {
        self.postgres.as_ref().map(|p| p.url())
    }

    /// Puts a proxy between the workers and `emulator_host` when the plan slows the broker;
    /// returns the host the workers should use.
    pub async fn workers_emulator_host(
        &mut self,
        plan: &FaultPlan,
        emulator_host: &str,
    ) -> anyhow::Result<String> {
        if !plan.has(Fault::BrokerSlow) {
            return Ok(emulator_host.to_string());
        }
        let proxy = BrokerProxy::start(emulator_host).await?;
        let host = proxy.host.clone();
        self.proxy = Some(proxy);
        Ok(host)
    }
}

/// What the faults did.
#[derive(Debug, Default)]
pub struct Strikes {
    /// `(seconds into the run, what)` of every fault and poison message.
    pub timeline: Vec<(f64, String)>,
    /// Faults struck (poison messages apart).
    pub faults: usize,
    /// Event ids of the poison messages published.
    pub poison: Vec<String>,
}

impl Strikes {
    /// Adds what a later phase struck.
    pub fn append(&mut self, later: Strikes) {
        self.timeline.extend(later.timeline);
        self.faults += later.faults;
        self.poison.extend(later.poison);
    }
}
