//! A running pipeline under test: the rig, its relay and consumer processes, and the sampler
//! watching them; what every pipeline command (throughput, latency, soak, chaos) starts with.

use crate::checker::{judge, read_facts, Facts, RegressionPoller, Verdict};
use crate::drive::{self, Load, Origin, Sample, Sampler, Watched, WriteOutcome};
use crate::processes::{find_process, Role, Workers};
use crate::report::Latency;
use crate::rig::Rig;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Pipeline {
    pub rig: Rig,
    pub workers: Workers,
    pub origin: Origin,
    pub watched: Watched,
    sampler: Option<Sampler>,
    /// `(label, pid)` watched besides the workers (the emulator, this process).
    others: Vec<(String, u32)>,
}

impl Pipeline {
    /// Starts `relays` relay processes and one consumer process on `rig`, and the sampler.
    pub async fn start(
        rig: Rig,
        dir: &std::path::Path,
        relays: u32,
        sample_every: Duration,
    ) -> anyhow::Result<Self> {
        let mut workers = Workers::new(&rig, dir)?;
        for _ in 0..relays {
            workers.start(Role::Relay)?;
        }
        workers.start(Role::Consumer)?;
        let mut others = vec![("harness".to_string(), std::process::id())];
        let port = rig.emulator_host.rsplit(':').next().unwrap_or_default();
        if let Some(pid) = find_process(&[&format!("--port={port}")]) {
            others.push(("emulator".into(), pid));
        }
        let watched: Watched = Arc::new(Mutex::new(Vec::new()));
        let origin = Origin::now();
        let mut pipeline = Self {
            sampler: Some(Sampler::start(
                rig.db.pool.clone(),
                origin,
                sample_every,
                watched.clone(),
            )),
            rig,
            workers,
            origin,
            watched,
            others,
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

    /// Runs `load`, then waits (up to `drain_timeout`) until every write it committed is
    /// projected; returns what the writers did and how many writes committed in all.
    pub async fn write_and_drain(
        &mut self,
        load: Load,
        drain_timeout: Duration,
    ) -> anyhow::Result<(WriteOutcome, u64)> {
        let write = drive::write_for(&self.rig.config, &self.rig.topic, self.origin, load).await?;
        let total = drive::committed_writes(&self.rig).await?;
        drive::wait_drained(&self.rig, total, drain_timeout).await?;
        self.keep_workers_up()?;
        Ok((write, total))
    }

    /// The end-to-end maximum: `writers` write as fast as they can for `seconds`, then the
    /// rate is what committed divided by the time until all of it was projected.
    pub async fn probe_max(
        &mut self,
        writers: u32,
        keys: u64,
        seconds: u64,
        drain_timeout: Duration,
    ) -> anyhow::Result<f64> {
        eprintln!("measuring the end-to-end maximum for {seconds} s");
        let started = self.origin.seconds();
        let before = drive::committed_writes(&self.rig).await?;
        let probe = Load {
            writers,
            keys,
            pace: drive::Pace::ClosedLoop,
            duration: Duration::from_secs(seconds),
        };
        let (_, total) = self.write_and_drain(probe, drain_timeout).await?;
        Ok((total - before) as f64 / (self.origin.seconds() - started))
    }

    /// Reads the commit → projection latency of the writes meant to start `from` seconds
    /// into the run or later, stops, and judges the whole run.
    pub async fn conclude(self, latency_name: &str, from: f64) -> anyhow::Result<Concluded> {
        let from = self.origin.wall + chrono::Duration::milliseconds((from * 1_000.0) as i64);
        let latency = drive::latency(&self.rig, latency_name, from).await?;
        let mut finished = self.finish().await?;
        finished.facts.regressions = std::mem::take(&mut finished.poller.regressions);
        Ok(Concluded {
            latency,
            verdict: judge(&finished.facts),
            samples: finished.samples,
            unexpected_exits: finished.unexpected_exits,
        })
    }

    /// Stops the sampler and the workers; returns the samples, the regression poller, and the
    /// checker's facts read from the database.
    pub async fn finish(mut self) -> anyhow::Result<Finished> {
        let (samples, poller) = match self.sampler.take() {
            Some(sampler) => sampler.finish().await?,
            None => (Vec::new(), RegressionPoller::new()),
        };
        self.workers.stop_all(Duration::from_secs(10)).await;
        let facts = read_facts(&self.rig.client().await?).await?;
        Ok(Finished {
            samples,
            poller,
            facts,
            unexpected_exits: std::mem::take(&mut self.workers.unexpected_exits),
        })
    }
}

/// A stopped pipeline's record.
pub struct Finished {
    pub samples: Vec<Sample>,
    pub poller: RegressionPoller,
    pub facts: Facts,
    pub unexpected_exits: Vec<String>,
}

/// A judged run: what the throughput, latency and soak reports are made of.
pub struct Concluded {
    pub latency: Latency,
    pub verdict: Verdict,
    pub samples: Vec<Sample>,
    pub unexpected_exits: Vec<String>,
}
