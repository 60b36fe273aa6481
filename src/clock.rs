//! Time as a value. Algorithms take `now` (integer milliseconds) as an argument; stores that
//! need "now" themselves are given a [`Clock`], so tests drive a [`ManualClock`] and never sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

pub trait Clock: Send + Sync + 'static {
    /// Milliseconds on a clock that never goes backwards.
    fn now_ms(&self) -> u64;

    /// A reading of this clock in Unix milliseconds (calendar windows need the date).
    /// Clocks that count in Unix milliseconds already (tests' manual clocks) leave it be.
    fn to_unix_ms(&self, now: u64) -> u64 {
        now
    }
}

/// Monotonic milliseconds since the first use in this process (never 0, so a zeroed state
/// reads as "long ago").
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

/// Offset added to the monotonic reading so that `now_ms()` is well above any window length:
/// algorithm state initialised at time 0 then always counts as expired.
const EPOCH_OFFSET_MS: u64 = 1 << 40;

/// The instant this process first asked for the time: the one base its monotonic
/// milliseconds (here, and the connection guard's) count from.
pub fn process_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        EPOCH_OFFSET_MS + process_start().elapsed().as_millis() as u64
    }

    /// The wall clock at this process's start plus the monotonic time since: immune to the
    /// wall clock jumping afterwards.
    fn to_unix_ms(&self, now: u64) -> u64 {
        static START_UNIX: OnceLock<u64> = OnceLock::new();
        let start = *START_UNIX.get_or_init(|| {
            let since = process_start().elapsed();
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .saturating_sub(since)
                .as_millis() as u64
        });
        start + now.saturating_sub(EPOCH_OFFSET_MS)
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(start_ms: u64) -> ManualClock {
        ManualClock(AtomicU64::new(start_ms))
    }

    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for std::sync::Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }

    fn to_unix_ms(&self, now: u64) -> u64 {
        (**self).to_unix_ms(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_does_not_go_back() {
        let c = MonotonicClock;
        let a = c.now_ms();
        let b = c.now_ms();
        assert!(b >= a && a >= EPOCH_OFFSET_MS);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(5);
        assert_eq!(c.now_ms(), 5);
        c.advance(10);
        assert_eq!(c.now_ms(), 15);
        c.set(3);
        assert_eq!(c.now_ms(), 3);
    }
}
