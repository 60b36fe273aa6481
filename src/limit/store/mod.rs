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
//!   until the store answers again), timed, counted, its health recorded; the breaker is
//!   shared with the connection's batch sender ([`shared_breaker`]), which reports a batch
//!   as one call;
//! - `fallback.rs`: the **local fallback** ([`Store::check_fallback`]), which decides in
//!   process with each limit divided by the number of live gateway instances, learned from
//!   heartbeats in Redis ([`Store::heartbeat`]) while it was up, or `expected_instances`;
//! - [`lease`]: **quota leasing** — the local table, its renewals, and the leased decision;
//! - `settle.rs`: after a decision — slots of an unanswered check released, a shed
//!   request's units given back, a response's cost charged, finished requests' slots freed;
//! - `inspect.rs`: what the store tells without deciding (usage, connection, kind, id) and
//!   its in-process state's upkeep.
//! - `instance.rs`: the id this process goes by in the fleet's heartbeats.
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
mod inspect;
mod instance;
pub mod lease;
pub mod memory;
pub mod metrics;
pub mod redis;
pub mod request;
mod settle;
pub mod shared_breaker;
mod together;

pub use error::StoreError;
pub use failure::{FailureMode, FailureSettings};
pub use health::StoreHealth;
pub use metrics::StoreMetrics;
pub use request::{CheckRequest, Counted};

use self::breaker::BreakerState;
use self::failure::DegradedLog;
use self::health::HealthCell;
use self::lease::{LeaseTable, MAX_LEASES};
use self::memory::MemoryStore;
use self::redis::{landing, RedisConfig, RedisStore, Topology};
use self::shared_breaker::StoreBreaker;
use crate::clock::{Clock, MonotonicClock};
use crate::limit::Verdict;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

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
    /// Single node, Sentinel: shared with the connection, whose batches report to it.
    breaker: Arc<StoreBreaker>,
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
        let breaker = Arc::new(StoreBreaker::new(
            failure.breaker_failures,
            failure.breaker_cooldown,
            metrics.clone(),
        ));
        let redis = RedisStore::with_breakers(config, &failure, Some(Arc::clone(&breaker)))?;
        Ok(Store::new(
            MonotonicClock,
            Backend::Redis(Arc::new(redis)),
            (failure, breaker),
            metrics,
        ))
    }
}

impl<C: Clock + Clone> Store<C> {
    /// A memory store on `clock` (tests drive a manual one).
    pub fn memory_with_clock(clock: C, metrics: StoreMetrics) -> Store<C> {
        let failure = failure::default_settings();
        let breaker = StoreBreaker::new(
            failure.breaker_failures,
            failure.breaker_cooldown,
            metrics.clone(),
        );
        Store::new(
            clock.clone(),
            Backend::Memory(MemoryStore::new(clock)),
            (failure, Arc::new(breaker)),
            metrics,
        )
    }

    fn new(
        clock: C,
        backend: Backend<C>,
        (failure, breaker): (FailureSettings, Arc<StoreBreaker>),
        metrics: StoreMetrics,
    ) -> Store<C> {
        metrics.set_breaker_state(BreakerState::Closed);
        let node_breakers = matches!(&backend, Backend::Redis(r) if matches!(r.config().topology, Topology::Cluster(_)));
        Store {
            node_breakers,
            fallback: MemoryStore::new(clock.clone()),
            clock,
            backend,
            breaker,
            failure,
            leases: Arc::new(LeaseTable::new(MAX_LEASES)),
            live_instances: AtomicU64::new(0),
            instance_id: instance::new_id(),
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
        let queued = AtomicBool::new(false);
        // A check taking concurrency slots may ride in a batch: its release, should no answer
        // come, waits for the call that carried it (`redis/batch.rs`).
        let (landing, landed) = match req.slot_id.is_empty() {
            true => (None, None),
            false => {
                let (landing, landed) = landing();
                (Some(landing), Some(landed))
            }
        };
        let result = self
            .guarded(redis.decide(req, &queued, landing), Some(&queued))
            .await;
        if let (Err(e), Some(landed)) = (&result, landed) {
            if !matches!(e, StoreError::CircuitOpen) {
                self.release_unanswered(redis, req, landed);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::store::request::DecideAt;
    use crate::limit::{Algorithm, Policy};

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
