//! Fixed window: one counter per aligned window (multiples of the window, or calendar units
//! in a time zone). Cheapest; admits up to twice the limit around a window edge. Mirrors
//! `lua/fixed_window.lua`.

use crate::limit::{Decision, Policy};

/// Fixed window state: the start of the window `count` belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedWindow {
    pub window_start: u64,
    pub count: u64,
}

impl FixedWindow {
    pub fn decide(&self, policy: &Policy, now: u64, cost: u64) -> (Decision, FixedWindow) {
        let (start, end) = policy.fixed_window_at(now);
        let count = if self.window_start == start {
            self.count
        } else {
            0
        };
        let reset_ms = end - now;
        if count + cost <= policy.limit {
            let count = count + cost;
            let decision = Decision {
                allowed: true,
                limit: policy.limit,
                remaining: policy.limit - count,
                reset_ms,
                retry_after_ms: 0,
            };
            (
                decision,
                FixedWindow {
                    window_start: start,
                    count,
                },
            )
        } else {
            let decision = Decision {
                allowed: false,
                limit: policy.limit,
                remaining: policy.limit.saturating_sub(count),
                reset_ms,
                retry_after_ms: reset_ms,
            };
            (
                decision,
                FixedWindow {
                    window_start: start,
                    count,
                },
            )
        }
    }
}
