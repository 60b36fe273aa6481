//! Quota leasing (`lease = N` on a plan's limits): the in-process half.
//!
//! Instead of one store call per request, an instance reserves a slice of a client's quota
//! in Redis (`lua/lease.lua`) and spends it locally; it calls Redis again only when the
//! slice is spent, its window ends, or the table cannot hold the key. This module is the
//! local bookkeeping — pure, no I/O: [`LeaseTable::take`] decides a request from the local
//! lease or says what to ask the store for; [`LeaseTable::settle`] and
//! [`LeaseTable::abandon`] take the store's answer (or its failure) back.
//!
//! # Bounds
//! - **Overshoot: none.** Granted units are counted in Redis when they are granted, in the
//!   same keys the per-request script uses, so every instance together can never spend more
//!   than the limit. A lease is only spent inside the window it was granted in: its local
//!   expiry is the window's end measured from *before* the call was sent (so it errs early),
//!   and leftover units are only merged into a renewal sent at least the store timeout
//!   before that expiry. A grant that arrives after its request stopped waiting
//!   ([`LeaseTable::settle_late`]) expires by the same rule, measured from when it was asked.
//! - **Undershoot: at most `lease` units per instance per window.** An instance holds at most
//!   one lease of at most `lease` units per (client, route); what it holds unspent when the
//!   window ends lapsed unused. Renewing after a lapse gives those units back first (for a
//!   sliding window they still weigh as the previous window), and so does a graceful
//!   shutdown ([`LeaseTable::drain`]).
//! - A refusal is remembered until the store said the request would fit (measured from
//!   before the call): rejected requests of an exhausted client cost no store call either.
//!
//! # Lease size
//! The first lease of a key is what the asking request needs; after that, the key's recent
//! rate on this instance (an exponentially weighted average, units per millisecond) times
//! [`HORIZON_MS`], within `[need, lease]`: a cold key leases nothing beyond its request (and
//! so stays exact), a hot one leases the cap.
//!
//! # Concurrency
//! One renewal per key at a time: requests that find the lease spent while a renewal is in
//! flight wait for it (bounded by the store timeout) and take again.

mod entry;
mod types;

pub use types::{Ask, Grant, GrantWindow, LeaseKey, Take, Unspent};

use self::entry::{Entry, Renewal, Window};
use crate::limit::sharded::Sharded;
use crate::limit::{Policy, Verdict};
use std::sync::Arc;
use tokio::sync::Notify;

/// A lease is sized to cover this much of the key's recent traffic (within the cap).
pub const HORIZON_MS: f64 = 200.0;

/// Weight of the newest rate observation in the moving average.
const RATE_WEIGHT: f64 = 0.5;

/// An entry with no lease, no refusal and no renewal for this long is dropped by the sweeper
/// (it forgets the key's rate; nothing else is lost).
pub const IDLE_MS: u64 = 10_000;

pub struct LeaseTable {
    map: Sharded<LeaseKey, Entry>,
    per_shard: usize,
}

impl LeaseTable {
    /// A table holding at most about `max_entries` keys.
    pub fn new(max_entries: usize) -> LeaseTable {
        let map = Sharded::new(Sharded::<LeaseKey, Entry>::default_shards());
        let per_shard = max_entries.div_ceil(map.shard_count()).max(1);
        LeaseTable { map, per_shard }
    }

    /// Decides a request of `cost` units from the local lease of `key`, or says what to ask.
    /// `cap` is the configured lease size; `margin` the store timeout in milliseconds.
    pub fn take(
        &self,
        key: &LeaseKey,
        policies: &[Policy],
        cost: u64,
        cap: u64,
        now: u64,
        margin: u64,
    ) -> Take {
        let (_, mut shard) = self.map.lock_key(key);
        if shard.get(key).is_none() {
            if shard.len() >= self.per_shard {
                return Take::Untracked;
            }
            shard.insert(key.clone(), Entry::new(policies));
        }
        let entry = shard.get_mut(key).expect("inserted above");
        if entry.policies != policies {
            *entry = Entry::new(policies);
        }
        if let Some((by, until)) = entry.refused {
            if now < until {
                return Take::Local(entry.verdict(now, Some((by, until))));
            }
            entry.refused = None;
        }
        if now >= entry.expires_at {
            entry.lapse();
        }
        if entry.left >= cost {
            entry.left -= cost;
            entry.spent += cost;
            return Take::Local(entry.verdict(now, None));
        }
        if let Some(renewing) = &entry.renewing {
            if now >= renewing.overdue_at {
                return Take::Stalled;
            }
            let mut wait = Box::pin(Arc::clone(&renewing.settled).notified_owned());
            wait.as_mut().enable();
            return Take::Wait(wait);
        }
        // Leftover units can join the renewal only if the renewal surely lands in their window.
        if now.saturating_add(margin) >= entry.expires_at {
            entry.lapse();
        }
        let held = std::mem::take(&mut entry.left);
        let need = cost - held;
        if entry.last_ask > 0 {
            let observed = entry.spent as f64 / now.saturating_sub(entry.last_ask).max(1) as f64;
            entry.rate = if entry.rate == 0.0 {
                observed
            } else {
                RATE_WEIGHT * observed + (1.0 - RATE_WEIGHT) * entry.rate
            };
        }
        let sized = (entry.rate * HORIZON_MS).ceil() as u64;
        let want = sized.clamp(need, cap.max(need));
        entry.last_ask = now;
        entry.spent = 0;
        entry.renewing = Some(Renewal {
            settled: Arc::new(Notify::new()),
            overdue_at: now.saturating_add(margin),
        });
        Take::Ask(Ask {
            need,
            want,
            held,
            give_back: std::mem::take(&mut entry.lapsed),
            give_back_starts: std::mem::take(&mut entry.lapsed_starts),
            sent_at: now,
        })
    }

    /// The store answered `ask`: records the lease (or the refusal) and decides the request.
    pub fn settle(
        &self,
        key: &LeaseKey,
        policies: &[Policy],
        ask: Ask,
        grant: &Grant,
        now: u64,
    ) -> Verdict {
        let (_, mut shard) = self.map.lock_key(key);
        let mut detached;
        let entry = match shard.get_mut(key) {
            Some(e) if e.policies == policies => e,
            // Swept or replaced by a reload meanwhile: decide from the grant alone.
            _ => {
                detached = Entry::new(policies);
                &mut detached
            }
        };
        if let Some(renewing) = entry.renewing.take() {
            renewing.settled.notify_waiters();
        }
        let same_window = entry.windows.len() == grant.windows.len()
            && entry
                .windows
                .iter()
                .zip(&grant.windows)
                .all(|(w, g)| w.start == g.start);
        entry.windows = grant
            .windows
            .iter()
            .map(|g| Window {
                start: g.start,
                ends_at: ask.sent_at.saturating_add(g.reset_ms),
                remaining: g.remaining,
            })
            .collect();
        entry.expires_at = entry.windows.iter().map(|w| w.ends_at).min().unwrap_or(0);
        // The held units belong to the old window; a grant landing in a new one voids them.
        let held = if same_window { ask.held } else { 0 };
        let cost = ask.need + ask.held;
        if grant.granted == 0 {
            entry.left += held;
            let by = grant.rejected.unwrap_or(0);
            let retry = grant.windows.get(by).map_or(0, |g| g.retry_after_ms);
            let until = ask.sent_at.saturating_add(retry);
            entry.refused = Some((by, until));
            return entry.verdict(now, Some((by, until)));
        }
        let total = grant.granted + held;
        if total < cost {
            // Only after a store clock jump: the units are kept, this request is refused.
            entry.left = total;
            return entry.verdict(now, Some((0, now.saturating_add(1))));
        }
        entry.left = total - cost;
        entry.spent += cost;
        entry.verdict(now, None)
    }

    /// A request spent `cost` units of `key`'s lease at `at` and was not served after all:
    /// they go back to the lease if it is still the lease of the same windows (it has not
    /// expired, and `at` falls within its windows). Otherwise they stay spent: they were
    /// counted in a window that has ended, where they no longer limit anyone.
    pub fn refund(&self, key: &LeaseKey, policies: &[Policy], cost: u64, at: u64, now: u64) {
        let (_, mut shard) = self.map.lock_key(key);
        let Some(entry) = shard.get_mut(key) else {
            return;
        };
        let shortest = policies.iter().map(Policy::window_ms).min().unwrap_or(0);
        let same_windows = entry.policies == policies
            && now < entry.expires_at
            && at.saturating_add(shortest) > entry.expires_at;
        if same_windows {
            entry.left += cost;
            entry.spent = entry.spent.saturating_sub(cost);
        }
    }

    /// The renewal failed: the request's held units go back (if still valid) and waiters are
    /// released to decide for themselves.
    pub fn abandon(&self, key: &LeaseKey, ask: &Ask, now: u64) {
        self.give_up(key, ask, now);
        self.end_renewal(key);
    }

    /// The request that asked stops waiting (the store timed out) while the renewal stays in
    /// flight: its held units go back (if still valid); until the renewal ends
    /// ([`settle_late`](Self::settle_late) or [`end_renewal`](Self::end_renewal)), requests
    /// of the key are told [`Take::Stalled`] once it is overdue.
    pub fn give_up(&self, key: &LeaseKey, ask: &Ask, now: u64) {
        let (_, mut shard) = self.map.lock_key(key);
        if let Some(entry) = shard.get_mut(key) {
            if now < entry.expires_at {
                entry.left += ask.held;
            }
        }
    }

    /// The renewal ended without a usable answer (the connection failed): waiters are
    /// released and the next request asks again.
    pub fn end_renewal(&self, key: &LeaseKey) {
        let (_, mut shard) = self.map.lock_key(key);
        if let Some(renewing) = shard.get_mut(key).and_then(|e| e.renewing.take()) {
            renewing.settled.notify_waiters();
        }
    }

    /// The store answered a renewal whose request had given up: the grant is not lost, it
    /// becomes this instance's lease (so the units are spent, not stranded in the store's
    /// count). A refusal is remembered like any other.
    pub fn settle_late(
        &self,
        key: &LeaseKey,
        policies: &[Policy],
        ask: &Ask,
        grant: &Grant,
        now: u64,
    ) {
        let (_, mut shard) = self.map.lock_key(key);
        let Some(entry) = shard.get_mut(key) else {
            return;
        };
        if let Some(renewing) = entry.renewing.take() {
            renewing.settled.notify_waiters();
        }
        if entry.policies != policies {
            // Replaced by a reload meanwhile: the units lapse with their window.
            return;
        }
        if grant.granted == 0 {
            let by = grant.rejected.unwrap_or(0);
            let retry = grant.windows.get(by).map_or(0, |g| g.retry_after_ms);
            entry.refused = Some((by, ask.sent_at.saturating_add(retry)));
            return;
        }
        let same_window = entry.windows.len() == grant.windows.len()
            && entry
                .windows
                .iter()
                .zip(&grant.windows)
                .all(|(w, g)| w.start == g.start);
        if !same_window || now >= entry.expires_at {
            // What is left of the old lease belongs to its window: given back with the next
            // renewal.
            entry.lapse();
        }
        entry.windows = grant
            .windows
            .iter()
            .map(|g| Window {
                start: g.start,
                ends_at: ask.sent_at.saturating_add(g.reset_ms),
                remaining: g.remaining,
            })
            .collect();
        entry.expires_at = entry.windows.iter().map(|w| w.ends_at).min().unwrap_or(0);
        entry.left += grant.granted;
        if now >= entry.expires_at {
            // Its window is already over: nothing may be spent from it.
            entry.lapse();
        }
    }

    /// Drops idle entries (see [`IDLE_MS`]); returns how many.
    pub fn sweep(&self, now: u64) -> usize {
        self.map.retain(|_, e| {
            e.renewing.is_some()
                || now < e.expires_at
                || e.refused.is_some_and(|(_, until)| now < until)
                || now < e.last_ask.saturating_add(IDLE_MS)
        })
    }

    /// Empties every live lease (nothing is spent from it afterwards) and returns what was
    /// unspent, for a graceful shutdown to give back.
    pub fn drain(&self, now: u64) -> Vec<Unspent> {
        let mut out = Vec::new();
        self.map.retain(|key, e| {
            if now >= e.expires_at {
                e.lapse();
            }
            let (units, starts) = if e.left > 0 {
                (e.left, e.windows.iter().map(|w| w.start).collect())
            } else {
                (e.lapsed, std::mem::take(&mut e.lapsed_starts))
            };
            if units > 0 {
                out.push(Unspent {
                    key: key.clone(),
                    policies: e.policies.clone(),
                    starts,
                    units,
                });
            }
            e.left = 0;
            e.lapsed = 0;
            true
        });
        out
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;
    use std::future::Future;

    fn key() -> LeaseKey {
        LeaseKey {
            client: "c".into(),
            route: "r".into(),
        }
    }

    fn policies() -> Vec<Policy> {
        vec![Policy::new("m", Algorithm::FixedWindow, 100, 60_000, 100)]
    }

    fn grant(granted: u64, remaining: u64, reset_ms: u64, start: u64) -> Grant {
        Grant {
            granted,
            rejected: (granted == 0).then_some(0),
            windows: vec![GrantWindow {
                remaining,
                reset_ms,
                retry_after_ms: if granted == 0 { reset_ms } else { 0 },
                start,
            }],
        }
    }

    fn ask(t: &LeaseTable, now: u64) -> Ask {
        match t.take(&key(), &policies(), 1, 10, now, 50) {
            Take::Ask(a) => a,
            _ => panic!("expected an ask"),
        }
    }

    #[test]
    fn a_cold_key_asks_for_its_request_only_and_a_hot_one_for_the_cap() {
        let t = LeaseTable::new(100);
        let a = ask(&t, 1_000);
        assert_eq!((a.need, a.want, a.held), (1, 1, 0));
        assert!(
            t.settle(&key(), &policies(), a, &grant(1, 99, 30_000, 0), 1_001)
                .admitted
        );
        // 1 unit per ms observed since the last ask: 200 ms of it is capped at 10.
        let a = ask(&t, 1_001);
        assert_eq!(a.want, 10);
        let v = t.settle(&key(), &policies(), a, &grant(10, 89, 29_999, 0), 1_002);
        assert!(v.admitted);
        assert_eq!(v.decisions[0].remaining, 89 + 9);
        for _ in 0..9 {
            assert!(matches!(
                t.take(&key(), &policies(), 1, 10, 1_003, 50),
                Take::Local(v) if v.admitted
            ));
        }
        assert!(matches!(
            t.take(&key(), &policies(), 1, 10, 1_003, 50),
            Take::Ask(_)
        ));
    }

    #[test]
    fn a_refund_goes_back_to_the_lease_of_its_window_only() {
        let t = LeaseTable::new(100);
        let a = ask(&t, 1_000);
        let v = t.settle(&key(), &policies(), a, &grant(5, 95, 30_000, 0), 1_001);
        t.refund(&key(), &policies(), 1, v.at_ms, 1_002);
        for _ in 0..5 {
            let taken = t.take(&key(), &policies(), 1, 10, 1_003, 50);
            assert!(matches!(taken, Take::Local(v) if v.admitted));
        }
        let taken = t.take(&key(), &policies(), 1, 10, 1_003, 50);
        assert!(matches!(taken, Take::Ask(_)));
        // After the lease's window: nothing to give back to.
        let t = LeaseTable::new(100);
        let a = ask(&t, 1_000);
        let v = t.settle(&key(), &policies(), a, &grant(5, 95, 30_000, 0), 1_001);
        t.refund(&key(), &policies(), 1, v.at_ms, 40_000);
        let taken = t.take(&key(), &policies(), 1, 10, 40_001, 50);
        assert!(matches!(taken, Take::Ask(a) if a.held == 0));
    }

    #[test]
    fn a_renewal_in_flight_makes_others_wait_and_settling_wakes_them() {
        let t = LeaseTable::new(100);
        let a = ask(&t, 1_000);
        let Take::Wait(mut wait) = t.take(&key(), &policies(), 1, 10, 1_000, 50) else {
            panic!("expected a wait")
        };
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        t.settle(&key(), &policies(), a, &grant(1, 99, 30_000, 0), 1_001);
        assert!(wait.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn a_refusal_is_remembered_until_the_retry_time() {
        let t = LeaseTable::new(100);
        let a = ask(&t, 1_000);
        let v = t.settle(&key(), &policies(), a, &grant(0, 0, 5_000, 0), 1_010);
        assert!(!v.admitted);
        assert_eq!(v.decisions[0].retry_after_ms, 5_000 - 10);
        assert!(matches!(
            t.take(&key(), &policies(), 1, 10, 5_999, 50),
            Take::Local(v) if !v.admitted
        ));
        assert!(matches!(
            t.take(&key(), &policies(), 1, 10, 6_000, 50),
            Take::Ask(_)
        ));
    }

    #[test]
    fn a_lease_is_never_spent_after_its_window_and_lapsed_units_are_given_back() {
        let t = LeaseTable::new(100);
        let a = ask(&t, 1_000);
        t.settle(&key(), &policies(), a, &grant(1, 99, 100, 60_000), 1_000);
        let a = ask(&t, 1_001);
        t.settle(&key(), &policies(), a, &grant(10, 80, 99, 60_000), 1_001);
        // 9 units left, expiring at 1_001 + 99 = 1_100.
        assert!(
            matches!(t.take(&key(), &policies(), 1, 10, 1_099, 50), Take::Local(v) if v.admitted)
        );
        // Expired: the 8 left lapse and ride along with the renewal, to be given back.
        let a = ask(&t, 1_100);
        assert_eq!((a.held, a.need, a.give_back), (0, 1, 8));
        assert_eq!(a.give_back_starts, vec![60_000]);
        t.settle(
            &key(),
            &policies(),
            a,
            &grant(5, 70, 59_000, 120_000),
            1_110,
        );
        assert_eq!(
            t.drain(1_120),
            vec![Unspent {
                key: key(),
                policies: policies(),
                starts: vec![120_000],
                units: 4,
            }]
        );
        // Drained: nothing left to spend.
        assert!(matches!(
            t.take(&key(), &policies(), 1, 10, 1_121, 50),
            Take::Ask(_)
        ));
    }

    #[test]
    fn held_units_join_a_renewal_in_their_window_and_are_void_in_another() {
        let t = LeaseTable::new(100);
        let take = |now| t.take(&key(), &policies(), 3, 10, now, 50);
        let Take::Ask(a) = take(1_000) else { panic!() };
        t.settle(&key(), &policies(), a, &grant(4, 96, 30_000, 0), 1_000);
        // 1 left; the next request holds it and needs 2 more (and gets 3: 1 left again).
        let Take::Ask(a) = take(1_001) else { panic!() };
        assert_eq!((a.held, a.need), (1, 2));
        assert!(
            t.settle(&key(), &policies(), a, &grant(3, 93, 29_999, 0), 1_002)
                .admitted
        );
        // If a grant lands in a later window (a store clock jump), the held unit is void and
        // the request is refused rather than overspend.
        let Take::Ask(a) = take(1_003) else { panic!() };
        assert_eq!(a.held, 1);
        let v = t.settle(&key(), &policies(), a, &grant(2, 98, 60_000, 60_000), 1_004);
        assert!(!v.admitted);
        // 2 left, expiring at 1_003 + 60_000. Near that end they cannot join a renewal: they
        // lapse and are given back with it.
        let Take::Ask(a) = take(60_960) else { panic!() };
        assert_eq!((a.held, a.need, a.give_back), (0, 3, 2));
    }

    #[test]
    fn a_failed_renewal_returns_the_held_units_and_a_changed_plan_starts_afresh() {
        let t = LeaseTable::new(100);
        let Take::Ask(a) = t.take(&key(), &policies(), 2, 10, 1_000, 50) else {
            panic!()
        };
        t.settle(&key(), &policies(), a, &grant(3, 97, 30_000, 0), 1_000);
        let Take::Ask(a) = t.take(&key(), &policies(), 2, 10, 1_001, 50) else {
            panic!()
        };
        assert_eq!(a.held, 1);
        t.abandon(&key(), &a, 1_002);
        let Take::Ask(a) = t.take(&key(), &policies(), 2, 10, 1_003, 50) else {
            panic!()
        };
        assert_eq!(a.held, 1);
        t.abandon(&key(), &a, 1_004);
        let other = vec![Policy::new("m", Algorithm::FixedWindow, 50, 60_000, 50)];
        let Take::Ask(a) = t.take(&key(), &other, 2, 10, 1_005, 50) else {
            panic!()
        };
        assert_eq!((a.held, a.need), (0, 2));
    }

    #[test]
    fn the_table_is_bounded_and_idle_entries_are_swept() {
        let t = LeaseTable::new(1);
        let shards = Sharded::<LeaseKey, Entry>::default_shards().next_power_of_two();
        let mut untracked = 0;
        for i in 0..shards * 4 {
            let k = LeaseKey {
                client: format!("c{i}").into(),
                route: "r".into(),
            };
            match t.take(&k, &policies(), 1, 10, 1_000, 50) {
                Take::Untracked => untracked += 1,
                Take::Ask(a) => t.abandon(&k, &a, 1_000),
                _ => panic!(),
            }
        }
        assert!(t.len() <= shards && untracked > 0);
        assert_eq!(t.sweep(1_000 + IDLE_MS - 1), 0);
        let n = t.len();
        assert_eq!(t.sweep(1_000 + IDLE_MS), n);
        assert!(t.is_empty());
    }
}
