//! A PostgreSQL cluster of the test's own that accepts TLS connections only, as Supabase or
//! Cloud SQL with SSL enforced do, with a server certificate for `localhost` signed by a CA
//! made for the test. Built with the installed server's `initdb` and `pg_ctl` (as user
//! `postgres` when the test runs as root, since the server refuses to run as root).

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A running TLS-only cluster; stopped and deleted on drop.
pub struct TlsPostgres {
    pub port: u16,
    /// PEM of the CA that signed the server's certificate (valid for `localhost` only).
    pub ca_cert: PathBuf,
    /// PEM of a CA that signed nothing here: a verifying client trusting it must refuse.
    pub other_ca_cert: PathBuf,
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
}

impl TlsPostgres {
    /// Creates and starts the cluster (a few seconds); blocking, so call it from
    /// `spawn_blocking` in async tests.
    pub fn start() -> anyhow::Result<Self> {
        let bin = server_bin_dir()?;
        let dir = std::env::temp_dir().join(crate::unique_name("courier-tls-pg"));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let as_postgres = run_output(Command::new("id").arg("-u"))?.trim() == "0";
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let cluster = Self {
            port,
            ca_cert: dir.join("ca.crt"),
            other_ca_cert: dir.join("other-ca.crt"),
            dir,
            bin,
            as_postgres,
        };
        cluster.write_certificates()?;
        if as_postgres {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&cluster.dir))?;
        }
        let data = cluster.dir.join("data");
        run(cluster.server_command("initdb").arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
        ]))?;
        // TLS only over TCP: a plaintext TCP connection is refused by name.
        let hba = "local all all trust\n\
                   hostssl all all 127.0.0.1/32 trust\n\
                   hostssl all all ::1/128 trust\n\
                   hostnossl all all all reject\n";
        std::fs::write(data.join("pg_hba.conf"), hba).context("write pg_hba.conf")?;
        let options = format!(
            "-p {port} -c listen_addresses=localhost -c unix_socket_directories={dir} \
             -c ssl=on -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key \
             -c fsync=off -c max_connections=40",
            dir = cluster.dir.display()
        );
        run(cluster
            .server_command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.join("server.log"))
            .args(["-w", "-t", "60", "-o", &options, "start"]))
        .with_context(|| {
            let log = std::fs::read_to_string(cluster.dir.join("server.log")).unwrap_or_default();
            format!("start the TLS cluster; its log:\n{log}")
        })?;
        Ok(cluster)
    }

    /// `postgres://postgres@{host}:{port}/{dbname}` followed by `query` (for example
    /// `?sslmode=require`).
    pub fn url(&self, host: &str, dbname: &str, query: &str) -> String {
        format!(
            "postgres://postgres@{host}:{port}/{dbname}{query}",
            port = self.port
        )
    }

    fn server_command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    fn write_certificates(&self) -> anyhow::Result<()> {
        let (ca, ca_key) = certificate_authority("courier test CA")?;
        let (other_ca, _) = certificate_authority("courier unrelated CA")?;
        let server_key = rcgen::KeyPair::generate()?;
        let server = rcgen::CertificateParams::new(vec!["localhost".to_string()])?.signed_by(
            &server_key,
            &ca,
            &ca_key,
        )?;
        write_private(&self.dir.join("server.key"), &server_key.serialize_pem())?;
        std::fs::write(self.dir.join("server.crt"), server.pem())?;
        std::fs::write(&self.ca_cert, ca.pem())?;
        std::fs::write(&self.other_ca_cert, other_ca.pem())?;
        Ok(())
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = self
            .server_command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn certificate_authority(name: &str) -> anyhow::Result<(rcgen::Certificate, rcgen::KeyPair)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key)?;
    Ok((cert, key))
}

/// The server refuses a key file others can read.
fn write_private(path: &Path, pem: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, pem)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// The installed server's programs: `COURIER_PG_BIN` or the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout).
fn server_bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("COURIER_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql; set COURIER_PG_BIN to the server's bin directory")?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .context("no PostgreSQL server with initdb under /usr/lib/postgresql")
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    run_output(command).map(|_| ())
}

fn run_output(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("run {command:?}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
