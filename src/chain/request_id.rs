//! `X-Request-Id`: kept when the client sent a sane one, generated otherwise.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub const HEADER: &str = "x-request-id";
/// [`HEADER`] parsed once (for lookups).
pub static NAME: http::HeaderName = http::HeaderName::from_static(HEADER);
/// Longest client-supplied id passed on unchanged.
pub const MAX_LEN: usize = 128;

/// An incoming id is kept if it is 1..=128 visible ASCII characters; anything else (empty,
/// huge, control characters, non-ASCII) is replaced by a generated one.
pub fn is_acceptable(value: &[u8]) -> bool {
    !value.is_empty() && value.len() <= MAX_LEN && value.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A new 32-hex-digit id: a random per-process prefix, then a counter scrambled by a
/// bijective mix, so ids are unique within a process and unlikely to collide across them.
pub fn generate() -> String {
    String::from_utf8(generate_digits().to_vec()).expect("hex digits are ASCII")
}

/// A new id (see [`generate`]) as a header value: one allocation, shared (not copied) by
/// the upstream request and the response that carry it.
pub fn generate_value() -> http::HeaderValue {
    http::HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(generate_digits()))
        .expect("hex digits are a valid value")
}

fn generate_digits() -> [u8; 32] {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut out = [0u8; 32];
    hex(prefix, &mut out[..16]);
    hex(splitmix64(n ^ prefix), &mut out[16..]);
    out
}

/// `value` as 16 lower-case hex digits into `out`.
fn hex(value: u64, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = DIGITS[((value >> (60 - 4 * i)) & 0xf) as usize];
    }
}

/// A bijection on u64 (distinct inputs give distinct outputs): request ids, and trace and
/// span ids (`ops::trace::context`), from a counter.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn generated_ids_are_unique_and_acceptable() {
        let ids: HashSet<String> = (0..10_000).map(|_| generate()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids
            .iter()
            .all(|id| id.len() == 32 && is_acceptable(id.as_bytes())));
        let value = generate_value();
        assert!(value.len() == 32 && is_acceptable(value.as_bytes()));
        assert!(!ids.contains(value.to_str().unwrap()));
    }

    #[test]
    fn hex_is_zero_padded_lower_case() {
        let mut out = [0u8; 16];
        hex(0xab, &mut out);
        assert_eq!(&out, b"00000000000000ab");
    }

    #[test]
    fn odd_incoming_ids_are_refused() {
        assert!(is_acceptable(b"abc-123"));
        assert!(!is_acceptable(b""));
        assert!(!is_acceptable(b"has space"));
        assert!(!is_acceptable("caf\u{e9}".as_bytes()));
        assert!(!is_acceptable(&[b'a'; MAX_LEN + 1]));
    }
}
