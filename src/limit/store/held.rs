//! Concurrency slots this instance's requests hold in Redis, kept for as long as each request
//! lasts. A slot lives `concurrency_slot_ttl` (so a crashed instance's slots free themselves);
//! a request still in flight a third of that after its slot was taken or last renewed has it
//! renewed — every such slot of the instance in one `release.lua` call per tick (per client
//! on Redis Cluster, where one call may only touch one hash slot). The renewals' cost grows
//! with instances (and, on a Cluster, clients holding long requests), not with requests.
//!
//! This file is the table (pure: time is an argument); `Store` registers slots in it and
//! runs the renewal loop (`store/mod.rs`).

use crate::limit::Policy;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The concurrency slots one admitted request holds.
pub struct HeldSlot {
    pub client: Arc<str>,
    pub route: Arc<str>,
    /// The request's concurrency policies it holds a slot in.
    pub policies: Vec<Policy>,
    pub slot_id: String,
    /// Admitted by the local fallback: the slots are in this process.
    pub fallback: bool,
}

impl HeldSlot {
    /// The slots' time to live (ms): the longest of its policies'.
    pub fn ttl_ms(&self) -> u64 {
        self.policies
            .iter()
            .map(Policy::window_ms)
            .max()
            .unwrap_or(0)
    }
}

/// Where a request's slots are, until it ends.
pub enum SlotTicket {
    /// In process (memory store, local fallback): nothing to renew.
    Local(HeldSlot),
    /// In Redis, renewed while held: the entry in the store's [`HeldTable`].
    Renewed(u64),
}

/// Shards of the table: requests registering on different threads rarely meet.
const SHARDS: usize = 8;

struct Entry {
    slot: HeldSlot,
    /// When its next renewal is due (the store clock's ms).
    due_ms: u64,
}

/// The Redis slots held by this instance's requests in flight.
#[derive(Default)]
pub struct HeldTable {
    shards: [Mutex<HashMap<u64, Entry>>; SHARDS],
    next_id: AtomicU64,
    /// The renewal loop was started.
    pub(super) renewing: AtomicBool,
}

/// A slot due for renewal: its entry, client (the Cluster hash tag), route, policy, slot id
/// and time to live.
pub struct Due {
    pub id: u64,
    pub client: Arc<str>,
    pub route: Arc<str>,
    pub policy: Policy,
    pub slot_id: String,
    pub ttl_ms: u64,
}

impl HeldTable {
    /// Holds `slot`, taken at `now_ms`; its first renewal is due a third of its TTL later.
    pub fn insert(&self, slot: HeldSlot, now_ms: u64) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let due_ms = now_ms + slot.ttl_ms() / 3;
        self.shard(id).insert(id, Entry { slot, due_ms });
        id
    }

    /// The request ended: its slot, to release.
    pub fn remove(&self, id: u64) -> Option<HeldSlot> {
        self.shard(id).remove(&id).map(|e| e.slot)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shortest time to live held (ms), if any slot is held.
    pub fn shortest_ttl_ms(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter_map(|s| lock(s).values().map(|e| e.slot.ttl_ms()).min())
            .min()
    }

    /// Every slot due for renewal at `now_ms`, one per policy; their next renewal is set a
    /// third of their TTL after `now_ms` (see [`HeldTable::retry`] when it fails).
    pub fn take_due(&self, now_ms: u64) -> Vec<Due> {
        let mut due = Vec::new();
        for shard in &self.shards {
            for (id, entry) in lock(shard).iter_mut() {
                if entry.due_ms > now_ms {
                    continue;
                }
                let ttl_ms = entry.slot.ttl_ms();
                entry.due_ms = now_ms + ttl_ms / 3;
                for policy in &entry.slot.policies {
                    due.push(Due {
                        id: *id,
                        client: Arc::clone(&entry.slot.client),
                        route: Arc::clone(&entry.slot.route),
                        policy: policy.clone(),
                        slot_id: entry.slot.slot_id.clone(),
                        ttl_ms,
                    });
                }
            }
        }
        due
    }

    /// A renewal of `ids` failed: due again at once (the next tick tries again; a slot is
    /// renewed a third into its life, so two more tries fit before it expires).
    pub fn retry(&self, ids: impl Iterator<Item = u64>, now_ms: u64) {
        for id in ids {
            if let Some(entry) = self.shard(id).get_mut(&id) {
                entry.due_ms = now_ms;
            }
        }
    }

    fn shard(&self, id: u64) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        lock(&self.shards[id as usize % SHARDS])
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a shard leaves plain data behind: keep using it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How often the renewal loop looks for due slots: a sixth of the shortest TTL held (a slot
/// is then renewed between a third and half into its life), between 50 ms and 1 s.
pub fn tick_ms(shortest_ttl_ms: Option<u64>) -> u64 {
    shortest_ttl_ms.map_or(1000, |ttl| (ttl / 6).clamp(50, 1000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    fn slot(id: &str, ttl: u64) -> HeldSlot {
        HeldSlot {
            client: Arc::from("c"),
            route: Arc::from("r"),
            policies: vec![Policy::new("cc", Algorithm::Concurrency, 2, ttl, 2)],
            slot_id: id.to_owned(),
            fallback: false,
        }
    }

    #[test]
    fn a_slot_is_due_a_third_into_its_life_and_again_after_each_renewal() {
        let table = HeldTable::default();
        let a = table.insert(slot("a", 3000), 10_000);
        assert!(table.take_due(10_999).is_empty());
        let due = table.take_due(11_000);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].id, &*due[0].slot_id, due[0].ttl_ms), (a, "a", 3000));
        assert!(table.take_due(11_999).is_empty());
        assert_eq!(table.take_due(12_000).len(), 1);
        // A failed renewal is due again at once.
        table.retry([a].into_iter(), 12_001);
        assert_eq!(table.take_due(12_001).len(), 1);
        // An ended request is no longer renewed.
        assert_eq!(table.remove(a).map(|s| s.slot_id), Some("a".to_owned()));
        assert!(table.take_due(20_000).is_empty());
        assert!(table.is_empty());
    }

    #[test]
    fn many_requests_are_renewed_together_and_the_tick_follows_the_shortest_ttl() {
        let table = HeldTable::default();
        let ids: Vec<u64> = (0..100)
            .map(|i| table.insert(slot(&format!("s{i}"), 60_000), 0))
            .collect();
        table.insert(slot("short", 600), 0);
        assert_eq!(table.shortest_ttl_ms(), Some(600));
        assert_eq!(tick_ms(table.shortest_ttl_ms()), 100);
        assert_eq!(tick_ms(None), 1000);
        assert_eq!(tick_ms(Some(60_000)), 1000);
        assert_eq!(table.take_due(20_000).len(), 101);
        for id in ids {
            table.remove(id);
        }
        assert_eq!(table.len(), 1);
    }
}
