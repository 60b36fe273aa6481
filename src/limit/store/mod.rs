//! Where per-client limiter state lives, chosen by `[store] kind`, behind one contract: a
//! [`CheckRequest`] in, a [`Verdict`] or a [`StoreError`] out (ARCHITECTURE.md, "The store").
//!
//! - `memory` ([`memory`]): in this process; cannot fail (`together.rs`: its decision for
//!   one request, pure).
//! - `redis` / `redis_cluster` / `redis_sentinel` ([`redis`]): shared by every instance.
//!
//! This file is the contract and the dispatch to the backend; around it:
//!
//! - `guard.rs`: every Redis call through the circuit breaker ([`breaker`]: after
//!   consecutive outages it opens and calls fail at once with [`StoreError::CircuitOpen`]
//!   until the store answers again), timed, counted, its health recorded;
//! - `fallback.rs`: the **local fallback** ([`Store::check_fallback`]), which decides in
//!   process with each limit divided by the number of live gateway instances, learned from
//!   heartbeats in Redis ([`Store::heartbeat`]) while it was up, or `expected_instances`;
//! - [`lease`]: **quota leasing** — the local table, its renewals, and the leased decision.
//!
//! Time is the store's [`Clock`] (the process's monotonic clock in production; tests give
//! their own and drive it). Every call is bounded by `store.timeout`.
//!
//! The route's failure mode ([`failure`]) is applied by the request chain; the store only
//! reports the error, counts it and logs it (at most once per
//! [`failure::DEGRADED_LOG_EVERY`]).

pub mod breaker;
pub mod error;
pub mod failure;
mod fallback;
pub mod fleet;
mod guard;
pub mod health;
pub mod held;
mod holding;
pub mod lease;
pub mod memory;
pub mod metrics;
pub mod redis;
pub mod request;
mod together;

pub use error::StoreError;
pub use failure::{FailureMode, FailureSettings};
pub use health::StoreHealth;
pub use metrics::StoreMetrics;
pub use request::{CheckRequest, Counted};

use self::breaker::{BreakerState, CircuitBreaker};
use self::failure::{divide, DegradedLog};
use self::health::HealthCell;
use self::lease::{LeaseKey, LeaseTable, MAX_LEASES};
use self::memory::MemoryStore;
use self::redis::{RedisConfig, RedisStore, Topology, LATE_REPLY};
use self::request::DecideAt;
use crate::clock::{Clock, MonotonicClock};
use crate::limit::{Policy, Verdict};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// How long a release of concurrency slots may wait for Redis: as long as a late reply is
/// waited for (it runs as a task of its own, after its request ended).
const RELEASE_WAIT: Duration = LATE_REPLY;

// One per process (behind an Arc), never moved: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Backend<C: Clock> {
    Memory(MemoryStore<C>),
    Redis(Arc<RedisStore>),
}

pub struct Store<C: Clock + Clone = MonotonicClock> {
    clock: C,
    backend: Backend<C>,
    failure: FailureSettings,
    breaker: CircuitBreaker,
    fallback: MemoryStore<C>,
    /// Quota leases held by this instance (Redis stores, plans with `lease`).
    leases: Arc<LeaseTable>,
    /// Live instances from the last successful heartbeat; 0 = never known.
    live_instances: AtomicU64,
    instance_id: String,
    metrics: StoreMetrics,
    degraded: DegradedLog,
    /// How the latest store call (decision or heartbeat) went.
    health: HealthCell,
    /// Concurrency slots held in Redis by requests in flight, renewed while they last.
    held: held::HeldTable,
    /// Redis Cluster: each node has its own breaker, and `breaker` is not used.
    node_breakers: bool,
}

impl Store {
    pub fn memory(metrics: StoreMetrics) -> Store {
        Store::memory_with_clock(MonotonicClock, metrics)
    }

    pub fn redis(
        config: RedisConfig,
        failure: FailureSettings,
        metrics: StoreMetrics,
    ) -> Result<Store, StoreError> {
        Ok(Store::new(
            MonotonicClock,
            Backend::Redis(Arc::new(RedisStore::with_breakers(config, &failure)?)),
            failure,
            metrics,
        ))
    }
}

impl<C: Clock + Clone> Store<C> {
    /// A memory store on `clock` (tests drive a manual one).
    pub fn memory_with_clock(clock: C, metrics: StoreMetrics) -> Store<C> {
        Store::new(
            clock.clone(),
            Backend::Memory(MemoryStore::new(clock)),
            failure::default_settings(),
            metrics,
        )
    }

    fn new(
        clock: C,
        backend: Backend<C>,
        failure: FailureSettings,
        metrics: StoreMetrics,
    ) -> Store<C> {
        metrics.set_breaker_state(BreakerState::Closed);
        let node_breakers = matches!(&backend, Backend::Redis(r) if matches!(r.config().topology, Topology::Cluster(_)));
        Store {
            node_breakers,
            fallback: MemoryStore::new(clock.clone()),
            clock,
            backend,
            breaker: CircuitBreaker::new(
                failure.breaker_failures,
                failure.breaker_cooldown.as_millis() as u64,
            ),
            failure,
            leases: Arc::new(LeaseTable::new(MAX_LEASES)),
            live_instances: AtomicU64::new(0),
            instance_id: instance_id(),
            metrics,
            degraded: DegradedLog::default(),
            health: HealthCell::default(),
            held: held::HeldTable::default(),
        }
    }

    /// Decides one request against every policy, committing only if all admit it.
    pub async fn check(&self, req: CheckRequest<'_>) -> Result<Verdict, StoreError> {
        let redis = match &self.backend {
            Backend::Memory(m) => return Ok(m.check(&req)),
            Backend::Redis(r) => r,
        };
        if let Some(cap) = req.lease {
            // Boxed: its renewal machinery would otherwise widen every request's future.
            return Box::pin(self.check_leased(redis, &req, cap)).await;
        }
        self.check_per_request(redis, &req).await
    }

    async fn check_per_request(
        &self,
        redis: &Arc<RedisStore>,
        req: &CheckRequest<'_>,
    ) -> Result<Verdict, StoreError> {
        let result = self.guarded(redis.check(req)).await;
        if let Err(e) = &result {
            if !req.slot_id.is_empty() && !matches!(e, StoreError::CircuitOpen) {
                self.release_unanswered(redis, req);
            }
        }
        result
    }

    /// A check that took concurrency slots got no usable answer: it may still run (the call
    /// timed out while Redis stalled) or have run (its reply was lost), taking slots that
    /// nothing would release before their lease ends. Release them now: on the same
    /// connection, so Redis runs the release after the check (a release of slots never
    /// taken removes nothing).
    fn release_unanswered(&self, redis: &Arc<RedisStore>, req: &CheckRequest<'_>) {
        let redis = Arc::clone(redis);
        let (client, route) = (Arc::clone(req.client), Arc::clone(req.route));
        let policies: Vec<Policy> = req
            .policies
            .iter()
            .filter(|p| p.is_concurrency())
            .cloned()
            .collect();
        let slot_id = req.slot_id.to_owned();
        tokio::spawn(async move {
            let released = redis
                .release(&client, &route, &policies, &slot_id, RELEASE_WAIT)
                .await;
            if let Err(e) = released {
                log::debug!("releasing the slots of an unanswered check failed: {e}");
            }
        });
    }

    /// Gives back what an admitted request counted (it was shed before reaching its
    /// upstream): to the store that counted it — this process's tables, Redis (one
    /// `refund.lua` call per slot), this instance's lease, or the local fallback. Best effort
    /// and bounded by the store timeout: units that cannot be given back stay counted (the
    /// client is then held to slightly less than its limit, never more).
    pub async fn refund(&self, taken: &Counted) {
        let req = taken.request();
        if taken.fallback {
            self.fallback.refund(&req, taken.at_ms);
            return;
        }
        match &self.backend {
            Backend::Memory(m) => m.refund(&req, taken.at_ms),
            Backend::Redis(_) if taken.from_lease => {
                let key = LeaseKey {
                    client: Arc::clone(&taken.client),
                    route: Arc::clone(&taken.route),
                };
                let now = self.clock.now_ms();
                self.leases
                    .refund(&key, &taken.policies, taken.cost, taken.at_ms, now);
            }
            Backend::Redis(r) => {
                if let Err(e) = r.refund(&req, taken.at_ms).await {
                    log::debug!("giving back the units of a shed request failed: {e}");
                }
            }
        }
    }

    /// Charges what a request admitted earlier turned out to cost: `deltas` (index into
    /// `taken.policies`, units more or less than counted), now, on the store that counted
    /// it. A leased request is not charged (plans that lease cannot charge from responses).
    pub async fn charge(&self, taken: &Counted, deltas: &[(usize, i64)]) -> Result<(), StoreError> {
        let req = CheckRequest {
            at: DecideAt::StoreClock,
            ..taken.request()
        };
        if taken.fallback {
            self.fallback.charge(&req, taken.at_ms, deltas);
            return Ok(());
        }
        match &self.backend {
            Backend::Memory(m) => {
                m.charge(&req, taken.at_ms, deltas);
                Ok(())
            }
            Backend::Redis(_) if taken.from_lease => Ok(()),
            Backend::Redis(r) => r.charge(&req, taken.at_ms, deltas).await,
        }
    }

    /// A request admitted with concurrency policies ended: free its slots. `fallback`: it was
    /// admitted by the local fallback (whose slots are in this process).
    pub async fn release(
        &self,
        client: &Arc<str>,
        route: &Arc<str>,
        policies: &[Policy],
        slot_id: &str,
        fallback: bool,
    ) {
        if fallback {
            self.fallback
                .release(client, route, &divide(policies, self.divisor()));
            return;
        }
        match &self.backend {
            Backend::Memory(m) => m.release(client, route, policies),
            Backend::Redis(r) => {
                // Runs as a task of its own (the request is over): it may wait for Redis as
                // long as a late reply is waited for, rather than be dropped unsent behind a
                // busy connection. A slot that cannot be released expires with its lease.
                let released = r
                    .release(client, route, policies, slot_id, RELEASE_WAIT)
                    .await;
                if let Err(e) = released {
                    log::debug!(
                        "releasing concurrency slots failed (they expire with their lease): {e}"
                    );
                }
            }
        }
    }

    /// What `client` has left of each `(route, policy)`, counting nothing: one read-only call
    /// on Redis (a client-wide limit read once), the state itself in process.
    pub async fn usage(
        &self,
        client: &Arc<str>,
        asks: &[(Arc<str>, Policy)],
    ) -> Result<Vec<crate::limit::Decision>, StoreError> {
        match &self.backend {
            Backend::Redis(r) => self.guarded(r.usage(client, asks)).await,
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

/// `<host>-<pid>-<random>`: unique per process, readable in `ZRANGE <prefix>:instances`.
fn instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{host}-{}-{:08x}", std::process::id(), h.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::store::request::DecideAt;
    use crate::limit::Algorithm;

    #[tokio::test]
    async fn the_memory_store_never_fails_and_the_fallback_divides() {
        let store = Store::memory(StoreMetrics::unregistered());
        let (c, r) = (Arc::from("c"), Arc::from("r"));
        let p = [Policy::new("p", Algorithm::FixedWindow, 4, 60_000, 4)];
        let req = || CheckRequest {
            client: &c,
            route: &r,
            policies: &p,
            partitions: &[],
            shadow: &[],
            cost: 1,
            slot_id: "",
            at: DecideAt::Fixed(1 << 40),
            lease: None,
            waits: &[],
            costs: &[],
        };
        assert!(store.check(req()).await.unwrap().admitted);
        assert_eq!(store.divisor(), 1);
        let admitted = (0..10)
            .filter(|_| store.check_fallback(req()).1.admitted)
            .count();
        assert_eq!(admitted, 4);
    }
}
