//! Running the gateway: the admin listener, configuration and its errors, hot reload,
//! secrets, logs, traces, the Grafana dashboard, the container, the compose topology,
//! Kubernetes and the release archive.
//!
//! One test binary per area (each links the whole crate once); the shared harness is
//! `tests/common/`.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod cli;
mod compose;
mod config;
mod console;
mod console_shift;
mod container;
mod cors_browser;
mod dashboard;
mod kubernetes;
mod logs;
mod quota;
mod refusals;
mod registry;
mod release;
mod reload;
mod secrets;
mod tracing;
