use anyhow::Context as _;
use courier::config::PubSubConfig;
use courier::pubsub::{PubSub, SubscriptionSpec};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use tokio::sync::OnceCell;

/// Project id used with the emulator (any id works there).
pub const TEST_PROJECT: &str = "courier-test";

/// The Pub/Sub emulator this test binary uses. Clients are built per test: the official
/// crate's clients run background tasks on the runtime that built them.
#[derive(Debug, Clone)]
pub struct TestPubSub {
    /// `host:port` of the emulator.
    pub host: String,
    /// The Java heap it was started with; `None` for the one at `PUBSUB_EMULATOR_HOST`.
    pub heap_mib: Option<u64>,
}

static EMULATOR: OnceCell<TestPubSub> = OnceCell::const_new();

/// The Java heap of an emulator started for a test binary: enough for the ~500,000 messages a
/// test binary publishes at most (see [`TestPubSub::get_with_heap`]).
pub const TEST_HEAP_MIB: u64 = 1024;

impl TestPubSub {
    /// The emulator at `PUBSUB_EMULATOR_HOST`, or one started for this binary with
    /// [`TEST_HEAP_MIB`] of heap.
    pub async fn get() -> anyhow::Result<TestPubSub> {
        Self::get_with_heap(TEST_HEAP_MIB).await
    }

    /// The emulator at `PUBSUB_EMULATOR_HOST`, or one started for this binary with `heap_mib`
    /// of Java heap (the first call of the binary decides). The emulator keeps every message
    /// published to it, acked or not, for as long as it runs (about 1.7 KB each with Courier's
    /// attributes); once they fill its heap it spends its CPU collecting garbage and fails
    /// publishes, so a long run needs a heap sized for what it will publish.
    pub async fn get_with_heap(heap_mib: u64) -> anyhow::Result<TestPubSub> {
        EMULATOR
            .get_or_try_init(|| async {
                match std::env::var("PUBSUB_EMULATOR_HOST") {
                    Ok(host) if !host.is_empty() => {
                        wait_ready(&host).await?;
                        Ok(TestPubSub {
                            host,
                            heap_mib: None,
                        })
                    }
                    _ => start_emulator(heap_mib).await,
                }
            })
            .await
            .cloned()
    }

    pub fn config(&self) -> PubSubConfig {
        PubSubConfig {
            project: TEST_PROJECT.into(),
            emulator_host: Some(self.host.clone()),
        }
    }

    /// A project of its own: for code whose topic and subscription names are fixed (the
    /// services), the project keeps one test's names apart from another's.
    pub fn isolated_config(&self) -> PubSubConfig {
        PubSubConfig {
            project: crate::unique_name("test-project"),
            emulator_host: Some(self.host.clone()),
        }
    }

    /// A client of `config`'s project (from [`TestPubSub::isolated_config`]).
    pub fn client_for(&self, config: &PubSubConfig) -> PubSub {
        PubSub::new(config.clone())
    }

    pub fn client(&self) -> PubSub {
        PubSub::new(self.config())
    }

    /// Creates a topic with a unique name starting with `prefix`.
    pub async fn topic(&self, prefix: &str) -> anyhow::Result<String> {
        let name = crate::unique_name(prefix);
        let pubsub = self.client();
        pubsub
            .ensure_topic(&pubsub.topic_admin().await?, &name)
            .await?;
        Ok(name)
    }

    /// Creates an ordered subscription with a unique name on `topic`.
    pub async fn subscription(&self, topic: &str) -> anyhow::Result<String> {
        let name = crate::unique_name(&format!("{topic}.sub"));
        let pubsub = self.client();
        pubsub
            .ensure_subscription(
                &pubsub.subscription_admin().await?,
                &SubscriptionSpec::plain(&name, topic),
            )
            .await?;
        Ok(name)
    }
}

/// Finds the emulator launcher: `COURIER_PUBSUB_EMULATOR`, the Debian package's location, or
/// the Google Cloud SDK root reported by `gcloud info`.
pub fn emulator_launcher() -> anyhow::Result<PathBuf> {
    if let Ok(path) = std::env::var("COURIER_PUBSUB_EMULATOR") {
        return Ok(path.into());
    }
    const RELATIVE: &str = "platform/pubsub-emulator/bin/cloud-pubsub-emulator";
    let debian = PathBuf::from("/usr/lib/google-cloud-sdk").join(RELATIVE);
    if debian.exists() {
        return Ok(debian);
    }
    let output = Command::new("gcloud")
        .args(["info", "--format=value(installation.sdk_root)"])
        .output()
        .context("the Pub/Sub emulator was not found and gcloud is not installed")?;
    let root = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let path = PathBuf::from(root).join(RELATIVE);
    anyhow::ensure!(
        path.exists(),
        "the Pub/Sub emulator is not installed at {}",
        path.display()
    );
    Ok(path)
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts the emulator under a watchdog shell that stops it (its whole process group) when
/// this test process exits, however it exits.
async fn start_emulator(heap_mib: u64) -> anyhow::Result<TestPubSub> {
    let launcher = emulator_launcher()?;
    let port = free_port()?;
    let log_dir = std::env::temp_dir().join("courier-emulator-logs");
    std::fs::create_dir_all(&log_dir)?;
    let log = log_dir.join(format!("emulator-{port}.log"));
    // The watchdog ignores the signals a test runner or `timeout` sends to the whole group,
    // so it outlives the test process and can stop the emulator.
    let script = r#"
        trap '' TERM INT HUP
        setsid "$1" --host=127.0.0.1 --port="$2" > "$3" 2>&1 &
        child=$!
        while kill -0 "$4" 2>/dev/null; do sleep 1; done
        kill -- -"$child" 2>/dev/null; sleep 2; kill -9 -- -"$child" 2>/dev/null
    "#;
    Command::new("bash")
        .args(["-c", script, "watchdog"])
        .arg(&launcher)
        .arg(port.to_string())
        .arg(&log)
        .arg(std::process::id().to_string())
        .env("JAVA_OPTS", format!("-Xmx{heap_mib}m"))
        .spawn()
        .with_context(|| format!("start {}", launcher.display()))?;
    let host = format!("127.0.0.1:{port}");
    wait_ready(&host)
        .await
        .with_context(|| format!("emulator log: {}", log.display()))?;
    Ok(TestPubSub {
        host,
        heap_mib: Some(heap_mib),
    })
}

/// Waits until the emulator answers HTTP on `host`.
pub async fn wait_ready(host: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The emulator keeps HTTP connections open whatever the request says: read until the
    // answer shows up instead of until end of stream.
    let probe = || async {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        stream
            .write_all(
                format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .ok()?;
        let mut reply = Vec::new();
        let mut chunk = [0u8; 512];
        loop {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            reply.extend_from_slice(&chunk[..n]);
            if String::from_utf8_lossy(&reply).contains("\r\n\r\nOk") {
                return Some(());
            }
        }
    };
    crate::wait_until(
        Duration::from_secs(60),
        &format!("Pub/Sub emulator at {host}"),
        || async {
            tokio::time::timeout(Duration::from_secs(2), probe())
                .await
                .ok()
                .flatten()
                .is_some()
        },
    )
    .await
}
