//! The store-wide circuit breaker of a single Redis or a Sentinel primary, shared by the
//! two places that report calls to it: the store (`guard.rs`), for each call a request makes
//! itself, and the Redis connection's batch sender (`redis/connection.rs`), for each call it
//! makes for decisions that queued. A batch is one call to Redis, so it is one call to the
//! breaker: a frozen Redis holding a batch of twenty decisions counts one timeout, not
//! twenty, and the decisions in it are not counted again when their own waits end.
//!
//! A state change is logged once and exported here; whoever reported it marks the request
//! connection lost when the breaker opens (it is repaired in the background, which closes the
//! breaker again).

use super::breaker::{Attempt, BreakerState, CircuitBreaker, Transition};
use super::error::StoreError;
use super::metrics::StoreMetrics;
use std::time::Duration;

pub struct StoreBreaker {
    breaker: CircuitBreaker,
    metrics: StoreMetrics,
    cooldown: Duration,
}

impl StoreBreaker {
    /// Opens after `failures` consecutive outages, for `cooldown`.
    pub fn new(failures: u32, cooldown: Duration, metrics: StoreMetrics) -> StoreBreaker {
        StoreBreaker {
            breaker: CircuitBreaker::new(failures, cooldown.as_millis() as u64),
            metrics,
            cooldown,
        }
    }

    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// One finished call, made with `attempt`'s leave at `now` (milliseconds): an outage
    /// counts toward opening, anything Redis answered resets the count. True when this call
    /// opened the breaker.
    pub fn ended(&self, attempt: Attempt, outcome: Result<(), &StoreError>, now: u64) -> bool {
        let transition = match outcome {
            Err(e) if e.is_outage() => self.breaker.on_failure(attempt, now),
            _ => self.breaker.on_success(attempt),
        };
        self.announce(transition)
    }

    /// Logs and exports a state change. True when the breaker opened.
    pub fn announce(&self, transition: Option<Transition>) -> bool {
        let Some(t) = transition else { return false };
        self.metrics.breaker_changed(t.to);
        match t.to {
            BreakerState::Open => log::warn!(
                "limiter store circuit breaker opened ({} -> open): routes use their failure mode for {:?}",
                t.from.as_str(),
                self.cooldown
            ),
            BreakerState::HalfOpen => log::info!("limiter store circuit breaker half-open: probing the store"),
            BreakerState::Closed => log::info!("limiter store circuit breaker closed: the store answers again"),
        }
        t.to == BreakerState::Open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_open_it_and_an_answer_of_any_kind_resets_the_count() {
        let b = StoreBreaker::new(2, Duration::from_secs(1), StoreMetrics::unregistered());
        let timeout = StoreError::Timeout(Duration::from_millis(20));
        let refused = StoreError::Refused("OOM".into());
        assert!(!b.ended(Attempt::Call, Err(&timeout), 0));
        assert!(!b.ended(Attempt::Call, Err(&refused), 0));
        assert!(!b.ended(Attempt::Call, Err(&timeout), 0));
        assert_eq!(b.breaker().state(), BreakerState::Closed);
        assert!(b.ended(Attempt::Call, Err(&timeout), 0));
        assert_eq!(b.breaker().state(), BreakerState::Open);
        assert!(!b.ended(Attempt::Call, Ok(()), 0));
        assert_eq!(b.breaker().state(), BreakerState::Open);
    }
}
