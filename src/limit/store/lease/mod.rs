//! Quota leasing (`lease = N` on a plan's limits): the in-process half.
//!
//! Instead of one store call per request, an instance reserves a slice of a client's quota
//! in Redis (`lua/lease.lua`) and spends it locally; it calls Redis again only when the
//! slice is spent, its window ends, or the table cannot hold the key. This module is the
//! local bookkeeping — pure, no I/O: [`LeaseTable::take`] decides a request from the local
//! lease or says what to ask the store for; [`LeaseTable::settle`] and
//! [`LeaseTable::renewal_failed`] take the store's answer (or its failure) back.
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
mod leased;
pub mod renewal;
mod types;

pub use types::{Ask, FromLease, Grant, GrantWindow, LeaseKey, Unspent};

use self::entry::{Held, InFlight};
use crate::limit::sharded::Sharded;
use crate::limit::{Policy, Verdict};
use std::sync::Arc;
use tokio::sync::Notify;

/// Most (client, route) keys holding a quota lease at once; past it, requests of new keys
/// are decided by one store call each (exact, just not leased).
pub const MAX_LEASES: usize = 100_000;

/// A lease is sized to cover this much of the key's recent traffic (within the cap).
pub const HORIZON_MS: f64 = 200.0;

/// Weight of the newest rate observation in the moving average.
const RATE_WEIGHT: f64 = 0.5;

/// An entry with no lease, no refusal and no renewal for this long is dropped by the sweeper
/// (it forgets the key's rate; nothing else is lost).
pub const IDLE_MS: u64 = 10_000;

pub struct LeaseTable {
    map: Sharded<LeaseKey, Held>,
    per_shard: usize,
}

impl LeaseTable {
    /// A table holding at most about `max_entries` keys.
    pub fn new(max_entries: usize) -> LeaseTable {
        let map = Sharded::new(Sharded::<LeaseKey, Held>::default_shards());
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
    ) -> FromLease {
        let (_, mut shard) = self.map.lock_key(key);
        if shard.get(key).is_none() {
            if shard.len() >= self.per_shard {
                return FromLease::Untracked;
            }
            shard.insert(key.clone(), Held::new(policies));
        }
        let entry = shard.get_mut(key).expect("inserted above");
        if entry.policies != policies {
            *entry = Held::new(policies);
        }
        if let Some((by, until)) = entry.refused {
            if now < until {
                return FromLease::Local(entry.verdict(now, Some((by, until))));
            }
            entry.refused = None;
        }
        if now >= entry.expires_at {
            entry.lapse();
        }
        if entry.left >= cost {
            entry.left -= cost;
            entry.spent += cost;
            return FromLease::Local(entry.verdict(now, None));
        }
        if let Some(renewing) = &entry.renewing {
            if now >= renewing.overdue_at {
                return FromLease::Stalled;
            }
            let mut wait = Box::pin(Arc::clone(&renewing.settled).notified_owned());
            wait.as_mut().enable();
            return FromLease::Wait(wait);
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
        entry.renewing = Some(InFlight {
            settled: Arc::new(Notify::new()),
            overdue_at: now.saturating_add(margin),
        });
        FromLease::Ask(Ask {
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
                detached = Held::new(policies);
                &mut detached
            }
        };
        if let Some(renewing) = entry.renewing.take() {
            renewing.settled.notify_waiters();
        }
        let same_window = entry.take_windows(grant, ask.sent_at);
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
    pub fn renewal_failed(&self, key: &LeaseKey, ask: &Ask, now: u64) {
        self.request_gave_up(key, ask, now);
        self.renewal_ended(key);
    }

    /// The request that asked stops waiting (the store timed out) while the renewal stays in
    /// flight: its held units go back (if still valid); until the renewal ends
    /// ([`settle_late`](Self::settle_late) or [`renewal_ended`](Self::renewal_ended)), requests
    /// of the key are told [`FromLease::Stalled`] once it is overdue.
    pub fn request_gave_up(&self, key: &LeaseKey, ask: &Ask, now: u64) {
        let (_, mut shard) = self.map.lock_key(key);
        if let Some(entry) = shard.get_mut(key) {
            if now < entry.expires_at {
                entry.left += ask.held;
            }
        }
    }

    /// The renewal ended without a usable answer (the connection failed): waiters are
    /// released and the next request asks again.
    pub fn renewal_ended(&self, key: &LeaseKey) {
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
        if !entry.same_windows(grant) || now >= entry.expires_at {
            // What is left of the old lease belongs to its window: given back with the next
            // renewal.
            entry.lapse();
        }
        entry.take_windows(grant, ask.sent_at);
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
mod tests;
