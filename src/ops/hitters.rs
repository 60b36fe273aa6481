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

    /// What a key not held may have been seen at most: the smallest count held once every
    /// counter is taken, 0 before.
    pub fn floor(&self) -> u64 {
        match self.held.len() == self.capacity {
            true => self.held.iter().map(|h| h.count).min().unwrap_or(0),
            false => 0,
        }
    }

    /// The `n` keys counted most, with the bound on every other key.
    pub fn summary(&self, n: usize) -> Summary {
        Summary {
            total: self.total,
            floor: self.floor(),
            top: self.held.clone(),
        }
        .truncated(n)
    }

    /// Forgets everything (a new window).
    pub fn clear(&mut self) {
        self.held.clear();
        self.total = 0;
    }
}

/// The most frequent keys of one stream, or of several merged: every key listed with its
/// count (at most `error` above the truth), every key not listed seen at most `floor` times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub total: u64,
    pub floor: u64,
    pub top: Vec<Hitter>,
}

impl Summary {
    /// The `n` keys counted most, most first; the floor rises to the last one kept when
    /// any is cut.
    pub fn truncated(mut self, n: usize) -> Summary {
        self.top
            .sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        if self.top.len() > n {
            self.top.truncate(n);
            let last = self.top.last().map_or(self.floor, |h| h.count);
            self.floor = self.floor.max(last);
        }
        self
    }
}

/// Summaries of several streams (instances, or one instance's windows) as one, keeping both
/// bounds (Agarwal et al., "Mergeable summaries", 2012): a key missing from a summary may
/// have been seen there up to its floor, so the floor is added to the key's count and to its
/// error. Then `count - error <= truth <= count` for every key listed, and every key not
/// listed was seen at most the merged `floor` (the sum of floors) times.
///
/// One pass over the entries: a key's count is the sum of every floor, plus, where it is
/// listed, how far its count there stands above that summary's floor (likewise its error).
pub fn merge(summaries: &[Summary], n: usize) -> Summary {
    let floor: u64 = summaries.iter().map(|s| s.floor).sum();
    // Key → (count − floor, error − floor) summed over the summaries listing it.
    let mut above: std::collections::HashMap<&str, (i128, i128)> = Default::default();
    for s in summaries {
        for h in &s.top {
            let entry = above.entry(h.key.as_str()).or_default();
            entry.0 += i128::from(h.count) - i128::from(s.floor);
            entry.1 += i128::from(h.error) - i128::from(s.floor);
        }
    }
    let at_least_zero = |v: i128| u64::try_from(v.max(0)).unwrap_or(u64::MAX);
    let top = above
        .into_iter()
        .map(|(key, (count, error))| Hitter {
            key: key.to_owned(),
            count: at_least_zero(i128::from(floor) + count),
            error: at_least_zero(i128::from(floor) + error),
        })
        .collect();
    Summary {
        total: summaries.iter().map(|s| s.total).sum(),
        floor,
        top,
    }
    .truncated(n)
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
        let top = s.summary(2).top;
        assert_eq!(top.len(), 2);
        let keys: Vec<&str> = top.iter().map(|h| h.key.as_str()).collect();
        assert!(
            keys.contains(&"heavy-a") && keys.contains(&"heavy-b"),
            "{top:?}"
        );
        let bound = s.summary(1).total / 8;
        for h in s.summary(8).top {
            let real = truth[&h.key];
            assert!(
                h.count >= real && h.count - real <= h.error,
                "{h:?} real {real}"
            );
            assert!(h.error <= bound, "{h:?} over N/k = {bound}");
        }
    }

    /// Three streams (three instances) summarised apart and merged: every listed key's
    /// truth lies in [count - error, count], every key not listed is under the floor.
    #[test]
    fn merged_summaries_keep_both_bounds() {
        let mut truth = std::collections::HashMap::<String, u64>::new();
        let mut parts = Vec::new();
        for stream in 0..3u64 {
            let mut s = SpaceSaving::new(8);
            let mut x = 7 + stream;
            for i in 0..3_000u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = match i % 3 {
                    0 => format!("heavy-{}", (x >> 60) % 3),
                    _ => format!("light-{}", (x >> 33) % 500),
                };
                s.add(&key);
                *truth.entry(key).or_default() += 1;
            }
            parts.push(s.summary(6));
        }
        let merged = merge(&parts, 5);
        assert_eq!(merged.total, 9_000);
        assert_eq!(merged.top.len(), 5);
        for h in &merged.top {
            let real = truth[&h.key];
            assert!(
                h.count >= real && h.count - h.error <= real,
                "{h:?} real {real}"
            );
        }
        for (key, real) in &truth {
            if !merged.top.iter().any(|h| &h.key == key) {
                assert!(*real <= merged.floor, "{key} {real} > {}", merged.floor);
            }
        }
        let heavy: Vec<&str> = merged.top.iter().take(3).map(|h| h.key.as_str()).collect();
        assert!(heavy.iter().all(|k| k.starts_with("heavy")), "{merged:?}");
        // A summary that never filled has floor 0: a key it lacks adds nothing.
        let mut a = SpaceSaving::new(4);
        a.add("x");
        let mut b = SpaceSaving::new(4);
        b.add("y");
        let m = merge(&[a.summary(4), b.summary(4)], 4);
        assert_eq!(
            m.top.iter().map(|h| (h.count, h.error)).collect::<Vec<_>>(),
            [(1, 0), (1, 0)]
        );
    }

    #[test]
    fn a_cleared_summary_starts_again() {
        let mut s = SpaceSaving::new(2);
        s.add("a");
        s.clear();
        assert_eq!((s.summary(1).total, s.summary(5).top.len()), (0, 0));
    }
}
