//! `courier dlq peek | republish`: what sits in a subscription's dead-letter keeper
//! (`<subscription>.dlq`), and sending it back to the main topic for a fresh delivery — the
//! original data, attributes and ordering key, without what dead-lettering added.

use crate::output::print_json;
use crate::service::audit_actor;
use anyhow::Context as _;
use clap::Args;
use courier::db::PgPool;
use courier::operations::{read_kept, revived, DeadLetterLog, KeptDeadLetter};
use courier::pubsub::PubSub;
use courier::CourierConfig;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::model::Message;
use google_cloud_pubsub::subscriber::handler::Handler;
use std::time::Duration;

#[derive(Args)]
pub struct DlqArgs {
    /// The consumer's subscription (`<topic>.<consumer>-<role>`); its dead letters are kept
    /// in `<subscription>.dlq`, and go back to `<topic>`.
    #[arg(long)]
    subscription: String,
    /// At most this many messages.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max: u32,
    /// Stop reading after this long without a new message.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=60), value_name = "SECONDS")]
    idle_secs: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
pub enum DlqCommand {
    /// List dead letters with their reasons; they stay in the keeper. (On the emulator a
    /// peeked message is back only after the keeper's ack deadline: its dead-stream bug.)
    #[command(
        after_help = "Example:\n  courier dlq peek --subscription catalog.video.events.engagement-reader"
    )]
    Peek(DlqArgs),
    /// Publish dead letters back to the main topic (fresh delivery), then remove them.
    #[command(
        after_help = "Examples:\n  courier dlq republish --subscription catalog.video.events.engagement-reader --dry-run\n  courier dlq republish --subscription catalog.video.events.engagement-reader --max 10"
    )]
    Republish {
        #[command(flatten)]
        args: DlqArgs,
        /// Show what would be republished; change nothing (same as peek).
        #[arg(long)]
        dry_run: bool,
    },
}

/// `<subscription>` → `<subscription>.dlq`, the subscription that keeps its dead letters.
pub(crate) fn keeper_of(subscription: &str) -> String {
    format!("{subscription}.dlq")
}

/// Sends one subscription's dead letters back to its topic for a fresh delivery: the original
/// data, attributes and ordering key. `courier dlq republish` and the console both act
/// through it.
pub(crate) struct Republisher {
    subscription: String,
    topic: String,
    publisher: Publisher,
    /// The consuming service's schema logs its dead letters (`dlq_message_count`): a
    /// republished one is closed there.
    log: DeadLetterLog,
    pool: PgPool,
}

impl Republisher {
    pub(crate) async fn new(
        config: &CourierConfig,
        pubsub: &PubSub,
        subscription: &str,
    ) -> anyhow::Result<Self> {
        let topic = topic_of(subscription)?.to_owned();
        Ok(Self {
            subscription: subscription.to_owned(),
            publisher: pubsub.publisher(&topic, Duration::from_millis(5)).await?,
            topic,
            log: DeadLetterLog::new(&config.database.schema),
            pool: courier::db::pool(&config.database, "courier-cli")?,
        })
    }

    /// Publishes `message` (read from the keeper) back to the topic, then acks it in the
    /// keeper: only what the topic stored leaves the keeper. Returns whether it was open in
    /// the schema's log; without that log (another schema) the republish still stands.
    pub(crate) async fn republish(
        &self,
        message: &Message,
        handler: Handler,
        actor: &str,
        reason: &str,
    ) -> anyhow::Result<bool> {
        let topic = &self.topic;
        self.publisher
            .publish(revived(message))
            .await
            .with_context(|| format!("republish {} to {topic}", message.message_id))?;
        handler.ack();
        let letter = KeptDeadLetter::of(message);
        let original = letter.original_message_id.as_deref().unwrap_or_default();
        tracing::info!(
            subscription = %self.subscription,
            message_id = %original,
            actor,
            reason,
            "dead letter republished"
        );
        match self
            .log
            .republished(&self.pool, &self.subscription, &letter, actor, reason)
            .await
        {
            Ok(closed) => Ok(closed),
            Err(e) => {
                tracing::warn!(message_id = %original, error = %e, "dead letter republished but not audited or closed in the log");
                Ok(false)
            }
        }
    }
}

/// `<topic>.<consumer>-<role>` → `<topic>`.
pub(crate) fn topic_of(subscription: &str) -> anyhow::Result<&str> {
    courier::pubsub::topic_of_subscription(subscription).ok_or_else(|| {
        anyhow::anyhow!("--subscription {subscription:?} is not named <topic>.<consumer>-<role>")
    })
}

pub async fn run(config: CourierConfig, command: DlqCommand) -> anyhow::Result<()> {
    let (args, republish) = match command {
        DlqCommand::Peek(args) => (args, false),
        DlqCommand::Republish { args, dry_run } => (args, !dry_run),
    };
    let topic = topic_of(&args.subscription)?.to_owned();
    let keeper = keeper_of(&args.subscription);
    let pubsub = PubSub::new(config.pubsub.clone());
    let read = read_kept(
        &pubsub,
        &keeper,
        args.max as usize,
        Duration::from_secs(args.idle_secs),
    )
    .await
    .with_context(|| format!("--subscription {:?}", args.subscription))?;
    let letters: Vec<KeptDeadLetter> = read.iter().map(|(m, _)| KeptDeadLetter::of(m)).collect();
    let mut republished = 0;
    let mut closed_in_log = 0;
    if republish {
        let republisher = Republisher::new(&config, &pubsub, &args.subscription).await?;
        let actor = audit_actor();
        // Drawn only on a terminal (stderr), so scripts and --json output stay clean.
        let progress = indicatif::ProgressBar::new(read.len() as u64).with_message("republishing");
        for (message, handler) in read {
            let closed = republisher
                .republish(&message, handler, &actor, "courier dlq republish")
                .await?;
            republished += 1;
            closed_in_log += usize::from(closed);
            progress.inc(1);
        }
        progress.finish_and_clear();
    }
    if args.json {
        return print_json(&serde_json::json!({
            "keeper": keeper,
            "topic": topic,
            "republished": republished,
            "closed_in_log": closed_in_log,
            "dead_letters": letters,
        }));
    }
    for letter in &letters {
        println!(
            "{} key {:?} attempt {} group {}: {}",
            letter
                .original_message_id
                .as_deref()
                .unwrap_or(&letter.message_id),
            letter.ordering_key,
            letter.delivery_attempt.as_deref().unwrap_or("-"),
            letter.consumer_group.as_deref().unwrap_or("-"),
            letter
                .reason
                .as_deref()
                .unwrap_or("(dead-lettered by Pub/Sub's policy)")
        );
    }
    match (republish, letters.len()) {
        (_, 0) => println!("{keeper}: no dead letters"),
        (true, _) => println!("republished {republished} dead letter(s) to {topic}"),
        (false, n) => println!("{n} dead letter(s) in {keeper} (left there)"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::topic_of;

    #[test]
    fn the_topic_is_the_subscription_without_its_consumer_suffix() {
        assert_eq!(
            topic_of("catalog.video.events.engagement-reader").ok(),
            Some("catalog.video.events")
        );
        assert!(topic_of("nodots").is_err());
        assert!(topic_of("catalog.video.events").is_err());
    }
}
