//! The name of a key publisher: a topic and an ordering key, shared rather than copied.

use std::sync::Arc;

/// Identifies one publisher actor: a topic and an ordering key. Shared, so the claimer's
/// bookkeeping, the registry and a key's publisher hold one copy (with a key per row, the
/// relay copies a key several times per row).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PublisherKey(Arc<KeyName>);

/// What a [`PublisherKey`] names.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct KeyName {
    pub topic: String,
    pub ordering_key: String,
}

impl PublisherKey {
    pub fn new(topic: String, ordering_key: String) -> Self {
        Self(Arc::new(KeyName {
            topic,
            ordering_key,
        }))
    }
}

impl std::ops::Deref for PublisherKey {
    type Target = KeyName;

    fn deref(&self) -> &KeyName {
        &self.0
    }
}
