//! The crate's integration tests, one binary: each file of this folder is a module of it, so a
//! build links the whole dependency graph once rather than once a file (the longest step of a
//! clean build). Cargo.toml lists the binaries (`autotests = false`); `layout::` in courier's
//! tests checks that every file here is compiled into one of them.
//!
//! Binaries of their own, for what a test does to its whole process (under `cargo test` the
//! tests of a binary share one):
//! - backlog.rs measures its process's resident memory;
//! - congestion.rs judges rates and latencies after a stall, alone;
//! - distinct_keys.rs measures its process's memory through its own allocator;
//! - logs.rs installs the process's JSON log subscriber.

mod support;

mod architecture_map;
mod backlog_gauge;
mod claim;
mod cold_start;
mod committer;
mod config_reference;
mod contiguous;
mod dependencies;
mod docs;
mod emitting;
mod horizon;
mod key_versions;
mod layout;
mod module_graph;
mod offsets;
mod otlp;
mod pinned_horizon;
mod read_side;
mod relay_plans;
mod retention;
mod schema_evolution;
mod sql_producers;
mod statements;
mod tls;
mod transactions;
mod transient;
mod wire_contract;
mod write_side;
