//! A route's CORS rules (`cors = { origins, methods, headers, expose, credentials, max_age }`):
//! which origins a browser may call it from, the preflight's answer, and the headers an
//! actual response carries. Pure: the proxy asks, `proxy/cors.rs` writes.
//!
//! - **Origins** are compared after normalising: scheme and host lower-case, the scheme's
//!   default port dropped (`https://API.example.com:443` is `https://api.example.com`). An
//!   entry is exact, `"*"` (any origin but `null`), or one leading wildcard label
//!   (`https://*.example.com`: exactly one more label, same scheme and port; never the bare
//!   `example.com`, never `a.b.example.com`). `null` (sandboxed pages, `file:`) is matched only
//!   by an entry that says `"null"`.
//! - **Preflight** (`OPTIONS` with `Origin` and `Access-Control-Request-Method`): allowed when
//!   the origin, the method and every requested header are; answered with the origin itself
//!   (never `*`), the methods, the requested headers, `credentials` and `max_age`.
//! - **Actual responses** from an allowed origin: the origin, `Vary: Origin`, credentials,
//!   and `Access-Control-Expose-Headers` naming the gateway's headers (`RateLimit`,
//!   `RateLimit-Policy`, `Retry-After`, `X-Request-Id`) beside the configured ones, so that a
//!   page can read why it was refused.

use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, VARY,
};
use http::{HeaderMap, HeaderName, HeaderValue, Method};

/// The methods a route allows cross-origin when its `cors` names none.
pub const DEFAULT_METHODS: [&str; 6] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];

/// The gateway's headers every allowed origin may read (lower-case, as on the wire).
/// What a gRPC-Web client reads from the gateway's own answers, exposed on them.
const GRPC_EXPOSED: [&str; 3] = ["grpc-status", "grpc-message", "grpc-retry-pushback-ms"];

pub const ALWAYS_EXPOSED: [&str; 4] = [
    "ratelimit",
    "ratelimit-policy",
    "retry-after",
    "x-request-id",
];

/// Every `Access-Control-*` response header (what `upstream = "replace"` takes away).
pub const RESPONSE_NAMES: [HeaderName; 6] = [
    ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_ALLOW_CREDENTIALS,
    ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_HEADERS,
    ACCESS_CONTROL_EXPOSE_HEADERS,
    ACCESS_CONTROL_MAX_AGE,
];

/// `Access-Control-Request-Method`, `Access-Control-Request-Headers`.
pub static REQUEST_METHOD: HeaderName = HeaderName::from_static("access-control-request-method");
pub static REQUEST_HEADERS: HeaderName = HeaderName::from_static("access-control-request-headers");

/// One `origins` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginPattern {
    /// `"*"`: every origin but `null`.
    Any,
    /// A normalised origin (or `null`).
    Exact(String),
    /// `scheme://*.suffix[:port]`: `suffix` starts with `.`; `port` as normalised (`None`:
    /// the scheme's default).
    Label {
        scheme: String,
        suffix: String,
        port: Option<u16>,
    },
}

impl OriginPattern {
    /// As configured, normalised (`/config`).
    pub fn describe(&self) -> String {
        match self {
            OriginPattern::Any => "*".to_owned(),
            OriginPattern::Exact(o) => o.clone(),
            OriginPattern::Label {
                scheme,
                suffix,
                port,
            } => match port {
                Some(port) => format!("{scheme}://*{suffix}:{port}"),
                None => format!("{scheme}://*{suffix}"),
            },
        }
    }
}

/// Which request headers a preflight may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHeaders {
    /// Whatever the browser asks (`headers` unset, or `["*"]`): echoed back.
    Any,
    /// Only these (lower-case).
    Only(Vec<HeaderName>),
}

/// A route's CORS rules, compiled at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    pub origins: Vec<OriginPattern>,
    pub methods: Vec<Method>,
    pub headers: AllowedHeaders,
    pub credentials: bool,
    /// `upstream = "keep"`: an upstream response that says `Access-Control-Allow-Origin`
    /// is left as the upstream wrote it; `"replace"` (default): the gateway's answer.
    pub keep_upstream: bool,
    /// `Access-Control-Allow-Methods` as sent.
    methods_value: HeaderValue,
    /// `Access-Control-Expose-Headers` as sent (the gateway's and the configured ones).
    expose_value: HeaderValue,
    /// The same on the gateway's own answer to a gRPC-Web call, with its status headers
    /// (a browser's gRPC-Web client reads the status from them).
    grpc_expose_value: HeaderValue,
    max_age_value: Option<HeaderValue>,
}

/// Why a preflight is refused (the problem's detail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Origin,
    Method,
    Header,
}

impl Refusal {
    pub fn detail(self) -> &'static str {
        match self {
            Refusal::Origin => "this origin may not call this route from a browser",
            Refusal::Method => "this method may not be used cross-origin on this route",
            Refusal::Header => "a requested header may not be sent cross-origin on this route",
        }
    }
}

impl Cors {
    /// Compiled rules. `expose`: configured names (the gateway's are added); `max_age` in
    /// seconds.
    pub fn new(
        origins: Vec<OriginPattern>,
        methods: Vec<Method>,
        headers: AllowedHeaders,
        expose: &[HeaderName],
        credentials: bool,
        max_age: Option<u64>,
        keep_upstream: bool,
    ) -> Cors {
        let methods_text = methods
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        let mut exposed: Vec<&str> = ALWAYS_EXPOSED.to_vec();
        for name in expose {
            if !exposed.contains(&name.as_str()) {
                exposed.push(name.as_str());
            }
        }
        let grpc_exposed: Vec<&str> = exposed
            .iter()
            .copied()
            .chain(GRPC_EXPOSED.into_iter().filter(|g| !exposed.contains(g)))
            .collect();
        Cors {
            origins,
            methods,
            headers,
            credentials,
            keep_upstream,
            // Tokens joined by ", ": always a valid value.
            methods_value: HeaderValue::try_from(methods_text)
                .unwrap_or(HeaderValue::from_static("GET")),
            expose_value: HeaderValue::try_from(exposed.join(", "))
                .unwrap_or(HeaderValue::from_static("x-request-id")),
            grpc_expose_value: HeaderValue::try_from(grpc_exposed.join(", "))
                .unwrap_or(HeaderValue::from_static("grpc-status")),
            max_age_value: max_age.map(HeaderValue::from),
        }
    }

    /// Whether a browser on `origin` (the `Origin` header's bytes) may call the route.
    pub fn allows_origin(&self, origin: &[u8]) -> bool {
        if origin == b"null" {
            return self
                .origins
                .iter()
                .any(|p| matches!(p, OriginPattern::Exact(e) if e == "null"));
        }
        let Some(origin) = Origin::parse(origin) else {
            return false;
        };
        self.origins.iter().any(|p| origin.matches(p))
    }

    /// A preflight from an allowed origin: the headers of the 204, or why it is refused.
    pub fn preflight(
        &self,
        origin: &HeaderValue,
        method: &[u8],
        requested: &HeaderMap,
    ) -> Result<Vec<(HeaderName, HeaderValue)>, Refusal> {
        if !self.methods.iter().any(|m| m.as_str().as_bytes() == method) {
            return Err(Refusal::Method);
        }
        let mut asked: Vec<String> = Vec::new();
        for value in requested.get_all(&REQUEST_HEADERS) {
            let text = value.to_str().map_err(|_| Refusal::Header)?;
            for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| Refusal::Header)?;
                if let AllowedHeaders::Only(list) = &self.headers {
                    if !list.contains(&name) {
                        return Err(Refusal::Header);
                    }
                }
                asked.push(name.as_str().to_owned());
            }
        }
        let mut out = self.common(origin);
        out.push((ACCESS_CONTROL_ALLOW_METHODS, self.methods_value.clone()));
        if !asked.is_empty() {
            let value = HeaderValue::try_from(asked.join(", ")).map_err(|_| Refusal::Header)?;
            out.push((ACCESS_CONTROL_ALLOW_HEADERS, value));
        }
        if let Some(age) = &self.max_age_value {
            out.push((ACCESS_CONTROL_MAX_AGE, age.clone()));
        }
        Ok(out)
    }

    /// The headers an actual response to an allowed `origin` carries.
    pub fn actual(&self, origin: &HeaderValue) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = self.common(origin);
        out.push((ACCESS_CONTROL_EXPOSE_HEADERS, self.expose_value.clone()));
        out
    }

    /// [`actual`](Self::actual) for the gateway's own answer to a gRPC-Web call: its
    /// `grpc-status`, `grpc-message` and `grpc-retry-pushback-ms` exposed too.
    pub fn actual_grpc(&self, origin: &HeaderValue) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = self.common(origin);
        out.push((
            ACCESS_CONTROL_EXPOSE_HEADERS,
            self.grpc_expose_value.clone(),
        ));
        out
    }

    fn common(&self, origin: &HeaderValue) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::with_capacity(6);
        out.push((ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone()));
        out.push((VARY, HeaderValue::from_static("Origin")));
        if self.credentials {
            out.push((
                ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            ));
        }
        out
    }
}

/// Whether a request is a CORS preflight: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`; the method it asks for.
pub fn preflight_method<'a>(method: &Method, headers: &'a HeaderMap) -> Option<&'a HeaderValue> {
    if method != Method::OPTIONS || !headers.contains_key(http::header::ORIGIN) {
        return None;
    }
    headers.get(&REQUEST_METHOD)
}

/// An origin taken apart: scheme and host lower-case, the default port as `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub scheme: String,
    pub host: String,
    pub port: Option<u16>,
}

impl Origin {
    /// `scheme://host[:port]` and nothing else (no path, user or query); `None` otherwise.
    pub fn parse(text: &[u8]) -> Option<Origin> {
        let text = std::str::from_utf8(text).ok()?;
        let (scheme, rest) = text.split_once("://")?;
        let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        if !scheme_ok || rest.is_empty() {
            return None;
        }
        let scheme = scheme.to_ascii_lowercase();
        let (host, port) = match rest.rfind(':') {
            // An IPv6 literal's colons are inside its brackets.
            Some(i) if !rest[i..].contains(']') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-.[]:_".contains(c))
            && (host.starts_with('[') == host.ends_with(']'))
            && (!host.contains(':') || host.starts_with('['));
        if !host_ok {
            return None;
        }
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
                let n: u32 = p.parse().ok()?;
                let n = u16::try_from(n).ok()?;
                (Some(n) != default_port(&scheme)).then_some(n)
            }
            Some(_) => return None,
        };
        Some(Origin {
            host: host.to_ascii_lowercase(),
            scheme,
            port,
        })
    }

    /// The normalised form (`https://api.example.com`, `http://127.0.0.1:8080`).
    pub fn normalized(&self) -> String {
        match self.port {
            Some(port) => format!("{}://{}:{port}", self.scheme, self.host),
            None => format!("{}://{}", self.scheme, self.host),
        }
    }

    fn matches(&self, pattern: &OriginPattern) -> bool {
        match pattern {
            OriginPattern::Any => true,
            OriginPattern::Exact(exact) => *exact == self.normalized(),
            OriginPattern::Label {
                scheme,
                suffix,
                port,
            } => {
                *scheme == self.scheme
                    && *port == self.port
                    && self
                        .host
                        .strip_suffix(suffix.as_str())
                        .is_some_and(|label| {
                            !label.is_empty() && !label.contains('.') && !label.starts_with('[')
                        })
            }
        }
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

/// An `origins` entry as configured: `"*"`, `"null"`, an origin, or one with a leading
/// `*.` label.
pub fn parse_pattern(text: &str) -> Result<OriginPattern, String> {
    match text {
        "*" => return Ok(OriginPattern::Any),
        "null" => return Ok(OriginPattern::Exact("null".into())),
        _ => {}
    }
    let not_origin = || {
        format!(
            "{text:?} is not an origin: scheme://host[:port], no path (e.g. \"https://app.example.com\")"
        )
    };
    if let Some((scheme, rest)) = text.split_once("://*.") {
        let origin = Origin::parse(format!("{scheme}://wildcard.{rest}").as_bytes())
            .ok_or_else(not_origin)?;
        let suffix = origin.host["wildcard".len()..].to_owned();
        if suffix.matches('.').count() < 2 && !suffix.ends_with(".localhost") {
            return Err(format!(
                "{text:?}: a wildcard needs a domain of at least two labels after it (\"https://*.example.com\")"
            ));
        }
        return Ok(OriginPattern::Label {
            scheme: origin.scheme,
            suffix,
            port: origin.port,
        });
    }
    if text.contains('*') {
        return Err(format!(
            "{text:?}: a wildcard may only be the first label of the host (\"https://*.example.com\")"
        ));
    }
    Origin::parse(text.as_bytes())
        .map(|o| OriginPattern::Exact(o.normalized()))
        .ok_or_else(not_origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: &[&str], headers: AllowedHeaders, credentials: bool) -> Cors {
        Cors::new(
            origins.iter().map(|o| parse_pattern(o).unwrap()).collect(),
            vec![Method::GET, Method::POST],
            headers,
            &[HeaderName::from_static("x-total")],
            credentials,
            Some(600),
            false,
        )
    }

    #[test]
    fn origins_are_compared_normalised() {
        let c = cors(
            &["https://App.Example.com:443", "http://127.0.0.1:8080"],
            AllowedHeaders::Any,
            false,
        );
        assert!(c.allows_origin(b"https://app.example.com"));
        assert!(c.allows_origin(b"HTTPS://APP.EXAMPLE.COM:443"));
        assert!(c.allows_origin(b"http://127.0.0.1:8080"));
        assert!(!c.allows_origin(b"http://app.example.com"));
        assert!(!c.allows_origin(b"https://app.example.com:8443"));
        assert!(!c.allows_origin(b"https://app.example.com/"));
        assert!(!c.allows_origin(b"https://app.example.com.evil.net"));
        assert!(!c.allows_origin(b"https://user@app.example.com"));
        assert!(!c.allows_origin(b"http://127.0.0.1:80800"));
        assert!(!c.allows_origin(b"null"));
        assert!(!c.allows_origin(b""));
    }

    #[test]
    fn a_wildcard_is_one_leading_label_and_never_null() {
        let c = cors(&["https://*.example.com"], AllowedHeaders::Any, false);
        assert!(c.allows_origin(b"https://a.example.com"));
        assert!(c.allows_origin(b"https://A-1.Example.COM:443"));
        assert!(!c.allows_origin(b"https://example.com"));
        assert!(!c.allows_origin(b"https://a.b.example.com"));
        assert!(!c.allows_origin(b"https://aexample.com"));
        assert!(!c.allows_origin(b"http://a.example.com"));
        assert!(!c.allows_origin(b"https://a.example.com:444"));
        assert!(!c.allows_origin(b"null"));
        let any = cors(&["*"], AllowedHeaders::Any, false);
        assert!(any.allows_origin(b"https://anything.test"));
        assert!(!any.allows_origin(b"null"));
        assert!(cors(&["null"], AllowedHeaders::Any, false).allows_origin(b"null"));
    }

    #[test]
    fn patterns_are_refused_when_they_are_not_origins() {
        for bad in [
            "example.com",
            "https://example.com/",
            "https://*.com",
            "https://a.*.example.com",
            "https://*example.com",
            "https://example.com:99999",
            "*.example.com",
        ] {
            assert!(parse_pattern(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_pattern("HTTPS://*.Example.com:443").unwrap(),
            OriginPattern::Label {
                scheme: "https".into(),
                suffix: ".example.com".into(),
                port: None
            }
        );
    }

    #[test]
    fn a_preflight_checks_the_method_and_every_header() {
        let origin = HeaderValue::from_static("https://app.example.com");
        let only = AllowedHeaders::Only(vec![
            HeaderName::from_static("x-api-key"),
            HeaderName::from_static("content-type"),
        ]);
        let c = cors(&["https://app.example.com"], only, true);
        let mut asked = HeaderMap::new();
        asked.insert(
            &REQUEST_HEADERS,
            HeaderValue::from_static("X-Api-Key, content-type"),
        );
        let answer = c.preflight(&origin, b"POST", &asked).unwrap();
        let get = |n: HeaderName| answer.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        assert_eq!(get(ACCESS_CONTROL_ALLOW_ORIGIN).unwrap(), origin);
        assert_eq!(get(ACCESS_CONTROL_ALLOW_METHODS).unwrap(), "GET, POST");
        assert_eq!(
            get(ACCESS_CONTROL_ALLOW_HEADERS).unwrap(),
            "x-api-key, content-type"
        );
        assert_eq!(get(ACCESS_CONTROL_ALLOW_CREDENTIALS).unwrap(), "true");
        assert_eq!(get(ACCESS_CONTROL_MAX_AGE).unwrap(), "600");
        assert_eq!(
            c.preflight(&origin, b"DELETE", &asked),
            Err(Refusal::Method)
        );
        asked.append(&REQUEST_HEADERS, HeaderValue::from_static("x-other"));
        assert_eq!(c.preflight(&origin, b"POST", &asked), Err(Refusal::Header));
        let actual = c.actual(&origin);
        let expose = actual
            .iter()
            .find(|(k, _)| *k == ACCESS_CONTROL_EXPOSE_HEADERS)
            .unwrap();
        assert_eq!(
            expose.1,
            "ratelimit, ratelimit-policy, retry-after, x-request-id, x-total"
        );
    }

    #[test]
    fn only_options_with_origin_and_a_requested_method_is_a_preflight() {
        let mut h = HeaderMap::new();
        h.insert(&REQUEST_METHOD, HeaderValue::from_static("POST"));
        assert!(preflight_method(&Method::OPTIONS, &h).is_none());
        h.insert(
            http::header::ORIGIN,
            HeaderValue::from_static("https://a.test"),
        );
        assert_eq!(preflight_method(&Method::OPTIONS, &h).unwrap(), "POST");
        assert!(preflight_method(&Method::GET, &h).is_none());
    }
}
