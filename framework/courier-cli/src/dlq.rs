//! `courier dlq peek | republish`: what sits in a subscription's dead-letter keeper
//! (`<subscription>.dlq`), and sending it back to the main topic for a fresh delivery — the
//! original data, attributes and ordering key, without what dead-lettering added.

use crate::output::print_json;
use anyhow::Context as _;
use clap::Args;
use courier::operations::{read_kept, revived, KeptDeadLetter};
use courier::pubsub::PubSub;
use courier::CourierConfig;
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

/// `<topic>.<consumer>-<role>` → `<topic>`.
fn topic_of(subscription: &str) -> anyhow::Result<&str> {
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
    let keeper = format!("{}.dlq", args.subscription);
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
        // The consuming service's schema logs its dead letters (dlq_message_count): close
        // the republished ones there. Without that schema the republish still stands.
        let log = courier::operations::DeadLetterLog::new(&config.database.schema);
        let pool = courier::db::pool(&config.database, "courier-cli")?;
        // Drawn only on a terminal (stderr), so scripts and --json output stay clean.
        let progress = indicatif::ProgressBar::new(read.len() as u64).with_message("republishing");
        let publisher = pubsub.publisher(&topic, Duration::from_millis(5)).await?;
        for (message, handler) in read {
            // Ack only what the main topic stored; a failure leaves the rest in the keeper.
            publisher
                .publish(revived(&message))
                .await
                .with_context(|| format!("republish {} to {topic}", message.message_id))?;
            handler.ack();
            republished += 1;
            progress.inc(1);
            let original = KeptDeadLetter::of(&message)
                .original_message_id
                .unwrap_or_default();
            match log.republished(&pool, &args.subscription, &original).await {
                Ok(closed) => closed_in_log += usize::from(closed),
                Err(e) => progress.println(format!(
                    "warning: dead letter {original} not closed in the log: {e}"
                )),
            }
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
