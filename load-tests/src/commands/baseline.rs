//! `baseline`: the seed's reference relay loop — claim 200 rows, publish them one at a time
//! waiting for each, mark each row by itself, commit — on the same events the framework's
//! relay then drains, so the report shows the framework's speed-up over it.

use crate::harness::fixtures::{events, fill, progress, set_shards_idle};
use crate::report::measures::{Rate, Ratio};
use crate::report::Report;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use courier::outbox::attributes::{self, RequiredFields};
use courier_testkit::{test_config, TestDb, TestPubSub};
use google_cloud_pubsub::model::Message;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct BaselineArgs {
    /// Events in the outbox (for each of the two runs).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=2_000_000))]
    pub events: u64,
    /// Aggregates (ordering keys) they are spread over.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub keys: u64,
    /// Outbox shards of the framework's relay.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub shards: u32,
    /// The reference loop stops after this long (it is slow); its rate is what it managed.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub baseline_seconds: u64,
    /// Give up on the framework's relay after this long.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
}

pub async fn run(args: BaselineArgs) -> anyhow::Result<Report> {
    let pubsub = TestPubSub::get().await?;
    let topic = pubsub.topic("baseline").await?;
    let events = events(&topic, args.events, args.keys);

    let seed_db = TestDb::new().await?;
    let config = test_config(&seed_db, &pubsub);
    fill(&seed_db, &config, &events, "rows for the reference loop").await?;
    let seed = reference_loop(
        &seed_db,
        &pubsub,
        &topic,
        args.events,
        Duration::from_secs(args.baseline_seconds),
    )
    .await?;
    drop(seed_db);

    let relay_db = TestDb::new().await?;
    let mut config = test_config(&relay_db, &pubsub);
    config.relay.shard_count = args.shards;
    config.database.pool_size = args.shards * 2 + 4;
    fill(&relay_db, &config, &events, "rows for the relay").await?;
    set_shards_idle(&relay_db, args.shards, true).await?;
    let relay =
        crate::commands::drain::relay_drain(&relay_db, &config, args.events, args.timeout_secs)
            .await?;
    let ratio = Ratio::to_lowest("relay / reference loop", &relay, &[&seed], 10.0);
    Ok(Report {
        benchmark: "baseline: the seed's reference relay loop vs the framework's relay".into(),
        parameters: vec![
            ("events".into(), args.events.to_string()),
            ("keys".into(), args.keys.to_string()),
            ("shards".into(), args.shards.to_string()),
            ("baseline_seconds".into(), args.baseline_seconds.to_string()),
        ],
        rates: vec![seed, relay],
        ratios: vec![ratio],
        ..Default::default()
    })
}

const CLAIM: &str = "
    SELECT id, aggregate_type, aggregate_id, event_type, version, schema_version,
           payload, occurred_at
    FROM courier.outbox
    WHERE published_at IS NULL
    ORDER BY seq
    LIMIT 200
    FOR UPDATE SKIP LOCKED";
const MARK: &str = "UPDATE courier.outbox SET published_at = now(), publish_attempts = publish_attempts + 1 WHERE id = $1";

/// The seed's loop, on one connection, until the outbox is empty or `budget` ran out.
async fn reference_loop(
    db: &TestDb,
    pubsub: &TestPubSub,
    topic: &str,
    total: u64,
    budget: Duration,
) -> anyhow::Result<Rate> {
    // No batching delay: the loop waits for every publish, so a delay would only slow it.
    let publisher = pubsub.client().publisher(topic, Duration::ZERO).await?;
    let mut client = db.client().await?;
    let bar = progress(total, "published by the reference loop");
    let started = Instant::now();
    let mut published = 0u64;
    'claims: while started.elapsed() < budget {
        let tx = client.transaction().await.context("begin")?;
        let rows = tx.query(CLAIM, &[]).await.context("claim 200 rows")?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            let id: uuid::Uuid = row.get("id");
            let aggregate_id: String = row.get("aggregate_id");
            let event_type: String = row.get("event_type");
            let aggregate_type: String = row.get("aggregate_type");
            let occurred_at: DateTime<Utc> = row.get("occurred_at");
            let message = Message::new()
                .set_data(row.get::<_, Vec<u8>>("payload"))
                .set_ordering_key(aggregate_id.clone())
                .set_attributes(attributes::build(
                    RequiredFields {
                        event_id: id,
                        event_type: &event_type,
                        aggregate_id: &aggregate_id,
                        aggregate_type: &aggregate_type,
                        version: row.get("version"),
                        occurred_at,
                        schema_version: row.get("schema_version"),
                    },
                    [],
                ));
            publisher
                .publish(message)
                .await
                .context("reference loop publish")?;
            tx.execute(MARK, &[&id]).await.context("mark one row")?;
            published += 1;
            bar.inc(1);
            if started.elapsed() >= budget {
                tx.commit().await.context("commit")?;
                break 'claims;
            }
        }
        tx.commit().await.context("commit")?;
    }
    bar.finish_and_clear();
    Ok(Rate::new(
        "seed reference loop (one publish at a time)",
        published,
        started.elapsed().as_secs_f64(),
    ))
}
