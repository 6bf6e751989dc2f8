//! A projection that emits (consume → project → emit in one transaction), declared with
//! `Inbound::build` so it is built from the deployment's loaded config, against real
//! PostgreSQL and the emulator: every consumed event emits exactly one event, caused by it,
//! into the shards of the deployment's `relay.shard_count` (not the default's), and the
//! relay publishes them. A rebuild (Seek replay) applies every event again and emits nothing
//! again: the appends name their cause, and the outbox skips a cause's version it has.

use courier::outbox::shard_of;
use courier::service::runtime::{self, RunOptions, RunningService};
use courier::{
    Deployment, EventMeta, HandlerError, Inbound, MigrationSet, NewEvent, Outbox, PgTransaction,
    Projection, Service,
};
use courier_testkit::{test_config, wait_until, Collector, TestDb, TestPubSub};
use std::time::Duration;

/// The consumed and the emitted events' payload: what changed, as a protobuf message.
#[derive(Clone, PartialEq, prost::Message)]
struct Changed {
    #[prost(string, tag = "1")]
    what: String,
}

/// Emits `<aggregate>.echoed` for every event it applies, in the projection's transaction, and
/// notes the event in its read model (`courier.echo_seen`).
#[derive(Clone)]
struct Echo {
    outbox: Outbox,
    topic: &'static str,
}

impl Projection for Echo {
    type Event = Changed;

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &Changed,
    ) -> Result<(), HandlerError> {
        let echo = Changed {
            what: format!("echo of {}", event.what),
        };
        // An aggregate of its own: the outbox keeps one event per (aggregate id, version).
        let emitted = NewEvent::new(
            self.topic,
            "echo",
            format!("echo-of-{}", meta.aggregate_id),
            "echo.echoed",
            meta.version,
            prost::Message::encode_to_vec(&echo),
        )
        .with_causation_id(meta.event_id.to_string());
        self.outbox.append(tx, emitted).await?;
        tx.execute(
            "INSERT INTO courier.echo_seen (event_id) VALUES ($1)",
            &[&meta.event_id],
        )
        .await?;
        Ok(())
    }
}

const SHARDS: u32 = 3;
const KEYS: usize = 20;
const VERSIONS: i64 = 3;

/// The echo service: the projection built from the deployment, its read model `echo_seen`.
fn echo_service(source: &'static str, echoes: &'static str) -> Service {
    Service {
        name: "echo",
        migrations: MigrationSet {
            set: "echo",
            migrations: &[],
        },
        outbound_topics: Box::leak(vec![source, echoes].into_boxed_slice()),
        inbound: vec![Inbound::build(
            source,
            "echoer",
            &["echo_seen"],
            move |deployment: &Deployment<'_>| Echo {
                outbox: deployment.outbox(),
                topic: echoes,
            },
        )],
        routes: |_| {},
        backfills: Vec::new(),
    }
}

#[tokio::test]
async fn an_emitting_projection_built_from_the_deployment_emits_once_per_event(
) -> anyhow::Result<()> {
    courier_testkit::init_logging();
    let db = TestDb::new().await?;
    let pubsub = TestPubSub::get().await?;
    let mut config = test_config(&db, &pubsub);
    config.relay.shard_count = SHARDS;
    config.http.listen = "127.0.0.1:0".into();
    let source: &'static str = Box::leak(pubsub.topic("changes").await?.into_boxed_str());
    let echoes: &'static str = Box::leak(courier_testkit::unique_name("echoes").into_boxed_str());
    let service = echo_service(source, echoes);
    // Unordered: the emulator cannot seek an ordered subscription (docs/emulator.md), and the
    // test rebuilds by Seek. Provisioning finds it made.
    let mut spec = service.inbound[0].subscription(service.name);
    spec.ordering = false;
    pubsub.client().provision(&spec).await?;
    runtime::provision(&service, &config).await?;
    let collector = Collector::start(&pubsub, &pubsub.subscription(echoes).await?).await?;
    let running = RunningService::start(
        service,
        &config,
        RunOptions {
            migrate: true,
            ..RunOptions::default()
        },
    )
    .await?;
    db.client()
        .await?
        .batch_execute("CREATE TABLE courier.echo_seen (event_id uuid PRIMARY KEY)")
        .await?;

    let before_writes = chrono::Utc::now() - chrono::Duration::seconds(1);
    let mut conn = db.pool.get().await?;
    let tx = conn.transaction().await?;
    let mut sources = Vec::new();
    for key in 0..KEYS {
        for version in 1..=VERSIONS {
            let event = NewEvent::new(
                source,
                "thing",
                format!("thing-{key}"),
                "thing.changed",
                version,
                prost::Message::encode_to_vec(&Changed {
                    what: format!("{key}@{version}"),
                }),
            );
            sources.push(event.event_id.to_string());
            Outbox::new(&config).append(&tx, event).await?;
        }
    }
    tx.commit().await?;

    let expected = KEYS * VERSIONS as usize;
    wait_until(Duration::from_secs(60), "every echo published", || async {
        collector.distinct_event_ids().len() >= expected
    })
    .await?;
    let count = |sql: &'static str| {
        let db = &db;
        async move {
            let client = db.client().await.expect("client");
            let row = client.query_one(sql, &[&echoes]).await.expect(sql);
            row.get::<_, i64>(0)
        }
    };
    let echo_rows = "SELECT count(*) FROM courier.outbox WHERE topic = $1";
    assert_eq!(count(echo_rows).await, expected as i64);

    // Rebuild: the read model is cleared and every event applied again; nothing is emitted
    // again and nothing is dead-lettered.
    let report = runtime::rebuild(
        &echo_service(source, echoes),
        &config,
        "echoer",
        before_writes,
        "tester",
        "rebuild an emitting projection",
    )
    .await?;
    assert_eq!(
        report.cleared,
        vec![("echo_seen".to_owned(), expected as u64)]
    );
    let seen = "SELECT count(*) FROM courier.echo_seen WHERE $1 <> ''";
    wait_until(
        Duration::from_secs(60),
        "every event applied again",
        || async { count(seen).await == expected as i64 },
    )
    .await?;
    assert_eq!(count(echo_rows).await, expected as i64, "re-emitted");
    let dead = "SELECT count(*) FROM courier.dead_letter_log WHERE $1 <> ''";
    assert_eq!(count(dead).await, 0, "dead-lettered");
    running.shutdown(Duration::from_secs(5)).await;

    // Exactly one echo per consumed event, each naming the event that caused it.
    let mut causes: Vec<String> = db
        .client()
        .await?
        .query(
            "SELECT attributes->>'causation_id' FROM courier.outbox WHERE topic = $1",
            &[&echoes],
        )
        .await?
        .iter()
        .map(|row| row.get::<_, String>(0))
        .collect();
    causes.sort();
    sources.sort();
    assert_eq!(causes, sources, "one echo per source event");
    // In the deployment's shards: an outbox built from the default config would spread
    // them over 8, some of which no relay of this deployment owns.
    let rows = db
        .client()
        .await?
        .query(
            "SELECT aggregate_id, shard FROM courier.outbox WHERE topic = $1",
            &[&echoes],
        )
        .await?;
    for row in rows {
        let (key, shard): (String, i32) = (row.get(0), row.get(1));
        assert_eq!(shard as u32, shard_of(&key, SHARDS), "{key}");
    }
    // Each key's echoes reached Pub/Sub in version order.
    let order = collector.publish_order();
    assert_eq!(order.len(), KEYS);
    for (key, versions) in order {
        assert_eq!(versions, (1..=VERSIONS).collect::<Vec<_>>(), "{key}");
    }
    Ok(())
}
