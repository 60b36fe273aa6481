//! Retries: what a route may retry (its [`RetryPolicy`]), how long to wait before each try
//! ([`backoff`], exponential with full jitter), and what the pool allows (its
//! [`RetryBudget`]: retries in flight at most a share of the requests in flight, plus a small
//! floor — Envoy's model — so that retries cannot multiply an outage).
//!
//! A retry is decided once the request has been sent: after a timeout, a reset or a status
//! the route names. A connect failure is not one of these: the request was not sent, and it
//! goes to the next server of the pool on every route (`proxy/upstream.rs`).

use http::Method;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a route retries, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries in all, the first included (at least 2).
    pub attempts: u32,
    pub on_timeout: bool,
    pub on_reset: bool,
    /// Statuses that are retried (sorted).
    pub statuses: Vec<u16>,
    /// Each try's read and write timeout (`None`: the route's).
    pub per_try_timeout: Option<Duration>,
    /// The whole request's budget, every try and wait included (`None`: no overall bound
    /// beyond the tries').
    pub timeout: Option<Duration>,
    /// The first wait's ceiling; each retry doubles it, up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Methods retried (`None`: the idempotent ones, RFC 9110 §9.2.2).
    pub methods: Option<Vec<Method>>,
}

/// Why an attempt is retried (the metric's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Timeout,
    Reset,
    Status(u16),
}

impl Reason {
    pub fn label(self) -> String {
        match self {
            Reason::Timeout => "timeout".to_owned(),
            Reason::Reset => "reset".to_owned(),
            Reason::Status(s) => s.to_string(),
        }
    }
}

impl RetryPolicy {
    /// Whether this policy retries after `reason`.
    pub fn retries(&self, reason: Reason) -> bool {
        match reason {
            Reason::Timeout => self.on_timeout,
            Reason::Reset => self.on_reset,
            Reason::Status(s) => self.statuses.binary_search(&s).is_ok(),
        }
    }

    /// Whether a request with `method` may be sent twice.
    pub fn repeats(&self, method: &Method) -> bool {
        match &self.methods {
            Some(methods) => methods.contains(method),
            None => method.is_idempotent(),
        }
    }
}

/// The wait before retry number `n` (1 for the first retry): uniformly random up to
/// `min(max, base × 2^(n-1))` ("full jitter"), from `random`.
pub fn backoff(base: Duration, max: Duration, n: u32, random: u64) -> Duration {
    let ceiling = base
        .checked_mul(1u32 << n.saturating_sub(1).min(20))
        .unwrap_or(max)
        .min(max);
    let ceiling_us = ceiling.as_micros() as u64;
    if ceiling_us == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(random % (ceiling_us + 1))
}

/// `[upstreams.NAME] retry_budget`: retries in flight to the pool at most `percent` % of its
/// requests in flight, or `min_retries`, whichever is more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetSettings {
    pub percent: u8,
    pub min_retries: u32,
}

impl Default for BudgetSettings {
    fn default() -> BudgetSettings {
        BudgetSettings {
            percent: 20,
            min_retries: 3,
        }
    }
}

/// A pool's retry budget: its requests and its retries in flight.
#[derive(Debug)]
pub struct RetryBudget {
    pub settings: BudgetSettings,
    active: AtomicUsize,
    retrying: AtomicUsize,
}

/// A request in flight to the pool (counted while it lives).
#[derive(Debug)]
pub struct Active(Arc<RetryBudget>);

/// A retry in flight (counted while it lives).
#[derive(Debug)]
pub struct Retrying(Arc<RetryBudget>);

impl RetryBudget {
    pub fn new(settings: BudgetSettings) -> RetryBudget {
        RetryBudget {
            settings,
            active: AtomicUsize::new(0),
            retrying: AtomicUsize::new(0),
        }
    }

    pub fn enter(self: &Arc<Self>) -> Active {
        self.active.fetch_add(1, Ordering::Relaxed);
        Active(Arc::clone(self))
    }

    /// A retry if the budget has room for one more (`None`: over budget).
    pub fn try_retry(self: &Arc<Self>) -> Option<Retrying> {
        let active = self.active.load(Ordering::Relaxed);
        let allowed = (active * usize::from(self.settings.percent) / 100)
            .max(self.settings.min_retries as usize);
        self.retrying
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                (r < allowed).then_some(r + 1)
            })
            .ok()
            .map(|_| Retrying(Arc::clone(self)))
    }

    /// Requests and retries in flight.
    pub fn in_flight(&self) -> (usize, usize) {
        (
            self.active.load(Ordering::Relaxed),
            self.retrying.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Retrying {
    fn drop(&mut self) {
        self.0.retrying.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 3,
            on_timeout: true,
            on_reset: false,
            statuses: vec![502, 503],
            per_try_timeout: None,
            timeout: None,
            backoff: Duration::from_millis(25),
            max_backoff: Duration::from_millis(250),
            methods: None,
        }
    }

    #[test]
    fn a_policy_retries_what_it_names_on_methods_safe_to_repeat() {
        let p = policy();
        assert!(p.retries(Reason::Timeout));
        assert!(!p.retries(Reason::Reset));
        assert!(p.retries(Reason::Status(503)));
        assert!(!p.retries(Reason::Status(500)));
        assert!(p.repeats(&Method::GET) && p.repeats(&Method::PUT));
        assert!(!p.repeats(&Method::POST) && !p.repeats(&Method::PATCH));
        let post = RetryPolicy {
            methods: Some(vec![Method::POST]),
            ..policy()
        };
        assert!(post.repeats(&Method::POST) && !post.repeats(&Method::GET));
    }

    #[test]
    fn backoff_is_full_jitter_under_a_doubling_ceiling() {
        let (base, max) = (Duration::from_millis(25), Duration::from_millis(250));
        for n in 1..=8u32 {
            let ceiling = Duration::from_millis((25u64 << (n - 1)).min(250));
            let mut seen_high = false;
            for r in 0..2_000u64 {
                let wait = backoff(base, max, n, r.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                assert!(wait <= ceiling, "retry {n}: {wait:?} > {ceiling:?}");
                seen_high |= wait > ceiling / 2;
            }
            assert!(seen_high, "retry {n} spreads over its whole range");
        }
        assert_eq!(backoff(base, max, 1, 0), Duration::ZERO);
        assert_eq!(
            backoff(Duration::ZERO, Duration::ZERO, 3, 99),
            Duration::ZERO
        );
        assert!(backoff(base, max, u32::MAX, u64::MAX) <= max);
    }

    #[test]
    fn the_budget_allows_a_share_of_the_requests_in_flight_or_the_floor() {
        let budget = Arc::new(RetryBudget::new(BudgetSettings {
            percent: 20,
            min_retries: 1,
        }));
        let active: Vec<Active> = (0..10).map(|_| budget.enter()).collect();
        // 20 % of 10: two retries at once, not three.
        let r1 = budget.try_retry().expect("first");
        let r2 = budget.try_retry().expect("second");
        assert!(budget.try_retry().is_none());
        drop(r1);
        let r3 = budget.try_retry().expect("room again");
        assert_eq!(budget.in_flight(), (10, 2));
        drop((r2, r3, active));
        // Nothing in flight: the floor.
        let floor = budget.try_retry().expect("the floor");
        assert!(budget.try_retry().is_none());
        drop(floor);
        assert_eq!(budget.in_flight(), (0, 0));
    }
}
