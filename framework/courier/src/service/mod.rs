//! What a service declares — its schema, outbound topics, inbound subscriptions with their
//! projections, and HTTP routes — and what the framework builds from that declaration.
//!
//! A service is a function returning a [`Service`]; `courier_cli::service::main` (the
//! `courier-cli` crate, so this one carries no command-line dependencies) turns it into a
//! binary with `serve`, `migrate`, `provision`, `rebuild` and `backfill`, and
//! [`RunningService`] runs it in-process (tests, demo).
//! The framework wires the relay, the consumers, supervision, health, readiness, metrics and
//! config; the service writes SQL, handlers and projections.

mod api_error;
mod context;
mod declaration;
mod error;
pub mod http;
pub mod runtime;

pub use api_error::ApiError;
pub use context::ServiceContext;
pub use declaration::{Deployment, Inbound, Service};
pub use error::ServiceError;
pub use http::{read_at_least, VersionToken, WriteAccess};
pub use runtime::{wait_for_signal, RunOptions, RunningService};
