//! Operations: what the gateway tells the people running it — Prometheus metrics, the
//! access log, traces, and the recent refusals. All written off the hot path (atomics
//! resolved once per snapshot; a bounded queue to a writer thread; refusals only on the
//! refusal path, in fixed memory).

pub mod access_log;
pub mod hitters;
pub mod logging;
pub mod metrics;
pub mod refusals;
pub mod trace;
