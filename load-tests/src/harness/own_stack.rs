//! A PostgreSQL cluster and a Pub/Sub emulator that belong to one run, so `chaos` can
//! restart the database and freeze the emulator without touching anything else on the
//! machine (other test runs share the default server). Both are stopped and removed on drop.

use crate::harness::processes::signal;
use anyhow::Context as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A throwaway PostgreSQL cluster on a free port, data in a temporary directory.
pub struct OwnPostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    as_postgres: bool,
}

/// The newest installed server's binaries (`/usr/lib/postgresql/<version>/bin`), or
/// `COURIER_PG_BIN`.
fn postgres_bin() -> anyhow::Result<PathBuf> {
    if let Ok(dir) = std::env::var("COURIER_PG_BIN") {
        return Ok(dir.into());
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context(
            "PostgreSQL's server binaries are not under /usr/lib/postgresql; set COURIER_PG_BIN",
        )?
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .context("no PostgreSQL server with pg_ctl under /usr/lib/postgresql; set COURIER_PG_BIN")
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl OwnPostgres {
    /// `initdb` and start (as the `postgres` user when running as root: PostgreSQL refuses
    /// to run as root).
    pub fn start() -> anyhow::Result<Self> {
        let bin = postgres_bin()?;
        let data = std::env::temp_dir().join(courier_testkit::unique_name("courier-load-pg"));
        std::fs::create_dir_all(&data).with_context(|| format!("create {}", data.display()))?;
        let as_postgres = running_as_root();
        if as_postgres {
            run(
                Command::new("chown").arg("postgres:postgres").arg(&data),
                "chown the data directory",
            )?;
        }
        let cluster = Self {
            bin,
            data,
            port: courier_testkit::free_port()?,
            as_postgres,
        };
        cluster.pg(
            "initdb",
            &[
                "-D",
                &cluster.data_str(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            "initdb",
        )?;
        cluster.pg_ctl(&["start", "-w", "-t", "60"])?;
        // Stops the cluster and removes its files if this process dies without dropping it.
        let pg_ctl = cluster.bin.join("pg_ctl");
        let stop = if cluster.as_postgres {
            format!(
                "runuser -u postgres -- {} -D {} stop -m immediate",
                pg_ctl.display(),
                cluster.data_str()
            )
        } else {
            format!(
                "{} -D {} stop -m immediate",
                pg_ctl.display(),
                cluster.data_str()
            )
        };
        watchdog(&format!("{stop}; rm -rf {}", cluster.data_str()))?;
        Ok(cluster)
    }

    fn data_str(&self) -> String {
        self.data.display().to_string()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn pg(&self, program: &str, args: &[&str], what: &str) -> anyhow::Result<()> {
        let path = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        run(command.args(args), what)
    }

    fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 \
             -c shared_preload_libraries=pg_stat_statements",
            self.port,
            self.data_str()
        );
        let data = self.data_str();
        // The server's output goes to a file: left on pg_ctl's stdout, it would hold the pipe
        // open and `output()` would wait for the server to exit.
        let log = format!("{data}/server.log");
        let mut all = vec!["-D", &data, "-l", &log];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", &options]);
        self.pg("pg_ctl", &all, &format!("pg_ctl {}", args.join(" ")))
    }

    /// An immediate restart: the server stops without a checkpoint, as after a crash, and
    /// recovers from its WAL on start.
    pub fn restart_immediately(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["restart", "-m", "immediate", "-w", "-t", "60"])
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w"]);
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// Runs `cleanup` (a shell command) once this process has exited, however it exits: a
/// detached shell that ignores the signals sent to this process group and polls for it.
fn watchdog(cleanup: &str) -> anyhow::Result<()> {
    const SCRIPT: &str = r#"
        trap '' TERM INT HUP
        while kill -0 "$1" 2>/dev/null; do sleep 1; done
        eval "$2" > /dev/null 2>&1
    "#;
    Command::new("setsid")
        .args(["bash", "-c", SCRIPT, "watchdog"])
        .arg(std::process::id().to_string())
        .arg(cleanup)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start the cleanup watchdog")?;
    Ok(())
}

fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{what}: cannot run it"))?;
    anyhow::ensure!(
        output.status.success(),
        "{what} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// An emulator of this run's own, in a process group of its own so it can be frozen
/// (SIGSTOP: every connection hangs, as in a network partition) and killed as a whole.
pub struct OwnEmulator {
    pub host: String,
    group: u32,
}

impl OwnEmulator {
    pub async fn start(log: &std::path::Path) -> anyhow::Result<Self> {
        let launcher = courier_testkit::emulator_launcher()?;
        let port = courier_testkit::free_port()?;
        let log_file =
            std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        // `setsid` makes the launcher the leader of a new group whose id is its pid; Java
        // runs inside that group.
        let child = Command::new("setsid")
            .arg(&launcher)
            .arg("--host=127.0.0.1")
            .arg(format!("--port={port}"))
            .env("JAVA_OPTS", "-Xmx512m")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("start {}", launcher.display()))?;
        let emulator = Self {
            host: format!("127.0.0.1:{port}"),
            group: child.id(),
        };
        watchdog(&format!(
            "kill -CONT -- -{0}; kill -KILL -- -{0}",
            emulator.group
        ))?;
        courier_testkit::wait_ready(&emulator.host)
            .await
            .with_context(|| format!("emulator log: {}", log.display()))?;
        Ok(emulator)
    }

    /// Freezes every process of the emulator for `pause`, then lets it go on.
    pub async fn freeze_for(&self, pause: Duration) {
        signal(format!("-{}", self.group), "STOP").await;
        tokio::time::sleep(pause).await;
        signal(format!("-{}", self.group), "CONT").await;
    }
}

impl Drop for OwnEmulator {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.group)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
