//! What happens when the store cannot decide: the route's [`FailureMode`], the settings of the
//! circuit breaker and the local fallback ([`FailureSettings`]), and the rate-limited log of
//! degraded decisions.

use crate::limit::Policy;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a route does when the store cannot decide (down, slow, refusing, breaker open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Admit the request without a decision (counted and logged).
    FailOpen,
    /// Answer 503 limiter-unavailable (not 429: the client did nothing wrong).
    FailClosed,
    /// Decide in process with the limits divided by the number of live instances.
    Local,
}

impl FailureMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::FailOpen => "fail_open",
            FailureMode::FailClosed => "fail_closed",
            FailureMode::Local => "local",
        }
    }
}

/// What to do when the store cannot decide, once the failure is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureSettings {
    /// Consecutive outages that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long the breaker stays open before one probe call.
    pub breaker_cooldown: Duration,
    /// The instance count used by the local fallback before any heartbeat was seen.
    pub expected_instances: u64,
    /// How often instances announce themselves in Redis.
    pub heartbeat_interval: Duration,
}

/// Degraded decisions are logged at most this often (with how many happened meanwhile).
pub const DEGRADED_LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts degraded decisions and says when to log them: at most once per
/// [`DEGRADED_LOG_EVERY`], with how many happened since.
#[derive(Default)]
pub struct DegradedLog {
    last_ms: AtomicU64,
    since: AtomicU64,
}

impl DegradedLog {
    /// Counts one degraded decision at `now_ms`; `Some(count)` when it is time to log.
    pub fn note(&self, now_ms: u64) -> Option<u64> {
        self.note_every(now_ms, DEGRADED_LOG_EVERY)
    }

    /// Counts one event at `now_ms`; `Some(count since the last)` at most once per `every`.
    pub fn note_every(&self, now_ms: u64, every: Duration) -> Option<u64> {
        self.since.fetch_add(1, Ordering::Relaxed);
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = now_ms >= last + every.as_millis() as u64;
        (due && self
            .last_ms
            .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok())
        .then(|| self.since.swap(0, Ordering::Relaxed))
    }
}

pub fn default_settings() -> FailureSettings {
    FailureSettings {
        breaker_failures: 5,
        breaker_cooldown: Duration::from_secs(1),
        expected_instances: 1,
        heartbeat_interval: Duration::from_secs(1),
    }
}

/// Each limit (and burst) divided by `n` (the local fallback's share), never below 1.
pub fn divide(policies: &[Policy], n: u64) -> Vec<Policy> {
    policies.iter().map(|p| p.divided(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    #[test]
    fn limits_are_divided_but_never_to_zero() {
        let p = [
            Policy::new("a", Algorithm::TokenBucket, 10, 1000, 20),
            Policy::new("b", Algorithm::FixedWindow, 1, 1000, 1),
        ];
        let d = divide(&p, 3);
        assert_eq!((d[0].limit(), d[0].burst(), d[1].limit()), (3, 6, 1));
        assert_eq!(d[0].name, p[0].name);
    }

    #[test]
    fn degraded_decisions_are_logged_at_most_every_ten_seconds_with_a_count() {
        let log = DegradedLog::default();
        assert_eq!(log.note(10_000), Some(1));
        assert_eq!(log.note(10_001), None);
        assert_eq!(log.note(19_999), None);
        assert_eq!(log.note(20_000), Some(3));
    }
}
