//! What the store can tell without deciding anything: a client's usage (the quota it would
//! see, counting nothing), the connection's state, the backend's kind, this instance's id,
//! and the upkeep of the in-process state it keeps (swept periodically, bounded).

use super::redis::{RedisStore, Topology};
use super::{Backend, CheckRequest, Store, StoreError};
use crate::clock::Clock;
use crate::limit::Policy;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

impl<C: Clock + Clone> Store<C> {
    /// What `client` has left of each `(route, policy)`, counting nothing: one read-only call
    /// on Redis (a client-wide limit read once; batched with the decisions under load), the
    /// state itself in process.
    pub async fn usage(
        &self,
        client: &Arc<str>,
        asks: &[(Arc<str>, Policy)],
    ) -> Result<Vec<crate::limit::Decision>, StoreError> {
        match &self.backend {
            Backend::Redis(r) => {
                // A quota question may ride in a batch, which reports to the breaker itself.
                let queued = AtomicBool::new(false);
                self.guarded(r.usage(client, asks, &queued), Some(&queued))
                    .await
            }
            Backend::Memory(m) => Ok(asks
                .iter()
                .flat_map(|(route, policy)| {
                    let policies = std::slice::from_ref(policy);
                    m.check(&CheckRequest::new(client, route, policies, 0))
                        .decisions
                })
                .collect()),
        }
    }

    /// Redis: whether the request connection is up, and how many times it was repaired.
    pub fn connection(&self) -> Option<(bool, u64)> {
        match &self.backend {
            Backend::Redis(r) => Some((r.connection_up(), r.connection_repairs())),
            Backend::Memory(_) => None,
        }
    }

    /// Redis Sentinel: the questions asked after timeouts, and how many found the primary
    /// moved.
    pub fn sentinel_questions(&self) -> Option<(u64, u64)> {
        match &self.backend {
            Backend::Redis(r) => r.sentinel_questions(),
            Backend::Memory(_) => None,
        }
    }

    /// Warms the store in the runtime this runs in (the one serving requests): a Redis
    /// store's request connection made and its scripts loaded, within its startup grace
    /// (`redis/warmth.rs`). Nothing to do for the memory store.
    pub fn warm(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let redis = match &self.backend {
            Backend::Redis(r) => Some(r.warm()),
            Backend::Memory(_) => None,
        };
        async move {
            if let Some(warm) = redis {
                warm.await;
            }
        }
    }

    /// Whether the store is warming (`/readyz`: not ready, `store warming`).
    pub fn warming(&self) -> bool {
        match &self.backend {
            Backend::Redis(r) => r.warming(),
            Backend::Memory(_) => false,
        }
    }

    /// The Redis store behind this one, for what shares its connections (the client
    /// registry); `None` for the memory store.
    pub fn redis_backend(&self) -> Option<Arc<RedisStore>> {
        match &self.backend {
            Backend::Redis(r) => Some(Arc::clone(r)),
            Backend::Memory(_) => None,
        }
    }

    /// Periodic housekeeping: drops idle in-process state. Returns entries dropped.
    pub fn sweep(&self) -> usize {
        let local = match &self.backend {
            Backend::Memory(m) => m.sweep(),
            Backend::Redis(_) => 0,
        };
        local + self.fallback.sweep() + self.leases.sweep(self.clock.now_ms())
    }

    /// At most about `max` keyed-limit keys in each in-process store (the memory store, the
    /// local fallback); applies to the next new key.
    pub fn set_max_tracked_keys(&self, max: usize) {
        if let Backend::Memory(m) = &self.backend {
            m.set_max_keyed(max);
        }
        self.fallback.set_max_keyed(max);
    }

    /// Entries held in process: (primary memory store, fallback store, leases).
    pub fn local_entries(&self) -> (usize, usize, usize) {
        let primary = match &self.backend {
            Backend::Memory(m) => m.keys(),
            Backend::Redis(_) => 0,
        };
        (primary, self.fallback.keys(), self.leases.len())
    }

    /// `<host>-<pid>-<random>`: this process, as heartbeats name it.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    pub fn kind(&self) -> &'static str {
        match &self.backend {
            Backend::Memory(_) => "memory",
            Backend::Redis(r) => match r.config().topology {
                Topology::Single(_) => "redis",
                Topology::Cluster(_) => "redis_cluster",
                Topology::Sentinel { .. } => "redis_sentinel",
            },
        }
    }
}
