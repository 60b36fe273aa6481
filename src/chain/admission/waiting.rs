//! Places for the requests leaky buckets hold on this instance: at most `server.max_delayed`
//! at once. A request that a leaky bucket may hold takes a place *before* the store counts
//! it, so a full instance refuses without taking anyone's turn; the place is freed at once
//! when the request need not wait, else when it stops waiting.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Places taken on this instance.
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// One place, freed when dropped.
#[derive(Debug)]
pub struct Place(());

impl Place {
    /// A place, if fewer than `most` are taken.
    pub fn take(most: usize) -> Option<Place> {
        TAKEN
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < most).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(()))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        TAKEN.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_place_beyond_the_most_and_a_dropped_one_is_free_again() {
        // Other tests share the counter: count from what is taken now.
        let base = TAKEN.load(Ordering::Acquire);
        let a = Place::take(base + 2).unwrap();
        let b = Place::take(base + 2).unwrap();
        assert!(Place::take(base + 2).is_none());
        drop(a);
        assert!(Place::take(base + 2).is_some());
        drop(b);
        assert!(Place::take(0).is_none());
    }
}
