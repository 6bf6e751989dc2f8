//! The claim query's head-of-line rules, run straight against real PostgreSQL (no relay, no
//! emulator): which rows a claim may take while other rows of their key are parked or held by
//! another owner's live claim.

use courier::outbox::store::{ClaimedRow, FailedRow, OutboxStore};
use courier::outbox::{NewEvent, Outbox};
use courier::CourierConfig;
use courier_testkit::{wait_until, TestDb};
use std::sync::Mutex;
use std::time::Duration;
use uuid::Uuid;

const SHARD: u32 = 0;
const LEASE: Duration = Duration::from_secs(2);

struct Setup {
    db: TestDb,
    store: OutboxStore,
}

/// One shard, so every key lands in shard 0; `events` are `(key, version)` appended in order.
async fn setup(events: &[(&str, i64)]) -> anyhow::Result<Setup> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let mut config = CourierConfig::default();
    config.database = db.config.clone();
    config.relay.shard_count = 1;
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    let events = events
        .iter()
        .map(|(key, version)| {
            NewEvent::new(
                "t.events",
                "video",
                *key,
                "VideoChanged",
                *version,
                b"x".to_vec(),
            )
        })
        .collect();
    Outbox::new(&config).append_all(&tx, events).await?;
    tx.commit().await?;
    drop(conn);
    let store = OutboxStore::new(db.pool.clone(), "courier");
    Ok(Setup { db, store })
}

fn keys(rows: &[ClaimedRow]) -> Vec<(String, i64)> {
    rows.iter()
        .map(|r| (r.aggregate_id.clone(), r.version))
        .collect()
}

fn owned(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

async fn contested_until_is_set(db: &TestDb) -> anyhow::Result<bool> {
    let row = db
        .client()
        .await?
        .query_one(
            "SELECT contested_until IS NOT NULL FROM courier.outbox_shard_state WHERE shard = 0",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn a_live_claim_of_another_owner_holds_back_its_keys_later_versions_until_the_lease_ends(
) -> anyhow::Result<()> {
    let s = setup(&[("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1)]).await?;
    let (first, second) = (Uuid::new_v4(), Uuid::new_v4());

    let taken = s.store.claim(SHARD, first, LEASE, 1).await?;
    assert_eq!(keys(&taken), owned(&[("a", 1)]));
    assert!(
        !contested_until_is_set(&s.db).await?,
        "one owner alone does not contest its shard"
    );

    // A second owner (a takeover, or a stale owner still claiming): a@1 is held by a live
    // claim, so a@2 and a@3 must wait; the other keys flow.
    let taken = s.store.claim(SHARD, second, LEASE, 10).await?;
    assert_eq!(keys(&taken), owned(&[("b", 1), ("c", 1)]));
    assert!(contested_until_is_set(&s.db).await?);

    // Once the first owner's lease is over, its row is claimable again, and the key behind it.
    let late = Mutex::new(Vec::new());
    wait_until(
        Duration::from_secs(10),
        "the first owner's lease to end",
        || {
            let (store, late) = (&s.store, &late);
            async move {
                match store.claim(SHARD, second, LEASE, 10).await {
                    Ok(rows) if !rows.is_empty() => {
                        *late.lock().expect("lock") = keys(&rows);
                        true
                    }
                    _ => false,
                }
            }
        },
    )
    .await?;
    let late = late.into_inner().expect("lock");
    assert_eq!(late, owned(&[("a", 1), ("a", 2), ("a", 3)]));
    Ok(())
}

#[tokio::test]
async fn the_owners_own_claims_do_not_hold_back_its_next_claim() -> anyhow::Result<()> {
    let s = setup(&[("a", 1), ("a", 2), ("b", 1)]).await?;
    let token = Uuid::new_v4();
    let taken = s.store.claim(SHARD, token, LEASE, 1).await?;
    assert_eq!(keys(&taken), owned(&[("a", 1)]));
    // Its publishers keep a key in claim order, so a@2 may go out behind a@1.
    let taken = s.store.claim(SHARD, token, LEASE, 10).await?;
    assert_eq!(keys(&taken), owned(&[("a", 2), ("b", 1)]));
    Ok(())
}

#[tokio::test]
async fn a_row_waiting_for_its_retry_or_dead_holds_back_its_key_only() -> anyhow::Result<()> {
    let s = setup(&[("a", 1), ("a", 2), ("b", 1), ("b", 2), ("c", 1)]).await?;
    let token = Uuid::new_v4();
    let taken = s.store.claim(SHARD, token, LEASE, 1).await?;
    assert_eq!(keys(&taken), owned(&[("a", 1)]));
    let a1 = taken[0].seq;
    let taken = s.store.claim(SHARD, token, LEASE, 1).await?;
    assert_eq!(keys(&taken), owned(&[("a", 2)]));
    let a2 = taken[0].seq;
    let taken = s.store.claim(SHARD, token, LEASE, 1).await?;
    assert_eq!(keys(&taken), owned(&[("b", 1)]));
    let b1 = taken[0].seq;
    // a@2 went back untried behind a@1's failure; a@1 retries in an hour; b@1 is dead.
    s.store.release(&[a2], token).await?;
    let in_an_hour = chrono::Utc::now() + chrono::Duration::hours(1);
    s.store
        .mark_failed(
            &[
                FailedRow {
                    seq: a1,
                    error: "unavailable".into(),
                    retry_at: Some(in_an_hour),
                    dead: false,
                },
                FailedRow {
                    seq: b1,
                    error: "permanent".into(),
                    retry_at: None,
                    dead: true,
                },
            ],
            token,
        )
        .await?;
    let taken = s.store.claim(SHARD, token, LEASE, 10).await?;
    assert_eq!(keys(&taken), owned(&[("c", 1)]));
    Ok(())
}
