//! The client registry: API clients, their plan and their key digests kept in the shared
//! store (Redis: single node, Cluster, Sentinel), managed at runtime through the admin API
//! and shared by every instance of the fleet.
//!
//! ```text
//! model.rs   a client as stored (JSON), its checks, new keys (CSPRNG, a recognisable prefix)
//! state.rs   every instance's copy: polled, resynced, kept when Redis is down or lost it
//! write.rs   the admin API's changes: compare-and-set one client in one script call
//! ```
//!
//! Clients of the configuration file (`[[clients]]`, `server.clients_file`) stay as they
//! are and win: a registry client with an id the file defines is not served, and the admin
//! API refuses to change one. With the memory store there is no registry: the admin API
//! writes `server.clients_file` instead (`control::clients_api`).

pub mod model;
pub mod state;
pub mod write;
