//! The control plane: how the running configuration is made and changed.
//!
//! ```text
//! TOML file ─► config (serde mirror → validated, typed Config; errors name TOML paths)
//!           ─► snapshot (everything a request reads: router, routes, pools, keys, store)
//!           ─► ArcSwap ◄─ reload (file watch, SIGHUP, POST /reload: build, reuse, swap)
//! ```
//!
//! The admin listener lives here too: it shows the running configuration and triggers
//! reloads (and serves the metrics and health endpoints operators scrape).

pub mod admin;
pub mod admin_guard;
pub mod client_auth;
pub mod clients_api;
pub mod clients_file;
pub mod config;
pub mod console;
pub mod history;
pub mod identity;
pub mod refusals_api;
pub mod reload;
pub mod snapshot;
pub mod tls;
