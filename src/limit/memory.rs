//! The embedded store (`store.kind = "memory"`): per-(client, route) limiter state in this
//! process. Exact for one gateway instance; with several instances each keeps its own counts
//! (which is what the Redis store exists to fix).
//!
//! All policies of one request are evaluated under one shard lock and committed only if all
//! admit the request, so a limit that rejects never burns tokens of the others. State is
//! keyed by the full policy definition: a policy whose definition changed starts fresh, an
//! unchanged one keeps its counts. Client ids come from the configuration, so the number of
//! keys is bounded by clients × routes; idle state is swept.

use super::algorithm::State;
use super::sharded::Sharded;
use super::{Decision, Policy, Verdict};
use crate::clock::Clock;
use std::sync::Arc;

type Key = (Arc<str>, Arc<str>);

struct Slot {
    policy: Policy,
    state: State,
}

pub struct MemoryStore<C: Clock> {
    clock: C,
    table: Sharded<Key, Vec<Slot>>,
}

impl<C: Clock> MemoryStore<C> {
    pub fn new(clock: C) -> MemoryStore<C> {
        MemoryStore {
            clock,
            table: Sharded::new(Sharded::<Key, Vec<Slot>>::default_shards()),
        }
    }

    /// Evaluates `policies` for one request of `cost` by `client` on `route`, at `now_ms` or
    /// the store's clock.
    pub fn check(
        &self,
        client: &Arc<str>,
        route: &Arc<str>,
        policies: &[Policy],
        cost: u64,
        now_ms: Option<u64>,
    ) -> Verdict {
        let now = now_ms.unwrap_or_else(|| self.clock.now_ms());
        let key = (Arc::clone(client), Arc::clone(route));
        let (_, mut shard) = self.table.lock_key(&key);
        let slots = shard.get(&key);
        let mut decisions: Vec<Decision> = Vec::with_capacity(policies.len());
        let mut next: Vec<Slot> = Vec::with_capacity(policies.len());
        for policy in policies {
            let current = slots
                .and_then(|s| s.iter().find(|slot| slot.policy == *policy))
                .map(|slot| &slot.state);
            let fresh;
            let state = match current {
                Some(state) => state,
                None => {
                    fresh = State::new(policy);
                    &fresh
                }
            };
            let (decision, state) = state.decide(policy, now, cost);
            decisions.push(decision);
            next.push(Slot {
                policy: policy.clone(),
                state,
            });
        }
        let mut verdict = Verdict { decisions };
        if verdict.allowed() {
            shard.insert(key, next);
        } else {
            // Nothing is committed: policies that would have admitted the request report
            // their state as it stays (the same decision at cost 0).
            for (decision, policy) in verdict.decisions.iter_mut().zip(policies) {
                if decision.allowed {
                    let current = slots
                        .and_then(|s| s.iter().find(|slot| slot.policy == *policy))
                        .map_or_else(|| State::new(policy), |slot| slot.state.clone());
                    *decision = current.decide(policy, now, 0).0;
                }
            }
        }
        verdict
    }

    /// Drops state that no longer affects any decision; returns how many keys were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_ms();
        self.table
            .retain(|_, slots| !slots.iter().all(|s| s.state.is_idle(&s.policy, now)))
    }

    /// Number of (client, route) keys held.
    pub fn keys(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limit::Algorithm;

    const T0: u64 = 1 << 40;

    fn store() -> MemoryStore<Arc<ManualClock>> {
        MemoryStore::new(Arc::new(ManualClock::new(T0)))
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
            assert!(s.check(&c, &r, &policies, 1, None).allowed());
        }
        let v = s.check(&c, &r, &policies, 1, None);
        assert!(!v.allowed());
        assert!(v.decisions[0].allowed && !v.decisions[1].allowed);
        // It reports the per-second bucket as it stays (7 tokens), and burnt none of them.
        assert_eq!(v.decisions[0].remaining, 7);
        let v = s.check(&c, &r, &policies[..1], 1, None);
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
        assert!(s.check(&a, &r1, &p, 1, None).allowed());
        assert!(!s.check(&a, &r1, &p, 1, None).allowed());
        assert!(s.check(&b, &r1, &p, 1, None).allowed());
        assert!(s.check(&a, &r2, &p, 1, None).allowed());
    }

    #[test]
    fn a_changed_policy_starts_fresh_and_sweep_drops_idle_keys() {
        let clock = Arc::new(ManualClock::new(T0));
        let s = MemoryStore::new(Arc::clone(&clock));
        let (c, r) = (Arc::from("c"), Arc::from("r"));
        let old = [Policy::new("p", Algorithm::FixedWindow, 1, 1000, 1)];
        let new = [Policy::new("p", Algorithm::FixedWindow, 2, 1000, 2)];
        assert!(s.check(&c, &r, &old, 1, None).allowed());
        assert!(!s.check(&c, &r, &old, 1, None).allowed());
        assert!(s.check(&c, &r, &new, 1, None).allowed());
        assert_eq!(s.sweep(), 0);
        clock.advance(1000);
        assert_eq!(s.sweep(), 1);
        assert_eq!(s.keys(), 0);
    }
}
