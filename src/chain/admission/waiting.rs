//! Places for the requests leaky buckets hold on this instance: at most `server.max_delayed`
//! at once, and at most `server.max_delayed_per_client` of them for one client — counted both
//! by its identity (the client id, when authenticated) and by its address (grouped as the
//! per-IP bucket groups it) — so one caller, however many keys it makes up, cannot take every
//! place from the others. A request that a leaky bucket may hold takes a place *before* the
//! store counts it, so a full instance refuses without taking anyone's turn; the place is
//! freed at once when the request need not wait, else when it stops waiting.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Places taken on this instance.
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// Places taken per owner (a client id's or an address's hash); an owner with none has no
/// entry, so the table holds at most two entries per place taken.
fn owners() -> &'static Mutex<HashMap<u64, usize>> {
    static OWNERS: OnceLock<Mutex<HashMap<u64, usize>>> = OnceLock::new();
    OWNERS.get_or_init(Mutex::default)
}

fn owners_lock() -> std::sync::MutexGuard<'static, HashMap<u64, usize>> {
    owners().lock().unwrap_or_else(|p| p.into_inner())
}

/// Who a held request belongs to: its client id and its grouped address, each if known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    ids: [Option<u64>; 2],
}

impl Owner {
    pub fn of(client: Option<&str>, ip: Option<u128>) -> Owner {
        static SEED: OnceLock<foldhash::fast::RandomState> = OnceLock::new();
        let seed = SEED.get_or_init(foldhash::fast::RandomState::default);
        // Tagged, so a client id never counts as an address.
        let hash = |tag: u8, value: &dyn Fn(&mut dyn std::hash::Hasher)| {
            let mut h = seed.build_hasher();
            tag.hash(&mut h);
            value(&mut h);
            std::hash::Hasher::finish(&h)
        };
        Owner {
            ids: [
                client.map(|c| hash(0, &|h| h.write(c.as_bytes()))),
                ip.map(|ip| hash(1, &|h| h.write_u128(ip))),
            ],
        }
    }
}

/// Why no place was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Every place on this instance is taken.
    Instance,
    /// The client (by id or address) holds its share already.
    Client,
}

/// One place, freed when dropped.
#[derive(Debug)]
pub struct Place {
    owner: Owner,
}

impl Place {
    /// A place, if fewer than `most` are taken on this instance and fewer than `share` by
    /// each of `owner`'s identities.
    pub fn take(most: usize, share: usize, owner: Owner) -> Result<Place, Full> {
        TAKEN
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < most).then_some(n + 1)
            })
            .map_err(|_| Full::Instance)?;
        let mut table = owners_lock();
        let over = owner
            .ids
            .iter()
            .flatten()
            .any(|id| table.get(id).copied().unwrap_or(0) >= share);
        if over {
            drop(table);
            TAKEN.fetch_sub(1, Ordering::AcqRel);
            return Err(Full::Client);
        }
        for id in owner.ids.iter().flatten() {
            *table.entry(*id).or_insert(0) += 1;
        }
        Ok(Place { owner })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.owner.ids.iter().any(Option::is_some) {
            let mut table = owners_lock();
            for id in self.owner.ids.iter().flatten() {
                if let Some(n) = table.get_mut(id) {
                    *n -= 1;
                    if *n == 0 {
                        table.remove(id);
                    }
                }
            }
        }
        TAKEN.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The default share of one client: a quarter of the places, at least one.
pub fn default_share(most: usize) -> usize {
    (most / 4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_place_beyond_the_most_and_a_dropped_one_is_free_again() {
        // Other tests share the counter: count from what is taken now.
        let base = TAKEN.load(Ordering::Acquire);
        let anyone = Owner::default();
        let a = Place::take(base + 2, usize::MAX, anyone).unwrap();
        let b = Place::take(base + 2, usize::MAX, anyone).unwrap();
        assert_eq!(
            Place::take(base + 2, usize::MAX, anyone).unwrap_err(),
            Full::Instance
        );
        drop(a);
        assert!(Place::take(base + 2, usize::MAX, anyone).is_ok());
        drop(b);
        assert!(Place::take(0, usize::MAX, anyone).is_err());
    }

    #[test]
    fn one_client_holds_its_share_by_id_and_by_address_and_others_still_get_places() {
        let (mallory, mallory_ip) = (Some("mallory-test"), Some(0xdead_0001));
        let by_key = Owner::of(mallory, Some(0xdead_0002));
        let by_ip = Owner::of(Some("mallory-2-test"), mallory_ip);
        let held: Vec<Place> = (0..3)
            .map(|_| Place::take(usize::MAX, 3, by_key).unwrap())
            .collect();
        // The same key from another address, or an anonymous request from an address whose
        // share is full, is refused; everyone else is not.
        assert_eq!(
            Place::take(usize::MAX, 3, Owner::of(mallory, Some(7))).unwrap_err(),
            Full::Client
        );
        let held_ip: Vec<Place> = (0..3)
            .map(|_| Place::take(usize::MAX, 3, by_ip).unwrap())
            .collect();
        assert_eq!(
            Place::take(usize::MAX, 3, Owner::of(None, mallory_ip)).unwrap_err(),
            Full::Client
        );
        let other = Place::take(usize::MAX, 3, Owner::of(Some("alice-test"), Some(9)));
        assert!(other.is_ok());
        drop(held);
        drop(held_ip);
        drop(other);
        assert!(Place::take(usize::MAX, 3, by_key).is_ok());
        assert_eq!(default_share(20), 5);
        assert_eq!(default_share(2), 1);
    }
}
