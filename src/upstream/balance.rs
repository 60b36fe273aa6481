//! How a pool spreads requests over its servers: weights, and the two policies.
//!
//! - `round_robin` (the default): Pingora's weighted round robin — a server of weight 3 gets
//!   three turns for every one of a server of weight 1.
//! - `least_request`: power of two choices — two healthy servers drawn at random, the request
//!   goes to the one with fewer requests in flight relative to its weight. It follows load
//!   (a slow server gathers requests in flight and gets fewer new ones) without the herd a
//!   plain "least" causes when every instance sees the same counts.
//!
//! A weight belongs to a configured server (`"host:port weight=N"`): every address its name
//! resolves to, now and after each re-resolution, gets that weight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The largest weight a server may have.
pub const MAX_WEIGHT: u16 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    LeastRequest,
}

/// A server entry as configured: `host:port`, optionally followed by ` weight=N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry<'a> {
    pub address: &'a str,
    pub weight: u16,
}

/// Splits `"host:port weight=N"`; the weight defaults to 1 and is 1 to [`MAX_WEIGHT`].
pub fn server_entry(text: &str) -> Result<ServerEntry<'_>, String> {
    let mut parts = text.split_ascii_whitespace();
    let address = parts.next().ok_or("an empty server")?;
    let mut weight = 1;
    for part in parts {
        let Some(value) = part.strip_prefix("weight=") else {
            return Err(format!(
                "{part:?}: a server is \"host:port\" optionally followed by \"weight=N\""
            ));
        };
        weight = match value.parse::<u16>() {
            Ok(w) if (1..=MAX_WEIGHT).contains(&w) => w,
            _ => return Err(format!("weight {value:?}: expected 1 to {MAX_WEIGHT}")),
        };
    }
    Ok(ServerEntry { address, weight })
}

/// Requests in flight to one server (the least-request policy's load).
#[derive(Debug, Default)]
pub struct Load(AtomicUsize);

impl Load {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// A request in flight to a server: counted while it lives.
#[derive(Debug)]
pub struct InFlight(Arc<Load>);

impl InFlight {
    pub fn start(load: &Arc<Load>) -> InFlight {
        load.0.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(load))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Two distinct indices below `n` (n ≥ 2) from one random number.
pub fn two_of(n: usize, random: u64) -> (usize, usize) {
    let n64 = n as u64;
    let a = (random % n64) as usize;
    let b = ((random / n64) % (n64 - 1)) as usize;
    (a, if b >= a { b + 1 } else { b })
}

/// Whether `a` (in flight, weight) is no busier than `b`, relative to their weights.
pub fn lighter(a: (usize, u16), b: (usize, u16)) -> bool {
    (a.0 as u64) * u64::from(b.1) <= (b.0 as u64) * u64::from(a.1)
}

/// A fast random number per thread (xorshift, seeded from the OS): for picking servers,
/// not for anything secret.
pub fn random() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut seed = [0u8; 8];
            let _ = getrandom::fill(&mut seed);
            u64::from_le_bytes(seed) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_entries_take_an_optional_weight() {
        assert_eq!(
            server_entry("10.0.0.1:80").unwrap(),
            ServerEntry {
                address: "10.0.0.1:80",
                weight: 1
            }
        );
        assert_eq!(server_entry("orders:80  weight=3").unwrap().weight, 3);
        for bad in [
            "",
            "a:1 weight=0",
            "a:1 weight=1001",
            "a:1 weight=x",
            "a:1 max_fails=3",
        ] {
            assert!(server_entry(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn two_of_draws_two_distinct_indices_covering_every_pair() {
        let mut seen = std::collections::HashSet::new();
        for r in 0..10_000u64 {
            let (a, b) = two_of(4, r.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            assert!(a < 4 && b < 4 && a != b);
            seen.insert((a, b));
        }
        assert_eq!(seen.len(), 12, "every ordered pair of 4");
        assert_eq!(two_of(2, 7).0 + two_of(2, 7).1, 1);
    }

    #[test]
    fn lighter_compares_load_per_weight() {
        assert!(lighter((1, 1), (2, 1)));
        assert!(!lighter((3, 1), (2, 1)));
        assert!(lighter((3, 3), (2, 1)), "3 on weight 3 beats 2 on weight 1");
        assert!(lighter((0, 1), (0, 5)));
    }

    #[test]
    fn in_flight_counts_while_it_lives() {
        let load = Arc::new(Load::default());
        let a = InFlight::start(&load);
        let b = InFlight::start(&load);
        assert_eq!(load.get(), 2);
        drop(a);
        drop(b);
        assert_eq!(load.get(), 0);
    }
}
