//! The request filter chain (DESIGN.md §2) as plain functions over plain data: each step
//! either passes what the next needs or returns a [`Reject`] describing the response. The
//! Pingora glue in `proxy.rs` only gathers the inputs and writes the outcome.
//!
//! ```text
//! [1] path check        → 400
//! [2] route match       → 404 / 405
//! [3] per-IP bucket     → 429 "ip"          (no key lookup, no store call)
//! [4] API key → client  → 400 / 401         (no limiter state created)
//! [5] plan limits       → 429 named policies (in the store; async, in proxy.rs)
//! ```

use crate::auth::{extract_key, Client, KeyError, API_KEY_HEADER};
use crate::headers;
use crate::identity::{client_ip, group_key};
use crate::limit::redis::StoreError;
use crate::limit::{Decision, Policy};
use crate::problem::Kind;
use crate::router::{check_request_path, RouteMatch};
use crate::snapshot::{Route, Snapshot};
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue, Method};
use std::net::IpAddr;
use std::sync::Arc;

/// Why the gateway answers a request itself instead of proxying it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reject {
    BadPath(&'static str),
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
            Reject::BadPath(_) | Reject::Key(KeyError::Ambiguous) => Kind::BadRequest,
            Reject::NotFound(_) => Kind::RouteNotFound,
            Reject::MethodNotAllowed { .. } => Kind::MethodNotAllowed,
            Reject::Key(_) | Reject::UnknownKey => Kind::Unauthorized,
            Reject::TooManyRequests => Kind::QuotaExceeded,
            Reject::Store(_) => Kind::LimiterUnavailable,
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Reject::BadPath(d) => (*d).to_owned(),
            Reject::NotFound(d) | Reject::MethodNotAllowed { detail: d, .. } => d.clone(),
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

/// [1] + [2]: the index of the route serving this request.
pub fn route(
    snapshot: &Snapshot,
    host: Option<&str>,
    method: &Method,
    path: &str,
) -> Result<usize, Reject> {
    check_request_path(path).map_err(|bad| Reject::BadPath(bad.detail()))?;
    match snapshot.router.find(host, method, path) {
        RouteMatch::Found(i) => Ok(i),
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
}

impl LimitStatus {
    pub fn push(&mut self, policy: &Policy, decision: Decision) {
        self.entries.push((policy.clone(), decision));
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
    pub fn headers(&self, legacy: bool) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(5);
        out.push((
            "ratelimit-policy",
            headers::policy_header(self.entries.iter().map(|(p, _)| p)),
        ));
        out.push((
            "ratelimit",
            headers::ratelimit_header(self.entries.iter().map(|(p, d)| (p, d))),
        ));
        if legacy {
            if let Some(d) = headers::most_restrictive(self.entries.iter().map(|(_, d)| d)) {
                for (name, value) in headers::legacy_headers(d) {
                    out.push((name, value.to_string()));
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
    if decision.allowed {
        Ok(())
    } else {
        Err(Reject::TooManyRequests)
    }
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
