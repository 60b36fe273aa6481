//! The embedded store (`store.kind = "memory"`): limiter state in this process. Exact for one
//! gateway instance; with several instances each keeps its own counts (which is what the
//! Redis store exists to fix).
//!
//! All policies of one request are decided together and committed only if every enforced
//! policy admits the request (a shadow policy never blocks; it is committed only where it
//! would have admitted). Rate-limit state is keyed by (client, route) and the full policy
//! definition: a changed definition starts fresh, an unchanged one keeps its counts. Client
//! ids come from the configuration, so their keys are bounded by clients × routes; idle state
//! is swept. Concurrency counts live in one small table (one lock, taken before a shard's),
//! incremented on admission and decremented by [`MemoryStore::release`].
//!
//! **Keyed limits' keys are capped** (`server.max_tracked_keys`, split evenly over the
//! shards), like the per-IP table: their values come from requests (one key per username). A
//! key is never evicted while its state matters (only the sweep drops state that decides like
//! none); a new key arriving at a full shard is decided on that shard's *overflow* state
//! instead (same limit), shared by every key the shard cannot take. So a flood of distinct
//! keys can neither grow memory nor get anyone a fresh count: it competes with itself, and an
//! account already being limited stays limited.

use crate::clock::Clock;
use crate::limit::algorithm::Concurrency;
use crate::limit::algorithm::State;
use crate::limit::sharded::{LockedMany, Sharded};
use crate::limit::store::request::CheckRequest;
use crate::limit::store::request::Partition;
use crate::limit::store::together::{decide, Times};
use crate::limit::{Policy, Scope, Verdict};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

type Key = (Arc<str>, Arc<str>);

/// Keyed partitions tracked unless told otherwise (`server.max_tracked_keys`).
pub const DEFAULT_MAX_KEYED: usize = 100_000;

/// The route segment of a client-wide (all routes) concurrency count.
const ALL_ROUTES: &str = "*";

struct Slot {
    policy: Policy,
    state: State,
}

/// (client, route or "*", policy name): one concurrency limit's counter.
type SlotKey = (Arc<str>, Arc<str>, Arc<str>);

pub struct MemoryStore<C: Clock> {
    clock: C,
    table: Sharded<Key, Vec<Slot>>,
    /// Keyed partitions a shard takes before new ones go to its overflow partition.
    keyed_per_shard: AtomicUsize,
    /// Shard `i`'s overflow partition name (no keyed partition looks like it).
    overflow: Box<[Arc<str>]>,
    /// (client, route or "*", policy name) → requests in flight.
    in_flight: Mutex<HashMap<SlotKey, u64>>,
}

fn scope_route(policy: &Policy, route: &Arc<str>) -> Arc<str> {
    match policy.scope {
        Scope::Route => Arc::clone(route),
        Scope::Client => Arc::from(ALL_ROUTES),
    }
}

impl<C: Clock> MemoryStore<C> {
    pub fn new(clock: C) -> MemoryStore<C> {
        let table = Sharded::new(Sharded::<Key, Vec<Slot>>::default_shards());
        let overflow = (0..table.shard_count())
            .map(|i| Arc::from(format!("~overflow:{i}")))
            .collect();
        let store = MemoryStore {
            clock,
            table,
            keyed_per_shard: AtomicUsize::new(0),
            overflow,
            in_flight: Mutex::new(HashMap::new()),
        };
        store.set_max_keyed(DEFAULT_MAX_KEYED);
        store
    }

    /// At most about `max` keyed partitions are tracked (split evenly over the shards).
    pub fn set_max_keyed(&self, max: usize) {
        let per_shard = max.div_ceil(self.table.shard_count()).max(1);
        self.keyed_per_shard.store(per_shard, Ordering::Relaxed);
    }

    /// The most keyed partitions tracked (the cap rounded to whole shards).
    pub fn max_keyed(&self) -> usize {
        self.keyed_per_shard.load(Ordering::Relaxed) * self.table.shard_count()
    }

    /// Decides one request against its policies (`shadow[i]`: policy `i` never blocks), at
    /// the time it asks for (normally this store's clock). Policies of several partitions
    /// (plan limits and keyed limits) are decided under all their locks at once: the state
    /// each policy reads ([`touched`](Self::touched)), the decision ([`decide`], pure), and —
    /// only if every enforced policy admits — the new state written back
    /// ([`commit`](Self::commit)), as `check.lua` does in Redis.
    pub fn check(&self, req: &CheckRequest<'_>) -> Verdict {
        let now = req.at.resolve(|| self.clock.now_ms());
        let has_concurrency = req.policies.iter().any(Policy::is_concurrency);
        // Lock order: the in-flight table, then the shards (in index order).
        let mut in_flight = has_concurrency.then(|| {
            self.in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        });
        let (keys, owners, overflow_of) = self.touched(req);
        let mut locked = self.table.lock_many(&keys);
        let owner = self.place(&locked, &keys, owners, &overflow_of);
        let before: Vec<State> = req
            .policies
            .iter()
            .enumerate()
            .map(|(i, policy)| {
                if policy.is_concurrency() {
                    let n = in_flight
                        .as_ref()
                        .and_then(|t| t.get(&slot_key(req.client, req.route, policy)))
                        .copied()
                        .unwrap_or(0);
                    return State::Concurrency(Concurrency { in_flight: n });
                }
                locked
                    .get(owner[i], &keys[owner[i]])
                    .and_then(|s| s.iter().find(|slot| slot.policy == *policy))
                    .map_or_else(|| State::new(policy), |slot| slot.state.clone())
            })
            .collect();
        let unix = match req.at {
            // A test's explicit time is the time on every calendar too.
            crate::limit::store::request::DecideAt::Fixed(ms) => ms,
            _ => self.clock.to_unix_ms(now),
        };
        let (admitted, decisions, next) = decide(req, &before, Times { now, unix });
        if admitted {
            let commit = Commit {
                req,
                keys: &keys,
                owner: &owner,
            };
            commit.write(&mut locked, in_flight.as_deref_mut(), next);
        }
        Verdict {
            admitted,
            decisions,
            at_ms: now,
            from_lease: false,
        }
    }

    /// The (partition, route) keys a request touches, the index of each policy's key, and
    /// for each keyed partition the index of its shard's overflow partition (locked with it,
    /// in case the shard is full).
    fn touched(&self, req: &CheckRequest<'_>) -> (Vec<Key>, Vec<usize>, Vec<Option<usize>>) {
        let mut keys: Vec<Key> = Vec::with_capacity(1);
        let owner: Vec<usize> = (0..req.policies.len())
            .map(|i| {
                let key = (Arc::clone(req.partition_of(i)), Arc::clone(req.route));
                match keys.iter().position(|k| *k == key) {
                    Some(at) => at,
                    None => {
                        keys.push(key);
                        keys.len() - 1
                    }
                }
            })
            .collect();
        let mut overflow_of: Vec<Option<usize>> = vec![None; keys.len()];
        for (k, overflow) in overflow_of.iter_mut().enumerate() {
            let first = owner
                .iter()
                .position(|o| *o == k)
                .expect("every key has a policy");
            if matches!(req.partitions.get(first), Some(Partition::Keyed(_))) {
                let shard = self.table.shard_index(&keys[k]);
                keys.push((Arc::clone(&self.overflow[shard]), Arc::clone(req.route)));
                *overflow = Some(keys.len() - 1);
            }
        }
        (keys, owner, overflow_of)
    }

    /// Each policy's key, a new keyed partition arriving at a full shard moved to the
    /// shard's overflow partition.
    fn place(
        &self,
        locked: &LockedMany<'_, Key, Vec<Slot>>,
        keys: &[Key],
        mut owner: Vec<usize>,
        overflow_of: &[Option<usize>],
    ) -> Vec<usize> {
        let per_shard = self.keyed_per_shard.load(Ordering::Relaxed);
        for (k, overflow) in overflow_of.iter().enumerate() {
            let Some(overflow) = *overflow else { continue };
            if locked.get(k, &keys[k]).is_none() && locked.shard_len(k) >= per_shard {
                owner
                    .iter_mut()
                    .filter(|o| **o == k)
                    .for_each(|o| *o = overflow);
            }
        }
        owner
    }

    /// Gives back what `req` counted at `at` (a request admitted and then not served): the
    /// undo of [`State::refund`] on each of its rate policies' state, if still held (what a
    /// request counted on an overflow partition stays counted).
    pub fn refund(&self, req: &CheckRequest<'_>, at: u64) {
        let keys: Vec<Key> = (0..req.policies.len())
            .map(|i| (Arc::clone(req.partition_of(i)), Arc::clone(req.route)))
            .collect();
        let mut locked = self.table.lock_many(&keys);
        for (i, policy) in req.policies.iter().enumerate() {
            if policy.is_concurrency() {
                continue;
            }
            let Some(slots) = locked.get_mut(i, &keys[i]) else {
                continue;
            };
            if let Some(slot) = slots.iter_mut().find(|s| s.policy == *policy) {
                let at = match policy.calendar() {
                    Some(_) => self.clock.to_unix_ms(at),
                    None => at,
                };
                let wait = req.waits.get(i).copied().unwrap_or(0);
                slot.state.refund(policy, at, req.cost_of(i), wait);
            }
        }
    }

    /// Charges `deltas` (policy index, units) of a request admitted at `at`, now (the
    /// request's time): `State::charge`, under the same locks and placement as a decision.
    pub fn charge(&self, req: &CheckRequest<'_>, at: u64, deltas: &[(usize, i64)]) {
        let charged: Vec<(usize, i64)> = deltas
            .iter()
            .copied()
            .filter(|(i, d)| *d != 0 && req.policies.get(*i).is_some_and(|p| !p.is_concurrency()))
            .collect();
        if charged.is_empty() {
            return;
        }
        let policies: Vec<Policy> = charged
            .iter()
            .map(|(i, _)| req.policies[*i].clone())
            .collect();
        let partitions: Vec<Partition> = charged
            .iter()
            .map(|(i, _)| req.partitions.get(*i).cloned().unwrap_or(Partition::Client))
            .collect();
        let sub = CheckRequest {
            policies: &policies,
            partitions: &partitions,
            shadow: &[],
            costs: &[],
            ..*req
        };
        let now = sub.at.resolve(|| self.clock.now_ms());
        let fixed = matches!(sub.at, crate::limit::store::request::DecideAt::Fixed(_));
        let unix = |t: u64| if fixed { t } else { self.clock.to_unix_ms(t) };
        let (keys, owners, overflow_of) = self.touched(&sub);
        let mut locked = self.table.lock_many(&keys);
        let owner = self.place(&locked, &keys, owners, &overflow_of);
        let next: Vec<State> = policies
            .iter()
            .zip(&charged)
            .enumerate()
            .map(|(j, (policy, (_, delta)))| {
                let mut state = locked
                    .get(owner[j], &keys[owner[j]])
                    .and_then(|s| s.iter().find(|slot| slot.policy == *policy))
                    .map_or_else(|| State::new(policy), |slot| slot.state.clone());
                let (at, now) = match policy.calendar() {
                    Some(_) => (unix(at), unix(now)),
                    None => (at, now),
                };
                state.charge(policy, at, now, *delta);
                state
            })
            .collect();
        let commit = Commit {
            req: &sub,
            keys: &keys,
            owner: &owner,
        };
        commit.write(&mut locked, None, next);
    }

    /// A request admitted with these concurrency policies ended: free its slots.
    pub fn release(&self, client: &Arc<str>, route: &Arc<str>, policies: &[Policy]) {
        let mut table = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for policy in policies.iter().filter(|p| p.is_concurrency()) {
            let key = slot_key(client, route, policy);
            if let Some(n) = table.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    table.remove(&key);
                }
            }
        }
    }

    /// Drops state that no longer affects any decision; returns how many keys were dropped.
    pub fn sweep(&self) -> usize {
        let times = Times::of(&self.clock);
        self.table.retain(|_, slots| {
            !slots
                .iter()
                .all(|s| s.state.is_idle(&s.policy, times.for_policy(&s.policy)))
        })
    }

    /// Number of (client, route) keys held, plus clients with requests in flight.
    pub fn keys(&self) -> usize {
        self.table.len()
            + self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
    }
}

/// Where an admitted request's new states go.
struct Commit<'r, 'a> {
    req: &'r CheckRequest<'a>,
    keys: &'r [Key],
    /// `owner[i]`: the index in `keys` of policy i's key.
    owner: &'r [usize],
}

impl Commit<'_, '_> {
    fn write(
        &self,
        locked: &mut LockedMany<'_, Key, Vec<Slot>>,
        mut in_flight: Option<&mut HashMap<SlotKey, u64>>,
        next: Vec<State>,
    ) {
        for (i, (policy, state)) in self.req.policies.iter().zip(next).enumerate() {
            match state {
                State::Concurrency(c) => {
                    if let Some(table) = in_flight.as_mut() {
                        table.insert(
                            slot_key(self.req.client, self.req.route, policy),
                            c.in_flight,
                        );
                    }
                }
                state => {
                    let k = self.owner[i];
                    match locked.get_mut(k, &self.keys[k]) {
                        Some(slots) => match slots.iter_mut().find(|s| s.policy == *policy) {
                            Some(slot) => slot.state = state,
                            None => slots.push(Slot {
                                policy: policy.clone(),
                                state,
                            }),
                        },
                        None => locked.insert(
                            k,
                            self.keys[k].clone(),
                            vec![Slot {
                                policy: policy.clone(),
                                state,
                            }],
                        ),
                    }
                }
            }
        }
    }
}

/// A concurrency limit's counter: (client, route or "*", policy name).
fn slot_key(client: &Arc<str>, route: &Arc<str>, policy: &Policy) -> SlotKey {
    (
        Arc::clone(client),
        scope_route(policy, route),
        Arc::clone(&policy.name),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::store::request::Counted;

    fn ask<C: Clock>(
        s: &MemoryStore<C>,
        client: &Arc<str>,
        route: &Arc<str>,
        policies: &[Policy],
        shadow: &[bool],
    ) -> Verdict {
        s.check(&CheckRequest {
            shadow,
            ..CheckRequest::new(client, route, policies, 1)
        })
    }
    use crate::clock::ManualClock;
    use crate::limit::Algorithm;

    const T0: u64 = 1 << 40;

    fn store() -> MemoryStore<Arc<ManualClock>> {
        MemoryStore::new(Arc::new(ManualClock::new(T0)))
    }

    #[test]
    fn a_refund_gives_back_exactly_what_the_request_took() {
        let s = store();
        let c: Arc<str> = Arc::from("ada");
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ] {
            let policies = [Policy::new("p", algorithm, 3, 60_000, 3)];
            let route: Arc<str> = Arc::from(format!("orders-{algorithm:?}"));
            let first = ask(&s, &c, &route, &policies, &[]);
            let second = ask(&s, &c, &route, &policies, &[]);
            assert_eq!(second.decisions[0].remaining, 1, "{algorithm:?}");
            let taken = Counted::of(
                &CheckRequest::new(&c, &route, &policies, 1),
                &policies,
                &second,
                false,
            )
            .unwrap();
            s.refund(&taken.request(), taken.at_ms);
            let third = ask(&s, &c, &route, &policies, &[]);
            assert_eq!(third.decisions[0].remaining, 1, "{algorithm:?}");
            assert!(first.admitted && third.admitted);
            // The limit holds again at three.
            assert!(ask(&s, &c, &route, &policies, &[]).admitted);
            assert!(
                !ask(&s, &c, &route, &policies, &[]).admitted,
                "{algorithm:?}"
            );
        }
    }

    #[test]
    fn several_limits_commit_only_if_all_allow() {
        let s = store();
        let (c, r) = (Arc::from("ada"), Arc::from("orders"));
        let policies = [
            Policy::new("per-second", Algorithm::TokenBucket, 10, 1000, 10),
            Policy::new("per-minute", Algorithm::FixedWindow, 3, 60_000, 3),
        ];
        for _ in 0..3 {
            assert!(ask(&s, &c, &r, &policies, &[]).admitted);
        }
        let v = ask(&s, &c, &r, &policies, &[]);
        assert!(!v.admitted);
        assert!(v.decisions[0].allowed && !v.decisions[1].allowed);
        // It reports the per-second bucket as it stays (7 tokens), and burnt none of them.
        assert_eq!(v.decisions[0].remaining, 7);
        let v = ask(&s, &c, &r, &policies[..1], &[]);
        assert_eq!(v.decisions[0].remaining, 6);
    }

    #[test]
    fn clients_and_routes_are_independent() {
        let s = store();
        let p = [Policy::new("p", Algorithm::FixedWindow, 1, 1000, 1)];
        let (a, b, r1, r2) = (
            Arc::from("a"),
            Arc::from("b"),
            Arc::from("r1"),
            Arc::from("r2"),
        );
        assert!(ask(&s, &a, &r1, &p, &[]).admitted);
        assert!(!ask(&s, &a, &r1, &p, &[]).admitted);
        assert!(ask(&s, &b, &r1, &p, &[]).admitted);
        assert!(ask(&s, &a, &r2, &p, &[]).admitted);
    }

    #[test]
    fn a_changed_policy_starts_fresh_and_sweep_drops_idle_keys() {
        let clock = Arc::new(ManualClock::new(T0));
        let s = MemoryStore::new(Arc::clone(&clock));
        let (c, r) = (Arc::from("c"), Arc::from("r"));
        let old = [Policy::new("p", Algorithm::FixedWindow, 1, 1000, 1)];
        let new = [Policy::new("p", Algorithm::FixedWindow, 2, 1000, 2)];
        assert!(ask(&s, &c, &r, &old, &[]).admitted);
        assert!(!ask(&s, &c, &r, &old, &[]).admitted);
        assert!(ask(&s, &c, &r, &new, &[]).admitted);
        assert_eq!(s.sweep(), 0);
        clock.advance(1000);
        assert_eq!(s.sweep(), 1);
        assert_eq!(s.keys(), 0);
    }

    #[test]
    fn shadow_policies_decide_and_count_but_never_block() {
        let s = store();
        let (c, r) = (Arc::from("c"), Arc::from("r"));
        let p = [
            Policy::new("enforced", Algorithm::FixedWindow, 10, 60_000, 10),
            Policy::new("trial", Algorithm::FixedWindow, 2, 60_000, 2),
        ];
        let shadow = [false, true];
        let verdicts: Vec<Verdict> = (0..4).map(|_| ask(&s, &c, &r, &p, &shadow)).collect();
        assert!(verdicts.iter().all(|v| v.admitted), "shadow never blocks");
        let trial: Vec<bool> = verdicts.iter().map(|v| v.decisions[1].allowed).collect();
        assert_eq!(
            trial,
            [true, true, false, false],
            "but it decides as if enforced"
        );
        // The enforced limit counted all four; the shadow one only what it would have let in.
        let v = ask(&s, &c, &r, &p, &shadow);
        assert_eq!(v.decisions[0].remaining, 5);
        assert_eq!(v.decisions[1].remaining, 0);
    }

    #[test]
    fn concurrency_slots_are_taken_and_released_across_routes() {
        let s = store();
        let c = Arc::from("c");
        let (r1, r2) = (Arc::from("r1"), Arc::from("r2"));
        let p = [Policy::concurrency("concurrency", 2, 60_000, Scope::Client).unwrap()];
        assert!(ask(&s, &c, &r1, &p, &[]).admitted);
        assert!(ask(&s, &c, &r2, &p, &[]).admitted);
        let third = ask(&s, &c, &r1, &p, &[]);
        assert!(!third.admitted);
        assert_eq!(third.decisions[0].retry_after_ms, 1000);
        s.release(&c, &r2, &p);
        assert!(ask(&s, &c, &r1, &p, &[]).admitted);
        // A rate limit rejecting the request does not take a slot.
        let mixed = [
            p[0].clone(),
            Policy::new("rate", Algorithm::FixedWindow, 1, 60_000, 1),
        ];
        s.release(&c, &r1, &p);
        s.release(&c, &r1, &p);
        assert!(ask(&s, &c, &r1, &mixed, &[]).admitted);
        assert!(!ask(&s, &c, &r1, &mixed, &[]).admitted);
        assert!(
            ask(&s, &c, &r2, &p, &[]).admitted,
            "the refused request held no slot"
        );
    }

    #[test]
    fn a_flood_of_keys_neither_grows_the_table_nor_gets_a_fresh_count() {
        let clock = Arc::new(ManualClock::new(T0));
        let s = MemoryStore::new(Arc::clone(&clock));
        s.set_max_keyed(64);
        let max = s.max_keyed();
        let (client, route) = (Arc::from("login"), Arc::from("login"));
        let policies = [Policy::new(
            "per-account",
            Algorithm::FixedWindow,
            2,
            60_000,
            2,
        )];
        let keyed = |key: &str| -> Verdict {
            s.check(&CheckRequest {
                partitions: &[Partition::Keyed(Arc::from(key))],
                ..CheckRequest::new(&client, &route, &policies, 1)
            })
        };
        // The victim's account is limited before the flood.
        assert!(keyed("k:victim").admitted && keyed("k:victim").admitted);
        assert!(!keyed("k:victim").admitted);
        let flood_admitted = (0..10_000)
            .filter(|i| keyed(&format!("k:flood-{i}")).admitted)
            .count();
        let tracked = s.keys();
        assert!(
            tracked <= max + s.table.shard_count(),
            "{tracked} keys for a cap of {max}"
        );
        // Each full shard's newcomers shared its overflow count: far fewer admitted than keys.
        assert!(
            flood_admitted <= max * 2 + s.table.shard_count() * 2,
            "{flood_admitted}"
        );
        assert!(!keyed("k:victim").admitted, "still limited");
        // Once the window has passed, the sweep frees the table and new keys are tracked again.
        clock.advance(60_000);
        assert!(s.sweep() > 0);
        assert!(keyed("k:newcomer").admitted && keyed("k:newcomer").admitted);
        assert!(!keyed("k:newcomer").admitted);
    }
}
