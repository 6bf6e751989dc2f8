//! How long the run database's backends waited for a core. `pg_stat_statements` times a
//! statement from start to end, waits on the run queue included: on a machine whose CPU a run
//! oversubscribes, that wait is most of a short statement's time, and it grows with whatever
//! else takes the CPU (run D3: the application's hot rows behind a pin). Read from the
//! kernel's per-process scheduler statistics (`/proc/<pid>/schedstat`), so only when
//! PostgreSQL runs on this machine.

use serde::Serialize;
use std::collections::BTreeMap;

/// One backend's CPU time and run-queue wait so far.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendTimes {
    pub pid: i32,
    /// Its `application_name` (`courier-relay`, `courier-load writer`, …), `-` when unset.
    pub application: String,
    pub cpu_ns: u64,
    pub wait_ns: u64,
}

impl BackendTimes {
    /// Whether `self` is an earlier reading of the backend `later` was read from: the same pid
    /// and application, and no more CPU (a reused pid starts again from zero).
    fn precedes(&self, later: &BackendTimes) -> bool {
        self.pid == later.pid
            && self.application == later.application
            && self.cpu_ns <= later.cpu_ns
    }
}

/// Every client backend of the current database with its scheduler times; empty when the
/// server's processes are not this machine's (or `pg_stat_activity` cannot be read).
pub async fn read(client: &tokio_postgres::Client) -> Vec<BackendTimes> {
    let Ok(rows) = client
        .query(
            "SELECT pid, coalesce(nullif(application_name, ''), '-') FROM pg_stat_activity
             WHERE datname = current_database() AND backend_type = 'client backend'",
            &[],
        )
        .await
    else {
        return Vec::new();
    };
    rows.iter()
        .filter_map(|row| {
            let pid: i32 = row.try_get(0).ok()?;
            let stat = procfs::process::Process::new(pid).ok()?.schedstat().ok()?;
            Some(BackendTimes {
                pid,
                application: row.try_get(1).ok()?,
                cpu_ns: stat.sum_exec_runtime,
                wait_ns: stat.run_delay,
            })
        })
        .collect()
}

/// The latest reading of every backend seen while pinned: one that ended before the pin's
/// release (a writer's, once the writes are over) keeps its last reading, so its time counts.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    backends: Vec<BackendTimes>,
}

impl Seen {
    /// Takes `reading`'s figures in place of the same backends' earlier ones.
    pub fn add(&mut self, reading: Vec<BackendTimes>) {
        for now in reading {
            match self.backends.iter_mut().find(|b| b.precedes(&now)) {
                Some(earlier) => *earlier = now,
                None => self.backends.push(now),
            }
        }
    }

    pub fn into_vec(self) -> Vec<BackendTimes> {
        self.backends
    }
}

/// Seconds an application's backends waited on the run queue per second of CPU they got,
/// before and while pinned.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunQueueWait {
    pub application: String,
    pub before: Option<f64>,
    pub pinned: Option<f64>,
}

/// Each application's wait per second of CPU from `earlier` to `later`. A backend counts from
/// its reading in `earlier`, or from zero when it started since (its times count from its
/// start); one that ended in between takes its times with it. Left out: an application whose
/// backends got no CPU in between.
fn wait_per_cpu(earlier: &[BackendTimes], later: &[BackendTimes]) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for now in later {
        let (cpu_then, wait_then) = earlier
            .iter()
            .find(|b| b.precedes(now))
            .map_or((0, 0), |then| (then.cpu_ns, then.wait_ns));
        let sum = sums.entry(now.application.clone()).or_default();
        sum.0 += now.cpu_ns - cpu_then;
        sum.1 += now.wait_ns.saturating_sub(wait_then);
    }
    sums.into_iter()
        .filter(|(_, (cpu, _))| *cpu > 0)
        .map(|(application, (cpu, wait))| (application, wait as f64 / cpu as f64))
        .collect()
}

/// Every application's wait per second of CPU from `baseline` to `start` (before the pin)
/// and from `start` to `end` (while pinned), by name.
pub fn compare([baseline, start, end]: [&[BackendTimes]; 3]) -> Vec<RunQueueWait> {
    let before = wait_per_cpu(baseline, start);
    let pinned = wait_per_cpu(start, end);
    let mut applications: Vec<&String> = before.keys().chain(pinned.keys()).collect();
    applications.sort();
    applications.dedup();
    applications
        .into_iter()
        .map(|application| RunQueueWait {
            application: application.clone(),
            before: before.get(application).copied(),
            pinned: pinned.get(application).copied(),
        })
        .collect()
}

/// `writers 2.93 → 4.85, relay 1.98 → 3.45`; `None` when nothing was read.
pub fn describe(waits: &[RunQueueWait]) -> Option<String> {
    let figure = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.2}"));
    (!waits.is_empty()).then(|| {
        waits
            .iter()
            .map(|w| {
                format!(
                    "{} {} → {}",
                    w.application,
                    figure(w.before),
                    figure(w.pinned)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(pid: i32, application: &str, cpu_ns: u64, wait_ns: u64) -> BackendTimes {
        BackendTimes {
            pid,
            application: application.into(),
            cpu_ns,
            wait_ns,
        }
    }

    #[test]
    fn waits_are_per_second_of_cpu_with_a_backend_started_since_counted_from_zero() {
        let baseline = [backend(1, "relay", 0, 0), backend(2, "writer", 0, 0)];
        // Backend 3 started before the pin.
        let start = [
            backend(1, "relay", 1_000, 2_000),
            backend(2, "writer", 2_000, 6_000),
            backend(3, "writer", 500, 500),
        ];
        // Backend 2 ended while pinned (its time is gone), 4 started.
        let end = [
            backend(1, "relay", 3_000, 5_000),
            backend(3, "writer", 1_500, 5_500),
            backend(4, "writer", 1_000, 4_000),
        ];
        let waits = compare([&baseline, &start, &end]);
        assert_eq!(
            waits,
            vec![
                RunQueueWait {
                    application: "relay".into(),
                    before: Some(2.0),
                    pinned: Some(1.5),
                },
                RunQueueWait {
                    application: "writer".into(),
                    before: Some(2.6),
                    pinned: Some(4.5),
                },
            ]
        );
        assert_eq!(
            describe(&waits).as_deref(),
            Some("relay 2.00 → 1.50, writer 2.60 → 4.50")
        );
        // Pid 3 reused by another application: a new backend, from zero; nothing ran before.
        let reused = [backend(3, "relay", 100, 300)];
        assert_eq!(
            compare([&start, &start, &reused]),
            vec![RunQueueWait {
                application: "relay".into(),
                before: None,
                pinned: Some(3.0),
            }]
        );
        assert_eq!(describe(&[]), None);
    }

    #[test]
    fn a_backend_that_ended_keeps_its_last_reading() {
        let mut seen = Seen::default();
        seen.add(vec![
            backend(1, "writer", 100, 100),
            backend(2, "relay", 100, 100),
        ]);
        seen.add(vec![
            backend(1, "writer", 300, 900),
            backend(2, "relay", 200, 200),
        ]);
        // The writer ended; the relay goes on.
        seen.add(vec![backend(2, "relay", 400, 600)]);
        assert_eq!(
            seen.into_vec(),
            vec![
                backend(1, "writer", 300, 900),
                backend(2, "relay", 400, 600)
            ]
        );
    }
}
