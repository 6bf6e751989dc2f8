//! What a measured phase cost in CPU: on the whole machine, and how much of it went to this
//! process and to the emulator (the rest is PostgreSQL's, mostly).
//!
//! Each ceiling is measured with the machine to itself and may use every core, while the
//! pipeline compared with it runs all of that work on the same cores at once. The CPU each
//! costs per event says how far the machine can take the pipeline at all: see
//! [`shared_machine_bound`].

use crate::harness::processes::{
    emulator_process, jit_compiler_ticks, read_process, thread_count, ticks_per_second,
};
use std::time::Instant;

/// CPU counters at the start of a phase.
pub struct CpuMeter {
    started: Instant,
    emulator_pid: Option<u32>,
    at_start: Ticks,
}

/// CPU-seconds spent during a phase: on the whole machine, by this process, by the emulator.
/// PostgreSQL is counted in what remains ([`CpuUse::rest`]) rather than by its processes:
/// backends that exit before the phase ends (a dropped pool) take their ticks with them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUse {
    pub seconds: f64,
    pub machine: f64,
    pub own: f64,
    pub emulator: f64,
}

#[derive(Debug, Clone, Copy)]
struct Ticks {
    machine: u64,
    own: u64,
    emulator: u64,
}

impl CpuMeter {
    /// Starts counting; `emulator_host` (`host:port`) finds the emulator's process by its port.
    pub fn start(emulator_host: &str) -> Self {
        let emulator_pid = emulator_process(emulator_host);
        Self {
            started: Instant::now(),
            emulator_pid,
            at_start: read_ticks(emulator_pid),
        }
    }

    /// The emulator's threads now: it keeps one for every ordering key it was ever sent.
    pub fn emulator_threads(&self) -> Option<i64> {
        thread_count(self.emulator_pid?)
    }

    /// CPU spent since [`CpuMeter::start`].
    pub fn stop(&self) -> CpuUse {
        let now = read_ticks(self.emulator_pid);
        let seconds = |end: u64, start: u64| end.saturating_sub(start) as f64 / ticks_per_second();
        CpuUse {
            seconds: self.started.elapsed().as_secs_f64(),
            machine: seconds(now.machine, self.at_start.machine),
            own: seconds(now.own, self.at_start.own),
            emulator: seconds(now.emulator, self.at_start.emulator),
        }
    }
}

/// How much of the emulator's CPU since it started went to its JIT compilers: a fresh JVM's
/// warm-up, done while the run is measured, which real Pub/Sub does not charge to this
/// machine. `None` when the emulator's process is not on this machine.
pub fn emulator_jit(emulator_host: &str) -> Option<String> {
    let (compilers, total) = jit_compiler_ticks(emulator_process(emulator_host)?)?;
    let seconds = |ticks: u64| ticks as f64 / ticks_per_second();
    Some(format!(
        "emulator's JIT compiler threads: {:.1} of its {:.1} CPU-seconds since it started \
         ({:.0} %), a fresh JVM's warm-up that real Pub/Sub does not charge to this machine",
        seconds(compilers),
        seconds(total),
        100.0 * compilers as f64 / total.max(1) as f64
    ))
}

impl CpuUse {
    /// Machine CPU-seconds per event.
    pub fn per_event(&self, events: u64) -> f64 {
        self.machine / events.max(1) as f64
    }

    /// Machine CPU-seconds of neither this process nor the emulator: PostgreSQL's, mostly.
    pub fn rest(&self) -> f64 {
        (self.machine - self.own - self.emulator).max(0.0)
    }

    /// `what: 96 µs of CPU per event (this process 28, emulator 17, PostgreSQL and the rest 51), 1.96 cores busy`.
    pub fn describe(&self, what: &str, events: u64) -> String {
        let micros = |cpu: f64| cpu * 1e6 / events.max(1) as f64;
        format!(
            "{what}: {:.0} µs of CPU per event (this process {:.0}, emulator {:.0}, PostgreSQL and the rest {:.0}), {:.2} cores busy",
            micros(self.machine),
            micros(self.own),
            micros(self.emulator),
            micros(self.rest()),
            self.machine / self.seconds.max(1e-9),
        )
    }
}

/// The most events per second `cores` can carry when every event needs the work of each
/// ceiling, at what that work cost per event when it was measured alone (machine
/// CPU-seconds). A pipeline on one machine does all of it on the same cores.
pub fn shared_machine_bound(cores: f64, per_event: &[f64]) -> f64 {
    let total: f64 = per_event.iter().sum();
    if total > 0.0 {
        cores / total
    } else {
        f64::INFINITY
    }
}

/// Cores this process may run on.
pub fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

fn read_ticks(emulator_pid: Option<u32>) -> Ticks {
    Ticks {
        machine: machine_busy_ticks().unwrap_or(0),
        own: read_process(std::process::id()).map_or(0, |r| r.cpu_ticks),
        emulator: emulator_pid
            .and_then(read_process)
            .map_or(0, |r| r.cpu_ticks),
    }
}

/// Busy ticks of all cores (`/proc/stat`'s `cpu` line): everything but idle and iowait.
fn machine_busy_ticks() -> Option<u64> {
    use procfs::CurrentSI as _;
    let total = procfs::KernelStats::current().ok()?.total;
    Some(busy(&total))
}

/// user + nice + system + irq + softirq + steal.
fn busy(time: &procfs::CpuTime) -> u64 {
    time.user
        + time.nice
        + time.system
        + time.irq.unwrap_or(0)
        + time.softirq.unwrap_or(0)
        + time.steal.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_busy_counts_ticks_that_grow() {
        let first = machine_busy_ticks().expect("/proc/stat");
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed().as_millis() < 100 {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        assert_ne!(x, 7);
        assert!(machine_busy_ticks().expect("/proc/stat") > first);
    }

    #[test]
    fn the_bound_shares_the_cores_between_both_ceilings_work() {
        // 34 µs + 21 µs per event on 2 cores: 2 / 55 µs ≈ 36.4k events/s.
        let bound = shared_machine_bound(2.0, &[34e-6, 21e-6]);
        assert!((bound - 36_363.6).abs() < 1.0, "{bound}");
        assert!(shared_machine_bound(2.0, &[0.0]).is_infinite());
    }

    #[test]
    fn a_phase_that_burns_cpu_is_counted_on_the_machine_and_for_this_process() {
        let meter = CpuMeter::start("127.0.0.1:1");
        // Burn until this process was charged 0.15 s of CPU, not for a wall-clock time: on a
        // machine busy with other tests a thread may get a fraction of the time it waits.
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        let mut x = 0u64;
        while meter.stop().own < 0.15 && Instant::now() < deadline {
            for _ in 0..1_000_000 {
                x = x.wrapping_mul(31).wrapping_add(1);
            }
        }
        assert_ne!(x, 7);
        let used = meter.stop();
        assert!(used.own >= 0.1, "{used:?}");
        // The machine's counters advance per core at its ticks, this process's to the
        // nanosecond: near the moment it crossed the mark, each core may still owe a tick or two.
        let owed = 2.0 * cores() / ticks_per_second();
        assert!(used.machine + owed >= used.own, "{used:?}");
        assert_eq!(used.emulator, 0.0, "no emulator on port 1: {used:?}");
        assert_eq!(used.rest(), (used.machine - used.own).max(0.0), "{used:?}");
        let text = used.describe("busy loop", 1_000);
        assert!(text.starts_with("busy loop: "), "{text}");
        assert!(text.contains("µs of CPU per event"), "{text}");
    }
}
