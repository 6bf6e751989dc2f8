//! Schema evolution against real PostgreSQL and the emulator: an upgraded producer adds an
//! optional field (same major schema version); a consumer built on the old contract keeps
//! working (protobuf skips the unknown field), a consumer on the new contract uses it; an
//! unknown major version is dead-lettered by both with its reason, never dropped.

use crate::support;

use courier::db::PgTransaction;
use courier::inbound::{
    Consumer, ConsumerOptions, ConsumerSpec, EventMeta, HandlerError, Projection, VersionedUpsert,
};
use courier::pubsub::SubscriptionSpec;
use courier_testkit::wait_until;
use std::sync::Arc;
use std::time::Duration;
use support::{read_setup, TestEvent, Videos};

const WAIT: Duration = Duration::from_secs(30);

/// The contract after the upgrade: the old `support::Change` (which the old consumer, `Videos`,
/// still decodes) plus an optional field.
#[derive(Clone, PartialEq, prost::Message)]
struct ChangeV2 {
    #[prost(string, tag = "1")]
    title: String,
    #[prost(string, optional, tag = "2")]
    subtitle: Option<String>,
}

/// A read model built on the new contract.
#[derive(Clone)]
struct Subtitled {
    upsert: VersionedUpsert,
}

impl Projection for Subtitled {
    type Event = ChangeV2;

    async fn apply(
        &self,
        tx: &PgTransaction<'_>,
        meta: &EventMeta,
        event: &ChangeV2,
    ) -> Result<(), HandlerError> {
        self.upsert
            .execute(
                tx,
                &[&meta.aggregate_id, &event.title, &event.subtitle],
                meta.version,
            )
            .await?;
        Ok(())
    }
}

fn v2(key: &str, version: i64, title: &str, subtitle: Option<&str>) -> TestEvent {
    let mut event = TestEvent::new(key, version, title);
    event.raw_data = Some(prost::Message::encode_to_vec(&ChangeV2 {
        title: title.into(),
        subtitle: subtitle.map(str::to_owned),
    }));
    event
}

#[tokio::test]
async fn old_and_new_consumers_read_an_added_field_and_refuse_an_unknown_major(
) -> anyhow::Result<()> {
    let s = read_setup(|_| {}).await?;
    s.db.client()
        .await?
        .batch_execute(
            "CREATE TABLE app.subtitled (video_id text PRIMARY KEY, title text NOT NULL,
                                         subtitle text, version bigint NOT NULL)",
        )
        .await?;
    // The new consumer reads the same topic through its own subscription.
    let spec = SubscriptionSpec::standard(&s.subscription.topic, "tests", "new-reader");
    s.pubsub.client().provision(&spec).await?;
    let escalate: courier::supervision::EscalationHandler =
        Arc::new(|e| panic!("unexpected escalation: {e:?}"));
    let new_consumer = Consumer::spawn(
        &s.config,
        ConsumerSpec {
            group: "new-readers".into(),
            subscription: spec.name.clone(),
            dead_letter_topic: format!("{}.dlq", s.subscription.topic),
        },
        Subtitled {
            upsert: VersionedUpsert::new("app.subtitled", &["video_id"], &["title", "subtitle"])
                .map_err(anyhow::Error::msg)?,
        },
        ConsumerOptions {
            escalate,
            ..ConsumerOptions::default()
        },
    )?;
    let old_consumer = s.spawn(Videos::new(), ConsumerOptions::default());

    // An old producer's event, then the upgraded producer's (same major version 1), then a
    // version 2 payload neither consumer knows.
    let old = TestEvent::new("video-1", 1, "Cats");
    let upgraded = v2("video-1", 2, "Cats, revised", Some("director's cut"));
    let mut unknown_major = v2("video-2", 1, "From the future", None);
    unknown_major.schema_version = 2;
    s.publish(&[old, upgraded, unknown_major]).await?;

    wait_until(
        WAIT,
        "both consumers applied both events and refused the unknown major",
        || async {
            let (o, n) = (old_consumer.stats(), new_consumer.stats());
            o.applied >= 2 && n.applied >= 2 && o.dead_lettered >= 1 && n.dead_lettered >= 1
        },
    )
    .await?;
    // The old consumer: the new field ignored, nothing failed.
    assert_eq!(
        s.videos().await["video-1"],
        ("Cats, revised".to_string(), 2)
    );
    assert_eq!(old_consumer.stats().failed, 0);
    // The new consumer: the field used.
    let row =
        s.db.client()
            .await?
            .query_one(
                "SELECT title, subtitle, version FROM app.subtitled WHERE video_id = 'video-1'",
                &[],
            )
            .await?;
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, Option<String>>(1),
            row.get::<_, i64>(2)
        ),
        ("Cats, revised".into(), Some("director's cut".into()), 2)
    );
    // The unknown major reached neither read model, and its dead letters say why.
    assert!(!s.videos().await.contains_key("video-2"));
    assert_eq!(
        s.scalar("SELECT count(*) FROM app.subtitled WHERE video_id = 'video-2'")
            .await,
        0
    );
    wait_until(WAIT, "the dead letters of both groups", || async {
        s.dead_letters.len() >= 2
    })
    .await?;
    for letter in s.dead_letters.all() {
        let reason = letter.attribute("courier_dlq_reason").unwrap_or_default();
        assert!(reason.contains("unknown schema version 2"), "{reason}");
    }
    old_consumer.kill();
    new_consumer.kill();
    Ok(())
}
