//! Background tasks, each a Pingora background service reading the live snapshot: upstream
//! health checks, the store heartbeat (instances alive, leases given back at shutdown), the
//! sweeper of idle in-process state, the refresh of issuers' key sets (JWKS), the client registry's copy, and the
//! configuration watchers (file changes, SIGHUP).

pub mod health;
pub mod heartbeat;
pub mod jwks;
pub mod registry;
pub mod sweeper;
pub mod watch;
