//! The crate's integration tests, one binary: each file of this folder is a module of it, so a
//! build links the whole dependency graph once rather than once a file (the longest step of a
//! clean build). Cargo.toml lists the binaries (`autotests = false`); `layout::` in courier's
//! tests checks that every file here is compiled into one of them.

mod pipeline;
mod support;

mod console;
mod console_browser;
mod dlq;
mod horizon;
mod outbox_operator;
mod parked;
mod provision;
mod tls;
mod verify;
