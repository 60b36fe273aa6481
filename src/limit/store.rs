//! Where per-client limiter state lives, chosen by `[store] kind`. An enum rather than a
//! trait object: the store is called on every authenticated request, and static dispatch
//! costs no allocation or indirect call.

use super::memory::MemoryStore;
use super::{Policy, Verdict};
use crate::clock::MonotonicClock;
use std::sync::Arc;

pub enum Store {
    Memory(MemoryStore<MonotonicClock>),
}

/// One request's question to the store.
pub struct CheckRequest<'a> {
    pub client: &'a Arc<str>,
    pub route: &'a Arc<str>,
    pub policies: &'a [Policy],
    pub cost: u64,
}

impl Store {
    pub fn memory() -> Store {
        Store::Memory(MemoryStore::new(MonotonicClock))
    }

    pub async fn check(&self, req: CheckRequest<'_>) -> Verdict {
        match self {
            Store::Memory(m) => m.check(req.client, req.route, req.policies, req.cost, None),
        }
    }

    /// Periodic housekeeping (dropping idle local state).
    pub fn sweep(&self) -> usize {
        match self {
            Store::Memory(m) => m.sweep(),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
        }
    }
}
