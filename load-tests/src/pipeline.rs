//! A running pipeline under test: the rig, its relay and consumer processes, and the sampler
//! watching them; what every pipeline command (throughput, latency, soak, chaos) starts with.

use crate::checker::{read_facts, Facts, RegressionPoller};
use crate::drive::{Origin, Sample, Sampler, Watched};
use crate::processes::{find_process, Role, Workers};
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
