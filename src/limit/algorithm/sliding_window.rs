//! Sliding window counter: the current and previous aligned windows, the previous one
//! weighing `(window - elapsed) / window`, compared multiplied through by `window` (exact).
//! Mirrors `lua/sliding_window.lua`.

use crate::limit::{Decision, Policy};

/// Sliding window counter state: counts of the current aligned window and the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlidingWindow {
    pub window_start: u64,
    pub current: u64,
    pub previous: u64,
}

impl SlidingWindow {
    /// The state rolled forward to the window containing `now`.
    pub fn rolled(&self, w: u64, now: u64) -> SlidingWindow {
        let start = now - now % w;
        if self.window_start == start {
            *self
        } else if self.window_start + w == start {
            SlidingWindow {
                window_start: start,
                current: 0,
                previous: self.current,
            }
        } else {
            SlidingWindow {
                window_start: start,
                current: 0,
                previous: 0,
            }
        }
    }

    pub fn decide(&self, policy: &Policy, now: u64, cost: u64) -> (Decision, SlidingWindow) {
        let w = policy.window_ms;
        let s = self.rolled(w, now);
        let elapsed = now - s.window_start;
        let until_next = w - elapsed;
        // used·w = previous·(w - elapsed) + current·w, compared against limit·w.
        let used = s.previous * until_next + s.current * w;
        let capacity = policy.limit * w;
        if used + cost * w <= capacity {
            let used = used + cost * w;
            let decision = Decision {
                allowed: true,
                limit: policy.limit,
                remaining: (capacity - used) / w,
                reset_ms: until_next,
                retry_after_ms: 0,
            };
            let s = SlidingWindow {
                current: s.current + cost,
                ..s
            };
            (decision, s)
        } else {
            let retry_after_ms = if cost > policy.limit {
                w
            } else if s.current + cost <= policy.limit {
                // Fits once the previous window's weight has decayed enough, within this window:
                // previous·(until_next - t) <= (limit - current - cost)·w.
                let spare = (policy.limit - s.current - cost) * w;
                until_next - spare / s.previous
            } else {
                // Only after this window ends, when `current` becomes the previous window:
                // current·(w - e) <= (limit - cost)·w.
                let spare = (policy.limit - cost) * w;
                until_next + (w - spare / s.current)
            };
            let decision = Decision {
                allowed: false,
                limit: policy.limit,
                remaining: capacity.saturating_sub(used) / w,
                reset_ms: retry_after_ms,
                retry_after_ms,
            };
            (decision, s)
        }
    }
}
