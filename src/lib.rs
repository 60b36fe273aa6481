//! turnstile: an API gateway on Pingora whose job is to limit how fast each client may call
//! the backends behind it, exactly, across any number of gateway instances.
//!
//! The folders draw the architecture (ARCHITECTURE.md has the whole picture):
//!
//! ```text
//! proxy/       Pingora glue: the only code that touches a Session; one file per phase group
//!   └─► chain/   the request path as plain steps, in order: message checks, path normal form,
//!                route, client IP, per-IP bucket, API key, plan limits (admission), what the
//!                upstream receives, problem+json, RateLimit headers
//!         └─► limit/  algorithms (pure, time as an argument) and where their state lives:
//!                     the per-IP table and the stores (memory, Redis) behind one contract
//! control/     config (TOML → typed, validated) → snapshot (what a request reads) → reload;
//!              the admin listener
//! ops/         metrics and the access log
//! background/  health checks, store heartbeat, sweeper, config file watch and SIGHUP
//! server.rs    assembles the Pingora services
//! ```
//!
//! Imports run one way: `proxy` and `background` use `control`, which uses `chain`, `limit`
//! and `ops`; `chain` uses `limit`; nothing below imports what is above it.

#![recursion_limit = "256"]

mod background;
pub mod chain;
pub mod clock;
mod control;
#[doc(hidden)]
pub mod fuzzing;
pub mod limit;
mod ops;
mod proxy;
pub mod server;

pub use control::config;
pub use control::snapshot::Snapshot;
pub use control::tls;
pub use ops::logging;
pub use ops::metrics::Metrics;
pub use ops::trace;
