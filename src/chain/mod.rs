//! The request filter chain (DESIGN.md §2) as plain functions over plain data: each step
//! either passes what the next needs or returns a [`Reject`] describing the response. The
//! Pingora glue in `proxy.rs` only gathers the inputs and writes the outcome.
//!
//! ```text
//! [0] message checks    → 400 ambiguous framing (smuggling) · 414 · 431 · 413 (Content-Length)
//! [1] path check        → 400
//! [2] route match       → 404 / 405
//! [3] per-IP bucket     → 429 "ip"          (no key lookup, no store call)
//! [4] API key → client  → 400 / 401         (no limiter state created)
//! [5] plan limits       → 429 named policies (in the store; async, in proxy.rs)
//! ```

pub mod auth;
pub mod headers;
pub mod identity;
pub mod path;
pub mod problem;
pub mod request_id;
pub mod router;

use crate::chain::auth::{extract_key, Client, KeyError, API_KEY_HEADER};
use crate::chain::identity::{client_ip, group_key};
use crate::chain::problem::Kind;
use crate::chain::router::RouteMatch;
use crate::control::config::RequestLimits;
use crate::control::snapshot::{Route, Snapshot};
use crate::limit::store::redis::StoreError;
use crate::limit::{Decision, Policy};
use http::header::{AUTHORIZATION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method};
use pingora::http::RequestHeader;
use std::net::IpAddr;
use std::sync::Arc;

/// Why the gateway answers a request itself instead of proxying it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    /// Ambiguous or unsupported message framing (request smuggling attempts), or a request
    /// head HTTP/1.1 does not allow (no `Host`, several).
    BadMessage(&'static str),
    UriTooLong(usize),
    HeadersTooLarge(String),
    BodyTooLarge(u64),
    BadPath(&'static str),
    /// The path matches a route's prefix only when letter case is ignored.
    CaseMismatch(String),
    NotFound(String),
    MethodNotAllowed {
        detail: String,
        allow: String,
    },
    Key(KeyError),
    UnknownKey,
    /// A limit rejected the request; the decisions are in the request's [`LimitStatus`].
    TooManyRequests,
    /// The store could not decide (down, slow, refusing).
    Store(StoreError),
}

impl Reject {
    pub fn kind(&self) -> Kind {
        match self {
            Reject::BadMessage(_)
            | Reject::BadPath(_)
            | Reject::CaseMismatch(_)
            | Reject::Key(KeyError::Ambiguous | KeyError::RepeatedAuthorization) => {
                Kind::BadRequest
            }
            Reject::UriTooLong(_) => Kind::UriTooLong,
            Reject::HeadersTooLarge(_) => Kind::HeadersTooLarge,
            Reject::BodyTooLarge(_) => Kind::PayloadTooLarge,
            Reject::NotFound(_) => Kind::RouteNotFound,
            Reject::MethodNotAllowed { .. } => Kind::MethodNotAllowed,
            Reject::Key(_) | Reject::UnknownKey => Kind::Unauthorized,
            Reject::TooManyRequests => Kind::QuotaExceeded,
            Reject::Store(_) => Kind::LimiterUnavailable,
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Reject::BadMessage(d) | Reject::BadPath(d) => (*d).to_owned(),
            Reject::UriTooLong(max) => format!("the request target is longer than {max} bytes"),
            Reject::HeadersTooLarge(why) => why.clone(),
            Reject::BodyTooLarge(max) => format!("the request body is larger than {max} bytes"),
            Reject::NotFound(d)
            | Reject::CaseMismatch(d)
            | Reject::MethodNotAllowed { detail: d, .. } => d.clone(),
            Reject::Key(e) => e.detail().to_owned(),
            Reject::UnknownKey => "the API key is not valid".to_owned(),
            Reject::TooManyRequests => {
                "rate limit exceeded; retry after the time in Retry-After".to_owned()
            }
            Reject::Store(_) => {
                "the rate limiter is unavailable; this is not caused by the request".to_owned()
            }
        }
    }
}

/// Whether the answer to this rejection must close the connection (the request's body, if
/// any, was not read, or its framing cannot be trusted).
pub fn closes_connection(reject: &Reject) -> bool {
    matches!(
        reject,
        Reject::BadMessage(_)
            | Reject::UriTooLong(_)
            | Reject::HeadersTooLarge(_)
            | Reject::BodyTooLarge(_)
            | Reject::BadPath(_)
            | Reject::Key(KeyError::Ambiguous | KeyError::RepeatedAuthorization)
    )
}

/// [0]: request smuggling and size limits, before anything else looks at the request.
///
/// Framing must be unambiguous: at most one `Transfer-Encoding` line, whose value is exactly
/// `chunked`; never together with `Content-Length`; never on HTTP/1.0. (Pingora itself
/// refuses malformed or conflicting `Content-Length` values and other codings.) `raw_head`
/// is the request head as received: Pingora drops `Content-Length` from the parsed headers
/// when `Transfer-Encoding` is present, so the raw bytes are where the conflict shows.
pub fn check_message(
    limits: &RequestLimits,
    req: &RequestHeader,
    raw_head: Option<&[u8]>,
) -> Result<(), Reject> {
    let headers = &req.headers;
    let mut te = headers.get_all(TRANSFER_ENCODING).iter();
    if let Some(value) = te.next() {
        if te.next().is_some() {
            return Err(Reject::BadMessage("more than one Transfer-Encoding header"));
        }
        if !value
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked")
        {
            return Err(Reject::BadMessage(
                "Transfer-Encoding other than a single \"chunked\"",
            ));
        }
        if headers.contains_key(CONTENT_LENGTH) || raw_head.is_some_and(has_content_length_line) {
            return Err(Reject::BadMessage(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        if req.version == http::Version::HTTP_10 {
            return Err(Reject::BadMessage("Transfer-Encoding on HTTP/1.0"));
        }
    }
    let mut hosts = headers.get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        // RFC 9112 §3.2: a server MUST respond 400 to an HTTP/1.1 request without Host (an
        // absolute-form target carries its own authority, which Pingora checks against it).
        (None, _) if req.version == http::Version::HTTP_11 && req.uri.authority().is_none() => {
            return Err(Reject::BadMessage(
                "an HTTP/1.1 request needs a Host header",
            ));
        }
        (Some(_), Some(_)) => return Err(Reject::BadMessage("more than one Host header")),
        _ => {}
    }
    // A list, even of equal values ("5, 5", which RFC 9110 lets a recipient accept), is
    // refused rather than passed on for the upstream to read its own way.
    if headers
        .get_all(CONTENT_LENGTH)
        .iter()
        .any(|v| v.as_bytes().contains(&b','))
    {
        return Err(Reject::BadMessage("a list of values in Content-Length"));
    }
    let uri_len = req.raw_path().len();
    if uri_len > limits.max_uri_length {
        return Err(Reject::UriTooLong(limits.max_uri_length));
    }
    if headers.len() > limits.max_header_count {
        return Err(Reject::HeadersTooLarge(format!(
            "more than {} header fields",
            limits.max_header_count
        )));
    }
    let bytes: usize = uri_len
        + req.method.as_str().len()
        + headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>();
    if bytes > limits.max_header_bytes {
        return Err(Reject::HeadersTooLarge(format!(
            "request headers larger than {} bytes",
            limits.max_header_bytes
        )));
    }
    Ok(())
}

/// Whether a raw request head has a `Content-Length` header line.
fn has_content_length_line(head: &[u8]) -> bool {
    head.split(|&b| b == b'\n')
        .skip(1)
        .any(|line| line.len() >= 15 && line[..15].eq_ignore_ascii_case(b"content-length:"))
}

/// The announced body must fit the route's limit (a chunked body is counted as it streams).
pub fn check_content_length(route: &Route, req: &RequestHeader) -> Result<(), Reject> {
    let max = route.config.max_body_bytes;
    let announced = req
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(len) if len > max => Err(Reject::BodyTooLarge(max)),
        _ => Ok(()),
    }
}

/// [1] + [2]: the index of the route serving this request, and the normalised path (the one
/// routed, and so the one to forward) when it differs from the request's.
pub fn route(
    snapshot: &Snapshot,
    host: Option<&str>,
    method: &Method,
    path: &str,
) -> Result<(usize, Option<String>), Reject> {
    let normal = self::path::normalize(path).map_err(|bad| Reject::BadPath(bad.detail()))?;
    let path = normal.as_ref();
    match snapshot.router.find(host, method, path) {
        RouteMatch::Found(i) => Ok((
            i,
            match normal {
                std::borrow::Cow::Borrowed(_) => None,
                std::borrow::Cow::Owned(p) => Some(p),
            },
        )),
        RouteMatch::CaseMismatch(i) => Err(Reject::CaseMismatch(format!(
            "{path} matches the path prefix {:?} only when letter case is ignored; send the path in the case the route is configured with",
            snapshot.routes[i].config.path_prefix
        ))),
        RouteMatch::MethodNotAllowed(allow) => Err(Reject::MethodNotAllowed {
            detail: format!("{method} is not allowed here; allowed: {allow}"),
            allow,
        }),
        RouteMatch::NotFound => Err(Reject::NotFound(format!(
            "no route matches {method} {path}"
        ))),
    }
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
        headers::retry_after(ms)
    }

    /// The rate-limit headers for this request's response.
    pub fn headers(&self, legacy: bool) -> Vec<(&'static str, HeaderValue)> {
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
        out.push(("ratelimit-policy", policy));
        let ratelimit = headers::ratelimit_header(self.entries.iter().map(|(p, d)| (p, d)));
        out.push((
            "ratelimit",
            HeaderValue::from_str(&ratelimit).expect("ASCII"),
        ));
        if legacy {
            if let Some(d) = headers::most_restrictive(self.entries.iter().map(|(_, d)| d)) {
                for (name, value) in headers::legacy_headers(d) {
                    out.push((name, HeaderValue::from(value)));
                }
            }
        }
        out
    }
}

/// [3]: the per-IP bucket of the route, if it has one. Returns `Err(TooManyRequests)` after
/// recording the rejecting decision.
pub fn check_ip(
    snapshot: &Snapshot,
    route: &Route,
    peer: Option<IpAddr>,
    forwarded_for: &HeaderMap,
    now_ms: u64,
    status: &mut LimitStatus,
) -> Result<(), Reject> {
    let Some(limiter) = &route.ip_limiter else {
        return Ok(());
    };
    let Some(peer) = peer else {
        // Not an IP connection (a Unix socket): nothing to key on.
        return Ok(());
    };
    let server = &snapshot.config.server;
    let values = forwarded_for.get_all("x-forwarded-for");
    let ip = client_ip(
        peer,
        values.iter().map(HeaderValue::as_bytes),
        &server.trusted_proxies,
    );
    let decision = limiter.check(group_key(ip, server.grouping), now_ms);
    status.push(&limiter.policy, decision);
    status.push_policy_header(limiter.policy_header.clone());
    if decision.allowed {
        Ok(())
    } else {
        Err(Reject::TooManyRequests)
    }
}

/// Headers whose upstream value the gateway decides: it sets them (`X-Client-Id`,
/// `X-Forwarded-For`, `X-Request-Id`) or removes them (`X-Api-Key`).
pub const CONTROLLED_HEADERS: [&str; 4] = [
    "x-client-id",
    "x-forwarded-for",
    "x-request-id",
    "x-api-key",
];

/// Incoming header names that CGI/WSGI-style upstreams would read as one of
/// [`CONTROLLED_HEADERS`]: they map `-` and `_` alike (`X_Client_Id` and `X-Client-Id` both
/// become `HTTP_X_CLIENT_ID`), so such a header could stand in for the gateway's own. Empty
/// (and allocation-free) unless a name has an underscore.
pub fn underscore_aliases<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    names
        .filter(|name| name.contains('_'))
        .filter(|name| {
            CONTROLLED_HEADERS.iter().any(|controlled| {
                name.len() == controlled.len()
                    && name
                        .bytes()
                        .zip(controlled.bytes())
                        .all(|(a, b)| a.to_ascii_lowercase() == b || (a == b'_' && b == b'-'))
            })
        })
        .collect()
}

/// [4]: the client owning the request's API key.
pub fn authenticate(snapshot: &Snapshot, headers: &HeaderMap) -> Result<Arc<Client>, Reject> {
    let key = extract_key(
        headers
            .get_all(API_KEY_HEADER)
            .iter()
            .map(HeaderValue::as_bytes),
        headers
            .get_all(AUTHORIZATION)
            .iter()
            .map(HeaderValue::as_bytes),
    )
    .map_err(Reject::Key)?;
    snapshot.keys.lookup(key).cloned().ok_or(Reject::UnknownKey)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::config::defaults;

    fn limits() -> RequestLimits {
        RequestLimits {
            header_timeout: defaults::HEADER_TIMEOUT,
            body_timeout: defaults::BODY_TIMEOUT,
            keepalive_timeout: defaults::CLIENT_KEEPALIVE_TIMEOUT,
            max_header_bytes: 1024,
            max_header_count: 10,
            max_uri_length: 64,
            max_body_bytes: 100,
        }
    }

    fn req(version: http::Version, path: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = bare_req(version, path, headers);
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            r.append_header("host", "a").unwrap();
        }
        r
    }

    fn bare_req(version: http::Version, path: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("POST", path.as_bytes(), None).unwrap();
        r.set_version(version);
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    fn check(headers: &[(&str, &str)]) -> Result<(), Reject> {
        check_message(&limits(), &req(http::Version::HTTP_11, "/x", headers), None)
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        assert!(check(&[("transfer-encoding", "chunked")]).is_ok());
        assert!(check(&[("transfer-encoding", " Chunked ")]).is_ok());
        assert!(check(&[("content-length", "5")]).is_ok());
        for bad in [
            vec![("transfer-encoding", "chunked"), ("content-length", "5")],
            vec![
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked"),
            ],
            vec![("transfer-encoding", "gzip, chunked")],
            vec![("transfer-encoding", "chunked, chunked")],
            vec![("transfer-encoding", "identity")],
        ] {
            assert!(matches!(check(&bad), Err(Reject::BadMessage(_))), "{bad:?}");
        }
        let old = req(
            http::Version::HTTP_10,
            "/x",
            &[("transfer-encoding", "chunked")],
        );
        assert!(matches!(
            check_message(&limits(), &old, None),
            Err(Reject::BadMessage(_))
        ));
        // Pingora removed Content-Length from the parsed headers; the raw head still has it.
        let te = req(
            http::Version::HTTP_11,
            "/x",
            &[("transfer-encoding", "chunked")],
        );
        let raw = b"POST /x HTTP/1.1\r\nHost: a\r\nCONTENT-LENGTH: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(matches!(
            check_message(&limits(), &te, Some(raw)),
            Err(Reject::BadMessage(_))
        ));
        let clean = b"POST /x HTTP/1.1\r\nHost: a\r\nX-Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(check_message(&limits(), &te, Some(clean)).is_ok());
    }

    #[test]
    fn http11_needs_exactly_one_host_and_content_length_is_one_number() {
        let v11 = http::Version::HTTP_11;
        let no_host = bare_req(v11, "/x", &[]);
        assert!(matches!(
            check_message(&limits(), &no_host, None),
            Err(Reject::BadMessage(_))
        ));
        let mut absolute = bare_req(v11, "/x", &[]);
        absolute.set_uri(http::Uri::from_static("http://a/x"));
        assert_eq!(check_message(&limits(), &absolute, None), Ok(()));
        let old = bare_req(http::Version::HTTP_10, "/x", &[]);
        assert!(check_message(&limits(), &old, None).is_ok());
        let two = bare_req(v11, "/x", &[("host", "a"), ("host", "b")]);
        assert!(matches!(
            check_message(&limits(), &two, None),
            Err(Reject::BadMessage(_))
        ));
        for list in ["5, 5", "5,5", "5, 6"] {
            assert!(
                matches!(
                    check(&[("content-length", list)]),
                    Err(Reject::BadMessage(_))
                ),
                "{list}"
            );
        }
    }

    #[test]
    fn underscore_spellings_of_controlled_headers_are_found() {
        let names = [
            "x_client_id",
            "X_Forwarded_For",
            "x-client_id",
            "x_api_key",
            "x_request_id",
            "x-client-id",
            "x_other",
            "x_client_idx",
        ];
        assert_eq!(
            underscore_aliases(names.into_iter()),
            [
                "x_client_id",
                "X_Forwarded_For",
                "x-client_id",
                "x_api_key",
                "x_request_id"
            ]
        );
        assert!(underscore_aliases(["accept", "host"].into_iter()).is_empty());
    }

    #[test]
    fn size_limits_are_enforced() {
        let long = format!("/{}", "a".repeat(64));
        assert_eq!(
            check_message(&limits(), &req(http::Version::HTTP_11, &long, &[]), None),
            Err(Reject::UriTooLong(64))
        );
        let many: Vec<(String, String)> = (0..11)
            .map(|i| (format!("x-h{i}"), "v".to_owned()))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert!(matches!(check(&many), Err(Reject::HeadersTooLarge(_))));
        let big = "v".repeat(1100);
        assert!(matches!(
            check(&[("x-big", &big)]),
            Err(Reject::HeadersTooLarge(_))
        ));
    }
}
