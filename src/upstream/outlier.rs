//! Passive outlier ejection: a server that fails `consecutive_failures` requests in a row
//! (a 5xx answer, a refused connect, a timeout, a reset — which of these count is
//! configured) is taken out of rotation for `base_ejection_time` × the number of times it was
//! ejected, at most `max_ejection_time`; it returns when that time is up, or earlier when an
//! active health check passes (as Envoy does). At most `max_ejected_percent` of the pool is
//! out at once, and never every server: a pool of one is never ejected from.
//!
//! Every request's outcome updates its server's counters: atomics in a table read without a
//! lock (new addresses are added rarely, by copy). Time is milliseconds of the process's
//! monotonic clock, passed in, so the rules are tested without waiting.

use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What counts as a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    /// A response with a 5xx status.
    pub status_5xx: bool,
    /// The connection could not be made.
    pub connect: bool,
    /// The server did not answer (or accept the request) in time.
    pub timeout: bool,
    /// The connection was reset or closed, or the answer was not HTTP.
    pub reset: bool,
}

impl Failures {
    pub const ALL: Failures = Failures {
        status_5xx: true,
        connect: true,
        timeout: true,
        reset: true,
    };
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutlierSettings {
    pub consecutive_failures: u32,
    pub base_ejection_time: Duration,
    pub max_ejection_time: Duration,
    /// 1 to 100.
    pub max_ejected_percent: u8,
    pub on: Failures,
}

/// How one attempt at a server ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The server answered with this status.
    Answered(u16),
    Connect,
    Timeout,
    Reset,
}

impl Attempt {
    fn failed(self, on: &Failures) -> bool {
        match self {
            Attempt::Answered(status) => on.status_5xx && status >= 500,
            Attempt::Connect => on.connect,
            Attempt::Timeout => on.timeout,
            Attempt::Reset => on.reset,
        }
    }
}

/// One server's record.
#[derive(Debug, Default)]
struct Record {
    failures: AtomicU32,
    ejections: AtomicU32,
    /// Out of rotation until then (ms); 0: in rotation.
    until_ms: AtomicU64,
    /// Ejected and its return not yet noticed (for the log line and the count).
    out: AtomicBool,
}

/// A change worth a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Ejected {
        addr: SocketAddr,
        failures: u32,
        for_ms: u64,
    },
    Returned {
        addr: SocketAddr,
    },
}

pub struct Outliers {
    pub settings: OutlierSettings,
    table: ArcSwap<HashMap<SocketAddr, Arc<Record>>>,
    /// Ejections since the pool was built.
    ejections: AtomicU64,
    /// The pool's `turnstile_upstream_ejections_total`, when counted.
    counter: Option<prometheus::IntCounter>,
}

impl Outliers {
    pub fn new(settings: OutlierSettings, counter: Option<prometheus::IntCounter>) -> Outliers {
        Outliers {
            settings,
            table: ArcSwap::from_pointee(HashMap::new()),
            ejections: AtomicU64::new(0),
            counter,
        }
    }

    /// Whether `addr` is out of rotation at `now_ms`; a return whose time has come is
    /// noticed here (once).
    pub fn is_out(&self, addr: &SocketAddr, now_ms: u64) -> (bool, Option<Transition>) {
        let table = self.table.load();
        let Some(record) = table.get(addr) else {
            return (false, None);
        };
        if record.until_ms.load(Ordering::Relaxed) > now_ms {
            return (true, None);
        }
        let returned = record.out.swap(false, Ordering::Relaxed);
        (
            false,
            returned.then_some(Transition::Returned { addr: *addr }),
        )
    }

    /// Counts how an attempt at `addr` ended, in a pool of `pool_size` addresses; ejects the
    /// server when this failure is one too many and the pool can spare it.
    pub fn record(
        &self,
        addr: SocketAddr,
        attempt: Attempt,
        now_ms: u64,
        pool_size: usize,
    ) -> Option<Transition> {
        let s = &self.settings;
        if !attempt.failed(&s.on) {
            let table = self.table.load();
            if let Some(record) = table.get(&addr) {
                record.failures.store(0, Ordering::Relaxed);
                // Healthy for a base time after its return: its next ejection is shorter.
                let until = record.until_ms.load(Ordering::Relaxed);
                let base = s.base_ejection_time.as_millis() as u64;
                if until != 0 && now_ms >= until.saturating_add(base) {
                    let _ =
                        record
                            .ejections
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            });
                    record.until_ms.store(0, Ordering::Relaxed);
                }
            }
            return None;
        }
        let record = self.record_of(addr);
        let failures = record.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < s.consecutive_failures || record.until_ms.load(Ordering::Relaxed) > now_ms {
            return None;
        }
        if self.out_now(now_ms) >= self.max_out(pool_size) {
            return None;
        }
        let ejections = record.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let base = s.base_ejection_time.as_millis() as u64;
        let for_ms = base
            .saturating_mul(u64::from(ejections))
            .min(s.max_ejection_time.as_millis() as u64);
        record.until_ms.store(now_ms + for_ms, Ordering::Relaxed);
        record.out.store(true, Ordering::Relaxed);
        record.failures.store(0, Ordering::Relaxed);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        if let Some(counter) = &self.counter {
            counter.inc();
        }
        Some(Transition::Ejected {
            addr,
            failures,
            for_ms,
        })
    }

    /// An active health check passed: the server is back now.
    pub fn check_passed(&self, addr: &SocketAddr) -> Option<Transition> {
        let table = self.table.load();
        let record = table.get(addr)?;
        record.until_ms.store(0, Ordering::Relaxed);
        record.failures.store(0, Ordering::Relaxed);
        record
            .out
            .swap(false, Ordering::Relaxed)
            .then_some(Transition::Returned { addr: *addr })
    }

    /// Servers out of rotation at `now_ms`.
    pub fn out_now(&self, now_ms: u64) -> usize {
        self.table
            .load()
            .values()
            .filter(|r| r.until_ms.load(Ordering::Relaxed) > now_ms)
            .count()
    }

    /// Every known address and whether it is out at `now_ms`.
    pub fn states(&self, now_ms: u64) -> Vec<(SocketAddr, bool)> {
        let mut all: Vec<(SocketAddr, bool)> = self
            .table
            .load()
            .iter()
            .map(|(a, r)| (*a, r.until_ms.load(Ordering::Relaxed) > now_ms))
            .collect();
        all.sort();
        all
    }

    /// Ejections since the pool was built.
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Forgets addresses the pool no longer has (after a re-resolution).
    pub fn retain(&self, current: &[SocketAddr]) {
        self.table.rcu(|table| {
            table
                .iter()
                .filter(|(a, _)| current.contains(a))
                .map(|(a, r)| (*a, Arc::clone(r)))
                .collect::<HashMap<_, _>>()
        });
    }

    /// How many of `pool_size` servers may be out at once: the share, at least one, never
    /// all of them.
    fn max_out(&self, pool_size: usize) -> usize {
        let share = pool_size * usize::from(self.settings.max_ejected_percent) / 100;
        share.max(1).min(pool_size.saturating_sub(1))
    }

    fn record_of(&self, addr: SocketAddr) -> Arc<Record> {
        if let Some(r) = self.table.load().get(&addr) {
            return Arc::clone(r);
        }
        self.table.rcu(|table| {
            let mut table = HashMap::clone(table);
            table.entry(addr).or_default();
            table
        });
        Arc::clone(self.table.load().get(&addr).expect("just added"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> OutlierSettings {
        OutlierSettings {
            consecutive_failures: 3,
            base_ejection_time: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(25),
            max_ejected_percent: 50,
            on: Failures::ALL,
        }
    }

    fn addr(n: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, n], 80))
    }

    #[test]
    fn consecutive_failures_eject_for_a_growing_time_then_the_server_returns() {
        let o = Outliers::new(settings(), None);
        let a = addr(1);
        assert_eq!(o.record(a, Attempt::Answered(500), 0, 4), None);
        assert_eq!(o.record(a, Attempt::Answered(200), 0, 4), None, "reset");
        assert_eq!(o.record(a, Attempt::Connect, 0, 4), None);
        assert_eq!(o.record(a, Attempt::Timeout, 0, 4), None);
        assert_eq!(
            o.record(a, Attempt::Reset, 1_000, 4),
            Some(Transition::Ejected {
                addr: a,
                failures: 3,
                for_ms: 10_000
            })
        );
        assert_eq!(o.is_out(&a, 10_999), (true, None));
        assert_eq!(
            o.is_out(&a, 11_000),
            (false, Some(Transition::Returned { addr: a }))
        );
        assert_eq!(o.is_out(&a, 11_001), (false, None), "noticed once");
        // Fails again at once: twice the base time.
        for _ in 0..2 {
            o.record(a, Attempt::Answered(503), 12_000, 4);
        }
        assert_eq!(
            o.record(a, Attempt::Answered(503), 12_000, 4),
            Some(Transition::Ejected {
                addr: a,
                failures: 3,
                for_ms: 20_000
            })
        );
        // A third time: capped at max_ejection_time.
        for _ in 0..3 {
            o.record(a, Attempt::Answered(503), 40_000, 4);
        }
        assert!(o.is_out(&a, 40_000).0);
        assert_eq!(o.states(40_000), [(a, true)]);
        assert_eq!(o.ejections(), 3);
        assert!(!o.is_out(&a, 65_000).0, "25 s, not 30 s");
    }

    #[test]
    fn a_healthy_stretch_shortens_the_next_ejection() {
        let o = Outliers::new(settings(), None);
        let a = addr(1);
        for _ in 0..3 {
            o.record(a, Attempt::Connect, 0, 4);
        }
        // Back at 10 s, healthy past 20 s: the count of ejections goes back down.
        o.record(a, Attempt::Answered(200), 20_000, 4);
        for _ in 0..2 {
            o.record(a, Attempt::Connect, 30_000, 4);
        }
        assert_eq!(
            o.record(a, Attempt::Connect, 30_000, 4),
            Some(Transition::Ejected {
                addr: a,
                failures: 3,
                for_ms: 10_000
            })
        );
    }

    #[test]
    fn only_the_configured_failures_count_and_4xx_never_does() {
        let mut s = settings();
        s.on = Failures {
            status_5xx: false,
            ..Failures::ALL
        };
        let o = Outliers::new(s, None);
        for _ in 0..10 {
            assert_eq!(o.record(addr(1), Attempt::Answered(503), 0, 4), None);
            assert_eq!(o.record(addr(2), Attempt::Answered(429), 0, 4), None);
        }
        assert_eq!(o.out_now(0), 0);
    }

    #[test]
    fn at_most_the_share_is_out_and_never_the_whole_pool() {
        let o = Outliers::new(settings(), None);
        let eject = |n: u8| {
            (0..3)
                .filter_map(|_| o.record(addr(n), Attempt::Connect, 0, 4))
                .count()
        };
        assert_eq!(eject(1), 1);
        assert_eq!(eject(2), 1);
        assert_eq!(eject(3), 0, "50 % of 4 are out already");
        assert_eq!(o.out_now(0), 2);
        // A pool of one: never.
        let single = Outliers::new(settings(), None);
        for _ in 0..10 {
            assert_eq!(single.record(addr(9), Attempt::Connect, 0, 1), None);
        }
        // An active check that passes brings a server back at once.
        assert_eq!(
            o.check_passed(&addr(1)),
            Some(Transition::Returned { addr: addr(1) })
        );
        assert_eq!(o.out_now(0), 1);
        o.retain(&[addr(2)]);
        assert_eq!(o.states(0), [(addr(2), true)]);
    }
}
