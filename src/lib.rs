//! turnstile: an API gateway on Pingora whose job is to limit how fast each client may call
//! the backends behind it, exactly, across any number of gateway instances.
//!
//! The folders draw the architecture (ARCHITECTURE.md has the whole picture):
//!
//! ```text
//! proxy/       Pingora glue: the only code that touches a Session; one file per phase group,
//!              and conn/, the connection guard (header, body and idle deadlines)
//!   └─► chain/   the request path as plain steps, in order: message checks, path normal form,
//!                route, client IP, per-IP bucket, API key, limits (admission), what the
//!                upstream receives (forward), problem+json, RateLimit headers
//!         ├─► upstream/  pools, balancing, name resolution, health checks, load shedding
//!         └─► limit/     algorithms (pure, time as an argument) and where their state lives:
//!                        the per-IP table and the stores (memory, Redis) behind one contract
//! registry/    API clients at runtime, in the shared store: every instance's copy, admin writes
//! control/     config (TOML → typed, validated) → snapshot (what a request reads) → reload;
//!              the admin listener
//! ops/         metrics, the access log, application logs, traces (W3C context, OTLP export)
//! background/  the services that run periodically: health checks, store heartbeat, sweeper,
//!              config file watch and SIGHUP
//! server.rs    assembles the Pingora services
//! clock.rs, secret.rs   time (monotonic, or driven by tests) and values never printed
//! outbound.rs  the gateway's own HTTP calls (OTLP export, JWKS): bounded, blocking, off the
//!              request path
//! ```
//!
//! Imports run one way, from the bottom: `clock`, `secret`, `outbound` ← `limit` ← `upstream` ← `chain` ← `registry` ←
//! `ops` ← `control` ← `background` ← `proxy` ← `server` (`tests/code/layout.rs` checks it).

#![recursion_limit = "256"]

/// The version and the commit it was built from: `0.2.0 (1a2b3c4d5e6f)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("TURNSTILE_COMMIT"),
    ")"
);

/// The commit the binary was built from (`unknown` outside a git checkout).
pub const COMMIT: &str = env!("TURNSTILE_COMMIT");

mod background;
pub mod chain;
pub mod clock;
mod control;
#[doc(hidden)]
pub mod fuzzing;
pub mod limit;
mod ops;
pub mod outbound;
mod proxy;
pub mod registry;
pub mod secret;
pub mod server;
pub mod upstream;

pub use control::config;
pub use control::snapshot::Snapshot;
pub use control::tls;
pub use ops::logging;
pub use ops::metrics::Metrics;
pub use ops::trace;
