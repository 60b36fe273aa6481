//! Who may ask the admin listener what, before any endpoint runs:
//!
//! - **Host names** ([`host_allowed`]): only the listener's own names (DNS rebinding → 421).
//! - **Tokens** ([`bearer`]): `Authorization: Bearer <token>`, compared in constant time by
//!   the configuration.
//! - **Wrong tokens are slowed** ([`Throttle`]): each address may send
//!   [`FAILURES_BURST`] wrong tokens, then one per [`FAILURE_REFILL`]; past that it gets 429
//!   with `Retry-After`, token or not (a right token answered meanwhile would tell a guesser
//!   it guessed), counted in `turnstile_admin_auth_failures_total` and logged at most once a
//!   minute. ~5 000 guesses a second from one address become about ten a minute.
//! - **Changes come from the operator, not from a page** ([`cross_site_write`]): a write
//!   (any method but GET and HEAD) is refused when the browser says it comes from another
//!   site (`Sec-Fetch-Site`) or another origin (`Origin`), and needs a header an HTML form
//!   cannot send — `Content-Type: application/json`, or `Authorization` — so a cross-site
//!   form cannot reload the gateway or change a client, token configured or not.

use crate::clock::{Clock, MonotonicClock};
use crate::limit::ip::{IpKey, IpLimiter};
use crate::limit::store::failure::DegradedLog;
use crate::limit::{Algorithm, Policy};
use http::request::Parts;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Wrong tokens an address may send at once, then one per [`FAILURE_REFILL`].
pub const FAILURES_BURST: u64 = 10;
pub const FAILURE_REFILL: Duration = Duration::from_secs(6);
/// Addresses tracked (more share overflow buckets: `limit/ip.rs`).
const TRACKED: usize = 10_000;
/// How often the throttle says what it refused.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The token of `Authorization: Bearer <token>`, if that is what the header says.
pub fn bearer(header: Option<&http::HeaderValue>) -> Option<&[u8]> {
    let value = header?.as_bytes();
    match value.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => Some(value[7..].trim_ascii()),
        _ => None,
    }
}

/// Wrong tokens per address.
pub struct Throttle {
    failures: IpLimiter,
    log: DegradedLog,
    throttled: AtomicU64,
}

impl Default for Throttle {
    fn default() -> Throttle {
        let window = FAILURE_REFILL.as_millis() as u64 * FAILURES_BURST;
        let policy = Policy::new(
            "admin-token-failures",
            Algorithm::TokenBucket,
            FAILURES_BURST,
            window,
            FAILURES_BURST,
        );
        Throttle {
            failures: IpLimiter::new(policy, TRACKED),
            log: DegradedLog::default(),
            throttled: AtomicU64::new(0),
        }
    }
}

impl Throttle {
    /// `Some(retry after, in seconds)` while `peer` may not try a token.
    pub fn refused(&self, peer: Option<IpAddr>) -> Option<u64> {
        let now = MonotonicClock.now_ms();
        let decision = self.failures.peek(key(peer), now);
        if decision.allowed {
            return None;
        }
        self.throttled.fetch_add(1, Ordering::Relaxed);
        Some(decision.retry_after_ms.div_ceil(1000).max(1))
    }

    /// `peer` sent a wrong (or no) token: counted against it; logged at most once a minute.
    pub fn failed(&self, peer: Option<IpAddr>) {
        let now = MonotonicClock.now_ms();
        self.failures.check(key(peer), now);
        if now % 4096 == 0 {
            self.failures.sweep(now);
        }
        if let Some(failures) = self.log.note_every(now, LOG_EVERY) {
            let throttled = self.throttled.swap(0, Ordering::Relaxed);
            log::warn!(
                "admin listener: {failures} request(s) with a wrong or missing token, {throttled} throttled, since the last report; the latest from {}",
                peer.map_or_else(|| "an unknown address".to_owned(), |p| p.to_string())
            );
        }
    }
}

fn key(peer: Option<IpAddr>) -> IpKey {
    match peer {
        Some(IpAddr::V4(v4)) => u128::from(v4.to_ipv6_mapped()),
        Some(IpAddr::V6(v6)) => u128::from(v6),
        None => 0,
    }
}

/// Why a write must be refused, if it must: from another site or origin (403), or without a
/// header an HTML form cannot send (415). `None` for reads, and for writes an operator's
/// tool or the console sends.
pub fn cross_site_write(req: &Parts) -> Option<(http::StatusCode, &'static str)> {
    if matches!(req.method, http::Method::GET | http::Method::HEAD) {
        return None;
    }
    let headers = &req.headers;
    let site = headers.get("sec-fetch-site").map(|v| v.as_bytes());
    if site.is_some_and(|s| s != b"same-origin" && s != b"none") {
        return Some((
            http::StatusCode::FORBIDDEN,
            "a change from another site's page is refused (Sec-Fetch-Site)",
        ));
    }
    if let Some(origin) = headers.get(http::header::ORIGIN) {
        let host = req
            .uri
            .authority()
            .map(|a| a.as_str().as_bytes())
            .or_else(|| headers.get(http::header::HOST).map(|h| h.as_bytes()));
        if !same_origin(origin.as_bytes(), host) {
            return Some((
                http::StatusCode::FORBIDDEN,
                "a change from another origin's page is refused (Origin)",
            ));
        }
    }
    let json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json && !headers.contains_key(http::header::AUTHORIZATION) {
        return Some((
            http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a change needs Content-Type: application/json or an Authorization header (an HTML form can send neither)",
        ));
    }
    None
}

/// Whether `origin` (`scheme://host[:port]`) names the listener the request reached (`host`,
/// as the request named it).
fn same_origin(origin: &[u8], host: Option<&[u8]>) -> bool {
    let Some(host) = host else { return false };
    let rest = origin
        .strip_prefix(b"http://")
        .or_else(|| origin.strip_prefix(b"https://"));
    rest.is_some_and(|r| r.eq_ignore_ascii_case(host))
}

/// Whether the admin listener answers a request naming `host` (`Host`, or the absolute-form
/// target's authority; a port is ignored): none named (HTTP/1.0), an IP literal (no name to
/// rebind), `localhost`, this machine's name, or one of `extra`.
pub fn host_allowed(host: Option<&[u8]>, extra: &[String]) -> bool {
    let Some(host) = host else {
        return true;
    };
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let host = host.trim();
    // `[v6]:port`, `[v6]`, `name:port`, `name`, `v4:port`.
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, _)) => return v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name == machine_name() || extra.contains(&name)
}

/// This machine's host name (lower case; empty when unknown).
fn machine_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_ascii_lowercase())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_must_match_exactly() {
        let config = crate::control::config::AdminConfig {
            listen: "127.0.0.1:9090".parse().unwrap(),
            tokens: vec![
                ("admin".into(), "admin-token-0123456789".into()),
                ("ci".into(), "ci-token-0123456789abc".into()),
            ],
            readers: Vec::new(),
            hosts: Vec::new(),
        };
        let h = |v: &str| http::HeaderValue::from_str(v).unwrap();
        let who = |v: &str| bearer(Some(&h(v))).and_then(|t| config.token_named(t));
        assert_eq!(who("Bearer admin-token-0123456789"), Some("admin"));
        assert_eq!(who("bearer  ci-token-0123456789abc "), Some("ci"));
        assert_eq!(who("Bearer admin-token-012345678"), None);
        assert_eq!(who("Basic admin-token-0123456789"), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn only_the_listeners_own_names_and_ip_literals_are_answered() {
        let extra = vec!["turnstile-admin.internal".to_owned()];
        let allowed = |h: &str| host_allowed(Some(h.as_bytes()), &extra);
        for ok in [
            "127.0.0.1:9090",
            "10.1.2.3",
            "[::1]:9090",
            "[::1]",
            "localhost:9090",
            "LOCALHOST",
            "localhost.",
            "turnstile-admin.internal:9090",
        ] {
            assert!(allowed(ok), "{ok}");
        }
        for refused in [
            "attacker.example",
            "attacker.example:9090",
            "localhost.attacker.example",
            "[::1",
            "127.0.0.1.attacker.example",
        ] {
            assert!(!allowed(refused), "{refused}");
        }
        assert!(!host_allowed(Some(b"\xff"), &extra));
        assert!(host_allowed(None, &extra));
    }

    fn parts(method: &str, headers: &[(&str, &str)]) -> Parts {
        let mut req = http::Request::builder()
            .method(method)
            .uri("/reload")
            .header("host", "127.0.0.1:9090");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(()).unwrap().into_parts().0
    }

    #[test]
    fn writes_a_form_or_another_site_could_send_are_refused() {
        let status = |m: &str, h: &[(&str, &str)]| cross_site_write(&parts(m, h)).map(|r| r.0);
        let json = ("content-type", "application/json; charset=utf-8");
        // Reads are never refused here; the console's and curl's writes pass.
        assert_eq!(status("GET", &[("origin", "http://evil.example")]), None);
        assert_eq!(status("POST", &[json]), None);
        assert_eq!(status("POST", &[("authorization", "Bearer x")]), None);
        assert_eq!(
            status(
                "POST",
                &[
                    json,
                    ("origin", "http://127.0.0.1:9090"),
                    ("sec-fetch-site", "same-origin")
                ]
            ),
            None
        );
        // What an HTML form sends: no JSON, no Authorization.
        for form in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ] {
            assert_eq!(
                status("POST", &[("content-type", form)]),
                Some(http::StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{form}"
            );
        }
        assert_eq!(
            status("POST", &[]),
            Some(http::StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
        // Another site or origin, whatever it sends.
        for (k, v) in [
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-site", "same-site"),
            ("origin", "http://evil.example"),
            ("origin", "null"),
            ("origin", "http://127.0.0.1:8080"),
        ] {
            assert_eq!(
                status("DELETE", &[json, (k, v)]),
                Some(http::StatusCode::FORBIDDEN),
                "{k}: {v}"
            );
        }
    }

    #[test]
    fn wrong_tokens_are_slowed_per_address() {
        let throttle = Throttle::default();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "::1".parse().unwrap());
        for _ in 0..FAILURES_BURST {
            assert_eq!(throttle.refused(Some(a)), None);
            throttle.failed(Some(a));
        }
        let retry = throttle.refused(Some(a)).expect("throttled");
        assert!((1..=FAILURE_REFILL.as_secs()).contains(&retry), "{retry}");
        assert_eq!(throttle.refused(Some(b)), None, "another address is not");
    }
}
