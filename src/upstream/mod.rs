//! The upstream side: where an admitted request goes, and what protects what it goes to.
//!
//! ```text
//! config.rs     [upstreams.NAME] as validated: servers, checks, TLS, shedding, timeouts
//! balance.rs    weights, round robin and least request (power of two choices), in flight
//! pool.rs       a pool: its servers (resolved again every resolve_interval), round robin over
//!               the healthy ones, its active health check, its shedding gate
//! resolve.rs    host names → addresses (the system resolver or server.dns_servers)
//! retry.rs      a route's retry policy, backoff with full jitter, a pool's retry budget
//! tls.rs        what its TLS connections use, read when it is built
//! health.rs     the due health checks and resolutions of every pool, run by background/
//! outlier.rs    passive outlier ejection: servers failing requests taken out for a while
//! shed/         load shedding: the adaptive limit (controller) and the gate (priorities,
//!               a bounded queue, permits)
//! ```
//!
//! What the upstream receives of a request (headers set and removed, the forwarded path) is
//! `chain::forward`'s; the Pingora hooks that apply it are `proxy/upstream.rs`'s. Nothing here
//! knows the control plane: a pool is built from its config by `control::snapshot`, which
//! keeps it across reloads while its config is unchanged.

pub mod balance;
pub mod config;
pub mod health;
pub mod outlier;
pub mod pool;
pub mod resolve;
pub mod retry;
pub mod shed;
pub mod tls;

/// Why a pool could not be built: the TOML path of the setting, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub path: String,
    pub message: String,
}
