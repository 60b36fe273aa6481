//! A concurrent hash map split into independently locked shards: no global lock on the hot
//! path, and each lock is held only for one small decision.
//!
//! A key is hashed once, with a randomly seeded hasher (foldhash, seeded per process and per
//! map), and that one hash picks both the shard (high bits) and the slot inside the shard's
//! table, so an attacker choosing keys (client addresses) cannot aim them at one shard or one
//! probe sequence without knowing the seed.

use foldhash::fast::RandomState;
use hashbrown::hash_table::{Entry, HashTable};
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard};

/// Keeps each shard's lock on its own cache lines.
#[repr(align(128))]
struct Shard<K, V>(Mutex<HashTable<(K, V)>>);

pub struct Sharded<K, V> {
    shards: Box<[Shard<K, V>]>,
    mask: u64,
    hasher: RandomState,
}

type ShardGuard<'a, K, V> = MutexGuard<'a, HashTable<(K, V)>>;

/// One shard, locked, positioned on one key's hash.
pub struct Locked<'a, K, V> {
    table: MutexGuard<'a, HashTable<(K, V)>>,
    hash: u64,
    hasher: &'a RandomState,
}

impl<K: Hash + Eq, V> Locked<'_, K, V> {
    pub fn get(&self, key: &K) -> Option<&V> {
        self.table
            .find(self.hash, |(k, _)| k == key)
            .map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.table
            .find_mut(self.hash, |(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Inserts or replaces the value of `key`.
    pub fn insert(&mut self, key: K, value: V) {
        let hasher = self.hasher;
        match self
            .table
            .entry(self.hash, |(k, _)| *k == key, |(k, _)| hasher.hash_one(k))
        {
            Entry::Occupied(mut e) => e.get_mut().1 = value,
            Entry::Vacant(e) => {
                e.insert((key, value));
            }
        }
    }

    /// Entries in this shard.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Keeps this shard's entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.table.retain(|(k, v)| keep(k, v));
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// The shards of several keys, locked together ([`Sharded::lock_many`]); key `i` is the
/// `i`-th key given.
pub struct LockedMany<'a, K, V> {
    /// Each locked shard once, by index.
    guards: Vec<(usize, ShardGuard<'a, K, V>)>,
    /// Shard index and hash of each key given.
    positions: Vec<(usize, u64)>,
    hasher: &'a RandomState,
}

impl<K: Hash + Eq, V> LockedMany<'_, K, V> {
    fn table(&self, i: usize) -> (usize, u64) {
        let (shard, hash) = self.positions[i];
        let slot = self
            .guards
            .iter()
            .position(|(index, _)| *index == shard)
            .expect("every key's shard is locked");
        (slot, hash)
    }

    /// The value of `key`, the `i`-th key given.
    pub fn get(&self, i: usize, key: &K) -> Option<&V> {
        let (slot, hash) = self.table(i);
        self.guards[slot]
            .1
            .find(hash, |(k, _)| k == key)
            .map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, i: usize, key: &K) -> Option<&mut V> {
        let (slot, hash) = self.table(i);
        self.guards[slot]
            .1
            .find_mut(hash, |(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Entries in the shard of the `i`-th key given.
    pub fn shard_len(&self, i: usize) -> usize {
        let (slot, _) = self.table(i);
        self.guards[slot].1.len()
    }

    /// The shard index of the `i`-th key given.
    pub fn shard_of(&self, i: usize) -> usize {
        self.positions[i].0
    }

    /// Inserts or replaces the value of `key`, the `i`-th key given.
    pub fn insert(&mut self, i: usize, key: K, value: V) {
        let (slot, hash) = self.table(i);
        let hasher = self.hasher;
        match self.guards[slot]
            .1
            .entry(hash, |(k, _)| *k == key, |(k, _)| hasher.hash_one(k))
        {
            Entry::Occupied(mut e) => e.get_mut().1 = value,
            Entry::Vacant(e) => {
                e.insert((key, value));
            }
        }
    }
}

impl<K: Hash + Eq, V> Sharded<K, V> {
    /// `shards` is rounded up to a power of two.
    pub fn new(shards: usize) -> Sharded<K, V> {
        let n = shards.max(1).next_power_of_two();
        Sharded {
            shards: (0..n)
                .map(|_| Shard(Mutex::new(HashTable::new())))
                .collect(),
            mask: n as u64 - 1,
            hasher: RandomState::default(),
        }
    }

    /// A shard count suited to this machine: 4 per core, at least 16.
    pub fn default_shards() -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores * 4).max(16)
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Index of the shard holding `key`.
    pub fn shard_index(&self, key: &K) -> usize {
        shard_of(self.hash(key), self.mask)
    }

    /// Locks the shard holding `key`. A poisoned lock (a panic while holding it) is
    /// recovered: the table itself is never left half-updated by our code.
    pub fn lock_key(&self, key: &K) -> (usize, Locked<'_, K, V>) {
        let hash = self.hash(key);
        let index = shard_of(hash, self.mask);
        (
            index,
            Locked {
                table: self.lock_shard(index),
                hash,
                hasher: &self.hasher,
            },
        )
    }

    /// Locks the shards holding every one of `keys` at once (each shard once, in index order,
    /// so that two callers cannot deadlock): a decision over several keys is atomic.
    pub fn lock_many(&self, keys: &[K]) -> LockedMany<'_, K, V> {
        let positions: Vec<(usize, u64)> = keys
            .iter()
            .map(|k| {
                let hash = self.hash(k);
                (shard_of(hash, self.mask), hash)
            })
            .collect();
        let mut indexes: Vec<usize> = positions.iter().map(|(i, _)| *i).collect();
        indexes.sort_unstable();
        indexes.dedup();
        LockedMany {
            guards: indexes
                .into_iter()
                .map(|i| (i, self.lock_shard(i)))
                .collect(),
            positions,
            hasher: &self.hasher,
        }
    }

    fn lock_shard(&self, index: usize) -> MutexGuard<'_, HashTable<(K, V)>> {
        self.shards[index]
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Number of entries (locks each shard in turn; not for the hot path).
    pub fn len(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock_shard(i).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes allocated by the shards' tables (not the fixed-size shard array).
    pub fn allocated_bytes(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock_shard(i).allocation_size())
            .sum()
    }

    /// Keeps the entries for which `keep` is true; returns how many were removed.
    pub fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) -> usize {
        let mut removed = 0;
        for i in 0..self.shards.len() {
            let mut shard = self.lock_shard(i);
            let before = shard.len();
            shard.retain(|(k, v)| keep(k, v));
            removed += before - shard.len();
            if shard.capacity() > 64 && shard.len() < shard.capacity() / 4 {
                let target = shard.len() * 2;
                shard.shrink_to(target, |(k, _)| self.hasher.hash_one(k));
            }
        }
        removed
    }
}

/// The shard of a key hashed to `hash`: every bit of the hash mixed (one multiply) before
/// `mask` picks the shard. Taking a fixed group of the hash's bits was not enough: the fast
/// hasher leaves some bit groups correlated for small integer keys, and with some seeds whole
/// shards stayed empty (1 000 sequential keys over 16 shards, a quarter of them unused).
fn shard_of(hash: u64, mask: u64) -> usize {
    (((hash ^ (hash >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) & mask) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_shards_and_retain_removes() {
        let map: Sharded<u32, u32> = Sharded::new(10);
        assert_eq!(map.shard_count(), 16);
        let mut per_shard = [0usize; 16];
        for k in 0..1000 {
            let (i, mut shard) = map.lock_key(&k);
            assert_eq!(i, map.shard_index(&k));
            shard.insert(k, k);
            per_shard[i] += 1;
        }
        assert_eq!(map.len(), 1000);
        assert!(per_shard.iter().all(|&n| n > 0), "{per_shard:?}");
        assert_eq!(map.retain(|k, _| k % 2 == 0), 500);
        assert_eq!(map.len(), 500);
        let (_, shard) = map.lock_key(&4);
        assert_eq!(shard.get(&4), Some(&4));
        assert_eq!(shard.get(&5), None);
    }

    #[test]
    fn several_keys_are_locked_together_each_shard_once() {
        let map: Sharded<u32, u32> = Sharded::new(4);
        let keys: Vec<u32> = (0..20).collect();
        {
            let mut many = map.lock_many(&keys);
            for (i, k) in keys.iter().enumerate() {
                assert_eq!(many.get(i, k), None);
                many.insert(i, *k, k * 10);
            }
            assert_eq!(many.get(3, &3), Some(&30));
        }
        assert_eq!(map.len(), 20);
        assert_eq!(map.lock_key(&7).1.get(&7), Some(&70));
        // The same key twice is one shard, locked once.
        let many = map.lock_many(&[5, 5]);
        assert_eq!(many.get(1, &5), Some(&50));
    }

    #[test]
    fn insert_replaces() {
        let map: Sharded<u32, &str> = Sharded::new(1);
        map.lock_key(&1).1.insert(1, "a");
        map.lock_key(&1).1.insert(1, "b");
        assert_eq!(map.len(), 1);
        assert_eq!(map.lock_key(&1).1.get(&1), Some(&"b"));
        *map.lock_key(&1).1.get_mut(&1).unwrap() = "c";
        assert_eq!(map.lock_key(&1).1.get(&1), Some(&"c"));
    }
}
