//! Where per-client limiter state lives, chosen by `[store] kind`. An enum rather than a
//! trait object: the store is called on every authenticated request, and static dispatch
//! costs no allocation or indirect call.

use super::memory::MemoryStore;
use super::redis::{RedisConfig, RedisStore, StoreError};
use super::{Policy, Verdict};
use crate::clock::MonotonicClock;
use std::sync::Arc;

// One per process (behind an Arc), never moved: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Store {
    /// In this process: exact for one instance.
    Memory(MemoryStore<MonotonicClock>),
    /// Redis or Redis Cluster: exact across every instance sharing it.
    Redis(RedisStore),
}

/// One request's question to the store.
pub struct CheckRequest<'a> {
    pub client: &'a Arc<str>,
    pub route: &'a Arc<str>,
    pub policies: &'a [Policy],
    pub cost: u64,
    /// Replaces the store's clock: for deterministic tests only.
    pub now_ms: Option<u64>,
}

impl Store {
    pub fn memory() -> Store {
        Store::Memory(MemoryStore::new(MonotonicClock))
    }

    pub fn redis(config: RedisConfig) -> Result<Store, StoreError> {
        RedisStore::new(config).map(Store::Redis)
    }

    /// Decides one request against every policy, committing only if all admit it.
    pub async fn check(&self, req: CheckRequest<'_>) -> Result<Verdict, StoreError> {
        match self {
            Store::Memory(m) => {
                Ok(m.check(req.client, req.route, req.policies, req.cost, req.now_ms))
            }
            Store::Redis(r) => {
                r.check(req.client, req.route, req.policies, req.cost, req.now_ms)
                    .await
            }
        }
    }

    /// Periodic housekeeping (dropping idle local state; Redis keys expire by TTL).
    pub fn sweep(&self) -> usize {
        match self {
            Store::Memory(m) => m.sweep(),
            Store::Redis(_) => 0,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(r) => match r.config().topology {
                super::redis::Topology::Single(_) => "redis",
                super::redis::Topology::Cluster(_) => "redis_cluster",
            },
        }
    }
}
