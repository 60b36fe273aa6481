//! turnstile: an API gateway on Pingora whose job is to limit how fast each client may call
//! the backends behind it, exactly, across any number of gateway instances.
//!
//! ```text
//! client ─► listener ─► proxy::Gateway (the only Pingora glue)
//!             new_ctx                  load the live Snapshot once (arc-swap)
//!             request_filter           request id · path check · router::Router::find → 404/405
//!             upstream_peer            upstream::Pool::select (round robin, health-checked) → 502
//!             upstream_request_filter  X-Forwarded-For += peer · X-Request-Id
//!             response_filter          X-Request-Id on the response
//!             fail_to_proxy            problem+json: 502 unreachable · 504 timeout
//! ```
//!
//! Everything a request reads comes from one [`snapshot::Snapshot`], built from a validated
//! [`config::Config`]. Pure logic (config validation, routing, problem bodies) lives in its
//! own modules and is tested without a network; `proxy` only moves data between Pingora and
//! those functions.

pub mod access_log;
pub mod admin;
pub mod auth;
pub mod chain;
pub mod clock;
pub mod config;
pub mod conn;
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
pub mod heartbeat;
pub mod identity;
pub mod limit;
pub mod metrics;
pub mod problem;
pub mod proxy;
pub mod reload;
pub mod request_id;
pub mod request_path;
pub mod router;
pub mod server;
pub mod snapshot;
pub mod sweeper;
pub mod upstream;
