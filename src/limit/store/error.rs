//! Why a store call did not produce a decision: one error type for every store (the memory
//! store never fails; the Redis store's driver errors are mapped into it).

use std::time::Duration;

/// Why a store call did not produce a decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    #[error("store unreachable: {0}")]
    Unavailable(String),
    /// Redis answered with an error: out of memory under `noeviction`, a key of the wrong
    /// type, a script error, a read-only replica...
    #[error("store refused the call: {0}")]
    Refused(String),
    /// Redis did not accept the configured credentials (wrong password or ACL user). Counts
    /// as an outage: without the breaker every request would open a connection to be refused.
    #[error("store rejected the credentials: {0}")]
    Auth(String),
    #[error("unexpected reply from the store: {0}")]
    Protocol(String),
    /// Not called: the circuit breaker is open after consecutive outages.
    #[error("store not called: circuit breaker open")]
    CircuitOpen,
}

impl StoreError {
    /// A short, stable name for logs and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Refused(_) => "refused",
            StoreError::Auth(_) => "auth",
            StoreError::Protocol(_) => "protocol",
            StoreError::CircuitOpen => "circuit_open",
        }
    }

    /// An outage (counts toward opening the circuit breaker), as opposed to an error Redis
    /// answered with.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout(_) | StoreError::Unavailable(_) | StoreError::Auth(_)
        )
    }
}
