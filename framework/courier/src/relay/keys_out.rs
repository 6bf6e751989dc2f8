//! Rows handed to key publishers and not settled yet, and the distinct keys they belong to.
//!
//! Pub/Sub sends a key's rows one request at a time, so the keys out are the publish requests
//! the relay has asked of the connection, and rows per key is how much its rows in flight
//! batch. The publish limit reads the relay-wide totals ([`KeysOutTally`]) to judge whether
//! more rows in flight are worth holding (see `publish_limit`); each claimer keeps its own
//! shard's keys ([`KeysOut`]), since a key belongs to one shard.

use crate::fast_hash::FastHash;
use crate::relay::publisher_key::PublisherKey;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The relay's rows and keys out, summed over its claimers.
#[derive(Debug, Default)]
pub struct KeysOutTally {
    rows: AtomicUsize,
    keys: AtomicUsize,
}

impl KeysOutTally {
    /// Rows out and the distinct keys among them. Read without a lock: the two may be a
    /// moment apart, which a judgement of their ratio does not mind.
    pub fn rows_and_keys(&self) -> (usize, usize) {
        (
            self.rows.load(Ordering::Relaxed),
            self.keys.load(Ordering::Relaxed),
        )
    }

    fn add(&self, rows: usize, keys: usize) {
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.keys.fetch_add(keys, Ordering::Relaxed);
    }

    fn sub(&self, rows: usize, keys: usize) {
        self.rows.fetch_sub(rows, Ordering::Relaxed);
        self.keys.fetch_sub(keys, Ordering::Relaxed);
    }
}

/// One claimer's rows out, per key, counted into the relay's tally. Dropping or clearing it
/// takes its share out of the tally, so a restarted claimer does not leave keys counted.
#[derive(Debug)]
pub struct KeysOut {
    per_key: HashMap<PublisherKey, usize, FastHash>,
    rows: usize,
    tally: Arc<KeysOutTally>,
}

impl KeysOut {
    pub fn new(tally: Arc<KeysOutTally>) -> Self {
        Self {
            per_key: HashMap::default(),
            rows: 0,
            tally,
        }
    }

    /// `rows` of `key` were handed to its publisher.
    pub fn handed(&mut self, key: &PublisherKey, rows: usize) {
        if rows == 0 {
            return;
        }
        let new_key = match self.per_key.get_mut(key) {
            Some(out) => {
                *out += rows;
                0
            }
            None => {
                self.per_key.insert(key.clone(), rows);
                1
            }
        };
        self.rows += rows;
        self.tally.add(rows, new_key);
    }

    /// `rows` of `key` settled (published, failed or given back).
    pub fn settled(&mut self, key: &PublisherKey, rows: usize) {
        let Some(out) = self.per_key.get_mut(key) else {
            return;
        };
        let rows = rows.min(*out);
        *out -= rows;
        let gone_key = if *out == 0 {
            self.per_key.remove(key);
            1
        } else {
            0
        };
        self.rows -= rows;
        self.tally.sub(rows, gone_key);
    }

    /// Forgets every row out (a restart: the earlier incarnation's outcomes are dropped).
    pub fn clear(&mut self) {
        self.tally.sub(self.rows, self.per_key.len());
        self.per_key.clear();
        self.rows = 0;
    }
}

impl Drop for KeysOut {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> PublisherKey {
        PublisherKey::new("topic".into(), name.into())
    }

    #[test]
    fn keys_count_once_however_many_of_their_rows_are_out() {
        let tally = Arc::new(KeysOutTally::default());
        let mut out = KeysOut::new(tally.clone());
        out.handed(&key("a"), 3);
        out.handed(&key("a"), 2);
        out.handed(&key("b"), 1);
        assert_eq!(tally.rows_and_keys(), (6, 2));
        out.settled(&key("a"), 4);
        assert_eq!(tally.rows_and_keys(), (2, 2), "a still has a row out");
        out.settled(&key("a"), 1);
        out.settled(&key("b"), 1);
        assert_eq!(tally.rows_and_keys(), (0, 0));
        out.settled(&key("b"), 1);
        assert_eq!(
            tally.rows_and_keys(),
            (0, 0),
            "an unknown key changes nothing"
        );
    }

    #[test]
    fn claimers_add_up_and_a_cleared_or_dropped_one_leaves_nothing_counted() {
        let tally = Arc::new(KeysOutTally::default());
        let mut first = KeysOut::new(tally.clone());
        let mut second = KeysOut::new(tally.clone());
        first.handed(&key("a"), 2);
        second.handed(&key("b"), 5);
        assert_eq!(tally.rows_and_keys(), (7, 2));
        first.clear();
        assert_eq!(tally.rows_and_keys(), (5, 1));
        drop(second);
        assert_eq!(tally.rows_and_keys(), (0, 0));
    }
}
