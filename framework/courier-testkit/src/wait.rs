use std::future::Future;
use std::time::Duration;

/// Polls `condition` every 50 ms until it returns true, failing with `what` after `timeout`.
/// A condition that itself hangs is cut off at the deadline too.
pub async fn wait_until<F, Fut>(
    timeout: Duration,
    what: &str,
    mut condition: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(true) = tokio::time::timeout_at(deadline, condition()).await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
