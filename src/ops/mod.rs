//! Operations: what the gateway tells the people running it — Prometheus metrics and the
//! access log. Both are written off the hot path (atomics resolved once per snapshot; a
//! bounded queue to a writer thread).

pub mod access_log;
pub mod logging;
pub mod metrics;
pub mod trace;
