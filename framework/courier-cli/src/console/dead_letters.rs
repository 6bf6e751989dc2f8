//! The console's hold on dead-letter keepers (`<subscription>.dlq`): one long-lived stream per
//! keeper, each message kept leased in memory with its handler until an operator republishes
//! it, so the page can group and count them on every refresh without reading the keeper again.
//!
//! Why a held stream instead of `courier dlq peek`'s short read: a read that ends hands its
//! messages back, and on the emulator a closed stream keeps them for the keeper's ack deadline
//! (docs/emulator.md, the dead-stream bug), so a page refreshing every few seconds would see
//! its dead letters come and go. While the console runs, `courier dlq peek` sees none of what
//! it holds (they are leased); stopping the console hands them back.

use crate::dlq::{keeper_of, Republisher};
use crate::refusal::Refusal;
use courier::operations::KeptDeadLetter;
use courier::pubsub::PubSub;
use courier::CourierConfig;
use google_cloud_pubsub::model::Message;
use google_cloud_pubsub::subscriber::handler::Handler;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// At most this many dead letters are held per keeper (the stream's flow control): the page
/// shows the first ones, and a keeper of more is a case for `courier dlq republish --max`.
const MAX_HELD: i64 = 1_000;
/// How long a keeper that failed (missing, unreachable) waits before it is read again.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// The keepers the console holds, by subscription.
pub(crate) struct DeadLetterHolds {
    pubsub: PubSub,
    /// The config dead letters are republished with (its schema logs them).
    holds: Mutex<HashMap<String, Arc<Hold>>>,
}

/// One keeper's held messages and its last error.
struct Hold {
    subscription: String,
    config: CourierConfig,
    held: Mutex<BTreeMap<String, (Message, Handler)>>,
    error: Mutex<Option<String>>,
}

/// A keeper's dead letters as the page shows them: grouped by reason and event type.
#[derive(Serialize)]
pub(crate) struct KeeperView {
    subscription: String,
    keeper: String,
    held: usize,
    /// Why the keeper cannot be read (it is tried again every few seconds).
    error: Option<String>,
    groups: Vec<LetterGroup>,
}

#[derive(Serialize)]
struct LetterGroup {
    reason: String,
    event_type: String,
    letters: Vec<KeptDeadLetter>,
}

/// Which held dead letters to republish: some by message id, and/or a whole group.
pub(crate) struct LetterSelection {
    pub(crate) message_ids: Vec<String>,
    pub(crate) group: Option<GroupKey>,
}

/// A group of dead letters: reason and event type, as the page shows them.
#[derive(Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct GroupKey {
    reason: String,
    event_type: String,
}

/// What a dead letter shows for a reason Pub/Sub's own policy gave (no Courier reason).
const POLICY_REASON: &str = "(dead-lettered by Pub/Sub's policy)";

fn group_key(message: &Message) -> GroupKey {
    let letter = KeptDeadLetter::of(message);
    GroupKey {
        reason: letter.reason.unwrap_or_else(|| POLICY_REASON.into()),
        event_type: message
            .attributes
            .get("event_type")
            .cloned()
            .unwrap_or_else(|| "-".into()),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind, still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DeadLetterHolds {
    pub(crate) fn new(pubsub: PubSub) -> Self {
        Self {
            pubsub,
            holds: Mutex::new(HashMap::new()),
        }
    }

    /// Starts holding `subscription`'s keeper (once), republishing with `config`.
    pub(crate) fn hold(&self, subscription: &str, config: &CourierConfig) {
        let mut holds = lock(&self.holds);
        if holds.contains_key(subscription) {
            return;
        }
        let hold = Arc::new(Hold {
            subscription: subscription.to_owned(),
            config: config.clone(),
            held: Mutex::new(BTreeMap::new()),
            error: Mutex::new(None),
        });
        holds.insert(subscription.to_owned(), hold.clone());
        tokio::spawn(read_keeper(self.pubsub.clone(), hold));
    }

    /// Every held keeper, its dead letters grouped by reason and event type.
    pub(crate) fn view(&self) -> Vec<KeeperView> {
        let holds: Vec<Arc<Hold>> = lock(&self.holds).values().cloned().collect();
        let mut views: Vec<KeeperView> = holds
            .iter()
            .map(|hold| {
                let held = lock(&hold.held);
                let mut groups: Vec<LetterGroup> = Vec::new();
                for (message, _) in held.values() {
                    let key = group_key(message);
                    let letter = KeptDeadLetter::of(message);
                    match groups
                        .iter_mut()
                        .find(|g| g.reason == key.reason && g.event_type == key.event_type)
                    {
                        Some(group) => group.letters.push(letter),
                        None => groups.push(LetterGroup {
                            reason: key.reason,
                            event_type: key.event_type,
                            letters: vec![letter],
                        }),
                    }
                }
                KeeperView {
                    keeper: keeper_of(&hold.subscription),
                    subscription: hold.subscription.clone(),
                    held: held.len(),
                    error: lock(&hold.error).clone(),
                    groups,
                }
            })
            .collect();
        views.sort_by(|a, b| a.subscription.cmp(&b.subscription));
        views
    }

    /// Republishes the selected held dead letters of `subscription` through the CLI's
    /// [`Republisher`]. With `expected`, refuses unless that many are selected (the page
    /// confirmed a count; the keeper may have changed since). Returns how many went.
    pub(crate) async fn republish(
        &self,
        subscription: &str,
        selection: &LetterSelection,
        expected: Option<usize>,
        actor: &str,
        reason: &str,
    ) -> anyhow::Result<usize> {
        crate::refusal::require_reason(reason, "the dead letters are republished")?;
        let hold = lock(&self.holds)
            .get(subscription)
            .cloned()
            .ok_or_else(|| Refusal::NotFound(format!("no dead letters held for {subscription}")))?;
        let chosen: Vec<(Message, Handler)> = {
            let mut held = lock(&hold.held);
            let ids: Vec<String> = held
                .iter()
                .filter(|(id, (message, _))| {
                    selection.message_ids.contains(id)
                        || selection
                            .group
                            .as_ref()
                            .is_some_and(|g| *g == group_key(message))
                })
                .map(|(id, _)| id.clone())
                .collect();
            if ids.is_empty() {
                return Err(Refusal::NotFound(format!(
                    "none of the selected dead letters is held for {subscription}"
                ))
                .into());
            }
            if let Some(expected) = expected.filter(|n| *n != ids.len()) {
                return Err(Refusal::Conflict(format!(
                    "{} dead letters match now, not the {expected} confirmed; look again",
                    ids.len()
                ))
                .into());
            }
            ids.iter().filter_map(|id| held.remove(id)).collect()
        };
        let republisher = Republisher::new(&hold.config, &self.pubsub, subscription).await?;
        let mut republished = 0;
        for (message, handler) in chosen {
            // A failure hands this one back (its handler is dropped: nack) and stops.
            republisher
                .republish(&message, handler, actor, reason)
                .await?;
            republished += 1;
        }
        Ok(republished)
    }
}

/// Reads one keeper for as long as the console runs: a failed stream is opened again after
/// [`RETRY_AFTER`]; no timeout ever wraps `next()` (the emulator's dead-stream bug).
async fn read_keeper(pubsub: PubSub, hold: Arc<Hold>) {
    let keeper = keeper_of(&hold.subscription);
    loop {
        let failure = match pubsub.subscriber().await {
            Err(e) => e.to_string(),
            Ok(subscriber) => {
                let mut stream = subscriber
                    .subscribe(pubsub.subscription_path(&keeper))
                    .set_max_outstanding_messages(MAX_HELD)
                    .build();
                loop {
                    match stream.next().await {
                        Some(Ok((message, handler))) => {
                            *lock(&hold.error) = None;
                            // A redelivery replaces the stale handler it came back from.
                            lock(&hold.held).insert(message.message_id.clone(), (message, handler));
                        }
                        Some(Err(e)) => break format!("read {keeper}: {e}"),
                        None => break format!("read {keeper}: the stream ended"),
                    }
                }
            }
        };
        tracing::warn!(keeper = %keeper, error = %failure, "dead-letter keeper not readable, trying again");
        *lock(&hold.error) = Some(failure);
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{group_key, GroupKey, POLICY_REASON};
    use google_cloud_pubsub::model::Message;

    fn letter(attributes: &[(&str, &str)]) -> Message {
        Message::new().set_attributes(
            attributes
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string())),
        )
    }

    #[test]
    fn dead_letters_group_by_courier_reason_and_event_type() {
        let key = group_key(&letter(&[
            ("courier_dlq_reason", "unknown schema version 9"),
            ("event_type", "video.changed"),
        ]));
        assert!(
            key == GroupKey {
                reason: "unknown schema version 9".into(),
                event_type: "video.changed".into(),
            }
        );
    }

    #[test]
    fn a_letter_dead_lettered_by_pubsubs_policy_has_a_reason_of_its_own() {
        let key = group_key(&letter(&[]));
        assert!(
            key == GroupKey {
                reason: POLICY_REASON.into(),
                event_type: "-".into(),
            }
        );
    }
}
