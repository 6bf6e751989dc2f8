//! The relay's Pub/Sub clients: one gRPC connection (`BasePublisher`) shared by cheap
//! per-topic `Publisher`s, each serving a bounded generation of ordering keys.
//!
//! Why generations: the official crate's `Publisher` keeps a batch actor and an unbounded
//! channel for every ordering key it ever published, for its whole life
//! (google-cloud-rust #6723, TODO #4012 in `publisher/actor.rs`, still in 1.7.0): ~17 KB a
//! key, 6.8 GB after 300k keys with a new key per aggregate. A `Publisher` frees all of it
//! when dropped. So a topic's client serves [`KEYS_PER_CLIENT`] key publishers, then new key
//! publishers get a new client; each key publisher holds its client for its whole life, and a
//! generation's client is dropped when the last of its key publishers passivates, the current
//! one too (so an idle relay keeps no per-key state). A key's rows never go out on two clients
//! at once: a key publisher passivates only with nothing in flight, and only then can the key's
//! next publisher start on a newer client.

use crate::pubsub::{PubSub, PubSubError};
use google_cloud_pubsub::client::{BasePublisher, Publisher};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::OnceCell;

/// Key publishers one topic client serves before new ones get a new client: bounds the crate's
/// per-key state of a client to this many keys (~17 MB at 1,000).
pub const KEYS_PER_CLIENT: u32 = 1_000;

/// Publish requests the relay's one connection sends or queues at once: the official crate's
/// gRPC channel sends 100 at a time per subchannel (one by default) and queues up to 1,024
/// more (google-cloud-gax-internal 0.7.21, `grpc.rs`: `concurrency_limit(100)`,
/// `DEFAULT_REQUEST_BUFFER_CAPACITY`). Requests beyond it wait in the client.
pub const REQUESTS_THE_CONNECTION_CARRIES: usize = 100 + 1_024;

/// A topic client of one generation; counted while alive.
pub struct TopicClient {
    pub publisher: Publisher,
    alive: Arc<AtomicUsize>,
}

impl Drop for TopicClient {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The clients of one relay.
pub struct TopicClients {
    pubsub: PubSub,
    /// Where the clients are built, so their background work runs there.
    runtime: Handle,
    /// The batch delay of every client.
    delay: Duration,
    base: OnceCell<BasePublisher>,
    /// Per topic, the client new key publishers get, and how many it has been given.
    current: Mutex<HashMap<String, (Arc<TopicClient>, u32)>>,
    /// Clients not dropped yet, of every generation.
    alive: Arc<AtomicUsize>,
}

impl TopicClients {
    pub fn new(pubsub: PubSub, runtime: Handle, delay: Duration) -> Self {
        Self {
            pubsub,
            runtime,
            delay,
            base: OnceCell::new(),
            current: Mutex::new(HashMap::new()),
            alive: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Topic clients alive now: those with a live key publisher, of every generation.
    pub fn alive(&self) -> usize {
        self.alive.load(Ordering::Relaxed)
    }

    /// The client a new key publisher of `topic` uses for its whole life.
    pub async fn for_new_key(&self, topic: &str) -> Result<Arc<TopicClient>, PubSubError> {
        let base = self
            .base
            .get_or_try_init(|| {
                let (pubsub, runtime) = (self.pubsub.clone(), self.runtime.clone());
                async move {
                    runtime
                        .spawn(async move { pubsub.base_publisher().await })
                        .await
                        .map_err(|e| PubSubError::Stopped {
                            context: "the relay's Pub/Sub connection".into(),
                            reason: e.to_string(),
                        })?
                }
            })
            .await?;
        Ok(self.client_on(base, topic))
    }

    /// [`TopicClients::for_new_key`] without waiting, once the connection exists (every key
    /// but the first few): `None` before that.
    pub fn for_new_key_now(&self, topic: &str) -> Option<Arc<TopicClient>> {
        self.base.get().map(|base| self.client_on(base, topic))
    }

    /// `topic`'s current client, or a new generation's when the current one has served
    /// [`KEYS_PER_CLIENT`] keys.
    fn client_on(&self, base: &BasePublisher, topic: &str) -> Arc<TopicClient> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((client, given)) = current.get_mut(topic) {
            if *given < KEYS_PER_CLIENT {
                *given += 1;
                return client.clone();
            }
        }
        // The client spawns its dispatcher on the runtime it is built in.
        let _entered = self.runtime.enter();
        self.alive.fetch_add(1, Ordering::Relaxed);
        let client = Arc::new(TopicClient {
            publisher: base
                .publisher(self.pubsub.topic_path(topic))
                .set_delay_threshold(self.delay)
                .build(),
            alive: self.alive.clone(),
        });
        current.insert(topic.to_string(), (client.clone(), 1));
        client
    }

    /// Drops `topic`'s current client if no key publisher holds it any more; called by a key
    /// publisher that has just let go of its client. Older generations go by themselves with
    /// their last holder; the current one is also held here, for the keys still to come.
    pub fn release_if_unused(&self, topic: &str) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current
            .get(topic)
            .is_some_and(|(client, _)| Arc::strong_count(client) == 1)
        {
            current.remove(topic);
        }
    }
}
