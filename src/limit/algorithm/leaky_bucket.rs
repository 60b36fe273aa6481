//! Leaky bucket that delays (nginx's `limit_req` with `burst` and `delay`): requests leave
//! at `limit` per `window`. The backlog ahead of a request — the bucket's `level`, one
//! request being `window` units, draining `limit` units per ms (scaled as the token bucket
//! is, so the drain is exact for any rate) — decides it:
//!
//! - at most `delay` requests ahead: it passes at once;
//! - at most `burst` ahead: it is admitted and held by the gateway until its turn,
//!   `(ahead − delay) × window / limit` ms (`retry_after_ms` of an admitted decision);
//! - more than `burst` ahead: refused, until the backlog has drained to `burst`.
//!
//! Mirrors `lua/leaky_bucket.lua`.

use crate::limit::{Decision, Policy};

/// Leaky bucket state: `level` in request·ms (`requests × window_ms`), as of `updated_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeakyBucket {
    pub level: u64,
    pub updated_ms: u64,
}

impl LeakyBucket {
    /// The backlog at `now`, drained since the last update.
    pub fn level_at(&self, policy: &Policy, now: u64) -> u64 {
        let elapsed = now.saturating_sub(self.updated_ms);
        self.level
            .saturating_sub(elapsed.saturating_mul(policy.limit))
    }

    pub fn decide(&self, policy: &Policy, now: u64, cost: u64) -> (Decision, LeakyBucket) {
        let w = policy.window_ms;
        let level = self.level_at(policy, now);
        let now = now.max(self.updated_ms);
        let burst = policy.burst * w;
        let capacity = policy.burst + 1;
        if level <= burst {
            let after = level + cost * w;
            // Held until the backlog ahead is down to `delay` requests.
            let wait = (level.saturating_sub(policy.delay * w)).div_ceil(policy.limit);
            let decision = Decision {
                allowed: true,
                limit: capacity,
                remaining: if after <= burst {
                    (burst - after) / w + 1
                } else {
                    0
                },
                reset_ms: after.div_ceil(policy.limit),
                retry_after_ms: wait,
            };
            (
                decision,
                LeakyBucket {
                    level: after,
                    updated_ms: now,
                },
            )
        } else {
            let decision = Decision {
                allowed: false,
                limit: capacity,
                remaining: 0,
                reset_ms: level.div_ceil(policy.limit),
                retry_after_ms: (level - burst).div_ceil(policy.limit),
            };
            (
                decision,
                LeakyBucket {
                    level,
                    updated_ms: now,
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_000_000_000;

    /// Runs requests of cost 1 at the given times: for each, admitted and the wait.
    fn run(p: &Policy, times: &[u64]) -> Vec<(bool, u64)> {
        let mut bucket = LeakyBucket::default();
        times
            .iter()
            .map(|&t| {
                let (d, next) = bucket.decide(p, t, 1);
                if d.allowed {
                    bucket = next;
                }
                (d.allowed, d.retry_after_ms)
            })
            .collect()
    }

    #[test]
    fn a_burst_is_queued_at_the_rate_and_the_rest_refused() {
        // 10/s, burst 5, no delay: the first passes, five wait 100 ms apart, the 7th is refused
        // until one has left (100 ms).
        let p = Policy::leaky_bucket("p", 10, 1000, 5, 0).unwrap();
        let out = run(&p, &[T0; 7]);
        assert_eq!(
            out,
            [
                (true, 0),
                (true, 100),
                (true, 200),
                (true, 300),
                (true, 400),
                (true, 500),
                (false, 100)
            ]
        );
    }

    #[test]
    fn the_first_delay_requests_pass_at_once() {
        let p = Policy::leaky_bucket("p", 10, 1000, 5, 2).unwrap();
        let waits: Vec<u64> = run(&p, &[T0; 6]).into_iter().map(|(_, w)| w).collect();
        assert_eq!(waits, [0, 0, 0, 100, 200, 300]);
    }

    #[test]
    fn requests_at_the_rate_never_wait() {
        let p = Policy::leaky_bucket("p", 3, 1000, 0, 0).unwrap();
        // One every 334 ms (just slower than 3/s): all pass at once; one every 300 ms does not.
        let slow: Vec<u64> = (0..10).map(|i| T0 + i * 334).collect();
        assert!(run(&p, &slow).iter().all(|&(ok, wait)| ok && wait == 0));
        let fast: Vec<u64> = (0..10).map(|i| T0 + i * 300).collect();
        assert!(run(&p, &fast).iter().any(|&(ok, _)| !ok));
    }

    #[test]
    fn burst_zero_is_a_plain_rate_limit_and_drains_exactly() {
        let p = Policy::leaky_bucket("p", 3, 1000, 0, 0).unwrap();
        let out = run(&p, &[T0, T0, T0 + 333, T0 + 334]);
        // 1000/3 ms per request: the next is free at 333.33 → 334 ms.
        assert_eq!(out, [(true, 0), (false, 334), (false, 1), (true, 0)]);
    }

    #[test]
    fn a_clock_going_back_drains_nothing() {
        let p = Policy::leaky_bucket("p", 10, 1000, 1, 0).unwrap();
        let (_, b) = LeakyBucket::default().decide(&p, T0, 1);
        let (_, b) = b.decide(&p, T0, 1);
        assert!(!b.decide(&p, T0 - 5_000, 1).0.allowed);
    }
}
