//! W3C Trace Context (`traceparent`, `tracestate`): parsing what a client sent, the ids of
//! new traces and spans, and the head sampling decision. Pure.

use crate::chain::request_id::splitmix64;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
/// Longest `tracestate` passed on (the spec's limit: 32 members of at most 256 bytes is more
/// than any vendor uses; 512 bytes is what it says a vendor may truncate to).
pub const MAX_TRACESTATE: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    pub fn to_hex(self) -> String {
        hex(&self.0)
    }
}

impl SpanId {
    pub fn to_hex(self) -> String {
        hex(&self.0)
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// A trace context a client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub sampled: bool,
}

/// `traceparent`: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lower-case hex,
/// neither id all zeros. A later version is read by its version-00 prefix (as the spec says);
/// version `ff` and anything malformed is `None` (a new trace starts).
pub fn parse_traceparent(value: &[u8]) -> Option<Parent> {
    if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let version = unhex::<1>(&value[..2])?[0];
    if version == 0xff || (version == 0 && value.len() != 55) {
        return None;
    }
    if version > 0 && value.len() > 55 && value[55] != b'-' {
        return None;
    }
    let trace_id = unhex::<16>(&value[3..35])?;
    let span_id = unhex::<8>(&value[36..52])?;
    let flags = unhex::<1>(&value[53..55])?[0];
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id: TraceId(trace_id),
        span_id: SpanId(span_id),
        sampled: flags & 1 == 1,
    })
}

fn unhex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Whether a `tracestate` may be passed on: at most [`MAX_TRACESTATE`] bytes of visible
/// ASCII, spaces, commas (the members are the vendors' business, not ours).
pub fn acceptable_tracestate(value: &[u8]) -> bool {
    !value.is_empty()
        && value.len() <= MAX_TRACESTATE
        && value.iter().all(|b| (0x20..0x7f).contains(b))
}

/// The `traceparent` naming span `span_id` of `trace_id`.
pub fn traceparent(trace_id: TraceId, span_id: SpanId, sampled: bool) -> String {
    format!(
        "00-{}-{}-{}",
        trace_id.to_hex(),
        span_id.to_hex(),
        if sampled { "01" } else { "00" }
    )
}

/// Head sampling of a new trace: the same answer for the same trace id on every instance
/// (its last 8 bytes, as a fraction of 2^64, below `ratio`).
pub fn sampled(trace_id: TraceId, ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id.0[8..]);
    (u64::from_be_bytes(low) as f64) < ratio * 18_446_744_073_709_551_616.0
}

/// Ids of new traces and spans: a random per-process key, and a counter scrambled by a
/// bijection — unique in the process, random-looking, no lock and no system call.
pub fn new_trace_id() -> TraceId {
    let (k1, k2) = keys();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&splitmix64(n ^ k1).to_be_bytes());
    id[8..].copy_from_slice(&splitmix64(n.wrapping_add(k2)).to_be_bytes());
    TraceId(id)
}

pub fn new_span_id() -> SpanId {
    let (k1, _) = keys();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let id = splitmix64(n.rotate_left(17) ^ k1).max(1);
    SpanId(id.to_be_bytes())
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn keys() -> (u64, u64) {
    static KEYS: OnceLock<(u64, u64)> = OnceLock::new();
    *KEYS.get_or_init(|| {
        let mut a = RandomState::new().build_hasher();
        a.write_u32(std::process::id());
        let mut b = RandomState::new().build_hasher();
        b.write_u64(a.finish());
        (a.finish(), b.finish())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_spec_example_is_read_and_written_back() {
        let p = parse_traceparent(EXAMPLE).unwrap();
        assert!(p.sampled);
        assert_eq!(p.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(traceparent(p.trace_id, p.span_id, true).as_bytes(), EXAMPLE);
    }

    #[test]
    fn malformed_parents_start_a_new_trace() {
        let bad: [&[u8]; 8] = [
            b"",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ];
        for value in bad {
            assert_eq!(
                parse_traceparent(value),
                None,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        // A later version is read by its 00 prefix.
        let future = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        assert!(!parse_traceparent(future).unwrap().sampled);
    }

    #[test]
    fn new_ids_are_unique_and_sampling_follows_the_ratio() {
        let ids: std::collections::HashSet<TraceId> = (0..10_000).map(|_| new_trace_id()).collect();
        assert_eq!(ids.len(), 10_000);
        let kept = ids.iter().filter(|id| sampled(**id, 0.25)).count();
        assert!((2_000..3_000).contains(&kept), "{kept}");
        assert!(ids.iter().all(|id| sampled(*id, 1.0)));
        assert!(!ids.iter().any(|id| sampled(*id, 0.0)));
        assert_ne!(new_span_id(), new_span_id());
    }

    #[test]
    fn tracestate_is_bounded() {
        assert!(acceptable_tracestate(
            b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
        ));
        assert!(!acceptable_tracestate(&[b'a'; 513]));
        assert!(!acceptable_tracestate(b"a=\x01"));
    }
}
