use crate::TestPubSub;
use courier::pubsub::PubSub;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One received message.
#[derive(Debug, Clone)]
pub struct Received {
    pub message_id: String,
    pub ordering_key: String,
    pub attributes: HashMap<String, String>,
    pub data: Vec<u8>,
}

impl Received {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// Receives and acks everything on a subscription into memory, on one long-lived stream that
/// is never cancelled mid-`next()` (the emulator strands messages on cancelled streams).
#[derive(Clone)]
pub struct Collector {
    received: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    /// Starts collecting from `subscription` of the shared test project on the current
    /// runtime.
    pub async fn start(pubsub: &TestPubSub, subscription: &str) -> anyhow::Result<Self> {
        Self::start_on(&pubsub.client(), subscription).await
    }

    /// Starts collecting from `subscription` of `client`'s project (an isolated one:
    /// [`TestPubSub::isolated_config`]).
    pub async fn start_on(client: &PubSub, subscription: &str) -> anyhow::Result<Self> {
        let subscriber = client.subscriber().await?;
        let mut stream = subscriber
            .subscribe(client.subscription_path(subscription))
            .build();
        let received = Arc::new(Mutex::new(Vec::new()));
        let sink = received.clone();
        tokio::spawn(async move {
            // Holds the client for the stream's life.
            let _subscriber = subscriber;
            while let Some(Ok((message, handler))) = stream.next().await {
                let item = Received {
                    message_id: message.message_id.clone(),
                    ordering_key: message.ordering_key.clone(),
                    attributes: message.attributes.clone().into_iter().collect(),
                    data: message.data.to_vec(),
                };
                if let Ok(mut all) = sink.lock() {
                    all.push(item);
                }
                handler.ack();
            }
        });
        Ok(Self { received })
    }

    /// Everything received so far, in arrival order.
    pub fn all(&self) -> Vec<Received> {
        self.received.lock().map(|v| v.clone()).unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.received.lock().map(|v| v.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Distinct event ids received.
    pub fn distinct_event_ids(&self) -> std::collections::HashSet<String> {
        self.all()
            .into_iter()
            .filter_map(|r| r.attributes.get("event_id").cloned())
            .collect()
    }

    /// For each ordering key, the versions (the `version` attribute) in the order Pub/Sub
    /// stored them: P2 is about what reaches Pub/Sub, not about how the emulator delivers it
    /// (its ordered delivery can hand a stranded message over late). The emulator numbers
    /// messages as it receives them (per key, ids grow with publish order), so each version
    /// counts at its smallest message id, and republished copies are left out. A key whose
    /// list is not ascending was reordered on the way to Pub/Sub.
    pub fn publish_order(&self) -> HashMap<String, Vec<i64>> {
        let mut first: HashMap<(String, i64), u64> = HashMap::new();
        for (arrival, r) in self.all().into_iter().enumerate() {
            let version: i64 = r
                .attribute("version")
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1);
            // A broker whose ids are not numbers: arrival order stands in.
            let id = r.message_id.parse().unwrap_or(arrival as u64);
            first
                .entry((r.ordering_key.clone(), version))
                .and_modify(|seen| *seen = (*seen).min(id))
                .or_insert(id);
        }
        let mut by_key: HashMap<String, Vec<(u64, i64)>> = HashMap::new();
        for ((key, version), id) in first {
            by_key.entry(key).or_default().push((id, version));
        }
        by_key
            .into_iter()
            .map(|(key, mut versions)| {
                versions.sort_unstable();
                (key, versions.into_iter().map(|(_, v)| v).collect())
            })
            .collect()
    }
}
