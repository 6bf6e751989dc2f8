//! A registry of per-key actors created on demand and passivated when idle: the key publishers
//! of the relay and the projectors of a consumer.
//!
//! The one subtle rule lives here: a message handed to a key's actor must never be lost to
//! that actor passivating at the same moment. Each live actor has a `queued` counter of
//! messages handed to it and not yet finished; it is raised under the registry entry's lock
//! before the hand-over, and an actor leaves the registry only under that same lock with the
//! counter at zero. So "hand over" and "leave" exclude each other, and a message that finds a
//! just-stopped actor (closed mailbox) is handed to a fresh one instead.

use crate::fast_hash::FastHash;
use actix::prelude::*;
use dashmap::DashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Messages handed to one keyed actor and not yet finished; also kept in the
/// `courier_mailbox_depth{actor}` gauge of its kind (the sum over every key).
pub struct Queued {
    count: AtomicUsize,
    /// The kind's gauge, resolved once by the registry (this is on every message's path).
    depth: metrics::Gauge,
}

impl Queued {
    fn new(depth: metrics::Gauge) -> Self {
        Self {
            count: AtomicUsize::new(0),
            depth,
        }
    }

    fn add(&self, n: usize) {
        self.count.fetch_add(n, Ordering::SeqCst);
        #[allow(clippy::cast_precision_loss)]
        self.depth.increment(n as f64);
    }

    /// Counts one message that is not here yet (an event given back to Pub/Sub and expected
    /// again), so the actor is neither passivated nor evicted while it waits; `finished(1)`
    /// releases it.
    pub fn expect_one(&self) {
        self.add(1);
    }

    /// The actor finished with `n` messages (processed, nacked or given back).
    pub fn finished(&self, n: usize) {
        self.count.fetch_sub(n, Ordering::SeqCst);
        #[allow(clippy::cast_precision_loss)]
        self.depth.decrement(n as f64);
    }

    fn is_empty(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }
}

/// A live actor and the messages handed to it and not yet finished.
struct Live<A: Actor> {
    addr: Addr<A>,
    queued: Arc<Queued>,
}

/// Why a message was not handed over; the message comes back to the caller.
#[derive(Debug)]
pub enum Refused<M> {
    /// The actor's mailbox is full.
    Full(M),
    /// The actor stopped, and so did the one started in its place.
    Closed(M),
}

pub struct KeyedActors<K, A: Actor> {
    map: DashMap<K, Live<A>, FastHash>,
    /// `courier_mailbox_depth{actor=<kind>}`, shared by every key's counter.
    depth: metrics::Gauge,
}

impl<K: Eq + Hash + Clone, A: Actor> KeyedActors<K, A> {
    /// `kind` labels the mailbox-depth gauge (`projector`, `key_publisher`).
    pub fn new(kind: &'static str) -> Self {
        Self {
            map: DashMap::default(),
            depth: metrics::gauge!(crate::metrics::MAILBOX_DEPTH, "actor" => kind),
        }
    }
}

impl<K, A> KeyedActors<K, A>
where
    K: Eq + Hash + Clone,
    A: Actor<Context = Context<A>>,
{
    /// Actors alive now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.contains_key(key)
    }

    /// Hands `message` to `key`'s actor now (so calls made in some order reach the actor in
    /// that order), starting one with `start` if none is live. `start` receives the counter
    /// the actor must lower by one for each message it finished with.
    pub fn send<M>(
        &self,
        key: &K,
        message: M,
        mut start: impl FnMut(Arc<Queued>) -> Addr<A>,
    ) -> Result<(), Refused<M>>
    where
        A: Handler<M>,
        M: Message + Send + 'static,
        M::Result: Send,
    {
        let mut message = message;
        // Twice: an actor that passivated after the lookup has a closed mailbox.
        for _ in 0..2 {
            let entry = self.map.entry(key.clone()).or_insert_with(|| {
                let queued = Arc::new(Queued::new(self.depth.clone()));
                Live {
                    addr: start(queued.clone()),
                    queued,
                }
            });
            entry.queued.add(1);
            match entry.addr.try_send(message) {
                Ok(()) => return Ok(()),
                Err(SendError::Full(returned)) => {
                    entry.queued.finished(1);
                    return Err(Refused::Full(returned));
                }
                Err(SendError::Closed(returned)) => {
                    entry.queued.finished(1);
                    message = returned;
                    let closed = entry.addr.clone();
                    drop(entry);
                    self.map.remove_if(key, |_, live| live.addr == closed);
                }
            }
        }
        Err(Refused::Closed(message))
    }

    /// Removes `key`'s actor if it is `addr` and has nothing queued; true if removed (the
    /// actor then stops). Called by the actor itself when idle.
    pub fn leave_if_idle(&self, key: &K, addr: &Addr<A>) -> bool {
        self.map
            .remove_if(key, |_, live| live.addr == *addr && live.queued.is_empty())
            .is_some()
    }

    /// Removes one actor with nothing queued, to make room under a cap; the caller tells it
    /// to stop.
    pub fn evict_one_idle(&self) -> Option<Addr<A>> {
        let idle_key = self
            .map
            .iter()
            .find(|e| e.queued.is_empty())
            .map(|e| e.key().clone())?;
        self.map
            .remove_if(&idle_key, |_, live| live.queued.is_empty())
            .map(|(_, live)| live.addr)
    }
}
