//! A circuit breaker around the shared store, so that a dead or hanging Redis costs
//! microseconds per request instead of a timeout each.
//!
//! ```text
//!            `failures` consecutive outage errors
//!   Closed ─────────────────────────────────────────► Open (no calls until `cooldown` passes)
//!     ▲                                                 │ cooldown over: the next caller is
//!     │ probe succeeds                                  ▼ the one probe
//!     └──────────────────────────────────────────── HalfOpen ── probe fails ──► Open
//! ```
//!
//! A connection repaired in the background (see `redis/repair.rs`) closes an open breaker at
//! once ([`CircuitBreaker::close`]): the store answered, so no request has to probe it.
//! Only outages (timeouts, unreachable) count; an error Redis answered with (out of memory,
//! wrong type) is not an outage and is handled per request by the route's failure mode.
//! Lock-free: the closed path is one atomic load before the call and at most one atomic
//! store after it. Time is an argument (milliseconds).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// What the breaker says about one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Call the store.
    Call,
    /// Call the store: this is the single probe after a cool-down.
    Probe,
    /// Do not call: go straight to the failure mode.
    Reject,
}

/// A state change, for the caller to log once and export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: BreakerState,
    pub to: BreakerState,
}

#[derive(Debug)]
pub struct CircuitBreaker {
    failures_to_open: u32,
    cooldown_ms: u64,
    state: AtomicU8,
    consecutive_failures: AtomicU32,
    open_until_ms: AtomicU64,
    probe_in_flight: AtomicBool,
}

impl CircuitBreaker {
    pub fn new(failures_to_open: u32, cooldown_ms: u64) -> CircuitBreaker {
        CircuitBreaker {
            failures_to_open: failures_to_open.max(1),
            cooldown_ms,
            state: AtomicU8::new(BreakerState::Closed as u8),
            consecutive_failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
            probe_in_flight: AtomicBool::new(false),
        }
    }

    pub fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            0 => BreakerState::Closed,
            1 => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// May a call go to the store at `now`?
    pub fn attempt(&self, now: u64) -> (Attempt, Option<Transition>) {
        match self.state() {
            BreakerState::Closed => (Attempt::Call, None),
            BreakerState::Open => {
                if now < self.open_until_ms.load(Ordering::Acquire) {
                    return (Attempt::Reject, None);
                }
                // Cool-down over: exactly one caller becomes the probe.
                if self
                    .probe_in_flight
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    self.state
                        .store(BreakerState::HalfOpen as u8, Ordering::Release);
                    let t = Transition {
                        from: BreakerState::Open,
                        to: BreakerState::HalfOpen,
                    };
                    (Attempt::Probe, Some(t))
                } else {
                    (Attempt::Reject, None)
                }
            }
            BreakerState::HalfOpen => (Attempt::Reject, None),
        }
    }

    /// The call answered (even with an error that is not an outage).
    pub fn on_success(&self, attempt: Attempt) -> Option<Transition> {
        match attempt {
            Attempt::Probe => {
                self.consecutive_failures.store(0, Ordering::Release);
                self.state
                    .store(BreakerState::Closed as u8, Ordering::Release);
                self.probe_in_flight.store(false, Ordering::Release);
                Some(Transition {
                    from: BreakerState::HalfOpen,
                    to: BreakerState::Closed,
                })
            }
            _ => {
                if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
                    self.consecutive_failures.store(0, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// The store was seen answering again outside of a call (a repaired connection): closed
    /// at once, whatever the cool-down says.
    pub fn close(&self) -> Option<Transition> {
        let from = self.state();
        if from == BreakerState::Closed {
            return None;
        }
        self.consecutive_failures.store(0, Ordering::Release);
        self.state
            .store(BreakerState::Closed as u8, Ordering::Release);
        self.probe_in_flight.store(false, Ordering::Release);
        Some(Transition {
            from,
            to: BreakerState::Closed,
        })
    }

    /// The call failed with an outage (timeout, unreachable) at `now`.
    pub fn on_failure(&self, attempt: Attempt, now: u64) -> Option<Transition> {
        match attempt {
            Attempt::Probe => {
                self.open_until_ms
                    .store(now + self.cooldown_ms, Ordering::Release);
                self.state
                    .store(BreakerState::Open as u8, Ordering::Release);
                self.probe_in_flight.store(false, Ordering::Release);
                Some(Transition {
                    from: BreakerState::HalfOpen,
                    to: BreakerState::Open,
                })
            }
            Attempt::Call => {
                let failures = self.consecutive_failures.fetch_add(1, Ordering::AcqRel) + 1;
                if failures >= self.failures_to_open
                    && self
                        .state
                        .compare_exchange(
                            BreakerState::Closed as u8,
                            BreakerState::Open as u8,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                {
                    self.open_until_ms
                        .store(now + self.cooldown_ms, Ordering::Release);
                    return Some(Transition {
                        from: BreakerState::Closed,
                        to: BreakerState::Open,
                    });
                }
                None
            }
            Attempt::Reject => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = CircuitBreaker::new(3, 1000);
        assert_eq!(b.attempt(0).0, Attempt::Call);
        b.on_failure(Attempt::Call, 0);
        b.on_failure(Attempt::Call, 0);
        b.on_success(Attempt::Call); // not consecutive any more
        b.on_failure(Attempt::Call, 0);
        b.on_failure(Attempt::Call, 0);
        assert_eq!(b.state(), BreakerState::Closed);
        let t = b.on_failure(Attempt::Call, 10);
        assert_eq!(
            t,
            Some(Transition {
                from: BreakerState::Closed,
                to: BreakerState::Open
            })
        );
        assert_eq!(b.attempt(10).0, Attempt::Reject);
        assert_eq!(b.attempt(1009).0, Attempt::Reject);
    }

    #[test]
    fn one_probe_after_the_cooldown_closes_or_reopens() {
        let b = CircuitBreaker::new(1, 1000);
        b.on_failure(Attempt::Call, 0);
        let (p, t) = b.attempt(1000);
        assert_eq!(p, Attempt::Probe);
        assert_eq!(t.unwrap().to, BreakerState::HalfOpen);
        // Everyone else keeps going to the failure mode while the probe is out.
        assert_eq!(b.attempt(1000).0, Attempt::Reject);
        assert_eq!(b.attempt(5000).0, Attempt::Reject);
        // The probe fails: open for another cooldown.
        assert_eq!(
            b.on_failure(Attempt::Probe, 1200).unwrap().to,
            BreakerState::Open
        );
        assert_eq!(b.attempt(2199).0, Attempt::Reject);
        let (p, _) = b.attempt(2200);
        assert_eq!(p, Attempt::Probe);
        assert_eq!(
            b.on_success(Attempt::Probe).unwrap().to,
            BreakerState::Closed
        );
        assert_eq!(b.attempt(2200).0, Attempt::Call);
    }

    #[test]
    fn concurrent_failures_open_it_once() {
        let b = std::sync::Arc::new(CircuitBreaker::new(5, 1000));
        let opened: usize = (0..4)
            .map(|_| {
                let b = std::sync::Arc::clone(&b);
                std::thread::spawn(move || {
                    (0..100)
                        .filter(|_| b.on_failure(Attempt::Call, 0).is_some())
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(opened, 1);
    }
}
