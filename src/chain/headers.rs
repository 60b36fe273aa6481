//! Decisions → response headers, per draft-ietf-httpapi-ratelimit-headers-11 and RFC 9110:
//!
//! ```text
//! RateLimit-Policy: "ip";q=50;w=1, "per-minute";q=100;w=60
//! RateLimit: "ip";r=49;t=1, "per-minute";r=0;t=20
//! Retry-After: 20
//! ```
//!
//! Both are structured-field lists; each member is the quoted policy name with parameters:
//! `q` quota, `w` window in seconds, `r` remaining units, `t` seconds until the quota resets.
//! Seconds are whole numbers rounded up. Policy names are restricted by the config loader to
//! characters that need no escaping in an sf-string.

use crate::limit::{Decision, Policy};
use http::{HeaderName, HeaderValue};
use std::fmt::Write;

/// Whole seconds, rounded up.
pub fn secs_ceil(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// `Retry-After` for a rejection: whole seconds, rounded up, never 0.
pub fn retry_after(ms: u64) -> u64 {
    secs_ceil(ms).max(1)
}

/// `RateLimit-Policy` for the given policies.
pub fn policy_header<'a>(policies: impl Iterator<Item = &'a Policy>) -> String {
    let mut out = String::with_capacity(64);
    for (i, p) in policies.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let (q, w) = p.quota();
        if p.is_concurrency() {
            let _ = write!(out, "\"{}\";q={q};qu=\"concurrent-requests\"", p.name);
        } else {
            let _ = write!(out, "\"{}\";q={q};w={w}", p.name);
        }
    }
    out
}

/// `RateLimit` for the given (policy, decision) pairs.
pub fn ratelimit_header<'a>(entries: impl Iterator<Item = (&'a Policy, &'a Decision)>) -> String {
    // Appended, not formatted: it runs for every limited request.
    let mut out = String::with_capacity(48);
    let mut digits = itoa::Buffer::new();
    for (i, (p, d)) in entries.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        for part in ["\"", &p.name, "\";r=", digits.format(d.remaining)] {
            out.push_str(part);
        }
        if !p.is_concurrency() {
            out.push_str(";t=");
            out.push_str(digits.format(secs_ceil(d.reset_ms)));
        }
    }
    out
}

/// The decision a single-policy header (`X-RateLimit-*`) should describe: the one with the
/// fewest units left (a rejecting one first).
pub fn most_restrictive<'a>(decisions: impl Iterator<Item = &'a Decision>) -> Option<&'a Decision> {
    decisions.min_by_key(|d| (d.allowed, d.remaining, u64::MAX - d.reset_ms))
}

/// The names of the headers that tell a client its quota (parsed once).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The legacy trio `X-RateLimit-Limit`, `-Remaining`, `-Reset` (seconds until reset).
pub fn legacy_headers(d: &Decision) -> [(&'static HeaderName, u64); 3] {
    [
        (&X_RATELIMIT_LIMIT, d.limit),
        (&X_RATELIMIT_REMAINING, d.remaining),
        (&X_RATELIMIT_RESET, secs_ceil(d.reset_ms)),
    ]
}

/// "Near the limit": some policy has at most a tenth of its quota left.
pub fn near_limit<'a>(mut decisions: impl Iterator<Item = &'a Decision>) -> bool {
    decisions.any(|d| !d.allowed || d.remaining.saturating_mul(10) <= d.limit)
}

/// Response header naming the dry-run (shadow) limits that would have rejected the request.
pub static WOULD_LIMIT: HeaderName = HeaderName::from_static("x-turnstile-would-limit");

/// The `X-Turnstile-Would-Limit` value, if any dry-run limit would have rejected.
pub fn would_limit_value(names: &[std::sync::Arc<str>]) -> Option<HeaderValue> {
    if names.is_empty() {
        return None;
    }
    let joined: Vec<&str> = names.iter().map(|n| &**n).collect();
    HeaderValue::from_str(&joined.join(", ")).ok()
}

/// Whether admitted responses carry the quota headers (rejections always do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadersMode {
    On,
    Off,
    /// Only when some policy has at most a tenth of its quota left.
    NearLimit,
}

/// The decisions taken for one request, in the order the policies were checked; they feed
/// the `RateLimit` headers of the response (admitted or not).
#[derive(Debug, Default)]
pub struct LimitStatus {
    pub entries: Vec<(Policy, Decision)>,
    /// `RateLimit-Policy` parts (rendered once per plan / per-IP table), in entry order.
    policy_parts: Vec<HeaderValue>,
}

impl LimitStatus {
    pub fn push(&mut self, policy: &Policy, decision: Decision) {
        self.entries.push((policy.clone(), decision));
    }

    /// Adds the rendered `RateLimit-Policy` of the policies pushed by one step.
    pub fn push_policy_header(&mut self, value: HeaderValue) {
        self.policy_parts.push(value);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn violated(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(_, d)| !d.allowed)
            .map(|(p, _)| &*p.name)
            .collect()
    }

    pub fn retry_after_secs(&self) -> u64 {
        let ms = self
            .entries
            .iter()
            .filter(|(_, d)| !d.allowed)
            .map(|(_, d)| d.retry_after_ms)
            .max()
            .unwrap_or(0);
        retry_after(ms)
    }

    /// The rate-limit headers for this request's response.
    pub fn headers(&self, legacy: bool) -> Vec<(&'static HeaderName, HeaderValue)> {
        let mut out = Vec::with_capacity(5);
        let policy = match self.policy_parts.as_slice() {
            [one] => one.clone(),
            parts => {
                let mut joined = Vec::with_capacity(parts.iter().map(|p| p.len() + 2).sum());
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        joined.extend_from_slice(b", ");
                    }
                    joined.extend_from_slice(part.as_bytes());
                }
                HeaderValue::from_bytes(&joined).expect("joined header values stay valid")
            }
        };
        out.push((&RATELIMIT_POLICY, policy));
        let ratelimit = ratelimit_header(self.entries.iter().map(|(p, d)| (p, d)));
        // The string's own buffer, not a copy of it.
        let ratelimit = HeaderValue::from_maybe_shared(bytes::Bytes::from(ratelimit));
        out.push((&RATELIMIT, ratelimit.expect("ASCII")));
        if legacy {
            if let Some(d) = most_restrictive(self.entries.iter().map(|(_, d)| d)) {
                for (name, value) in legacy_headers(d) {
                    out.push((name, HeaderValue::from(value)));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Algorithm;

    fn d(allowed: bool, limit: u64, remaining: u64, reset_ms: u64) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            reset_ms,
            retry_after_ms: if allowed { 0 } else { reset_ms },
        }
    }

    #[test]
    fn renders_the_draft_11_fields_exactly() {
        let ip = Policy::new("ip", Algorithm::TokenBucket, 50, 1000, 50);
        let minute = Policy::new("per-minute", Algorithm::SlidingWindow, 100, 60_000, 100);
        assert_eq!(
            policy_header([&ip, &minute].into_iter()),
            r#""ip";q=50;w=1, "per-minute";q=100;w=60"#
        );
        let (a, b) = (d(true, 50, 49, 20), d(false, 100, 0, 19_001));
        assert_eq!(
            ratelimit_header([(&ip, &a), (&minute, &b)].into_iter()),
            r#""ip";r=49;t=1, "per-minute";r=0;t=20"#
        );
    }

    #[test]
    fn token_buckets_advertise_capacity_over_refill_time() {
        let p = Policy::new("ip", Algorithm::TokenBucket, 50, 1000, 100);
        assert_eq!(policy_header(std::iter::once(&p)), r#""ip";q=100;w=2"#);
        let p = Policy::new("ip", Algorithm::TokenBucket, 1, 60_000, 3);
        assert_eq!(policy_header(std::iter::once(&p)), r#""ip";q=3;w=180"#);
    }

    #[test]
    fn concurrency_limits_use_the_concurrent_requests_unit_and_no_window() {
        let p = Policy::concurrency("concurrency", 2, 60_000, crate::limit::Scope::Client).unwrap();
        assert_eq!(
            policy_header(std::iter::once(&p)),
            r#""concurrency";q=2;qu="concurrent-requests""#
        );
        let d = d(false, 2, 0, 0);
        assert_eq!(
            ratelimit_header(std::iter::once((&p, &d))),
            r#""concurrency";r=0"#
        );
    }

    #[test]
    fn sub_second_windows_round_up() {
        let p = Policy::new("burst", Algorithm::FixedWindow, 5, 250, 5);
        assert_eq!(policy_header(std::iter::once(&p)), r#""burst";q=5;w=1"#);
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_never_zero() {
        assert_eq!(retry_after(0), 1);
        assert_eq!(retry_after(1), 1);
        assert_eq!(retry_after(1000), 1);
        assert_eq!(retry_after(1001), 2);
        assert_eq!(retry_after(59_999), 60);
    }

    #[test]
    fn the_most_restrictive_decision_is_chosen_for_legacy_headers() {
        let ds = [
            d(true, 100, 50, 1000),
            d(false, 10, 0, 5000),
            d(true, 5, 1, 100),
        ];
        assert_eq!(most_restrictive(ds.iter()), Some(&ds[1]));
        let ds = [d(true, 100, 50, 1000), d(true, 5, 1, 100)];
        let m = most_restrictive(ds.iter()).unwrap();
        assert_eq!(
            legacy_headers(m),
            [
                (&X_RATELIMIT_LIMIT, 5),
                (&X_RATELIMIT_REMAINING, 1),
                (&X_RATELIMIT_RESET, 1)
            ]
        );
    }

    #[test]
    fn near_limit_means_a_tenth_or_less_left() {
        assert!(!near_limit([d(true, 100, 11, 0)].iter()));
        assert!(near_limit([d(true, 100, 10, 0)].iter()));
        assert!(near_limit([d(false, 100, 50, 0)].iter()));
    }
}
