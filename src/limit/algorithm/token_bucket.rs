//! Token bucket: capacity `burst`, refilled at `limit` per `window`; the level kept scaled by
//! `window_ms`, so refill is exact for any rate. Mirrors `lua/token_bucket.lua`.

use crate::limit::{Decision, Policy};

/// Token bucket state: `level` in units of token·ms (`tokens * window_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenBucket {
    pub level: u64,
    pub updated_ms: u64,
}

impl TokenBucket {
    pub fn full(policy: &Policy) -> TokenBucket {
        TokenBucket {
            level: policy.burst * policy.window_ms,
            updated_ms: 0,
        }
    }

    /// The level at `now` after refilling (time going backwards refills nothing).
    pub fn level_at(&self, policy: &Policy, now: u64) -> u64 {
        let capacity = policy.burst * policy.window_ms;
        let elapsed = now.saturating_sub(self.updated_ms);
        let refill = elapsed.saturating_mul(policy.limit);
        self.level.saturating_add(refill).min(capacity)
    }

    pub fn decide(&self, policy: &Policy, now: u64, cost: u64) -> (Decision, TokenBucket) {
        let w = policy.window_ms;
        let capacity = policy.burst * w;
        let level = self.level_at(policy, now);
        let need = cost * w;
        let now = now.max(self.updated_ms);
        if level >= need {
            let level = level - need;
            let decision = Decision {
                allowed: true,
                limit: policy.burst,
                remaining: level / w,
                reset_ms: u64::div_ceil(capacity - level, policy.limit),
                retry_after_ms: 0,
            };
            (
                decision,
                TokenBucket {
                    level,
                    updated_ms: now,
                },
            )
        } else {
            let retry_after_ms = if need > capacity {
                w // can never pass; validation prevents this, report one window
            } else {
                u64::div_ceil(need - level, policy.limit)
            };
            let decision = Decision {
                allowed: false,
                limit: policy.burst,
                remaining: level / w,
                reset_ms: u64::div_ceil(capacity - level, policy.limit),
                retry_after_ms,
            };
            (
                decision,
                TokenBucket {
                    level,
                    updated_ms: now,
                },
            )
        }
    }
}
