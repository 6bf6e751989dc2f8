//! The run's worker processes (this binary's hidden `worker` command): started, killed with
//! SIGKILL, restarted when they exit on their own (as Kubernetes would), stopped at the end;
//! and what `/proc` says about any process's memory and CPU.

use crate::harness::rig::Rig;
use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Relay,
    Consumer,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Relay => "relay",
            Role::Consumer => "consumer",
        }
    }
}

struct Worker {
    role: Role,
    label: String,
    child: Option<Child>,
}

/// The workers of one run.
pub struct Workers {
    exe: PathBuf,
    logs: PathBuf,
    config: PathBuf,
    emulator_host: String,
    /// Arguments of the consumer's command line beyond the config.
    consumer_args: Vec<String>,
    workers: Vec<Worker>,
    /// Exits nobody asked for, restarted.
    pub unexpected_exits: Vec<String>,
}

impl Workers {
    pub fn new(rig: &Rig, dir: &Path) -> anyhow::Result<Self> {
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
        Ok(Self {
            exe: std::env::current_exe().context("find this program's path")?,
            logs,
            config: rig.config_path.clone(),
            emulator_host: rig.workers_emulator_host.clone(),
            consumer_args: crate::commands::worker::consumer_args(rig),
            workers: Vec::new(),
            unexpected_exits: Vec::new(),
        })
    }

    /// Starts a worker; returns its index.
    pub fn start(&mut self, role: Role) -> anyhow::Result<usize> {
        let n = self.workers.iter().filter(|w| w.role == role).count();
        let label = format!("{}-{}", role.name(), n + 1);
        let child = self.spawn(role, &label)?;
        self.workers.push(Worker {
            role,
            label,
            child: Some(child),
        });
        Ok(self.workers.len() - 1)
    }

    fn spawn(&self, role: Role, label: &str) -> anyhow::Result<Child> {
        let log_path = self.logs.join(format!("{label}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let mut command = Command::new(&self.exe);
        command
            .arg("worker")
            .arg(role.name())
            .arg("--config")
            .arg(&self.config);
        if role == Role::Consumer {
            command.args(&self.consumer_args);
        }
        command
            .env("PUBSUB_EMULATOR_HOST", &self.emulator_host)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("log file handle")?)
            .stderr(log)
            .kill_on_drop(true);
        command
            .spawn()
            .with_context(|| format!("start worker {label}"))
    }

    pub fn indices(&self, role: Role) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&i| self.workers[i].role == role)
            .collect()
    }

    pub fn label(&self, index: usize) -> &str {
        &self.workers[index].label
    }

    /// `(label, pid)` of every running worker.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.workers
            .iter()
            .filter_map(|w| Some((w.label.clone(), w.child.as_ref()?.id()?)))
            .collect()
    }

    /// SIGKILL, as a crash would.
    pub async fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        if let Some(mut child) = self.workers[index].child.take() {
            child.start_kill().context("kill a worker")?;
            child.wait().await.context("reap a killed worker")?;
        }
        Ok(())
    }

    /// Starts a stopped worker again.
    pub fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        let (role, label) = (self.workers[index].role, self.workers[index].label.clone());
        self.workers[index].child = Some(self.spawn(role, &label)?);
        Ok(())
    }

    /// Restarts workers that exited on their own (a supervisor past its budget exits the
    /// process), recording each exit.
    pub fn restart_exited(&mut self) -> anyhow::Result<()> {
        for index in 0..self.workers.len() {
            let status = match self.workers[index].child.as_mut() {
                Some(child) => child.try_wait().context("poll a worker")?,
                None => None,
            };
            if let Some(status) = status {
                self.unexpected_exits
                    .push(format!("{} exited ({status})", self.workers[index].label));
                self.restart(index)?;
            }
        }
        Ok(())
    }

    /// SIGTERM to one worker, then SIGKILL if it still runs after `grace`.
    pub async fn stop(&mut self, index: usize, grace: Duration) {
        if let Some(mut child) = self.workers[index].child.take() {
            if let Some(pid) = child.id() {
                signal(pid, "TERM").await;
            }
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }

    /// SIGTERM to every worker at once, then SIGKILL to those still running after `grace`.
    pub async fn stop_all(&mut self, grace: Duration) {
        for (_, pid) in self.pids() {
            signal(pid, "TERM").await;
        }
        for index in 0..self.workers.len() {
            self.stop(index, grace).await;
        }
    }
}

/// Sends `signal` (a name `kill` knows) to a process or, with a negative pid string, a group.
pub async fn signal(pid: impl std::fmt::Display, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

/// One reading of a process from `/proc` (through the `procfs` crate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessReading {
    /// Which process was read: a label's pid changes when its worker is started again.
    /// 0 for a sum over many processes ([`read_all_named`]).
    pub pid: u32,
    pub rss_bytes: u64,
    /// User + system CPU time so far, in clock ticks ([`ticks_per_second`]).
    pub cpu_ticks: u64,
}

/// Reads a process's `stat`; `None` once the process is gone, or dead and not yet reaped (a
/// zombie's RSS reads 0, which would count as memory freed).
pub fn read_process(pid: u32) -> Option<ProcessReading> {
    let stat = procfs::process::Process::new(i32::try_from(pid).ok()?)
        .ok()?
        .stat()
        .ok()?;
    (stat.state != 'Z').then(|| reading(&stat))
}

/// How many threads process `pid` runs now.
pub fn thread_count(pid: u32) -> Option<i64> {
    let process = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    Some(process.stat().ok()?.num_threads)
}

/// CPU ticks of a Java process's JIT compiler threads (`C1 CompilerThre…`, `C2 CompilerThre…`)
/// and of the whole process, since it started: the compilers' share is warm-up work that a
/// fresh JVM does while it is measured, and that real Pub/Sub does not charge to this machine.
pub fn jit_compiler_ticks(pid: u32) -> Option<(u64, u64)> {
    let process = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    let total = reading(&process.stat().ok()?).cpu_ticks;
    let compilers = process
        .tasks()
        .ok()?
        .filter_map(|task| task.ok()?.stat().ok())
        .filter(|stat| stat.comm.starts_with("C1 Compiler") || stat.comm.starts_with("C2 Compiler"))
        .map(|stat| stat.utime + stat.stime)
        .sum();
    Some((compilers, total))
}

fn reading(stat: &procfs::process::Stat) -> ProcessReading {
    use procfs::WithCurrentSystemInfo as _;
    ProcessReading {
        pid: u32::try_from(stat.pid).unwrap_or(0),
        rss_bytes: stat.rss_bytes().get(),
        cpu_ticks: stat.utime + stat.stime,
    }
}

/// CPU of every process named `name` on this machine, summed (PostgreSQL runs one process
/// per connection; its shared memory makes a summed RSS meaningless, so RSS is left at 0).
/// Backends that exited since the last reading take their ticks with them, so a rate
/// computed from two readings can dip; negative deltas are dropped where rates are drawn.
pub fn read_all_named(name: &str) -> ProcessReading {
    let cpu_ticks = procfs::process::all_processes()
        .into_iter()
        .flatten()
        .filter_map(|process| process.ok()?.stat().ok())
        .filter(|stat| stat.comm == name)
        .map(|stat| reading(&stat).cpu_ticks)
        .sum();
    ProcessReading {
        pid: 0,
        rss_bytes: 0,
        cpu_ticks,
    }
}

/// Clock ticks per second of `cpu_ticks` (the kernel's USER_HZ).
pub fn ticks_per_second() -> f64 {
    procfs::ticks_per_second() as f64
}

/// The emulator's Java process, found by the port of its `host:port`.
pub fn emulator_process(emulator_host: &str) -> Option<u32> {
    let port = emulator_host.rsplit(':').next()?;
    find_process(&[&format!("--port={port}")])
}

/// The first process whose command line contains every one of `needles` (the emulator's
/// Java process, found by its port).
fn find_process(needles: &[&str]) -> Option<u32> {
    procfs::process::all_processes()
        .ok()?
        .filter_map(Result::ok)
        .find(|process| {
            process.cmdline().is_ok_and(|args| {
                let cmdline = args.join(" ");
                cmdline.contains("java") && needles.iter().all(|n| cmdline.contains(n))
            })
        })
        .and_then(|process| u32::try_from(process.pid()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn processes_are_summed_by_name() {
        // Burn a little CPU so this process has ticks to count.
        let mut x = 0u64;
        for i in 0..30_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert_ne!(x, 1);
        let name = procfs::process::Process::myself()
            .and_then(|me| me.stat())
            .expect("own stat")
            .comm;
        let own = read_process(std::process::id()).expect("own reading");
        let all = read_all_named(&name);
        assert!(all.cpu_ticks >= own.cpu_ticks, "{all:?} < {own:?}");
        assert_eq!(all.rss_bytes, 0);
        assert_eq!(read_all_named("no such process name").cpu_ticks, 0);
    }

    /// A thread named `name` that burns CPU until its flag is set.
    fn burner(name: &str) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut x = 0u64;
                while !flag.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                }
            })
            .expect("spawn");
        (stop, thread)
    }

    #[test]
    fn only_threads_named_as_a_jvm_names_its_compilers_count_as_jit() {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let read = || jit_compiler_ticks(std::process::id()).expect("own tasks");

        // Another name burns while the compiler count stays at zero.
        let (stop, other) = burner("C3 other");
        let (_, total_before) = read();
        while read().1 < total_before + 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            read().0,
            0,
            "a thread not named as a JIT compiler was counted"
        );
        stop.store(true, Ordering::Relaxed);
        other.join().expect("join");

        // A compiler's ticks count while it exists (read before it exits: its entry goes).
        let (stop, compiler) = burner("C2 CompilerThread0");
        while read().0 == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (jit, total) = read();
        stop.store(true, Ordering::Relaxed);
        compiler.join().expect("join");
        assert!(jit > 0, "the compiler thread's ticks were not counted");
        assert!(total >= jit, "{total} < {jit}");
    }

    #[test]
    fn a_dead_child_not_yet_reaped_reads_as_gone() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let is_zombie = || {
            procfs::process::Process::new(pid as i32)
                .and_then(|p| p.stat())
                .is_ok_and(|stat| stat.state == 'Z')
        };
        while !is_zombie() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(is_zombie(), "`true` did not exit within 10 s");
        assert_eq!(read_process(pid), None);
        child.wait().expect("reap");
    }

    #[test]
    fn this_process_can_be_read() {
        let reading = read_process(std::process::id()).expect("own /proc entry");
        assert_eq!(reading.pid, std::process::id());
        assert!(reading.rss_bytes > 0);
        assert!(ticks_per_second() >= 1.0);
    }
}
