//! The crate's integration tests, one binary: each file of this folder is a module of it, so a
//! build links the whole dependency graph once rather than once a file (the longest step of a
//! clean build). Cargo.toml lists the binaries (`autotests = false`); `layout::` in courier's
//! tests checks that every file here is compiled into one of them.
//!
//! Binaries of their own, for what a test does to its whole process (under `cargo test` the
//! tests of a binary share one):
//! - tracing.rs installs the process's span recorder.

mod support;

mod backfill;
mod demo_story;
mod deploy_manifests;
mod held_locks;
mod injected_dead_letter;
mod offsets_cli;
mod services;
