//! The most traces one instance samples per second: lock-free, one window per second.

use std::sync::atomic::{AtomicU64, Ordering};

/// At most `max` sampled traces per second (`None`: no bound).
pub struct SampleBudget {
    max: Option<u32>,
    /// The current second (high 32 bits) and the traces sampled in it (low 32 bits).
    window: AtomicU64,
}

impl SampleBudget {
    pub fn new(max: Option<u32>) -> SampleBudget {
        SampleBudget {
            max,
            window: AtomicU64::new(0),
        }
    }

    /// Whether one more trace may be sampled at `now_ms`.
    pub fn take(&self, now_ms: u64) -> bool {
        let Some(max) = self.max else {
            return true;
        };
        let second = (now_ms / 1000) & 0xffff_ffff;
        let mut current = self.window.load(Ordering::Relaxed);
        loop {
            let (at, used) = (current >> 32, current & 0xffff_ffff);
            let used = if at == second { used } else { 0 };
            if used >= u64::from(max) {
                return false;
            }
            let next = (second << 32) | (used + 1);
            match self.window.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_per_second_then_a_fresh_second() {
        let b = SampleBudget::new(Some(3));
        let taken = (0..10).filter(|_| b.take(5_000)).count();
        assert_eq!(taken, 3);
        assert!(!b.take(5_999));
        assert!(b.take(6_000));
        let unbounded = SampleBudget::new(None);
        assert!((0..1000).all(|_| unbounded.take(1)));
    }
}
