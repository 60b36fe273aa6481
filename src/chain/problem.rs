//! `application/problem+json` bodies (RFC 9457) for every response the gateway itself
//! writes: bad requests, unknown routes, authentication and limiter rejections (429, and 503
//! when the store cannot decide and the route fails closed), upstream failures.

use serde::Serialize;

pub const CONTENT_TYPE: &str = "application/problem+json";

/// Problem type URIs are identifiers under this base (documented in `docs/problems.md`); they need
/// not be dereferenceable.
pub const TYPE_BASE: &str = "https://turnstile.dev/problems/";

/// The kinds of problems the gateway reports, each with its status and fixed wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    BadRequest,
    Unauthorized,
    /// The client's address (or, later, the client) may not call the route.
    Forbidden,
    RouteNotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    UriTooLong,
    HeadersTooLarge,
    QuotaExceeded,
    /// The limiter's store failed and the route fails closed.
    LimiterUnavailable,
    /// An issuer's keys were never loaded (its JWKS endpoint has not answered): the token
    /// cannot be checked, through no fault of the client.
    IdentityUnavailable,
    NoHealthyUpstream,
    /// The upstream pool is at its concurrency limit: the request was shed.
    Overloaded,
    UpstreamUnavailable,
    UpstreamTimeout,
    Internal,
    /// Any other status the gateway has to answer with (e.g. one Pingora chose).
    Other(u16),
}

impl Kind {
    /// Every kind but `Other` (the docs' tables have a row for each).
    pub const NAMED: [Kind; 16] = [
        Kind::BadRequest,
        Kind::Unauthorized,
        Kind::Forbidden,
        Kind::RouteNotFound,
        Kind::MethodNotAllowed,
        Kind::PayloadTooLarge,
        Kind::UriTooLong,
        Kind::HeadersTooLarge,
        Kind::QuotaExceeded,
        Kind::LimiterUnavailable,
        Kind::IdentityUnavailable,
        Kind::NoHealthyUpstream,
        Kind::Overloaded,
        Kind::UpstreamUnavailable,
        Kind::UpstreamTimeout,
        Kind::Internal,
    ];

    pub fn from_status(status: u16) -> Kind {
        match status {
            400 => Kind::BadRequest,
            401 => Kind::Unauthorized,
            403 => Kind::Forbidden,
            429 => Kind::QuotaExceeded,
            413 => Kind::PayloadTooLarge,
            414 => Kind::UriTooLong,
            431 => Kind::HeadersTooLarge,
            503 => Kind::LimiterUnavailable,
            404 => Kind::RouteNotFound,
            405 => Kind::MethodNotAllowed,
            502 => Kind::UpstreamUnavailable,
            504 => Kind::UpstreamTimeout,
            500 => Kind::Internal,
            other => Kind::Other(other),
        }
    }

    pub fn status(self) -> u16 {
        match self {
            Kind::BadRequest => 400,
            Kind::Unauthorized => 401,
            Kind::Forbidden => 403,
            Kind::RouteNotFound => 404,
            Kind::MethodNotAllowed => 405,
            Kind::QuotaExceeded => 429,
            Kind::PayloadTooLarge => 413,
            Kind::UriTooLong => 414,
            Kind::HeadersTooLarge => 431,
            Kind::LimiterUnavailable | Kind::Overloaded | Kind::IdentityUnavailable => 503,
            Kind::NoHealthyUpstream | Kind::UpstreamUnavailable => 502,
            Kind::UpstreamTimeout => 504,
            Kind::Internal => 500,
            Kind::Other(status) => status,
        }
    }

    pub fn slug(self) -> &'static str {
        match self {
            Kind::BadRequest => "bad-request",
            Kind::Unauthorized => "unauthorized",
            Kind::Forbidden => "forbidden",
            Kind::RouteNotFound => "route-not-found",
            Kind::MethodNotAllowed => "method-not-allowed",
            Kind::QuotaExceeded => "quota-exceeded",
            Kind::PayloadTooLarge => "payload-too-large",
            Kind::UriTooLong => "uri-too-long",
            Kind::HeadersTooLarge => "headers-too-large",
            Kind::LimiterUnavailable => "limiter-unavailable",
            Kind::IdentityUnavailable => "identity-provider-unavailable",
            Kind::NoHealthyUpstream => "no-healthy-upstream",
            Kind::Overloaded => "overloaded",
            Kind::UpstreamUnavailable => "upstream-unavailable",
            Kind::UpstreamTimeout => "upstream-timeout",
            Kind::Internal => "internal-error",
            Kind::Other(_) => "http-error",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Kind::BadRequest => "Bad Request",
            Kind::Unauthorized => "Unauthorized",
            Kind::Forbidden => "Forbidden",
            Kind::RouteNotFound => "Not Found",
            Kind::MethodNotAllowed => "Method Not Allowed",
            Kind::QuotaExceeded => "Too Many Requests",
            Kind::PayloadTooLarge => "Content Too Large",
            Kind::UriTooLong => "URI Too Long",
            Kind::HeadersTooLarge => "Request Header Fields Too Large",
            Kind::LimiterUnavailable | Kind::Overloaded | Kind::IdentityUnavailable => {
                "Service Unavailable"
            }
            Kind::NoHealthyUpstream | Kind::UpstreamUnavailable => "Bad Gateway",
            Kind::UpstreamTimeout => "Gateway Timeout",
            Kind::Internal => "Internal Server Error",
            Kind::Other(status) => http::StatusCode::from_u16(status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("Error"),
        }
    }
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    type_uri: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
    #[serde(
        rename = "violated-policies",
        skip_serializing_if = "<[&str]>::is_empty"
    )]
    violated_policies: &'a [&'a str],
}

/// Renders a problem body. `detail` is a human sentence; `request_id` lets a client quote
/// the request to an operator.
pub fn render(kind: Kind, detail: &str, request_id: Option<&str>) -> Vec<u8> {
    render_with_policies(kind, detail, request_id, &[])
}

/// A problem body naming the rate-limit policies that rejected the request.
pub fn render_with_policies(
    kind: Kind,
    detail: &str,
    request_id: Option<&str>,
    violated_policies: &[&str],
) -> Vec<u8> {
    let body = Body {
        type_uri: format!("{TYPE_BASE}{}", kind.slug()),
        title: kind.title(),
        status: kind.status(),
        detail,
        request_id,
        violated_policies,
    };
    serde_json::to_vec(&body).expect("problem bodies serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_rfc9457_members() {
        let body = render(Kind::RouteNotFound, "no route for GET /x", Some("abc"));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "https://turnstile.dev/problems/route-not-found");
        assert_eq!(v["title"], "Not Found");
        assert_eq!(v["status"], 404);
        assert_eq!(v["detail"], "no route for GET /x");
        assert_eq!(v["request_id"], "abc");
    }

    #[test]
    fn quota_problems_name_the_violated_policies() {
        let body = render_with_policies(Kind::QuotaExceeded, "slow down", None, &["per-minute"]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["status"], 429);
        assert_eq!(v["type"], "https://turnstile.dev/problems/quota-exceeded");
        assert_eq!(v["violated-policies"], serde_json::json!(["per-minute"]));
        let plain: serde_json::Value =
            serde_json::from_slice(&render(Kind::RouteNotFound, "x", None)).unwrap();
        assert!(plain.get("violated-policies").is_none());
    }

    #[test]
    fn details_are_escaped() {
        let body = render(Kind::BadRequest, "bad \"quote\"\n", None);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["detail"], "bad \"quote\"\n");
        assert!(v.get("request_id").is_none());
    }

    /// docs/problems.md has a row for each kind: its status and its type.
    #[test]
    fn every_kind_is_documented() {
        let docs = include_str!("../../docs/problems.md");
        // Exhaustive: a new kind does not compile here until it is listed.
        let listed = |k: Kind| match k {
            Kind::BadRequest
            | Kind::Unauthorized
            | Kind::Forbidden
            | Kind::RouteNotFound
            | Kind::MethodNotAllowed
            | Kind::PayloadTooLarge
            | Kind::UriTooLong
            | Kind::HeadersTooLarge
            | Kind::QuotaExceeded
            | Kind::LimiterUnavailable
            | Kind::IdentityUnavailable
            | Kind::NoHealthyUpstream
            | Kind::Overloaded
            | Kind::UpstreamUnavailable
            | Kind::UpstreamTimeout
            | Kind::Internal
            | Kind::Other(_) => k,
        };
        for kind in Kind::NAMED.map(listed) {
            let row = format!("| {} | `{}` |", kind.status(), kind.slug());
            assert!(docs.contains(&row), "docs/problems.md lacks {row}");
        }
        assert!(docs.contains(&format!("| other | `{}` |", Kind::Other(418).slug())));
    }
}
