//! Where per-client limiter state lives, chosen by `[store] kind`, behind one contract: a
//! [`CheckRequest`] in, a [`Verdict`] or a [`StoreError`] out (ARCHITECTURE.md, "The store").
//!
//! - `memory` ([`memory`]): in this process; cannot fail.
//! - `redis` / `redis_cluster` ([`redis`]): shared by every instance. Calls go through a
//!   circuit breaker ([`breaker`]): after consecutive outages it opens and calls fail at once
//!   with [`StoreError::CircuitOpen`] — no network, no waiting — until a single probe after
//!   the cool-down succeeds. Every call is bounded by `store.timeout`.
//! - **Quota leasing** ([`lease`]: the local table; [`leasing`]: its renewals) spends leased
//!   slices of a client's quota in process.
//! - The **local fallback** ([`Store::check_fallback`]) decides in process with each limit
//!   divided by the number of live gateway instances, learned from heartbeats in Redis
//!   ([`Store::heartbeat`]) while it was up, or `expected_instances` when never known.
//!
//! The route's failure mode ([`failure`]) is applied by the request chain; the store only
//! reports the error, counts it and logs it (at most once per
//! [`failure::DEGRADED_LOG_EVERY`]).

pub mod breaker;
pub mod error;
pub mod failure;
pub mod health;
pub mod lease;
pub mod leasing;
pub mod memory;
pub mod metrics;
pub mod redis;
pub mod request;

pub use error::StoreError;
pub use failure::{FailureMode, FailureSettings};
pub use health::StoreHealth;
pub use metrics::StoreMetrics;
pub use request::{CheckRequest, Taken};

use self::breaker::{BreakerState, CircuitBreaker, Permit, Transition};
use self::failure::{divide, DegradedLog};
use self::health::HealthCell;
use self::lease::{LeaseKey, LeaseTable, Take};
use self::leasing::{Renewal, LATE_RENEWAL, MAX_LEASES};
use self::memory::MemoryStore;
use self::redis::{RedisConfig, RedisStore, Topology};
use crate::clock::{Clock, MonotonicClock};
use crate::limit::{Policy, Verdict};
use futures::future::{self, Either, FutureExt};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// One per process (behind an Arc), never moved: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Memory(MemoryStore<MonotonicClock>),
    Redis(Arc<RedisStore>),
}

pub struct Store {
    backend: Backend,
    failure: FailureSettings,
    breaker: CircuitBreaker,
    fallback: MemoryStore<MonotonicClock>,
    /// Quota leases held by this instance (Redis stores, plans with `lease`).
    leases: Arc<LeaseTable>,
    /// Live instances from the last successful heartbeat; 0 = never known.
    live_instances: AtomicU64,
    instance_id: String,
    metrics: StoreMetrics,
    degraded: DegradedLog,
    /// How the latest store call (decision or heartbeat) went.
    health: HealthCell,
}

impl Store {
    pub fn memory(metrics: StoreMetrics) -> Store {
        Store::new(
            Backend::Memory(MemoryStore::new(MonotonicClock)),
            failure::default_settings(),
            metrics,
        )
    }

    pub fn redis(
        config: RedisConfig,
        failure: FailureSettings,
        metrics: StoreMetrics,
    ) -> Result<Store, StoreError> {
        Ok(Store::new(
            Backend::Redis(Arc::new(RedisStore::new(config)?)),
            failure,
            metrics,
        ))
    }

    fn new(backend: Backend, failure: FailureSettings, metrics: StoreMetrics) -> Store {
        metrics.set_breaker_state(BreakerState::Closed);
        Store {
            backend,
            breaker: CircuitBreaker::new(
                failure.breaker_failures,
                failure.breaker_cooldown.as_millis() as u64,
            ),
            failure,
            fallback: MemoryStore::new(MonotonicClock),
            leases: Arc::new(LeaseTable::new(MAX_LEASES)),
            live_instances: AtomicU64::new(0),
            instance_id: instance_id(),
            metrics,
            degraded: DegradedLog::default(),
            health: HealthCell::default(),
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
                .release(&client, &route, &policies, &slot_id, LATE_RENEWAL)
                .await;
            if let Err(e) = released {
                log::debug!("releasing the slots of an unanswered check failed: {e}");
            }
        });
    }

    /// Decides from this instance's lease of the client's quota, renewing it from Redis when
    /// it is spent or its window ended ([`lease`]).
    async fn check_leased(
        &self,
        redis: &Arc<RedisStore>,
        req: &CheckRequest<'_>,
        cap: u64,
    ) -> Result<Verdict, StoreError> {
        let key = LeaseKey {
            client: Arc::clone(req.client),
            route: Arc::clone(req.route),
        };
        let margin = redis.config().timeout.as_millis() as u64;
        // A request waits for at most two renewals of others before asking by itself.
        for _ in 0..3 {
            let now = MonotonicClock.now_ms();
            match self
                .leases
                .take(&key, req.policies, req.cost, cap, now, margin)
            {
                Take::Local(verdict) => {
                    self.metrics.lease_local.inc();
                    return Ok(verdict);
                }
                Take::Wait(renewal) => {
                    // Bounded: the renewal itself is bounded by the same timeout.
                    let _ = tokio::time::timeout(redis.config().timeout, renewal).await;
                }
                Take::Untracked => break,
                Take::Stalled => {
                    return Err(StoreError::Timeout(redis.config().timeout));
                }
                Take::Ask(ask) => {
                    let renewal = Renewal {
                        redis: Arc::clone(redis),
                        leases: Arc::clone(&self.leases),
                        key: key.clone(),
                        policies: req.policies.to_vec(),
                        ask,
                        at: req.at,
                    };
                    let timeout = redis.config().timeout;
                    return match self.guarded(renewal.send(timeout)).await {
                        Ok((ask, grant)) => Ok(self.leases.settle(
                            &key,
                            req.policies,
                            ask,
                            &grant,
                            MonotonicClock.now_ms(),
                        )),
                        Err(e) => Err(e),
                    };
                }
            }
        }
        self.check_per_request(redis, req).await
    }

    /// One store call through the circuit breaker, timed and counted by result.
    ///
    /// A plain function returning a combinator, not an `async fn`: an `async fn` keeps the
    /// future it is given twice in its own state (as the argument and as what it awaits), and
    /// every decision passes through here, nested in the request's future.
    fn guarded<'a, T: 'a>(
        &'a self,
        call: impl Future<Output = Result<T, StoreError>> + 'a,
    ) -> impl Future<Output = Result<T, StoreError>> + 'a {
        let now = MonotonicClock.now_ms();
        let (mut permit, transition) = self.breaker.permit(now);
        self.on_transition(transition);
        if permit == Permit::Reject && self.answers_again() {
            // The request connection was repaired since the breaker opened.
            self.on_transition(self.breaker.close());
            permit = Permit::Call;
        }
        if permit == Permit::Reject {
            self.metrics.short_circuits.inc();
            self.health.set(StoreHealth::Unreachable);
            return Either::Left(future::ready(Err(StoreError::CircuitOpen)));
        }
        let started = Instant::now();
        Either::Right(call.map(move |result| {
            self.record(permit, started, &result);
            result
        }))
    }

    /// Counts, times and reports one finished call to the breaker and the health cell.
    fn record<T>(&self, permit: Permit, started: Instant, result: &Result<T, StoreError>) {
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        let slot = match result {
            Ok(_) => 0,
            Err(StoreError::Timeout(_)) => 1,
            Err(StoreError::Unavailable(_) | StoreError::CircuitOpen) => 2,
            Err(StoreError::Refused(_) | StoreError::Auth(_)) => 3,
            Err(StoreError::Protocol(_)) => 4,
        };
        self.metrics.calls[slot].inc();
        self.health.record(result);
        let transition = match result {
            Err(e) if e.is_outage() => self.breaker.on_failure(permit, MonotonicClock.now_ms()),
            _ => self.breaker.on_success(permit),
        };
        self.on_transition(transition);
    }

    /// Graceful shutdown: stops spending this instance's leases and gives their unspent
    /// units back to Redis, so other instances can use them in the same window. Best
    /// effort: what cannot be given back lapses with its window. Returns units given back.
    pub async fn give_back_leases(&self) -> u64 {
        let Backend::Redis(redis) = &self.backend else {
            return 0;
        };
        let mut back = 0;
        for unspent in self.leases.drain(MonotonicClock.now_ms()) {
            match redis
                .give_back(
                    &unspent.key.client,
                    &unspent.key.route,
                    &unspent.policies,
                    &unspent.starts,
                    unspent.units,
                )
                .await
            {
                Ok(units) => back += units,
                Err(e) => {
                    log::info!("giving back unspent leases stopped: {e}");
                    break;
                }
            }
        }
        back
    }

    /// The local fallback: the same limits divided by the number of live instances, decided
    /// in this process. Used by routes with `on_store_error = "local"` while the store fails.
    /// Returns the divided policies (what the client is told) with the verdict.
    pub fn check_fallback(&self, req: CheckRequest<'_>) -> (Vec<Policy>, Verdict) {
        let divided = divide(req.policies, self.divisor());
        let verdict = self.fallback.check(&CheckRequest {
            policies: &divided,
            ..req
        });
        (divided, verdict)
    }

    /// Gives back what an admitted request counted (it was shed before reaching its
    /// upstream): to the store that counted it — this process's tables, Redis (one
    /// `refund.lua` call per slot), this instance's lease, or the local fallback. Best effort
    /// and bounded by the store timeout: units that cannot be given back stay counted (the
    /// client is then held to slightly less than its limit, never more).
    pub async fn refund(&self, taken: &Taken) {
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
                let now = MonotonicClock.now_ms();
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
                    .release(client, route, policies, slot_id, LATE_RENEWAL)
                    .await;
                if let Err(e) = released {
                    log::debug!(
                        "releasing concurrency slots failed (they expire with their lease): {e}"
                    );
                }
            }
        }
    }

    /// The instance count the fallback divides by.
    pub fn divisor(&self) -> u64 {
        match self.live_instances.load(Ordering::Relaxed) {
            0 => self.failure.expected_instances.max(1),
            n => n,
        }
    }

    /// Live instances from the last heartbeat (0 when never known).
    pub fn live_instances(&self) -> u64 {
        self.live_instances.load(Ordering::Relaxed)
    }

    /// One heartbeat (Redis stores only): announces this instance and learns how many are
    /// alive. With `leave`, withdraws this instance (graceful shutdown).
    pub async fn heartbeat(&self, leave: bool) -> Result<u64, StoreError> {
        let Backend::Redis(redis) = &self.backend else {
            return Ok(1);
        };
        let liveness = self.failure.heartbeat_interval * 3;
        let result = redis.heartbeat(&self.instance_id, liveness, leave).await;
        self.health.record(&result);
        let live = result?;
        if !leave {
            self.live_instances.store(live.max(1), Ordering::Relaxed);
            self.metrics.live_instances.set(live.max(1) as i64);
        }
        Ok(live)
    }

    pub fn heartbeat_interval(&self) -> Option<Duration> {
        match self.backend {
            Backend::Redis(_) => Some(self.failure.heartbeat_interval),
            Backend::Memory(_) => None,
        }
    }

    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// How the latest call went (the memory store always answers).
    pub fn health(&self) -> StoreHealth {
        match self.backend {
            Backend::Memory(_) => StoreHealth::Ok,
            Backend::Redis(_) => self.health.get(),
        }
    }

    /// Counts a degraded decision and logs, at most once per
    /// [`failure::DEGRADED_LOG_EVERY`], how many there were and why.
    pub fn note_degraded(&self, error: &StoreError, mode: &str) {
        if let Some(count) = self.degraded.note(MonotonicClock.now_ms()) {
            log::warn!(
                "limiter store failing ({error}); {count} degraded decision(s) since the last report, latest handled as {mode}"
            );
        }
    }

    /// Redis: whether the request connection is up, and how many times it was repaired.
    pub fn connection(&self) -> Option<(bool, u64)> {
        match &self.backend {
            Backend::Redis(r) => Some((r.connection_up(), r.connection_repairs())),
            Backend::Memory(_) => None,
        }
    }

    /// Whether the store's request connection has been repaired (Redis answered a ping)
    /// since it was last marked lost — as it is whenever the breaker opens.
    fn answers_again(&self) -> bool {
        match &self.backend {
            Backend::Redis(r) => r.connection_up(),
            Backend::Memory(_) => false,
        }
    }

    fn on_transition(&self, transition: Option<Transition>) {
        let Some(t) = transition else { return };
        if let (BreakerState::Open, Backend::Redis(r)) = (t.to, &self.backend) {
            // Repaired in the background: once Redis answers, the breaker closes.
            r.connection_lost();
        }
        self.metrics.breaker_changed(t.to);
        match t.to {
            BreakerState::Open => log::warn!(
                "limiter store circuit breaker opened ({} -> open): routes use their failure mode for {:?}",
                t.from.as_str(),
                self.failure.breaker_cooldown
            ),
            BreakerState::HalfOpen => log::info!("limiter store circuit breaker half-open: probing the store"),
            BreakerState::Closed => log::info!("limiter store circuit breaker closed: the store answers again"),
        }
    }

    /// Periodic housekeeping: drops idle in-process state. Returns entries dropped.
    pub fn sweep(&self) -> usize {
        let local = match &self.backend {
            Backend::Memory(m) => m.sweep(),
            Backend::Redis(_) => 0,
        };
        local + self.fallback.sweep() + self.leases.sweep(MonotonicClock.now_ms())
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
        };
        assert!(store.check(req()).await.unwrap().admitted);
        assert_eq!(store.divisor(), 1);
        let admitted = (0..10)
            .filter(|_| store.check_fallback(req()).1.admitted)
            .count();
        assert_eq!(admitted, 4);
    }
}
