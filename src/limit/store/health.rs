//! How the store answered lately, for `/readyz`: from the latest call (decisions and the
//! heartbeat alike).

use crate::limit::store::error::StoreError;
use std::sync::atomic::{AtomicU8, Ordering};

/// How the latest call to the store went, for `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreHealth {
    /// No call yet.
    Unknown = 0,
    /// It answered.
    Ok = 1,
    /// It answered with an error: a wrong password, out of memory, a read-only replica...
    Refusing = 2,
    /// No answer: timed out, unreachable, or not called because the breaker is open.
    Unreachable = 3,
}

impl StoreHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreHealth::Unknown => "unknown",
            StoreHealth::Ok => "ok",
            StoreHealth::Refusing => "refusing",
            StoreHealth::Unreachable => "unreachable",
        }
    }

    fn of<T>(result: &Result<T, StoreError>) -> StoreHealth {
        match result {
            Ok(_) => StoreHealth::Ok,
            Err(StoreError::Refused(_) | StoreError::Protocol(_) | StoreError::Auth(_)) => {
                StoreHealth::Refusing
            }
            Err(_) => StoreHealth::Unreachable,
        }
    }
}

/// The latest [`StoreHealth`], shared by every call.
pub struct HealthCell(AtomicU8);

impl Default for HealthCell {
    fn default() -> HealthCell {
        HealthCell(AtomicU8::new(StoreHealth::Unknown as u8))
    }
}

impl HealthCell {
    pub fn get(&self) -> StoreHealth {
        match self.0.load(Ordering::Relaxed) {
            1 => StoreHealth::Ok,
            2 => StoreHealth::Refusing,
            3 => StoreHealth::Unreachable,
            _ => StoreHealth::Unknown,
        }
    }

    pub fn record<T>(&self, result: &Result<T, StoreError>) {
        self.set(StoreHealth::of(result));
    }

    pub fn set(&self, health: StoreHealth) {
        // Only a change writes: steady state leaves the cache line shared.
        if self.0.load(Ordering::Relaxed) != health as u8 {
            self.0.store(health as u8, Ordering::Relaxed);
        }
    }
}
