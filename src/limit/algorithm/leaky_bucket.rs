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
//! A held request that is not forwarded after all (its client left) gives its turn back as a
//! **hole**: the next request that would be held (or refused) takes the earliest hole still
//! ahead instead of a turn at the end of the backlog. So the turns given out stay one
//! interval apart — a given-back turn is reused, never doubled up — and at most [`HOLES`] are
//! remembered (beyond that the soonest is forgotten: the bucket then admits less, never
//! more). A hole whose time has passed is dropped.
//!
//! Mirrors `lua/leaky_bucket.lua`.

use crate::limit::{Decision, Policy};

/// Turns given back that a bucket remembers.
pub const HOLES: usize = 4;

/// Leaky bucket state: `level` in request·ms (`requests × window_ms`), as of `updated_ms`;
/// `holes`: the times of turns given back (0: none), in no order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeakyBucket {
    pub level: u64,
    pub updated_ms: u64,
    pub holes: [u64; HOLES],
}

impl LeakyBucket {
    /// The backlog at `now`, drained since the last update.
    pub fn level_at(&self, policy: &Policy, now: u64) -> u64 {
        let elapsed = now.saturating_sub(self.updated_ms);
        self.level
            .saturating_sub(elapsed.saturating_mul(policy.limit))
    }

    /// The earliest hole after `now`: its index.
    fn next_hole(&self, now: u64) -> Option<usize> {
        (0..HOLES)
            .filter(|&i| self.holes[i] > now)
            .min_by_key(|&i| self.holes[i])
    }

    /// Gives back the turn of a request of `cost` admitted at `at` and held `wait` ms. A
    /// request that passed at once (`wait` 0) leaves the backlog; a held request of cost 1
    /// leaves a hole at its turn; a held request of a higher cost keeps its turns.
    pub fn give_back(&mut self, policy: &Policy, at: u64, cost: u64, wait: u64) {
        if wait == 0 {
            self.level = self.level.saturating_sub(cost * policy.window_ms);
            return;
        }
        if cost != 1 {
            return;
        }
        let turn = at + wait;
        // An empty place, or the soonest hole (the least useful).
        let i = (0..HOLES)
            .min_by_key(|&i| self.holes[i])
            .unwrap_or_default();
        self.holes[i] = turn;
    }

    pub fn decide(&self, policy: &Policy, now: u64, cost: u64) -> (Decision, LeakyBucket) {
        let w = policy.window_ms;
        let level = self.level_at(policy, now);
        let now = now.max(self.updated_ms);
        let burst = policy.burst * w;
        let capacity = policy.burst + 1;
        let mut holes = self.holes;
        for h in &mut holes {
            if *h <= now {
                *h = 0;
            }
        }
        // A request that would wait (or be refused) takes a turn given back, if one is ahead.
        if cost == 1 && level > policy.delay * w {
            if let Some(i) = self.next_hole(now) {
                let wait = holes[i] - now;
                holes[i] = 0;
                let decision = Decision {
                    allowed: true,
                    limit: capacity,
                    remaining: if level < burst {
                        (burst - level) / w
                    } else {
                        0
                    },
                    reset_ms: level.div_ceil(policy.limit),
                    retry_after_ms: wait,
                };
                return (
                    decision,
                    LeakyBucket {
                        level,
                        updated_ms: now,
                        holes,
                    },
                );
            }
        }
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
                    holes,
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
                    holes,
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
    fn a_turn_given_back_is_the_next_held_requests_turn() {
        // 10/s, burst 5: turns at +0, +100, +200, +300. The one at +100 is given back.
        let p = Policy::leaky_bucket("p", 10, 1000, 5, 0).unwrap();
        let mut b = LeakyBucket::default();
        for _ in 0..4 {
            b = b.decide(&p, T0, 1).1;
        }
        b.give_back(&p, T0, 1, 100);
        // 50 ms later the next request takes that turn (50 ms from now), not one at +400.
        let (d, next) = b.decide(&p, T0 + 50, 1);
        assert!(d.allowed);
        assert_eq!(d.retry_after_ms, 50);
        // The one after it goes to the end of the backlog as usual: +400.
        let (d, _) = next.decide(&p, T0 + 50, 1);
        assert_eq!(d.retry_after_ms, 350);
        // A hole whose time has passed is not handed out.
        let (d, _) = b.decide(&p, T0 + 150, 1);
        assert_eq!(d.retry_after_ms, 250);
    }

    #[test]
    fn a_request_that_passed_at_once_leaves_the_backlog_and_costlier_turns_are_kept() {
        let p = Policy::leaky_bucket("p", 10, 1000, 5, 0).unwrap();
        let (_, mut b) = LeakyBucket::default().decide(&p, T0, 1);
        b.give_back(&p, T0, 1, 0);
        assert_eq!(b.level, 0);
        let (_, mut b) = LeakyBucket::default().decide(&p, T0, 1);
        let before = b;
        b.give_back(&p, T0, 2, 100);
        assert_eq!(b, before);
    }

    #[test]
    fn at_most_holes_turns_are_remembered() {
        let p = Policy::leaky_bucket("p", 10, 1000, 9, 0).unwrap();
        let mut b = LeakyBucket::default();
        for _ in 0..10 {
            b = b.decide(&p, T0, 1).1;
        }
        for k in 1..=9 {
            b.give_back(&p, T0, 1, k * 100);
        }
        // The latest HOLES turns are kept: +600 … +900.
        let mut kept: Vec<u64> = b.holes.iter().map(|h| h - T0).collect();
        kept.sort_unstable();
        assert_eq!(kept, [600, 700, 800, 900]);
    }

    #[test]
    fn refund_lua_remembers_as_many_holes() {
        let lua = include_str!("../../../lua/refunding.lua");
        assert!(lua.contains(&format!("local HOLES = {HOLES}\n")));
    }

    #[test]
    fn a_clock_going_back_drains_nothing() {
        let p = Policy::leaky_bucket("p", 10, 1000, 1, 0).unwrap();
        let (_, b) = LeakyBucket::default().decide(&p, T0, 1);
        let (_, b) = b.decide(&p, T0, 1);
        assert!(!b.decide(&p, T0 - 5_000, 1).0.allowed);
    }
}
