//! Producers in any language (issue 57): the SQL appends of migrations/courier/0020_sql_append.sql
//! (and 0023) write what `Outbox::append` writes, refuse what it refuses with the same message,
//! and a Python (psycopg), a Node (pg), a Java (JDBC) and a Go (pgx) producer publish through the
//! real relay to the real emulator. The clients are tests/clients/writer.{py,js,go} and
//! Writer.java, whose packages scripts/stack.sh installs (ensure_producer_clients);
//! docs/sql-producers.md quotes them whole.

use chrono::{DateTime, SubsecRound, Utc};
use courier::outbox::MAX_MESSAGE_BYTES;
use courier::outbox::{record_shard_count, AppendError, NewEvent, Outbox};
use courier::outbox::{shard_of, stable_hash};
use courier::CourierConfig;
use courier_testkit::{test_config, wait_until, Collector, TestDb, TestPubSub};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

const TOPIC: &str = "catalog.video.events";

/// Debian's PostgreSQL JDBC driver (libpostgresql-jdbc-java), which scripts/stack.sh installs.
const JDBC_DRIVER: &str = "/usr/share/java/postgresql.jar";
/// Where Debian's Go libraries (pgx v4 among them, which scripts/stack.sh installs) live.
const GO_PATH: &str = "/usr/share/gocode";

fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

fn docs_page() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/sql-producers.md")
}

/// Keys of every kind a service uses: counters, UUIDs, non-ASCII, long, with spaces.
fn keys() -> Vec<String> {
    let mut keys: Vec<String> = (0..1500).map(|i| format!("video-{i}")).collect();
    keys.extend((0..500).map(|i| Uuid::from_u128(0x9e37_79b9_7f4a_7c15 * (i + 1)).to_string()));
    keys.extend((0..200).map(|i| format!("ключ-{i}-🎬-é")));
    keys.extend((0..50).map(|i| "k".repeat(i * 20 + 1)));
    keys.extend(["a b", "\t", "Ä", "x"].map(String::from));
    keys
}

#[tokio::test]
async fn the_sql_hash_and_shard_are_shard_rs() -> anyhow::Result<()> {
    let db = TestDb::new().await?;
    let client = db.client().await?;
    let keys = keys();
    let row = client
        .query_one(
            "SELECT array_agg(courier.fnv1a_64(k) ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY u(k, i)",
            &[&keys],
        )
        .await?;
    let hashes: Vec<i64> = row.get(0);
    for (key, hash) in keys.iter().zip(&hashes) {
        assert_eq!(
            *hash,
            i64::from_ne_bytes(stable_hash(key).to_ne_bytes()),
            "{key:?}"
        );
    }
    for count in [1_i32, 3, 4, 7, 8, 16, 1000, 1024] {
        let row = client
            .query_one(
                "SELECT array_agg(courier.shard_of(k, $2) ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY u(k, i)",
                &[&keys, &count],
            )
            .await?;
        let shards: Vec<i32> = row.get(0);
        for (key, shard) in keys.iter().zip(&shards) {
            let expected = shard_of(key, u32::try_from(count)?);
            assert_eq!(i64::from(*shard), i64::from(expected), "{key:?} of {count}");
        }
    }
    Ok(())
}

/// A varied set of events: keys of every kind, one to three versions, every optional
/// attribute alone and together, trace context, schema versions, empty and binary payloads.
fn varied_events() -> Vec<NewEvent> {
    let at = Utc::now().trunc_subsecs(6);
    let mut events = Vec::new();
    let keys = keys().into_iter().filter(|k| !k.trim().is_empty());
    for (i, key) in keys.step_by(7).enumerate() {
        for version in 1..=(i % 3 + 1) as i64 {
            let payload: Vec<u8> = (0..(i * 13 + version as usize) % 40)
                .map(|b| (b * 37 + i) as u8)
                .collect();
            let mut event = NewEvent::new(TOPIC, "video", &key, "video.changed", version, payload);
            event.occurred_at = at - chrono::Duration::microseconds(i as i64 * 1013);
            event = match i % 6 {
                0 => event,
                1 => event.with_correlation_id(format!("c-{i}")),
                2 => event
                    .with_causation_id(format!("cause-{i}"))
                    .with_user_id("user-7")
                    .with_schema_version(3),
                3 => event
                    .with_source_service("catalog")
                    .with_source_version("1.2.3"),
                4 => event
                    .with_trace_id(format!("{:032x}", i + 1))
                    .with_span_id(format!("{:016x}", i + 2))
                    .with_traceparent(format!("00-{:032x}-{:016x}-01", i + 1, i + 2)),
                _ => event
                    .with_correlation_id("")
                    .with_causation_id("x")
                    .with_user_id("ü")
                    .with_source_service("s")
                    .with_source_version("v")
                    .with_trace_id("t")
                    .with_span_id("s")
                    .with_traceparent("p"),
            };
            events.push(event);
        }
    }
    events
}

/// The optional attributes of `event` as the SQL functions take them.
fn attributes_json(event: &NewEvent) -> serde_json::Value {
    serde_json::json!(event.optional_attributes())
}

/// A database whose shard count is recorded, as `<service> migrate` leaves it.
async fn recorded_db(shard_count: u32) -> anyhow::Result<(TestDb, CourierConfig)> {
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let mut config = test_config(&db, &pubsub);
    config.relay.shard_count = shard_count;
    record_shard_count(&db.client().await?, &config).await?;
    Ok((db, config))
}

/// Every column of every outbox row but `seq`, `created_at` and the relay's, and the ledger
/// with the causes it recorded.
async fn rows(db: &TestDb) -> anyhow::Result<Vec<String>> {
    let client = db.client().await?;
    let mut rows: Vec<String> = client
        .query(
            "SELECT (id, shard, topic, aggregate_type, aggregate_id, event_type, version,
                     schema_version, encode(payload, 'hex'), attributes, occurred_at)::text
             FROM courier.outbox ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    rows.extend(
        client
            .query(
                "SELECT (aggregate_id, version, causation_id)::text FROM courier.outbox_versions
                 ORDER BY aggregate_id, version",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get::<_, String>(0)),
    );
    Ok(rows)
}

#[tokio::test]
async fn sql_appends_write_the_rows_outbox_append_writes() -> anyhow::Result<()> {
    let events = varied_events();
    assert!(events.len() > 500, "{}", events.len());
    let (rust_db, config) = recorded_db(7).await?;
    let (sql_db, _) = recorded_db(7).await?;

    // Rust: half one append per transaction, half in batches of 50.
    let outbox = Outbox::new(&config);
    let (single, batched) = events.split_at(events.len() / 2);
    let mut conn = rust_db.pool.get().await?;
    for event in single {
        let tx = conn.transaction().await?;
        outbox.append(&tx, event.clone()).await?;
        tx.commit().await?;
    }
    for chunk in batched.chunks(50) {
        let tx = conn.transaction().await?;
        outbox.append_all(&tx, chunk.to_vec()).await?;
        tx.commit().await?;
    }

    // SQL: the same, through append_event and append_events.
    let mut client = sql_db.client().await?;
    for event in single {
        let tx = client.transaction().await?;
        let id: Uuid = append_event(&tx, event).await?.get(0);
        assert_eq!(id, event.event_id);
        tx.commit().await?;
    }
    for chunk in batched.chunks(50) {
        let tx = client.transaction().await?;
        let ids: Vec<Uuid> = append_events(&tx, chunk).await?.get(0);
        assert_eq!(ids, chunk.iter().map(|e| e.event_id).collect::<Vec<_>>());
        tx.commit().await?;
    }

    let (rust_rows, sql_rows) = (rows(&rust_db).await?, rows(&sql_db).await?);
    assert_eq!(rust_rows.len(), 2 * events.len());
    for (rust, sql) in rust_rows.iter().zip(&sql_rows) {
        assert_eq!(rust, sql);
    }
    assert_eq!(rust_rows, sql_rows);
    // The shards are the ones shard.rs gives, spread over all seven.
    let shards = sql_db
        .scalar("SELECT count(DISTINCT shard) FROM courier.outbox")
        .await?;
    assert_eq!(shards, 7);

    // Defaults: a fresh time-ordered id, schema version 1, now, no attributes.
    let row = client
        .query_one(
            "SELECT courier.append_event('catalog.video.events', 'video', 'fresh', 'video.created', 1, '\\x01')",
            &[],
        )
        .await?;
    let id: Uuid = row.get(0);
    assert_eq!(id.get_version_num(), 7);
    let row = client
        .query_one(
            "SELECT shard, schema_version, attributes::text, now() - occurred_at < interval '1 minute'
             FROM courier.outbox WHERE id = $1",
            &[&id],
        )
        .await?;
    assert_eq!(row.get::<_, i32>(0), shard_of("fresh", 7) as i32);
    assert_eq!(row.get::<_, i32>(1), 1);
    assert_eq!(row.get::<_, String>(2), "{}");
    assert!(row.get::<_, bool>(3));
    Ok(())
}

/// A caused append replayed (the same version with the same `causation_id`) writes nothing
/// through the SQL functions either, and its id comes back NULL where `Outbox::append` says
/// `replay`; another cause, or none, is still a conflict. Both paths leave the same rows.
#[tokio::test]
async fn a_caused_sql_append_is_written_once_per_cause() -> anyhow::Result<()> {
    let (rust_db, config) = recorded_db(4).await?;
    let (sql_db, _) = recorded_db(4).await?;
    let caused = |version: i64, cause: Option<&str>| {
        let event = NewEvent::new(TOPIC, "video", "v-1", "video.indexed", version, vec![7]);
        match cause {
            Some(cause) => event.with_causation_id(cause),
            None => event,
        }
    };
    // The calls: a first append, its replay, a batch of a replay and a new version, and then
    // the same version with another cause and with none (both refused).
    let calls = [
        vec![caused(1, Some("e-1"))],
        vec![caused(1, Some("e-1"))],
        vec![caused(1, Some("e-1")), caused(2, Some("e-2"))],
        vec![caused(2, Some("e-3"))],
        vec![caused(2, None)],
    ];
    let expected: [Option<Vec<bool>>; 5] = [
        Some(vec![false]),
        Some(vec![true]),
        Some(vec![true, false]),
        None,
        None,
    ];

    let outbox = Outbox::new(&config);
    let mut rust = rust_db.pool.get().await?;
    let mut sql = sql_db.client().await?;
    for (events, expected) in calls.iter().zip(&expected) {
        let tx = rust.transaction().await?;
        match (outbox.append_all(&tx, events.clone()).await, expected) {
            (Ok(appended), Some(replays)) => {
                let got: Vec<bool> = appended.iter().map(|a| a.replay).collect();
                assert_eq!(&got, replays, "{events:?}");
                tx.commit().await?;
            }
            (Err(e), None) => assert!(e.is_conflict(), "{e}"),
            (result, _) => panic!("Outbox::append_all of {events:?}: {result:?}"),
        }

        let tx = sql.transaction().await?;
        match (append_events(&tx, events).await, expected) {
            (Ok(row), Some(replays)) => {
                let ids: Vec<Option<Uuid>> = row.get(0);
                let want: Vec<Option<Uuid>> = events
                    .iter()
                    .zip(replays)
                    .map(|(e, replay)| (!replay).then_some(e.event_id))
                    .collect();
                assert_eq!(ids, want, "{events:?}");
                tx.commit().await?;
            }
            (Err(e), None) => {
                assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION), "{e}")
            }
            (result, _) => panic!("append_events of {events:?}: {result:?}"),
        }
    }
    // append_event gives a replay's id as NULL too.
    let tx = sql.transaction().await?;
    let id: Option<Uuid> = tx
        .query_one(
            "SELECT courier.append_event($1, 'video', 'v-1', 'video.indexed', 1, '\\x07', $2)",
            &[&TOPIC, &serde_json::json!({ "causation_id": "e-1" })],
        )
        .await?
        .get(0);
    assert_eq!(id, None);
    tx.commit().await?;

    let (rust_rows, sql_rows) = (rows(&rust_db).await?, rows(&sql_db).await?);
    assert_eq!(rust_rows.len(), 4, "{rust_rows:?}");
    assert_eq!(rust_rows, sql_rows);
    Ok(())
}

/// `events` through append_events, every column given (so the rows can equal Rust's).
async fn append_events(
    tx: &tokio_postgres::Transaction<'_>,
    events: &[NewEvent],
) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
    let column = |f: fn(&NewEvent) -> String| events.iter().map(f).collect::<Vec<_>>();
    tx.query_one(
        "SELECT courier.append_events($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        &[
            &column(|e| e.topic.clone()),
            &column(|e| e.aggregate_type.clone()),
            &column(|e| e.aggregate_id.clone()),
            &column(|e| e.event_type.clone()),
            &events.iter().map(|e| e.version).collect::<Vec<_>>(),
            &events.iter().map(|e| e.payload.clone()).collect::<Vec<_>>(),
            &events.iter().map(attributes_json).collect::<Vec<_>>(),
            &events.iter().map(|e| e.schema_version).collect::<Vec<_>>(),
            &events.iter().map(|e| e.event_id).collect::<Vec<_>>(),
            &events.iter().map(|e| e.occurred_at).collect::<Vec<_>>(),
        ],
    )
    .await
}

/// `event` appended with append_event.
async fn append_event(
    tx: &tokio_postgres::Transaction<'_>,
    event: &NewEvent,
) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
    tx.query_one(
        "SELECT courier.append_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        &[
            &event.topic,
            &event.aggregate_type,
            &event.aggregate_id,
            &event.event_type,
            &event.version,
            &event.payload,
            &attributes_json(event),
            &event.schema_version,
            &event.event_id,
            &event.occurred_at,
        ],
    )
    .await
}

/// The SQL error of appending `events` with append_events; of one event, the error of
/// append_event too, which must be the same (it is written apart for speed: 0025).
async fn sql_error(
    client: &mut tokio_postgres::Client,
    events: &[NewEvent],
) -> anyhow::Result<tokio_postgres::error::DbError> {
    let refused = |result: Result<tokio_postgres::Row, tokio_postgres::Error>| match result {
        Ok(_) => anyhow::bail!("{events:?} was appended"),
        Err(e) => e
            .as_db_error()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("not a database error: {e}")),
    };
    let tx = client.transaction().await?;
    let batch = refused(append_events(&tx, events).await);
    tx.rollback().await?;
    let batch = batch?;
    if let [event] = events {
        let tx = client.transaction().await?;
        let single = refused(append_event(&tx, event).await);
        tx.rollback().await?;
        let single = single?;
        assert_eq!(
            (
                single.code(),
                single.message(),
                single.column(),
                single.detail()
            ),
            (
                batch.code(),
                batch.message(),
                batch.column(),
                batch.detail()
            ),
            "append_event and append_events refuse {event:?} alike"
        );
    }
    Ok(batch)
}

#[tokio::test]
async fn sql_appends_refuse_what_outbox_append_refuses_with_the_same_message() -> anyhow::Result<()>
{
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let config = test_config(&db, &pubsub);
    let mut client = db.client().await?;
    let event = || NewEvent::new(TOPIC, "video", "v-1", "video.created", 1, vec![1, 2, 3]);

    // No shard count recorded yet: no guess.
    let err = sql_error(&mut client, &[event()]).await?;
    assert_eq!(err.code(), &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE);
    assert!(err.message().contains("shard count"), "{}", err.message());
    record_shard_count(&client, &config).await?;

    let cases: Vec<NewEvent> = vec![
        NewEvent {
            aggregate_id: " ".into(),
            ..event()
        },
        NewEvent {
            aggregate_id: String::new(),
            ..event()
        },
        NewEvent {
            aggregate_id: "\u{3000}\u{a0}".into(),
            ..event()
        },
        NewEvent {
            aggregate_type: String::new(),
            ..event()
        },
        NewEvent {
            event_type: String::new(),
            ..event()
        },
        NewEvent {
            event_type: "Video.Created".into(),
            ..event()
        },
        NewEvent {
            event_type: "video".into(),
            ..event()
        },
        NewEvent {
            event_type: "video..created".into(),
            ..event()
        },
        NewEvent {
            event_type: "video.\"quoted\\\"".into(),
            ..event()
        },
        NewEvent {
            version: 0,
            ..event()
        },
        NewEvent {
            version: -5,
            ..event()
        },
        NewEvent {
            schema_version: 0,
            ..event()
        },
        NewEvent {
            topic: "ab".into(),
            ..event()
        },
        NewEvent {
            topic: "9topic".into(),
            ..event()
        },
        NewEvent {
            topic: "googthings".into(),
            ..event()
        },
        NewEvent {
            topic: "GOOGthings".into(),
            ..event()
        },
        NewEvent {
            topic: "bad/topic".into(),
            ..event()
        },
        NewEvent {
            topic: "topic-é".into(),
            ..event()
        },
        NewEvent {
            topic: "Étopic".into(),
            ..event()
        },
        NewEvent {
            event_type: "ä.b".into(),
            ..event()
        },
        NewEvent {
            topic: "t".repeat(256),
            ..event()
        },
        NewEvent {
            aggregate_id: "k".repeat(1025),
            ..event()
        },
        NewEvent {
            aggregate_type: "t".repeat(1025),
            ..event()
        },
        event().with_trace_id("t".repeat(2000)),
        event().with_user_id("ü".repeat(600)),
        event()
            .with_correlation_id("c".repeat(1025))
            .with_user_id("u".repeat(1025)),
        NewEvent {
            payload: vec![0; MAX_MESSAGE_BYTES],
            ..event()
        },
    ];
    let outbox = Outbox::new(&config);
    for case in cases {
        let expected = case.validate().expect_err("an invalid case");
        let mut conn = db.pool.get().await?;
        let tx = conn.transaction().await?;
        match outbox.append(&tx, case.clone()).await {
            Err(AppendError::Invalid(e)) => assert_eq!(e, expected),
            other => panic!("Outbox::append of {case:?}: {other:?}"),
        }
        drop(tx);
        let err = sql_error(&mut client, &[case]).await?;
        assert_eq!(err.code(), &SqlState::INVALID_PARAMETER_VALUE, "{expected}");
        assert_eq!(err.message(), expected.to_string());
        assert_eq!(err.column(), Some(expected.field), "{expected}");
    }

    // One invalid event of a batch refuses the batch, naming it.
    let batch = vec![
        event(),
        NewEvent {
            version: 0,
            ..event()
        },
    ];
    let err = sql_error(&mut client, &batch).await?;
    assert_eq!(err.column(), Some("version"));
    assert_eq!(err.detail(), Some("event 2 of 2 in the call"));

    // Two events of one call with one version: AppendError::DuplicateVersion's message.
    let twice = vec![event(), event(), event()];
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    let rust = outbox.append_all(&tx, twice.clone()).await;
    drop(tx);
    let rust = match rust {
        Err(e @ AppendError::DuplicateVersion { .. }) => e,
        other => panic!("{other:?}"),
    };
    let err = sql_error(&mut client, &twice).await?;
    assert_eq!(err.code(), &SqlState::INVALID_PARAMETER_VALUE);
    assert_eq!(err.message(), rust.to_string());

    // Attributes the outbox does not know, or that are not strings.
    for (attributes, field, reason) in [
        (
            serde_json::json!({"tenant": "t-1"}),
            "attributes",
            "unknown attribute",
        ),
        (
            serde_json::json!({"user_id": 7}),
            "user_id",
            "must be a string",
        ),
        (serde_json::json!(["a"]), "attributes", "JSON object"),
    ] {
        let tx = client.transaction().await?;
        let err = tx
            .query_one(
                "SELECT courier.append_event('catalog.video.events', 'video', 'v-1', 'video.created', 1, '\\x01', $1)",
                &[&attributes],
            )
            .await
            .expect_err("refused");
        tx.rollback().await?;
        let err = err.as_db_error().expect("a database error");
        assert_eq!(err.code(), &SqlState::INVALID_PARAMETER_VALUE);
        assert_eq!(err.column(), Some(field));
        assert!(err.message().contains(reason), "{}", err.message());
    }

    // A version appended before is the ledger's unique violation, as Outbox::append's is.
    let tx = client.transaction().await?;
    tx.query_one(
        "SELECT courier.append_event('catalog.video.events', 'video', 'v-9', 'video.created', 1, '\\x01')",
        &[],
    )
    .await?;
    tx.commit().await?;
    let err = sql_error(
        &mut client,
        &[NewEvent {
            aggregate_id: "v-9".into(),
            ..event()
        }],
    )
    .await?;
    assert_eq!(err.code(), &SqlState::UNIQUE_VIOLATION);

    // Nothing of the refused events was written.
    assert_eq!(db.scalar("SELECT count(*) FROM courier.outbox").await?, 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM courier.outbox_versions")
            .await?,
        1
    );
    Ok(())
}

/// One line of a producer's output.
#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Committed {
        key: String,
        version: i64,
        event_id: Uuid,
    },
    RolledBack(Uuid),
    Refused {
        case: String,
        sqlstate: String,
        column: Option<String>,
        message: String,
    },
}

/// A producer in another language: the program that runs its one source file.
struct Producer<'a> {
    program: PathBuf,
    args: &'a [&'a str],
    /// Environment besides the connection's.
    envs: &'a [(&'a str, String)],
    /// Its source file in tests/clients.
    script: &'a str,
    /// Prefix of its keys, naming it in the refusals.
    prefix: &'a str,
    /// The `source` its committed events are counted under.
    source: &'a str,
}

impl Producer<'_> {
    /// Runs the producer to its end, connected as `role`; its output lines.
    async fn run(&self, db: &TestDb, role: &str, topic: &str) -> anyhow::Result<Vec<Line>> {
        let Producer {
            program,
            args,
            envs,
            script,
            prefix,
            ..
        } = self;
        anyhow::ensure!(
            program.exists() || program.components().count() == 1,
            "{} is missing: run scripts/test, or `source scripts/stack.sh && ensure_producer_clients`",
            program.display()
        );
        let server: tokio_postgres::Config = db.config.url.parse()?;
        let host = match server.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            _ => "127.0.0.1".into(),
        };
        let port = server.get_ports().first().copied().unwrap_or(5432);
        let dbname = server.get_dbname().unwrap_or_default().to_string();
        let mut command = tokio::process::Command::new(program);
        command
            .args(*args)
            .arg(clients_dir().join(script))
            .current_dir(clients_dir())
            .env("PGHOST", host)
            .env("PGPORT", port.to_string())
            .env("PGUSER", role)
            .env("PGDATABASE", dbname)
            .env("COURIER_TOPIC", topic)
            .env("COURIER_KEY_PREFIX", prefix)
            .envs(envs.iter().map(|(name, value)| (name, value)))
            .kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(60), command.output())
            .await
            .map_err(|_| anyhow::anyhow!("{script} did not finish within 60 s"))?
            .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", program.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "{script} failed: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout)?
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .map_err(|e| anyhow::anyhow!("{script} printed {line:?}: {e}"))
            })
            .collect()
    }
}

#[tokio::test]
async fn python_node_java_and_go_producers_publish_through_the_relay() -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let topic = pubsub.topic("producers").await?;
    let subscription = pubsub.subscription(&topic).await?;
    let collector = Collector::start(&pubsub, &subscription).await?;
    let config = test_config(&db, &pubsub);

    // The producers' business table, and their login role: a member of courier_producer and
    // nothing more on the framework's schema (dropped with the database by the test kit).
    let writer = format!("{}_writer", db.name);
    let admin = db.client().await?;
    admin
        .batch_execute(&format!(
            "CREATE TABLE public.orders (id text PRIMARY KEY, version bigint NOT NULL,
                                         total_cents bigint NOT NULL);
             CREATE ROLE {writer} LOGIN;
             GRANT courier_producer TO {writer};
             GRANT SELECT, INSERT, UPDATE ON public.orders TO {writer};
             INSERT INTO courier.outbox_settings (shard_count) VALUES (1);"
        ))
        .await?;
    // The relay records its shard count over the stale one.
    let relay = courier_testkit::spawn_relay(&config)?;
    wait_until(
        Duration::from_secs(20),
        "the relay's shard count",
        || async {
            db.scalar("SELECT shard_count::bigint FROM courier.outbox_settings")
                .await
                .ok()
                == Some(i64::from(config.relay.shard_count))
        },
    )
    .await?;

    let python = clients_dir().join(".venv/bin/python");
    let mut committed = Vec::new();
    let mut rolled_back = Vec::new();
    let mut refused = Vec::new();
    // Java runs its one source file with Debian's PostgreSQL JDBC driver; Go builds its one
    // file in GOPATH mode against Debian's pgx (scripts/stack.sh installs both).
    let java = ["-cp", JDBC_DRIVER];
    let go_env = [
        ("GO111MODULE", "off".to_string()),
        ("GOPATH", GO_PATH.to_string()),
        ("GOFLAGS", String::new()),
        (
            "GOCACHE",
            std::env::temp_dir()
                .join("courier-go-producer-cache")
                .display()
                .to_string(),
        ),
    ];
    let producers = [
        Producer {
            program: python,
            args: &[],
            envs: &[],
            script: "writer.py",
            prefix: "py",
            source: "orders-python",
        },
        Producer {
            program: PathBuf::from("node"),
            args: &[],
            envs: &[],
            script: "writer.js",
            prefix: "js",
            source: "orders-node",
        },
        Producer {
            program: PathBuf::from("java"),
            args: &java,
            envs: &[],
            script: "Writer.java",
            prefix: "java",
            source: "orders-java",
        },
        Producer {
            program: PathBuf::from("go"),
            args: &["run"],
            envs: &go_env,
            script: "writer.go",
            prefix: "go",
            source: "orders-go",
        },
    ];
    for producer in &producers {
        let (prefix, source) = (producer.prefix, producer.source);
        for line in producer.run(&db, &writer, &topic).await? {
            match line {
                Line::Committed {
                    key,
                    version,
                    event_id,
                } => committed.push((key, version, event_id, source)),
                Line::RolledBack(id) => rolled_back.push(id),
                Line::Refused {
                    case,
                    sqlstate,
                    column,
                    message,
                } => refused.push((prefix, case, sqlstate, column, message)),
            }
        }
    }
    assert_eq!(committed.len(), 36);
    assert_eq!(rolled_back.len(), 4);
    assert_eq!(refused.len(), 12);

    // A Rust append of the same kind, for the attributes a Rust producer's event carries.
    let rust_event = NewEvent::new(&topic, "order", "rust-0", "order.placed", 1, b"{}".to_vec())
        .with_correlation_id("checkout-rust-0")
        .with_source_service("orders-rust")
        .with_user_id("user-7");
    let rust_id = rust_event.event_id;
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    Outbox::new(&config).append(&tx, rust_event).await?;
    tx.commit().await?;

    // Exactly the committed events, each key's in version order.
    let expected: HashSet<String> = committed
        .iter()
        .map(|(_, _, id, _)| id.to_string())
        .chain([rust_id.to_string()])
        .collect();
    wait_until(Duration::from_secs(60), "every committed event", || async {
        collector.distinct_event_ids().len() >= expected.len()
    })
    .await?;
    wait_until(Duration::from_secs(30), "every row marked", || async {
        db.scalar("SELECT count(*) FROM courier.outbox WHERE published_at IS NULL")
            .await
            .ok()
            == Some(0)
    })
    .await?;
    assert_eq!(collector.distinct_event_ids(), expected);
    assert_eq!(db.scalar("SELECT count(*) FROM courier.outbox").await?, 37);
    for id in &rolled_back {
        assert!(!expected.contains(&id.to_string()));
    }
    let order = collector.publish_order();
    for prefix in ["py", "js", "java", "go"] {
        for i in 0..3 {
            assert_eq!(
                order[&format!("{prefix}-{i}")],
                vec![1, 2, 3],
                "{prefix}-{i}"
            );
        }
    }

    // The attributes a Rust append of the same event gives, and the same attribute names as
    // the Rust producer's.
    let received = collector.all();
    let by_id: HashMap<&str, _> = received
        .iter()
        .filter_map(|r| Some((r.attribute("event_id")?, r)))
        .collect();
    let rust_names: BTreeMap<&String, ()> = by_id[rust_id.to_string().as_str()]
        .attributes
        .keys()
        .map(|k| (k, ()))
        .collect();
    for (key, version, event_id, source) in &committed {
        let message = by_id[event_id.to_string().as_str()];
        assert_eq!(&message.ordering_key, key);
        let occurred_at: DateTime<Utc> = message
            .attribute("occurred_at")
            .expect("occurred_at")
            .parse()?;
        let mut same = NewEvent::new(
            &topic,
            "order",
            key,
            "order.placed",
            *version,
            message.data.clone(),
        )
        .with_correlation_id(format!("checkout-{key}"))
        .with_source_service(*source)
        .with_user_id("user-7");
        same.event_id = *event_id;
        same.occurred_at = occurred_at;
        let attributes: BTreeMap<String, String> = message.attributes.clone().into_iter().collect();
        assert_eq!(attributes, same.attributes(), "{key} v{version}");
        let names: BTreeMap<&String, ()> = message.attributes.keys().map(|k| (k, ())).collect();
        assert_eq!(names, rust_names);
        let payload: serde_json::Value = serde_json::from_slice(&message.data)?;
        assert_eq!(payload["order_id"], serde_json::json!(key));
    }

    // The business rows of the committed transactions only.
    assert_eq!(db.scalar("SELECT count(*) FROM public.orders").await?, 12);
    assert_eq!(
        db.scalar("SELECT count(*) FROM public.orders WHERE version = 3")
            .await?,
        12
    );

    // Bad input: in every language the error Outbox::append gives, and nothing written.
    for (prefix, case, sqlstate, column, message) in &refused {
        let (event_type, version, key) = match case.as_str() {
            "event_type" => ("OrderPlaced", 1, format!("{prefix}-bad")),
            "version" => ("order.placed", 0, format!("{prefix}-bad")),
            _ => ("order.placed", 1, String::new()),
        };
        let expected = NewEvent::new(&topic, "order", key, event_type, version, b"{}".to_vec())
            .validate()
            .expect_err("invalid");
        assert_eq!(sqlstate, "22023");
        assert_eq!(column.as_deref(), Some(expected.field), "{prefix} {case}");
        assert_eq!(message, &expected.to_string(), "{prefix} {case}");
    }
    let cases: HashSet<(&str, &str)> = refused.iter().map(|(p, c, ..)| (*p, c.as_str())).collect();
    assert_eq!(cases.len(), 12);

    // The producers' role may append and nothing else on the framework's schema.
    let mut as_writer: tokio_postgres::Config = db.config.url.parse()?;
    as_writer.user(&writer);
    let (client, connection) = as_writer.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let err = client
        .query("SELECT 1 FROM courier.outbox LIMIT 1", &[])
        .await
        .expect_err("the outbox is not the producers'");
    assert_eq!(
        err.as_db_error().map(|e| e.code()),
        Some(&SqlState::INSUFFICIENT_PRIVILEGE)
    );
    relay.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// docs/sql-producers.md shows the very producers the test above runs.
#[test]
fn the_guide_quotes_the_tested_producers() -> anyhow::Result<()> {
    let page = std::fs::read_to_string(docs_page())?;
    for (file, fence) in [
        ("writer.py", "```python\n"),
        ("writer.js", "```js\n"),
        ("Writer.java", "```java\n"),
        ("writer.go", "```go\n"),
    ] {
        let code = std::fs::read_to_string(clients_dir().join(file))?;
        assert!(
            page.contains(&format!("{fence}{code}```")),
            "docs/sql-producers.md must quote tests/clients/{file} whole, in a {fence:?} block"
        );
    }
    Ok(())
}
