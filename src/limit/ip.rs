//! The coarse per-client-IP token bucket, checked before anything else so that a flood never
//! reaches authentication or the shared store.
//!
//! **Memory is bounded.** Each table tracks at most `max_tracked` addresses (split evenly over
//! its shards). An entry costs 32 bytes of key and state plus the hash table's overhead; see
//! BENCHMARKS.md for the measured bytes per tracked address.
//!
//! **Eviction never hands out a fresh bucket.** A bucket that has refilled completely is
//! equal to a bucket that was never created, so dropping it loses nothing; the sweeper
//! ([`IpLimiter::sweep`]) removes exactly those. A bucket that is not full is never evicted.
//! When a shard is full of such active buckets, addresses it does not track yet share that
//! shard's *overflow bucket* (same rate and burst) until the sweep frees room: a flood of
//! distinct addresses competes with itself in the overflow buckets and cannot reset the
//! bucket of an address already being limited.

use crate::limit::algorithm::TokenBucket;
use crate::limit::sharded::Sharded;
use crate::limit::{Decision, Policy};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Addresses are tracked as 128-bit keys: IPv6 as is, IPv4 as IPv4-mapped IPv6, both after
/// prefix grouping (see `identity::group_key`).
pub type IpKey = u128;

pub struct IpLimiter {
    pub policy: Policy,
    table: Sharded<IpKey, TokenBucket>,
    max_per_shard: usize,
    overflow: Box<[Mutex<TokenBucket>]>,
    overflow_decisions: AtomicU64,
}

impl IpLimiter {
    /// `policy` must be a token bucket; `max_tracked` is the table's total capacity.
    pub fn new(policy: Policy, max_tracked: usize) -> IpLimiter {
        let table = Sharded::new(Sharded::<IpKey, TokenBucket>::default_shards());
        let shards = table.shard_count();
        let overflow = (0..shards)
            .map(|_| Mutex::new(TokenBucket::full(&policy)))
            .collect();
        IpLimiter {
            max_per_shard: max_tracked.div_ceil(shards).max(1),
            policy,
            table,
            overflow,
            overflow_decisions: AtomicU64::new(0),
        }
    }

    /// Decides one request from `key` at `now` (milliseconds).
    pub fn check(&self, key: IpKey, now: u64) -> Decision {
        let (index, mut shard) = self.table.lock_key(&key);
        if let Some(bucket) = shard.get_mut(&key) {
            let (decision, next) = bucket.decide(&self.policy, now, 1);
            if decision.allowed {
                *bucket = next;
            }
            return decision;
        }
        if shard.len() < self.max_per_shard {
            let (decision, next) = TokenBucket::full(&self.policy).decide(&self.policy, now, 1);
            shard.insert(key, next);
            return decision;
        }
        drop(shard);
        self.overflow_decisions.fetch_add(1, Ordering::Relaxed);
        let mut bucket = self.overflow[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (decision, next) = bucket.decide(&self.policy, now, 1);
        if decision.allowed {
            *bucket = next;
        }
        decision
    }

    /// How [`IpLimiter::check`] would decide for `key` at `now`, nothing taken: whether
    /// the key's bucket has a token left.
    pub fn peek(&self, key: IpKey, now: u64) -> Decision {
        let (index, shard) = self.table.lock_key(&key);
        if let Some(bucket) = shard.get(&key) {
            return bucket.decide(&self.policy, now, 1).0;
        }
        if shard.len() < self.max_per_shard {
            return TokenBucket::full(&self.policy)
                .decide(&self.policy, now, 1)
                .0;
        }
        drop(shard);
        let bucket = self.overflow[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        bucket.decide(&self.policy, now, 1).0
    }

    /// Drops every bucket that is full at `now` (it would decide exactly like a new one).
    /// Returns how many were dropped.
    pub fn sweep(&self, now: u64) -> usize {
        let capacity = self.policy.burst * self.policy.window_ms;
        self.table
            .retain(|_, bucket| bucket.level_at(&self.policy, now) < capacity)
    }

    /// Addresses currently tracked.
    pub fn tracked(&self) -> usize {
        self.table.len()
    }

    /// Bytes the table currently allocates for its entries.
    pub fn allocated_bytes(&self) -> usize {
        self.table.allocated_bytes()
    }

    pub fn max_tracked(&self) -> usize {
        self.max_per_shard * self.table.shard_count()
    }

    /// Decisions made on an overflow bucket since start.
    pub fn overflow_decisions(&self) -> u64 {
        self.overflow_decisions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    const T0: u64 = 1 << 40;

    fn limiter(rate: u64, burst: u64, max: usize) -> IpLimiter {
        IpLimiter::new(
            Policy::new("ip", Algorithm::TokenBucket, rate, 1000, burst),
            max,
        )
    }

    #[test]
    fn a_peek_takes_nothing_and_sees_what_a_check_would() {
        for max in [100, 0] {
            // 0: every key in the overflow buckets.
            let l = limiter(1, 2, max);
            assert!(l.peek(7, T0).allowed);
            assert!(l.peek(7, T0).allowed, "nothing taken by a peek");
            assert!(l.check(7, T0).allowed && l.check(7, T0).allowed);
            assert!(!l.peek(7, T0).allowed);
            assert!(!l.check(7, T0).allowed);
            assert!(l.peek(7, T0 + 1000).allowed, "refilled");
        }
    }

    #[test]
    fn each_address_has_its_own_bucket() {
        let l = limiter(1, 2, 1000);
        assert!(l.check(1, T0).allowed);
        assert!(l.check(1, T0).allowed);
        assert!(!l.check(1, T0).allowed);
        assert!(l.check(2, T0).allowed);
        assert!(l.check(1, T0 + 1000).allowed);
    }

    #[test]
    fn sweep_drops_only_full_buckets() {
        let l = limiter(10, 10, 1000);
        l.check(1, T0);
        for _ in 0..5 {
            l.check(2, T0 + 50);
        }
        // At T0+100, address 1 has refilled (1 token in 100 ms); address 2 has not.
        assert_eq!(l.sweep(T0 + 100), 1);
        assert_eq!(l.tracked(), 1);
        assert!(l.sweep(T0 + 10_000) == 1 && l.tracked() == 0);
    }

    #[test]
    fn a_flood_of_new_addresses_cannot_reset_an_active_bucket() {
        let l = limiter(1, 3, 64);
        let abuser: IpKey = 42;
        for _ in 0..3 {
            assert!(l.check(abuser, T0).allowed);
        }
        assert!(!l.check(abuser, T0).allowed);
        // 100 000 distinct addresses, far more than the table holds.
        for k in 0..100_000u128 {
            l.check(1_000_000 + k, T0);
        }
        assert!(l.tracked() <= l.max_tracked());
        assert!(l.overflow_decisions() > 0);
        // The abuser is still tracked and still empty.
        assert!(!l.check(abuser, T0).allowed);
        // Even after a sweep: its bucket is not full, so it is kept.
        l.sweep(T0 + 500);
        assert!(!l.check(abuser, T0 + 500).allowed);
    }

    #[test]
    fn memory_is_bounded_by_the_table_size() {
        let l = limiter(1, 1, 10_000);
        for k in 0..200_000u128 {
            l.check(k, T0);
        }
        assert!(l.tracked() <= l.max_tracked());
        let per_entry = l.allocated_bytes() / l.tracked();
        // (u128 key, 16-byte state) = 32 bytes + 1 control byte, times table slack (< 2x).
        assert!(
            (33..=80).contains(&per_entry),
            "{per_entry} bytes per tracked address"
        );
    }

    #[test]
    fn untracked_addresses_share_a_bounded_overflow_bucket_when_full() {
        let l = limiter(1, 1, 16); // one entry per shard
        let mut admitted = 0;
        for k in 0..10_000u128 {
            if l.check(k, T0).allowed {
                admitted += 1;
            }
        }
        // At most one per tracked entry plus one per shard's overflow bucket.
        assert!(
            admitted <= l.max_tracked() + l.table.shard_count(),
            "{admitted}"
        );
    }
}
