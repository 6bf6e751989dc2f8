//! Dead letters: a message that can never be processed is published to the subscription's
//! dead-letter topic with its original data and attributes, plus why and for whom, and only
//! then acked (P5: nothing is dropped silently).

use crate::pubsub::{PubSub, PubSubError};
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::model::Message;
use std::time::Duration;

/// Attributes added to a dead letter.
pub const REASON: &str = "courier_dlq_reason";
pub const CONSUMER_GROUP: &str = "courier_dlq_consumer_group";
pub const SUBSCRIPTION: &str = "courier_dlq_subscription";
pub const MESSAGE_ID: &str = "courier_dlq_message_id";
pub const ORDERING_KEY: &str = "courier_dlq_ordering_key";
pub const DELIVERY_ATTEMPT: &str = "courier_dlq_delivery_attempt";

/// Prefix of the attributes Pub/Sub's own dead-letter policy adds (delivery count, source
/// subscription, …).
pub const PUBSUB_DEAD_LETTER_PREFIX: &str = "CloudPubSubDeadLetter";

/// Pub/Sub's limit on an attribute value; a longer reason is cut.
const MAX_REASON_BYTES: usize = 1024;

pub struct DeadLetters {
    publisher: Publisher,
    topic: String,
    group: String,
    subscription: String,
    timeout: Duration,
}

impl DeadLetters {
    pub async fn new(
        pubsub: &PubSub,
        topic: &str,
        group: &str,
        subscription: &str,
        timeout: Duration,
    ) -> Result<Self, PubSubError> {
        Ok(Self {
            publisher: pubsub.publisher(topic, Duration::from_millis(1)).await?,
            topic: topic.into(),
            group: group.into(),
            subscription: subscription.into(),
            timeout,
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Publishes `original` with `reason`; returns once Pub/Sub stored it.
    pub async fn publish(
        &self,
        original: &Message,
        reason: &str,
        delivery_attempt: Option<i32>,
    ) -> Result<String, String> {
        let mut attributes = original.attributes.clone();
        attributes.insert(REASON.into(), truncate(reason, MAX_REASON_BYTES).into());
        attributes.insert(CONSUMER_GROUP.into(), self.group.clone());
        attributes.insert(SUBSCRIPTION.into(), self.subscription.clone());
        attributes.insert(MESSAGE_ID.into(), original.message_id.clone());
        attributes.insert(ORDERING_KEY.into(), original.ordering_key.clone());
        if let Some(attempt) = delivery_attempt {
            attributes.insert(DELIVERY_ATTEMPT.into(), attempt.to_string());
        }
        // No ordering key: a dead letter must not wait behind, or pause, anything.
        let message = Message::new()
            .set_data(original.data.clone())
            .set_attributes(attributes);
        match tokio::time::timeout(self.timeout, self.publisher.publish(message)).await {
            Ok(Ok(id)) => Ok(id),
            Ok(Err(e)) => Err(format!("publish to dead-letter topic {}: {e}", self.topic)),
            Err(_) => Err(format!(
                "publish to dead-letter topic {} timed out after {:?}",
                self.topic, self.timeout
            )),
        }
    }
}

/// A dead letter as an operator sees it (read from the keeper subscription `<sub>.dlq`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeptDeadLetter {
    pub message_id: String,
    pub reason: Option<String>,
    pub consumer_group: Option<String>,
    pub original_message_id: Option<String>,
    pub ordering_key: String,
    pub delivery_attempt: Option<String>,
    /// Every attribute, the added ones included.
    pub attributes: std::collections::BTreeMap<String, String>,
    pub data_bytes: usize,
}

impl KeptDeadLetter {
    pub fn of(message: &Message) -> Self {
        let attribute = |key: &str| message.attributes.get(key).cloned();
        Self {
            message_id: message.message_id.clone(),
            reason: attribute(REASON),
            consumer_group: attribute(CONSUMER_GROUP),
            original_message_id: attribute(MESSAGE_ID),
            ordering_key: attribute(ORDERING_KEY).unwrap_or_else(|| message.ordering_key.clone()),
            delivery_attempt: attribute(DELIVERY_ATTEMPT),
            attributes: message.attributes.clone().into_iter().collect(),
            data_bytes: message.data.len(),
        }
    }
}

/// The message to publish back to the main topic for a fresh delivery: the original data and
/// attributes (without what dead-lettering added) and the original ordering key.
pub fn revived(dead: &Message) -> Message {
    let ordering_key = dead
        .attributes
        .get(ORDERING_KEY)
        .cloned()
        .unwrap_or_else(|| dead.ordering_key.clone());
    let attributes: std::collections::HashMap<String, String> = dead
        .attributes
        .iter()
        .filter(|(key, _)| {
            !key.starts_with("courier_dlq_") && !key.starts_with(PUBSUB_DEAD_LETTER_PREFIX)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Message::new()
        .set_data(dead.data.clone())
        .set_attributes(attributes)
        .set_ordering_key(ordering_key)
}

/// Reads up to `max` messages from the keeper subscription `keeper`, stopping once `idle`
/// passes without a new one. The caller acks (republished) or drops (nacks) each handler.
///
/// Ending the stream after an idle wait is what the emulator's dead-stream bug punishes
/// (docs/emulator.md): on the emulator, messages nacked here come back only after the keeper's
/// ack deadline. Real Pub/Sub redelivers them at once.
pub async fn read_kept(
    pubsub: &PubSub,
    keeper: &str,
    max: usize,
    idle: Duration,
) -> Result<Vec<(Message, google_cloud_pubsub::subscriber::handler::Handler)>, PubSubError> {
    let subscriber = pubsub.subscriber().await?;
    let mut stream = subscriber
        .subscribe(pubsub.subscription_path(keeper))
        .set_max_outstanding_messages(i64::try_from(max).unwrap_or(i64::MAX))
        .build();
    let mut read = Vec::new();
    while read.len() < max {
        match tokio::time::timeout(idle, stream.next()).await {
            Err(_) | Ok(None) => break,
            Ok(Some(Ok(received))) => read.push(received),
            Ok(Some(Err(source))) => {
                return Err(PubSubError::Rpc {
                    context: format!("read dead letters from {keeper}"),
                    source,
                })
            }
        }
    }
    Ok(read)
}

/// The longest prefix of `text` within `max` bytes, on a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncates_on_a_character_boundary() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("aéb", 3), "aé");
    }
}
