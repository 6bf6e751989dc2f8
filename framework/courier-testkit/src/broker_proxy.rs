//! A TCP proxy between Pub/Sub clients and the emulator that can make Pub/Sub slow or silent
//! for a while (load-tests' `broker-slow` fault, the relay's congestion tests): every byte is held until a due instant, in order, so the
//! gRPC streams stay intact and only their timing changes, as with a congested or stalled
//! broker. Real Pub/Sub slows down this way under load or in an incident; the emulator alone
//! answers at the speed of this machine.

use anyhow::Context as _;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// How the proxy treats traffic now.
#[derive(Debug, Clone, Copy, Default)]
struct Condition {
    /// Added to every chunk in each direction.
    delay: Duration,
    /// Nothing is delivered before this instant ("not at all", for a while).
    silent_until: Option<Instant>,
}

impl Condition {
    fn due(&self, now: Instant) -> Instant {
        let due = now + self.delay;
        self.silent_until.map_or(due, |silent| due.max(silent))
    }
}

/// The proxy; it stops with the runtime.
pub struct BrokerProxy {
    /// `host:port` the workers connect to instead of the emulator.
    pub host: String,
    condition: Arc<Mutex<Condition>>,
}

/// Bytes read per chunk; a chunk is the unit that is delayed.
const CHUNK: usize = 64 * 1024;

impl BrokerProxy {
    /// Listens on a free local port and forwards every connection to `upstream`.
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the broker proxy")?;
        let host = listener
            .local_addr()
            .context("the proxy's address")?
            .to_string();
        let condition = Arc::new(Mutex::new(Condition::default()));
        let upstream = upstream.to_string();
        let shared = condition.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, condition) = (upstream.clone(), shared.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::spawn(pump(client_read, server_write, condition.clone()));
                        tokio::spawn(pump(server_read, client_write, condition));
                    }
                });
            }
        });
        Ok(Self { host, condition })
    }

    /// Every chunk takes `delay` longer in each direction, for `window`.
    pub async fn slow_for(&self, delay: Duration, window: Duration) {
        self.set(Condition {
            delay,
            silent_until: None,
        });
        tokio::time::sleep(window).await;
        self.set(Condition::default());
    }

    /// Nothing gets through for `window`; then everything held is delivered, in order.
    pub async fn silent_for(&self, window: Duration) {
        self.set(Condition {
            delay: Duration::ZERO,
            silent_until: Some(Instant::now() + window),
        });
        tokio::time::sleep(window).await;
        self.set(Condition::default());
    }

    fn set(&self, condition: Condition) {
        if let Ok(mut current) = self.condition.lock() {
            *current = condition;
        }
    }
}

/// Copies `from` to `to`, each chunk no earlier than its due instant, in arrival order.
/// Memory is bounded by what the peers send within one delay: gRPC's flow-control windows.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, condition: Arc<Mutex<Condition>>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        while let Some(item) = rx.recv().await {
            queue.push_back(item);
            while let Some((due, bytes)) = queue.pop_front() {
                tokio::time::sleep_until(due).await;
                if to.write_all(&bytes).await.is_err() {
                    return;
                }
                while let Ok(next) = rx.try_recv() {
                    queue.push_back(next);
                }
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buffer = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let due = condition
                    .lock()
                    .map_or_else(|_| Instant::now(), |c| c.due(Instant::now()));
                if tx.send((due, buffer[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends one byte through the proxy to the echo server and back; returns how long it took.
    async fn round_trip(client: &mut TcpStream, byte: u8) -> anyhow::Result<Duration> {
        let started = Instant::now();
        client.write_all(&[byte]).await?;
        let mut got = [0u8; 1];
        client.read_exact(&mut got).await?;
        anyhow::ensure!(got[0] == byte, "got {} for {byte}", got[0]);
        Ok(started.elapsed())
    }

    /// An echo server behind the proxy: bytes arrive intact and in order, late by the delay
    /// while slowed, not at all while silent.
    #[tokio::test]
    async fn traffic_is_delayed_or_held_in_order() -> anyhow::Result<()> {
        let echo = TcpListener::bind("127.0.0.1:0").await?;
        let upstream = echo.local_addr()?.to_string();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = Arc::new(BrokerProxy::start(&upstream).await?);
        let mut client = TcpStream::connect(&proxy.host).await?;
        assert!(round_trip(&mut client, 1).await? < Duration::from_millis(200));

        let slowed = proxy.clone();
        let slow = tokio::spawn(async move {
            slowed
                .slow_for(Duration::from_millis(150), Duration::from_secs(2))
                .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let took = round_trip(&mut client, 2).await?;
        assert!(
            took >= Duration::from_millis(300),
            "two delayed hops: {took:?}"
        );
        slow.await?;

        let silenced = proxy.clone();
        let silent =
            tokio::spawn(async move { silenced.silent_for(Duration::from_millis(600)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let took = round_trip(&mut client, 3).await?;
        assert!(
            took >= Duration::from_millis(500),
            "held while silent: {took:?}"
        );
        silent.await?;
        assert!(round_trip(&mut client, 4).await? < Duration::from_millis(200));
        Ok(())
    }
}
