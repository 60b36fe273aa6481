//! The local fallback (routes with `on_store_error = "local"`): the same limits divided by the
//! number of live gateway instances, decided in this process; and that number, learned from
//! heartbeats in Redis (or `expected_instances` before the first one).

use super::failure::divide;
use super::request::CheckRequest;
use super::{Backend, Store, StoreError};
use crate::clock::Clock;
use crate::limit::{Policy, Verdict};
use std::sync::atomic::Ordering;
use std::time::Duration;

impl<C: Clock + Clone> Store<C> {
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
    /// alive, publishing `limited` (who it refused most lately, `Refusals::published`). With
    /// `leave`, withdraws this instance (graceful shutdown).
    pub async fn heartbeat(&self, leave: bool, limited: &str) -> Result<u64, StoreError> {
        let Backend::Redis(redis) = &self.backend else {
            return Ok(1);
        };
        let liveness = self.failure.heartbeat_interval * 3;
        let info = super::fleet::this_instance();
        let result = redis
            .heartbeat(&self.instance_id, liveness, leave, (&info, limited))
            .await;
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
}
