//! Rate limiting: the data every limiter speaks ([`Policy`] in, [`Decision`] out), the pure
//! algorithms ([`algorithm`]), and where state lives: the bounded per-IP table ([`ip`]), and
//! the per-client stores behind [`store::Store`] (the embedded [`memory`] store, and
//! [`redis`] for one limit shared by every gateway instance).

pub mod algorithm;
pub mod calendar;
pub mod ip;
pub mod sharded;
pub mod store;

use std::fmt;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    TokenBucket,
    /// Requests leave at the rate; excess waits (up to `burst`) instead of being refused.
    LeakyBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    /// At most `limit` requests in flight; `window_ms` is how long a slot lease lives.
    Concurrency,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a limit is counted over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Per client and route (every rate limit; a route's concurrency limit).
    Route,
    /// Per client, all routes together (a plan's concurrency limit).
    Client,
}

/// One named limit: `limit` units per `window_ms`. For the token bucket, `burst` is the
/// capacity (the other algorithms ignore it; it equals `limit` for them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    pub name: Arc<str>,
    pub algorithm: Algorithm,
    /// At least 1 (checked at construction, like `window_ms` and `burst`).
    limit: u64,
    window_ms: u64,
    burst: u64,
    /// Leaky bucket: how many requests ahead still pass at once (the others up to `burst`
    /// wait their turn).
    delay: u64,
    pub scope: Scope,
    /// A fixed window aligned to the calendar (day, week, month in a time zone) instead of
    /// to multiples of `window_ms` (then a typical length).
    calendar: Option<Arc<calendar::Calendar>>,
}

/// A policy with a zero limit, window or burst: it could admit nothing, or divide by zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a limit's {0} must be at least 1")]
pub struct InvalidPolicy(pub &'static str);

/// Name of the per-IP policy in `RateLimit` headers and 429 bodies (reserved: plans cannot
/// name a limit so).
pub const IP_POLICY_NAME: &str = "ip";
/// Name of a plan's concurrency limit (`max_concurrent`), reserved likewise.
pub const CONCURRENCY_POLICY_NAME: &str = "concurrency";
/// Name of a route's concurrency limit, reserved likewise.
pub const ROUTE_CONCURRENCY_POLICY_NAME: &str = "route-concurrency";
/// Name of the quota endpoint's own per-client bucket (only on that endpoint's answers, where
/// no plan limit is decided: not reserved).
pub const QUOTA_POLICY_NAME: &str = "quota";
/// Every reserved policy name.
pub const RESERVED_POLICY_NAMES: [&str; 3] = [
    IP_POLICY_NAME,
    CONCURRENCY_POLICY_NAME,
    ROUTE_CONCURRENCY_POLICY_NAME,
];

impl Policy {
    /// A policy from checked values (the config loader's, or constants); zero values are
    /// refused, so every policy can admit something and no computation divides by zero.
    pub fn try_new(
        name: &str,
        algorithm: Algorithm,
        limit: u64,
        window_ms: u64,
        burst: u64,
    ) -> Result<Policy, InvalidPolicy> {
        for (value, what) in [(limit, "limit"), (window_ms, "window"), (burst, "burst")] {
            if value == 0 {
                return Err(InvalidPolicy(what));
            }
        }
        Ok(Policy {
            name: name.into(),
            algorithm,
            limit,
            window_ms,
            burst,
            delay: 0,
            scope: Scope::Route,
            calendar: None,
        })
    }

    /// A leaky bucket: `limit` per `window` ms leave; `burst` may wait; the first `delay` of
    /// those pass at once (nginx's `limit_req rate= burst= delay=`).
    pub fn leaky_bucket(
        name: &str,
        limit: u64,
        window_ms: u64,
        burst: u64,
        delay: u64,
    ) -> Result<Policy, InvalidPolicy> {
        for (value, what) in [(limit, "limit"), (window_ms, "window")] {
            if value == 0 {
                return Err(InvalidPolicy(what));
            }
        }
        Ok(Policy {
            name: name.into(),
            algorithm: Algorithm::LeakyBucket,
            limit,
            window_ms,
            burst,
            delay: delay.min(burst),
            scope: Scope::Route,
            calendar: None,
        })
    }

    /// Leaky bucket: requests ahead that still pass at once.
    pub fn delay(&self) -> u64 {
        self.delay
    }

    /// A fixed window of `limit` per calendar unit (`calendar`).
    pub fn calendar_window(
        name: &str,
        limit: u64,
        calendar: calendar::Calendar,
    ) -> Result<Policy, InvalidPolicy> {
        let window = calendar.unit.nominal_ms();
        Ok(Policy {
            calendar: Some(Arc::new(calendar)),
            ..Policy::try_new(name, Algorithm::FixedWindow, limit, window, limit)?
        })
    }

    /// The calendar a fixed window is aligned to, if any.
    pub fn calendar(&self) -> Option<&calendar::Calendar> {
        self.calendar.as_deref()
    }

    /// The fixed window containing `now`: `[start, end)` (on the calendar when the policy
    /// has one, `now` then in Unix milliseconds).
    pub fn fixed_window_at(&self, now: u64) -> (u64, u64) {
        match &self.calendar {
            Some(c) => c.window(now),
            None => {
                let start = now - now % self.window_ms;
                (start, start + self.window_ms)
            }
        }
    }

    /// [`try_new`](Self::try_new) for values known to be valid (literals, or values checked
    /// already). Panics on a zero limit, window or burst.
    pub fn new(name: &str, algorithm: Algorithm, limit: u64, window_ms: u64, burst: u64) -> Policy {
        Policy::try_new(name, algorithm, limit, window_ms, burst)
            .unwrap_or_else(|e| panic!("policy {name:?}: {e}"))
    }

    /// A concurrency limit: `limit` (at least 1) in flight, a slot living `slot_ttl_ms`
    /// (at least 1) unless released.
    pub fn concurrency(
        name: &str,
        limit: u64,
        slot_ttl_ms: u64,
        scope: Scope,
    ) -> Result<Policy, InvalidPolicy> {
        Ok(Policy {
            scope,
            ..Policy::try_new(name, Algorithm::Concurrency, limit, slot_ttl_ms, limit)?
        })
    }

    /// The same policy under another name.
    pub fn renamed(&self, name: &str) -> Policy {
        Policy {
            name: name.into(),
            ..self.clone()
        }
    }

    /// Units per window (for a token bucket: the refill per window); at least 1.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window in milliseconds (for a concurrency limit: how long a slot lives); at
    /// least 1.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// A token bucket's capacity (the other algorithms: the limit); at least 1.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The same policy with its limit and burst divided by `n` (the local fallback's share
    /// of `n` instances), never below 1.
    pub fn divided(&self, n: u64) -> Policy {
        let n = n.max(1);
        if self.algorithm == Algorithm::LeakyBucket {
            let burst = self.burst / n;
            return Policy {
                limit: (self.limit / n).max(1),
                burst,
                delay: self.delay.min(burst),
                ..self.clone()
            };
        }
        Policy {
            limit: (self.limit / n).max(1),
            burst: (self.burst / n).max(1),
            ..self.clone()
        }
    }

    /// `(q, w)` of `RateLimit-Policy`: the quota and its window in whole seconds. A token
    /// bucket advertises its capacity over the time a refill of the whole capacity takes
    /// (its sustained rate is exactly `q` per `w`, and `q` is also the largest burst); a
    /// leaky bucket likewise the one passing plus its `burst`, over the time they take to
    /// drain. A concurrency limit has no window (`w` is not sent for it).
    pub fn quota(&self) -> (u64, u64) {
        match self.algorithm {
            // A bucket: its capacity, and the time it takes to refill (drain) all of it.
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let capacity = self.capacity();
                // Wide arithmetic: never overflows, whatever the numbers.
                let refill = (u128::from(capacity) * u128::from(self.window_ms))
                    .div_ceil(u128::from(self.limit) * 1000);
                (capacity, u64::try_from(refill).unwrap_or(u64::MAX))
            }
            _ => (self.limit, self.window_ms.div_ceil(1000)),
        }
    }

    pub fn is_concurrency(&self) -> bool {
        self.algorithm == Algorithm::Concurrency
    }

    /// The most units one request may cost and still be admissible at all.
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket => self.burst,
            // One passing now, `burst` waiting.
            Algorithm::LeakyBucket => self.burst.saturating_add(1),
            _ => self.limit,
        }
    }
}

/// The outcome of one policy for one request: everything the headers, the 429 body, logs and
/// metrics need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The quota (`q` in `RateLimit-Policy`; a token bucket's capacity).
    pub limit: u64,
    /// Units left after this request (`r`).
    pub remaining: u64,
    /// Milliseconds until the quota resets (`t`): for the token bucket, until it is full again;
    /// for the window algorithms, until the current window ends (fixed, sliding counter) or
    /// its oldest entry expires (sliding log); a rejecting sliding window counter reports when
    /// the request would fit.
    pub reset_ms: u64,
    /// Milliseconds until a request of the same cost would be admitted; 0 when admitted.
    pub retry_after_ms: u64,
}

/// Decisions of several policies evaluated together: the request is admitted when every
/// enforced (non-shadow) policy allows it, and only then is anything committed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict {
    /// Whether the request is admitted (shadow policies never block it).
    pub admitted: bool,
    /// Same order as the policies asked about.
    pub decisions: Vec<Decision>,
    /// The store's time the request was decided at (what a refund undoes).
    pub at_ms: u64,
    /// Decided from this instance's quota lease (a refund goes back to the lease).
    pub from_lease: bool,
}

impl Verdict {
    /// The longest wait among the rejecting policies.
    pub fn retry_after_ms(&self) -> u64 {
        self.decisions
            .iter()
            .map(|d| d.retry_after_ms)
            .max()
            .unwrap_or(0)
    }

    /// How long `policies[i]` holds an admitted request: a leaky bucket's wait for its turn
    /// (its `retry_after_ms`), 0 for every other algorithm.
    pub fn wait_of(&self, policies: &[Policy], i: usize) -> u64 {
        match (policies.get(i), self.decisions.get(i)) {
            (Some(p), Some(d)) if p.algorithm == Algorithm::LeakyBucket && d.allowed => {
                d.retry_after_ms
            }
            _ => 0,
        }
    }
}
