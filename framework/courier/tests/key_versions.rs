//! The version each key of a delta projection stands at (inbound/parked.rs `KeyVersions`,
//! 0019_append_key_versions.sql), straight against real PostgreSQL: read and moved in every
//! projection transaction of the key, one transaction of a key at a time, carried over from the
//! table before the log, and (P9) as cheap after 20,000 moves under a pinned horizon as right
//! after the pin began. A row rewritten in place keeps every old version while pinned (a chain
//! the read follows to its end, and once its page fills, index entries too).

use chrono::{DateTime, Utc};
use courier::operations::{KeyMove, KeyVersions};
use courier_testkit::{generic_plan, wait_until, TestDb};
use std::time::Duration;

const GROUP: &str = "search_reader";
/// Keys of the projection: each transaction moves all of them by one version.
const KEYS: usize = 50;
/// Versions of every key moved in each measured window.
const WINDOW_VERSIONS: i64 = 20;
/// Versions of every key moved between the two windows while pinned.
const FILLER_VERSIONS: i64 = 400;

/// The statements on the key versions (a regular expression for `TestDb::fewest_pages`).
const KEY_VERSION_STATEMENTS: &str = "projection_version|projection_keys";

/// One projection transaction over every key: reads where each stands (the one before
/// `version`, as a contiguous projection does) and moves it to `version`.
async fn advance_all(
    db: &TestDb,
    versions: &KeyVersions,
    keys: &[&str],
    version: i64,
) -> anyhow::Result<()> {
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    let expected: Vec<(&str, i64)> = keys.iter().map(|k| (*k, version - 1)).collect();
    let stored = versions.stored(&tx, GROUP, &expected).await?;
    for key in keys {
        let stands_at = stored.get(*key).copied().unwrap_or(0);
        anyhow::ensure!(
            stands_at == version - 1,
            "{key} stands at {stands_at}, not {}",
            version - 1
        );
    }
    let now = Utc::now();
    let moves: Vec<KeyMove> = keys
        .iter()
        .map(|key| moved(key, version - 1, version, now))
        .collect();
    versions.advance(&tx, GROUP, &moves).await?;
    tx.commit().await?;
    Ok(())
}

/// Pages read per key moved while every key moves through `WINDOW_VERSIONS` versions from
/// `from`, and the version after the window. A window that the server's eviction of statement
/// counts crossed is void and the next one is measured.
async fn pages_per_move(
    db: &TestDb,
    versions: &KeyVersions,
    keys: &[&str],
    from: i64,
) -> anyhow::Result<(f64, i64)> {
    let mut next = from;
    let pages = db
        .fewest_pages(KEY_VERSION_STATEMENTS, 1, async || {
            for version in next..next + WINDOW_VERSIONS {
                advance_all(db, versions, keys, version).await?;
            }
            next += WINDOW_VERSIONS;
            Ok(())
        })
        .await?;
    let per_move = pages as f64 / (WINDOW_VERSIONS as f64 * keys.len() as f64);
    Ok((per_move, next))
}

#[tokio::test(flavor = "multi_thread")]
async fn key_versions_read_no_more_pages_after_20k_moves_under_a_pinned_horizon(
) -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    db.enable_statement_stats().await?;
    let versions = KeyVersions::new("courier");
    let names: Vec<String> = (0..KEYS).map(|k| format!("video-{k}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    // Other keys, as a service has: the index is as deep before the pin as after it.
    let others: Vec<String> = (0..20_000).map(|k| format!("channel-{k}")).collect();
    let others: Vec<&str> = others.iter().map(String::as_str).collect();
    advance_all(&db, &versions, &others, 1).await?;
    // Every key has a version, and the statements are prepared, before the pin.
    advance_all(&db, &versions, &keys, 1).await?;

    let pin = db.pin_snapshot().await?;
    let held: i64 = db
        .scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND backend_xmin IS NOT NULL AND state = 'idle in transaction'",
        )
        .await?;
    assert_eq!(held, 1, "the pinning session holds its snapshot");

    let (early, filler_from) = pages_per_move(&db, &versions, &keys, 2).await?;
    for version in filler_from..filler_from + FILLER_VERSIONS {
        advance_all(&db, &versions, &keys, version).await?;
    }
    let (late, _) = pages_per_move(&db, &versions, &keys, filler_from + FILLER_VERSIONS).await?;
    pin.batch_execute("COMMIT").await?;
    eprintln!(
        "pages per key moved: {early:.2} right after the pin, {late:.2} after {} more moves \
         under it",
        KEYS as i64 * FILLER_VERSIONS
    );
    assert!(
        late <= early * 1.5 + 0.5,
        "pages per key moved grew under the pin: {early:.2} → {late:.2}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_transaction_of_a_key_waits_and_reads_what_the_first_committed(
) -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let versions = KeyVersions::new("courier");
    advance_all(&db, &versions, &["video-1"], 1).await?;

    let mut first_conn = db.pool.get().await?;
    let first = first_conn.transaction().await?;
    assert_eq!(
        versions.stored(&first, GROUP, &[("video-1", 1)]).await?["video-1"],
        1
    );
    let pid_row = first.query_one("SELECT pg_backend_pid()", &[]).await?;
    let first_pid: i32 = pid_row.get(0);

    let second = tokio::spawn({
        let (pool, versions) = (db.pool.clone(), versions.clone());
        async move {
            let mut conn = pool.get().await?;
            let tx = conn.transaction().await?;
            let stored = versions
                .stored(&tx, GROUP, &[("video-1", 1), ("video-2", 0)])
                .await?;
            tx.commit().await?;
            anyhow::Ok(stored)
        }
    });
    // The second waits on the first's lock on video-1.
    wait_until(Duration::from_secs(10), "the second transaction waits for the key", || {
        let db = &db;
        async move {
            db.scalar(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE {first_pid} = ANY(pg_blocking_pids(pid))"
            ))
            .await
            .map(|waiting| waiting == 1)
            .unwrap_or(false)
        }
    })
    .await?;
    assert!(
        !second.is_finished(),
        "the second read did not wait for the first"
    );
    versions
        .advance(&first, GROUP, &[moved("video-1", 1, 2, Utc::now())])
        .await?;
    first.commit().await?;
    let stored = second.await??;
    assert_eq!(
        stored.get("video-1"),
        Some(&2),
        "read after the first committed"
    );
    assert_eq!(stored.get("video-2"), None, "a key not seen yet");
    Ok(())
}

/// A transaction that reads `keys` (locking them), spawned; it commits once `release` fires.
fn spawn_reader(
    db: &TestDb,
    keys: &'static [&'static str],
    release: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let pool = db.pool.clone();
    tokio::spawn(async move {
        let versions = KeyVersions::new("courier");
        let mut conn = pool.get().await?;
        let tx = conn.transaction().await?;
        let expected: Vec<(&str, i64)> = keys.iter().map(|k| (*k, 1)).collect();
        versions.stored(&tx, GROUP, &expected).await?;
        let _ = release.await;
        tx.commit().await?;
        anyhow::Ok(())
    })
}

/// Sessions of this database waiting for a lock.
async fn waiting(db: &TestDb) -> i64 {
    db.scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .await
    .unwrap_or(-1)
}

/// Two transactions given the same keys in opposite orders lock them in one order, so neither
/// holds a key the other waits for. Made to collide: a third holds the first key, the one given
/// it first queues behind it, then the one given it last; unsorted, that one would take the
/// second key at once and wait on the first, which the other takes when the third ends:
/// a deadlock, which PostgreSQL ends by failing one of them.
#[tokio::test(flavor = "multi_thread")]
async fn transactions_given_the_same_keys_in_any_order_never_deadlock() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let versions = KeyVersions::new("courier");
    advance_all(&db, &versions, &["video-1", "video-2"], 1).await?;
    let (release_holder, holder_released) = tokio::sync::oneshot::channel();
    let holder = spawn_reader(&db, &["video-1"], holder_released);
    wait_until(
        Duration::from_secs(10),
        "the holder locks video-1",
        || async {
            db.scalar(
                "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'idle in transaction'",
            )
            .await
            .map(|idle| idle == 1)
            .unwrap_or(false)
        },
    )
    .await?;
    let (release_first, first_released) = tokio::sync::oneshot::channel();
    let in_order = spawn_reader(&db, &["video-1", "video-2"], first_released);
    wait_until(
        Duration::from_secs(10),
        "the first waits for video-1",
        || async { waiting(&db).await == 1 },
    )
    .await?;
    let (release_second, second_released) = tokio::sync::oneshot::channel();
    let reversed = spawn_reader(&db, &["video-2", "video-1"], second_released);
    wait_until(Duration::from_secs(10), "the second waits too", || async {
        waiting(&db).await == 2
    })
    .await?;
    let _ = release_first.send(());
    let _ = release_second.send(());
    let _ = release_holder.send(());
    holder.await??;
    in_order.await??;
    reversed.await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_move_never_goes_back_and_keeps_the_keys_first_publish_time() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let versions = KeyVersions::new("courier");
    let first: chrono::DateTime<Utc> = "2026-01-01T00:00:00Z".parse()?;
    let later: chrono::DateTime<Utc> = "2026-02-01T00:00:00Z".parse()?;
    let mut conn = db.pool.get().await?;
    for (version, at) in [(3, first), (5, later), (4, later), (5, later)] {
        let tx = conn.transaction().await?;
        let stands_at = versions
            .stored(&tx, GROUP, &[("video-1", version - 1)])
            .await?;
        let from = stands_at.get("video-1").copied().unwrap_or(0);
        versions
            .advance(&tx, GROUP, &[moved("video-1", from, version, at)])
            .await?;
        tx.commit().await?;
    }
    let row = conn
        .query_one(
            "SELECT version, first_publish_time,
                    (SELECT count(*) FROM courier.projection_version_log)
             FROM courier.projection_versions",
            &[],
        )
        .await?;
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, chrono::DateTime<Utc>>(1),
            row.get::<_, i64>(2)
        ),
        (5, first, 1),
        "one entry, at the highest version, with the key's first publish time"
    );
    Ok(())
}

/// The version a key is expected at is where its reads and moves look first, never what they
/// answer: from below, at, or above the key's newest entry (a redelivery, in order, a gap or
/// a rolled-back move), with entries dead behind a pin or not, each finds the newest.
#[tokio::test]
async fn reads_and_moves_find_a_keys_newest_version_from_any_expected_version() -> anyhow::Result<()>
{
    let db = TestDb::new().await?;
    let versions = KeyVersions::new("courier");
    for version in 1..=5 {
        advance_all(&db, &versions, &["video-1"], version).await?;
    }
    let pin = db.pin_snapshot().await?;
    for version in 6..=9 {
        advance_all(&db, &versions, &["video-1"], version).await?;
    }
    let mut conn = db.pool.get().await?;
    for expected in [0, 1, 5, 8, 9, 10, 1_000] {
        let tx = conn.transaction().await?;
        let stored = versions
            .stored(&tx, GROUP, &[("video-1", expected), ("video-2", expected)])
            .await?;
        assert_eq!(
            (stored.get("video-1"), stored.get("video-2")),
            (Some(&9), None),
            "read expecting version {expected}"
        );
    }
    // A move told the wrong version still replaces the key's newest entry: one stays.
    for (from, to) in [(0, 10), (3, 11), (11, 12), (40, 13)] {
        let tx = conn.transaction().await?;
        versions.stored(&tx, GROUP, &[("video-1", from)]).await?;
        versions
            .advance(&tx, GROUP, &[moved("video-1", from, to, Utc::now())])
            .await?;
        tx.commit().await?;
    }
    pin.batch_execute("COMMIT").await?;
    let entries = conn
        .query(
            "SELECT version FROM courier.projection_version_log WHERE routing_key = 'video-1'",
            &[],
        )
        .await?;
    let entries: Vec<i64> = entries.iter().map(|r| r.get(0)).collect();
    assert_eq!(entries, [13], "the key's one entry, at its last move");
    Ok(())
}

#[tokio::test]
async fn the_migration_to_the_log_keeps_every_keys_version() -> anyhow::Result<()> {
    use courier::migrate::{migrate, COURIER};
    let db = TestDb::new().await?;
    db.migrate_before("upgraded", "0019_append_key_versions")
        .await?;
    db.client()
        .await?
        .batch_execute(
            "INSERT INTO upgraded.projection_versions VALUES
                 ('g', 'video-1', 7, '2026-01-01T00:00:00Z'),
                 ('g', 'video-2', 1, '2026-01-02T00:00:00Z'),
                 ('h', 'video-1', 3, '2026-01-03T00:00:00Z')",
        )
        .await?;
    migrate(&db.pool, "upgraded", &[COURIER]).await?;

    let versions = KeyVersions::new("upgraded");
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    let g = versions
        .stored(&tx, "g", &[("video-1", 6), ("video-2", 4), ("video-3", 2)])
        .await?;
    let h = versions.stored(&tx, "h", &[("video-1", 0)]).await?;
    versions
        .advance(&tx, "g", &[moved("video-1", 7, 8, Utc::now())])
        .await?;
    tx.commit().await?;
    assert_eq!(
        (g.get("video-1"), g.get("video-2"), g.get("video-3")),
        (Some(&7), Some(&1), None)
    );
    assert_eq!(h.get("video-1"), Some(&3));
    let first: chrono::DateTime<Utc> = conn
        .query_one(
            "SELECT first_publish_time FROM upgraded.projection_versions
             WHERE consumer_group = 'g' AND routing_key = 'video-1' AND version = 8",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(first.to_rfc3339(), "2026-01-01T00:00:00+00:00");
    Ok(())
}

#[tokio::test]
async fn the_reads_and_moves_are_planned_through_the_index() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let client = db.client().await?;
    // A new log, never analyzed (PostgreSQL plans from its size on disk); one of 2,000 keys,
    // still never analyzed (a new service's, with autovacuum off or not yet round: the lock
    // was planned there as a scan of the whole group, and its cost grew with every key seen);
    // then one of 20,000 keys, analyzed. A log of a few pages, analyzed, is read whole: as
    // cheap as its index, and planned again at the next analyze, as autovacuum's come with the
    // log's inserts.
    let fill = |keys: i64| {
        format!(
            "INSERT INTO courier.projection_keys
             SELECT '{GROUP}', 'video-' || i, now() FROM generate_series(1, {keys}) i
             ON CONFLICT DO NOTHING;
             INSERT INTO courier.projection_version_log
             SELECT '{GROUP}', 'video-' || i, 1 FROM generate_series(1, {keys}) i
             ON CONFLICT DO NOTHING;"
        )
    };
    for log in [
        "new",
        "never analyzed, of 2,000 keys,",
        "analyzed, of 20,000 keys,",
    ] {
        match log {
            "new" => {}
            "never analyzed, of 2,000 keys," => client.batch_execute(&fill(2_000)).await?,
            _ => {
                client.batch_execute(&fill(20_000)).await?;
                client
                    .batch_execute(
                        "ANALYZE courier.projection_keys, courier.projection_version_log",
                    )
                    .await?
            }
        }
        let keys = "ARRAY['video-1', 'video-2']";
        let plans = [
            (
                "lock_key_versions.sql",
                generic_plan(
                    &client,
                    &sql(include_str!("../src/inbound/queries/lock_key_versions.sql")),
                    "text, text[]",
                    &format!("'{GROUP}', {keys}"),
                )
                .await?,
            ),
            (
                "key_versions.sql",
                generic_plan(
                    &client,
                    &with_key_newest(
                        include_str!("../src/inbound/queries/key_versions.sql"),
                        "l.version",
                    ),
                    "text, text[], bigint[]",
                    &format!("'{GROUP}', {keys}, ARRAY[1, 1]::bigint[]"),
                )
                .await?,
            ),
            (
                "advance_key_version.sql",
                generic_plan(
                    &client,
                    &with_key_newest(
                        include_str!("../src/inbound/queries/advance_key_version.sql"),
                        "l.ctid, l.version",
                    ),
                    "text, text[], bigint[], timestamptz[], bigint[]",
                    &format!(
                        "'{GROUP}', {keys}, ARRAY[2, 2]::bigint[], ARRAY[now(), now()], \
                         ARRAY[1, 1]::bigint[]"
                    ),
                )
                .await?,
            ),
        ];
        for (name, plan) in &plans {
            assert!(
                !plan.contains("Seq Scan"),
                "{name} on a {log} log reads the whole table:\n{plan}"
            );
        }
        // The lock finds each key's row by its key; an index condition on the group alone
        // reads every row of the group at every call.
        let lock_plan = &plans[0].1;
        assert!(
            lock_plan
                .lines()
                .filter(|line| line.contains("Index Cond:"))
                .all(|line| line.contains("routing_key")),
            "lock_key_versions.sql on a {log} log reads the whole group:\n{lock_plan}"
        );
        // The first look at a key stops at the version it was read or expected at: below it
        // lie the dead entries a pinned horizon keeps (key_newest.sql).
        for (name, plan) in [
            ("key_versions.sql", &plans[1].1),
            ("advance_key_version.sql", &plans[2].1),
        ] {
            assert!(
                plan.contains(
                    "Index Cond: ((consumer_group = $1) AND (routing_key = k.routing_key) \
                     AND (version >= k.from_version))"
                ),
                "{name} on a {log} log does not bound its first look at a key:\n{plan}"
            );
        }
    }
    Ok(())
}

fn moved<'a>(key: &'a str, from: i64, to: i64, first_publish_time: DateTime<Utc>) -> KeyMove<'a> {
    KeyMove {
        key,
        from,
        to,
        first_publish_time,
    }
}

/// A query file as the store renders it for schema `courier`.
fn sql(template: &str) -> String {
    courier::db::render(template, "courier")
}

/// `template` with a key's newest entry (`columns` of it) looked for as the store does.
fn with_key_newest(template: &str, columns: &str) -> String {
    let newest = include_str!("../src/inbound/queries/key_newest.sql")
        .trim_end()
        .replace("{columns}", columns);
    sql(&template.replace("{newest}", &newest))
}
