//! The most frequent keys of a stream in fixed memory: the Space-Saving summary (Metwally,
//! Agrawal, El Abbadi, 2005). It keeps `capacity` counters; a key not held replaces the one
//! with the smallest count and inherits that count as its possible overcount. Every key seen
//! more than `total / capacity` times is held, and a held key's count is at most its `error`
//! above the truth. Pure: no clock, no lock.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hitter {
    pub key: String,
    /// Times seen (an upper bound: at most `error` more than the truth).
    pub count: u64,
    /// How much of `count` may belong to the keys it replaced.
    pub error: u64,
}

#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    held: Vec<Hitter>,
    total: u64,
}

impl SpaceSaving {
    pub fn new(capacity: usize) -> SpaceSaving {
        SpaceSaving {
            capacity: capacity.max(1),
            held: Vec::with_capacity(capacity.max(1)),
            total: 0,
        }
    }

    /// Counts one occurrence of `key`.
    pub fn add(&mut self, key: &str) {
        self.total += 1;
        if let Some(h) = self.held.iter_mut().find(|h| h.key == key) {
            h.count += 1;
            return;
        }
        if self.held.len() < self.capacity {
            self.held.push(Hitter {
                key: key.to_owned(),
                count: 1,
                error: 0,
            });
            return;
        }
        if let Some(min) = self.held.iter_mut().min_by_key(|h| h.count) {
            let floor = min.count;
            min.key.clear();
            min.key.push_str(key);
            min.count = floor + 1;
            min.error = floor;
        }
    }

    /// Occurrences counted in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The `n` keys counted most, most first.
    pub fn top(&self, n: usize) -> Vec<Hitter> {
        let mut held = self.held.clone();
        held.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        held.truncate(n);
        held
    }

    /// Forgets everything (a new window).
    pub fn clear(&mut self) {
        self.held.clear();
        self.total = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_keys_are_held_among_many_light_ones_within_the_stated_error() {
        let mut s = SpaceSaving::new(8);
        let mut truth = std::collections::HashMap::new();
        // Two heavy keys in a stream of 2 000 distinct light ones.
        for i in 0..2_000u32 {
            for key in [format!("light-{i}"), "heavy-a".into(), "heavy-b".into()] {
                if i % 2 == 0 || key.starts_with("light") {
                    s.add(&key);
                    *truth.entry(key).or_insert(0u64) += 1;
                }
            }
        }
        let top = s.top(2);
        assert_eq!(top.len(), 2);
        let keys: Vec<&str> = top.iter().map(|h| h.key.as_str()).collect();
        assert!(
            keys.contains(&"heavy-a") && keys.contains(&"heavy-b"),
            "{top:?}"
        );
        let bound = s.total() / 8;
        for h in s.top(8) {
            let real = truth[&h.key];
            assert!(
                h.count >= real && h.count - real <= h.error,
                "{h:?} real {real}"
            );
            assert!(h.error <= bound, "{h:?} over N/k = {bound}");
        }
    }

    #[test]
    fn a_cleared_summary_starts_again() {
        let mut s = SpaceSaving::new(2);
        s.add("a");
        s.clear();
        assert_eq!((s.total(), s.top(5).len()), (0, 0));
    }
}
