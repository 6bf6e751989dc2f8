//! Lone rows: a claimed batch of one row, of a key with no key publisher and nothing out, is
//! published without starting one.
//!
//! With a fresh aggregate per row (a new video) nearly every row is lone, and a key publisher
//! per row (an actor with its mailbox, idle timer and registry entry) cost the relay about a
//! tenth of its unique-key drain rate. A lone row needs none of it: with nothing else of its
//! key out, there is no order to keep but its own. So it is handed straight to the client.
//! Batches of its key claimed while it is out wait for it ([`LoneRows`]); once it settles they
//! go, in claim order, to a key publisher whose frontier has the lone row out if it was
//! acknowledged (the rows right behind it may follow) and not otherwise (they wait for its
//! retry). A row claimed after that, while the lone row is acknowledged but not yet marked,
//! comes with the claimer's word that it is out (`out_to`, `Claimer::acked_right_before`).

use super::frontier::Frontier;
use super::handed::{judge, Handed, Verdict};
use super::{PublishOutcome, PublishRows, PublisherKey, Publishers};
use crate::fast_hash::FastHash;
use crate::relay::store::ClaimedRow;
use dashmap::DashMap;
use std::future::Future;
use std::time::Instant;

/// Keys with a lone row out, each with its batches claimed meanwhile, in claim order (at most
/// one per in-flight batch of its claimer, as a key publisher's mailbox would hold).
#[derive(Default)]
pub(super) struct LoneRows {
    waiting: DashMap<PublisherKey, Vec<PublishRows>, FastHash>,
}

impl LoneRows {
    /// Queues `batch` behind `key`'s lone row if one is out; gives it back otherwise.
    pub(super) fn wait_behind(
        &self,
        key: &PublisherKey,
        batch: PublishRows,
    ) -> Option<PublishRows> {
        match self.waiting.get_mut(key) {
            Some(mut waiting) => {
                waiting.push(batch);
                None
            }
            None => Some(batch),
        }
    }

    /// Keys with a lone row out now.
    pub(super) fn len(&self) -> usize {
        self.waiting.len()
    }
}

/// Publishes `rows` as a lone row if they are one: a single row that `frontier` (what is
/// known to be out of the key) admits, of a key with no key publisher and no lone row out,
/// once the topic's client exists. The future yields its outcome; it must be polled on an
/// actix arbiter (it may start a key publisher).
pub(super) fn try_publish(
    publishers: &Publishers,
    key: &PublisherKey,
    rows: &[ClaimedRow],
    frontier: Frontier,
) -> Option<impl Future<Output = Vec<PublishOutcome>> + 'static> {
    let [row] = rows else { return None };
    if !frontier.admits(row.prev_version)
        || publishers.live.contains(key)
        || publishers.lone.waiting.contains_key(key)
    {
        return None;
    }
    let client = publishers.clients.for_new_key_now(&key.topic)?;
    let settings = &publishers.settings;
    let handed = match settings.fault.as_ref().and_then(|f| f(row)) {
        Some(error) => Handed::Injected(error),
        None => Handed::send(&client.publisher, row),
    };
    publishers.lone.waiting.insert(key.clone(), Vec::new());
    let (seq, version, prev_version) = (row.seq, row.version, row.prev_version);
    let deadline = tokio::time::Instant::now() + settings.publish_timeout;
    let (publishers, key) = (publishers.clone(), key.clone());
    Some(async move {
        let started = Instant::now();
        let result = handed.settle(deadline).await;
        let verdict = judge(
            &publishers.settings,
            &key.ordering_key,
            result,
            started.elapsed(),
        );
        let got_through = matches!(verdict, Verdict::Published(_));
        let frontier = frontier_after(frontier, version, prev_version, got_through);
        let outcome = match verdict {
            Verdict::Published(message_id) => PublishOutcome::Published {
                seq,
                message_id,
                acked: Instant::now(),
            },
            Verdict::NotTried { paused } => {
                resume_if(paused, &client.publisher, &key);
                PublishOutcome::NotTried { seq }
            }
            Verdict::Failed {
                error,
                kind,
                paused,
            } => {
                // Nothing else of the key is on the client: it may go again at once.
                resume_if(paused, &client.publisher, &key);
                metrics::counter!(crate::metrics::OUTBOX_PUBLISH_ERROR_TOTAL).increment(1);
                PublishOutcome::Failed { seq, error, kind }
            }
        };
        drop(client);
        publishers.clients.release_if_unused(&key.topic);
        let waiting = publishers.lone.waiting.remove(&key);
        for batch in waiting.into_iter().flat_map(|(_, batches)| batches) {
            publishers.enqueue(&key, batch, frontier);
        }
        vec![outcome]
    })
}

/// What is out of the key once its lone row settled, from what was out before it (`before`,
/// which admitted it): the row too if it got through; otherwise nothing past what came before
/// it, so no row behind it goes out ahead of its retry.
fn frontier_after(
    before: Frontier,
    version: i64,
    prev_version: Option<i64>,
    got_through: bool,
) -> Frontier {
    let mut after = before;
    if got_through {
        after.handed(version);
    } else {
        after.set_back(prev_version);
    }
    after
}

fn resume_if(paused: bool, client: &google_cloud_pubsub::client::Publisher, key: &PublisherKey) {
    if paused {
        client.resume_publish(key.ordering_key.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_behind_a_lone_row_may_follow_it_only_once_it_got_through() {
        // Version 1, nothing before it: the rows right behind it (prev 1) wait for its retry
        // if it failed, and follow it if it got through.
        let failed = frontier_after(Frontier::default(), 1, None, false);
        assert!(!failed.admits(Some(1)));
        assert!(failed.admits(None));
        assert!(frontier_after(Frontier::default(), 1, None, true).admits(Some(1)));
        // Version 5 right behind version 4, which was acknowledged and not yet marked.
        let behind_acked = Frontier::out_to(Some(4));
        let failed = frontier_after(behind_acked, 5, Some(4), false);
        assert!(failed.admits(Some(4)), "version 4 is still out");
        assert!(!failed.admits(Some(5)));
        assert!(frontier_after(behind_acked, 5, Some(4), true).admits(Some(5)));
    }
}
