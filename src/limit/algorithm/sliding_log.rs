//! Sliding log: the times (and costs) admitted in the last window; exact, memory grows with
//! the limit. Mirrors `lua/sliding_log.lua`.

use crate::limit::{Decision, Policy};
use std::collections::VecDeque;

/// Sliding log state: `(timestamp, cost)` of admitted requests, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLog {
    pub entries: VecDeque<(u64, u64)>,
}

impl SlidingLog {
    pub fn decide(mut self, policy: &Policy, now: u64, cost: u64) -> (Decision, SlidingLog) {
        let w = policy.window_ms;
        // An entry counts while now - w < ts, i.e. it expires at ts + w.
        while self.entries.front().is_some_and(|(ts, _)| ts + w <= now) {
            self.entries.pop_front();
        }
        let count: u64 = self.entries.iter().map(|(_, c)| c).sum();
        if count + cost <= policy.limit {
            self.entries.push_back((now, cost));
            let oldest = self.entries.front().map_or(now, |(ts, _)| *ts);
            let decision = Decision {
                allowed: true,
                limit: policy.limit,
                remaining: policy.limit - count - cost,
                reset_ms: oldest + w - now,
                retry_after_ms: 0,
            };
            (decision, self)
        } else {
            let retry_after_ms = if cost > policy.limit {
                w
            } else {
                // Wait until enough of the oldest entries expire to make room for `cost`.
                let excess = count + cost - policy.limit;
                let mut freed = 0;
                let mut at = now;
                for (ts, c) in &self.entries {
                    freed += c;
                    if freed >= excess {
                        at = ts + w;
                        break;
                    }
                }
                at - now
            };
            let oldest = self.entries.front().map_or(now, |(ts, _)| *ts);
            let decision = Decision {
                allowed: false,
                limit: policy.limit,
                remaining: policy.limit.saturating_sub(count),
                reset_ms: oldest + w - now,
                retry_after_ms,
            };
            (decision, self)
        }
    }
}
