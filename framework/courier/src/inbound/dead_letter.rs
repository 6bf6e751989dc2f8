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
