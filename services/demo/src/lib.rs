//! The catalog, engagement and search services together, as the demo runs them and as the
//! cross-service tests check them: in one process, each with its own schema, database role,
//! HTTP port and Pub/Sub subscriptions, talking to each other only through events.
//!
//! # Layout
//! - [`stack`]: migrate, provision and start the three services.
//! - [`client`]: a small JSON-over-HTTP client for their APIs.
//! - [`scenario`]: the demo's scripted story and the table of what flowed where.
//! - [`injected`]: a dead letter the demo leaves for the operator console to republish.

/// A small JSON-over-HTTP client for the services' APIs (the test kit's).
pub mod client {
    pub use courier_testkit::{Api, Reply};
}
pub mod injected;
pub mod scenario;
pub mod stack;

/// The README's code examples, compiled by `cargo test --doc -p courier-demo` (this crate sees
/// every crate a service uses), so the README cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;
