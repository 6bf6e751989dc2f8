//! P7 on the read side: a large backlog does not flow into memory. Its own test binary, so the
//! process's resident memory belongs to this test alone.

mod support;

use courier::inbound::ConsumerOptions;
use courier_testkit::wait_until;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;

const BACKLOG: usize = 20_000;
/// Each payload's size: the whole backlog is ~100 MB of payload (20,000 of 5 kB bound memory as
/// 100,000 of 1 kB did, in 22 s instead of 184).
const PAYLOAD_BYTES: usize = 5_000;
const STREAMS: u32 = 2;
const MAX_OUTSTANDING: u32 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_100_mb_keeps_memory_bounded() -> anyhow::Result<()> {
    // No acked-message retention: the emulator would keep the whole backlog in its heap.
    // A 60 s ack deadline: the emulator ignores server-side flow control and pushes messages
    // the client does not read yet; with 10 s many expire there and come back as duplicates.
    let s = read_setup_with(
        |sub| {
            sub.retain_acked = false;
            sub.ack_deadline_secs = 60;
        },
        |c| {
            c.consumer.streams = STREAMS;
            c.consumer.max_outstanding_messages = MAX_OUTSTANDING;
            c.consumer.lease_extension_secs = 60;
        },
    )
    .await?;
    let filler = "x".repeat(PAYLOAD_BYTES);
    // Published in chunks (inside `publish`), so the publisher never holds the whole backlog.
    for chunk in 0..BACKLOG / 5_000 {
        let events: Vec<TestEvent> = (0..5_000)
            .map(|i| {
                let n = chunk * 5_000 + i;
                TestEvent::new(
                    &format!("video-{}", n % 1_000),
                    (n / 1_000 + 1) as i64,
                    &filler,
                )
            })
            .collect();
        s.publish(&events).await?;
    }
    let baseline = rss_bytes();

    let peak = Arc::new(AtomicU64::new(baseline));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                peak.fetch_max(rss_bytes(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let consumer = s.spawn(Videos::new(), ConsumerOptions::default());
    wait_until(Duration::from_secs(240), "the backlog drained", || async {
        consumer.stats().applied >= BACKLOG as u64
    })
    .await?;
    done.store(true, Ordering::SeqCst);
    sampler.await?;

    let stats = consumer.stats();
    let growth = peak.load(Ordering::SeqCst).saturating_sub(baseline);
    eprintln!(
        "backlog {BACKLOG} × {PAYLOAD_BYTES} B: peak outstanding {} (limit {}), \
         resident memory {} MiB → peak {} MiB (+{} MiB), {} redelivered duplicates",
        stats.peak_outstanding,
        STREAMS * MAX_OUTSTANDING,
        baseline >> 20,
        peak.load(Ordering::SeqCst) >> 20,
        growth >> 20,
        stats.duplicates
    );
    assert_eq!(stats.applied, BACKLOG as u64, "{stats:?}");
    // Flow control: never more than the per-stream limit in the process.
    let limit = u64::from(STREAMS * MAX_OUTSTANDING);
    assert!(
        stats.peak_outstanding <= limit,
        "outstanding peaked at {} for a limit of {limit}",
        stats.peak_outstanding
    );
    // Pulling the whole backlog would add ~100 MB of payloads alone.
    assert!(
        growth < 48 << 20,
        "resident memory grew by {} MiB",
        growth >> 20
    );
    Ok(())
}
