//! `courier provision`: the Pub/Sub resources of one consumer, created idempotently as
//! docs/design.md (Contracts) names them — the topic, `<topic>.<consumer>-<role>` (ordering, 60 s ack
//! deadline, dead-lettering after 5 attempts, 10–600 s retry backoff, acked messages retained
//! for replay), the `<topic>.dlq` topic, and `<subscription>.dlq` keeping its dead letters.

use courier::outbox::check_topic_id;
use courier::pubsub::{PubSub, SubscriptionSpec};
use courier::CourierConfig;

#[derive(clap::Args)]
pub struct ProvisionArgs {
    /// Topic id, `<domain>.<aggregate>.events`.
    #[arg(long)]
    topic: String,
    /// The consuming service, e.g. `engagement`.
    #[arg(long)]
    consumer: String,
    /// What the subscription is for, e.g. `reader` or `projector`.
    #[arg(long, default_value = "reader")]
    role: String,
    /// Deliveries before Pub/Sub moves a message to the dead-letter topic (5-100).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i32).range(5..=100))]
    max_delivery_attempts: i32,
    /// Exactly-once delivery on the subscription (Pub/Sub does not redeliver a confirmed
    /// ack; the consumer confirms each ack). Off by default: the inbox already gives each event
    /// one effect, and confirmed acks cost throughput. Cannot be changed on an existing
    /// subscription by this command.
    #[arg(long)]
    exactly_once: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(config: CourierConfig, args: ProvisionArgs) -> anyhow::Result<()> {
    check_topic_id(&args.topic)
        .map_err(|reason| anyhow::anyhow!("--topic {:?}: {reason}", args.topic))?;
    for (flag, value) in [("--consumer", &args.consumer), ("--role", &args.role)] {
        let valid = !value.is_empty()
            && value
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        anyhow::ensure!(
            valid,
            "{flag} {value:?}: use lowercase letters, digits, - and _"
        );
    }
    let mut spec = SubscriptionSpec::standard(&args.topic, &args.consumer, &args.role);
    if let Some(dead_letter) = spec.dead_letter.as_mut() {
        dead_letter.max_delivery_attempts = args.max_delivery_attempts;
    }
    spec.exactly_once = args.exactly_once;
    let pubsub = PubSub::new(config.pubsub.clone());
    let created = pubsub.provision(&spec).await?;
    if args.json {
        return crate::output::print_json(&serde_json::json!({
            "topic": spec.topic,
            "subscription": spec.name,
            "created": created,
        }));
    }
    if created.is_empty() {
        println!(
            "already provisioned: subscription {} on topic {}",
            spec.name, spec.topic
        );
    }
    for line in created {
        println!("created {line}");
    }
    Ok(())
}
