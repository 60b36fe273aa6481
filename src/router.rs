//! Route matching: a pure function of (host, method, path) over the configured routes.
//!
//! Rules (documented in `conf/gateway.toml`):
//! - a route's `path_prefix` matches the path itself and everything below it on a segment
//!   boundary (`/orders` matches `/orders`, `/orders/7`, but not `/ordersx`); a prefix ending
//!   in `/` matches any path starting with it;
//! - the longest matching prefix wins; at equal length a route with a `host` beats one
//!   without; then the earlier route in the file;
//! - `host` and `methods` are match criteria: a request whose method no route allows, but
//!   whose host and path some route matches, gets `405` with an `Allow` list.
//!
//! Paths containing dot segments (`/a/../b`, also percent-encoded) or backslashes are
//! rejected before matching: a gateway must not route `/public/../admin` by its first
//! segment while the upstream resolves it to `/admin`.

use crate::config::RouteConfig;
use http::Method;

#[derive(Debug, Clone)]
pub struct Router {
    /// Sorted by precedence: longest prefix, host-specific first, then file order.
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
struct Entry {
    route: usize,
    prefix: Box<str>,
    host: Option<Box<str>>,
    methods: Option<Vec<Method>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteMatch {
    /// Index into the configured routes.
    Found(usize),
    /// Some route matches host and path, none allows the method; the value is the
    /// `Allow` header listing the methods that would be accepted.
    MethodNotAllowed(String),
    NotFound,
}

impl Router {
    pub fn new(routes: &[RouteConfig]) -> Router {
        let mut entries: Vec<Entry> = routes
            .iter()
            .enumerate()
            .map(|(route, r)| Entry {
                route,
                prefix: r.path_prefix.clone().into_boxed_str(),
                host: r.host.clone().map(String::into_boxed_str),
                methods: r.methods.clone(),
            })
            .collect();
        entries.sort_by(|a, b| {
            b.prefix
                .len()
                .cmp(&a.prefix.len())
                .then(b.host.is_some().cmp(&a.host.is_some()))
                .then(a.route.cmp(&b.route))
        });
        Router { entries }
    }

    /// `host` is the request's Host (header or URI authority), possibly with a port.
    pub fn find(&self, host: Option<&str>, method: &Method, path: &str) -> RouteMatch {
        let host = host.map(strip_port);
        let mut allowed: Option<Vec<&Method>> = None;
        for entry in &self.entries {
            if let Some(want) = &entry.host {
                match host {
                    Some(h) if h.eq_ignore_ascii_case(want) => {}
                    _ => continue,
                }
            }
            if !prefix_matches(&entry.prefix, path) {
                continue;
            }
            match &entry.methods {
                Some(methods) if !methods.contains(method) => {
                    let list = allowed.get_or_insert_with(Vec::new);
                    for m in methods {
                        if !list.contains(&m) {
                            list.push(m);
                        }
                    }
                }
                _ => return RouteMatch::Found(entry.route),
            }
        }
        match allowed {
            Some(methods) => {
                let names: Vec<&str> = methods.iter().map(|m| m.as_str()).collect();
                RouteMatch::MethodNotAllowed(names.join(", "))
            }
            None => RouteMatch::NotFound,
        }
    }
}

fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
        None => false,
    }
}

/// `example.com:8080` → `example.com`, `[::1]:80` → `[::1]`; a trailing dot is dropped.
fn strip_port(host: &str) -> &str {
    let host = if host.starts_with('[') {
        host.find(']').map_or(host, |end| &host[..=end])
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    host.strip_suffix('.').unwrap_or(host)
}

/// Why a request path is refused before routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadPath {
    NotAbsolute,
    DotSegment,
    Backslash,
}

impl BadPath {
    pub fn detail(self) -> &'static str {
        match self {
            BadPath::NotAbsolute => "the request path must start with '/'",
            BadPath::DotSegment => "the request path must not contain '.' or '..' segments",
            BadPath::Backslash => "the request path must not contain backslashes",
        }
    }
}

/// Checks a request path (without query) before it is routed.
pub fn check_request_path(path: &str) -> Result<(), BadPath> {
    if !path.starts_with('/') {
        return Err(BadPath::NotAbsolute);
    }
    let bytes = path.as_bytes();
    // Fast path for the common case: nothing that could start a dot segment or a backslash.
    if !bytes.iter().any(|&b| matches!(b, b'.' | b'%' | b'\\')) {
        return Ok(());
    }
    if bytes.contains(&b'\\') || contains_ignore_case(bytes, b"%5c") {
        return Err(BadPath::Backslash);
    }
    for segment in path.split('/') {
        if is_dot_segment(segment) {
            return Err(BadPath::DotSegment);
        }
    }
    Ok(())
}

fn is_dot_segment(segment: &str) -> bool {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        if rest[0] == b'.' {
            rest = &rest[1..];
        } else if rest.len() >= 3 && rest[0] == b'%' && rest[1] == b'2' && (rest[2] | 0x20) == b'e'
        {
            rest = &rest[3..];
        } else {
            return false;
        }
        dots += 1;
    }
    dots == 1 || dots == 2
}

fn contains_ignore_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Validation of a configured `path_prefix` (used by the config loader).
pub fn check_path_prefix(prefix: &str) -> Result<(), String> {
    let expected =
        "expected a path like \"/orders\" (starting with '/', no query, spaces or dot segments)";
    if !prefix.starts_with('/')
        || prefix.contains("//")
        || prefix
            .bytes()
            .any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#')
        || check_request_path(prefix).is_err()
    {
        return Err(format!("{prefix:?}: {expected}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn route(
        name: &str,
        prefix: &str,
        host: Option<&str>,
        methods: Option<&[&str]>,
    ) -> RouteConfig {
        RouteConfig {
            name: name.into(),
            path_prefix: prefix.into(),
            host: host.map(Into::into),
            methods: methods.map(|ms| ms.iter().map(|m| m.parse().unwrap()).collect()),
            upstream: "u".into(),
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
            write_timeout: Duration::from_secs(1),
            ip_limit: crate::config::IpLimitChoice::Off,
            auth: crate::config::Auth::None,
            cost: 1,
            rate_limit_headers: crate::config::HeadersMode::On,
            legacy_rate_limit_headers: false,
            forward_api_key: false,
            on_store_error: crate::config::FailureMode::FailOpen,
            max_body_bytes: 1024,
            shadow: false,
            max_concurrent: None,
        }
    }

    fn find(router: &Router, host: Option<&str>, method: &str, path: &str) -> RouteMatch {
        router.find(host, &method.parse().unwrap(), path)
    }

    #[test]
    fn longest_prefix_wins_regardless_of_order() {
        let r = Router::new(&[
            route("root", "/", None, None),
            route("orders", "/orders", None, None),
            route("special", "/orders/special", None, None),
        ]);
        assert_eq!(
            find(&r, None, "GET", "/orders/special/1"),
            RouteMatch::Found(2)
        );
        assert_eq!(find(&r, None, "GET", "/orders/1"), RouteMatch::Found(1));
        assert_eq!(find(&r, None, "GET", "/orders"), RouteMatch::Found(1));
        assert_eq!(find(&r, None, "GET", "/other"), RouteMatch::Found(0));
    }

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        let r = Router::new(&[
            route("orders", "/orders", None, None),
            route("api", "/api/", None, None),
        ]);
        assert_eq!(find(&r, None, "GET", "/ordersx"), RouteMatch::NotFound);
        assert_eq!(find(&r, None, "GET", "/orders/"), RouteMatch::Found(0));
        assert_eq!(find(&r, None, "GET", "/api/x"), RouteMatch::Found(1));
        assert_eq!(find(&r, None, "GET", "/api"), RouteMatch::NotFound);
    }

    #[test]
    fn host_is_matched_case_insensitively_without_port() {
        let r = Router::new(&[
            route("any", "/orders", None, None),
            route("eu", "/orders", Some("eu.example.com"), None),
        ]);
        assert_eq!(
            find(&r, Some("EU.example.com:8080"), "GET", "/orders"),
            RouteMatch::Found(1)
        );
        assert_eq!(
            find(&r, Some("eu.example.com."), "GET", "/orders"),
            RouteMatch::Found(1)
        );
        assert_eq!(
            find(&r, Some("us.example.com"), "GET", "/orders"),
            RouteMatch::Found(0)
        );
        assert_eq!(find(&r, None, "GET", "/orders"), RouteMatch::Found(0));
        assert_eq!(strip_port("[::1]:80"), "[::1]");
    }

    #[test]
    fn methods_are_match_criteria_and_405_lists_allowed_ones() {
        let r = Router::new(&[
            route("read", "/orders", None, Some(&["GET", "HEAD"])),
            route("write", "/orders", None, Some(&["POST"])),
        ]);
        assert_eq!(find(&r, None, "POST", "/orders"), RouteMatch::Found(1));
        assert_eq!(
            find(&r, None, "DELETE", "/orders/1"),
            RouteMatch::MethodNotAllowed("GET, HEAD, POST".into())
        );
        let with_fallback = Router::new(&[
            route("read", "/orders", None, Some(&["GET"])),
            route("root", "/", None, None),
        ]);
        assert_eq!(
            find(&with_fallback, None, "POST", "/orders"),
            RouteMatch::Found(1)
        );
    }

    #[test]
    fn dot_segments_and_backslashes_are_rejected() {
        for bad in ["/a/../b", "/..", "/a/./b", "/a/%2e%2E/b", "/a/.%2e", "/%2E"] {
            assert_eq!(check_request_path(bad), Err(BadPath::DotSegment), "{bad}");
        }
        assert_eq!(check_request_path("/a\\b"), Err(BadPath::Backslash));
        assert_eq!(check_request_path("/a%5Cb"), Err(BadPath::Backslash));
        assert_eq!(check_request_path("*"), Err(BadPath::NotAbsolute));
        for good in [
            "/",
            "/orders/1",
            "/a/...",
            "/file.json",
            "/.well-known/x",
            "/a%20b",
        ] {
            assert_eq!(check_request_path(good), Ok(()), "{good}");
        }
    }

    #[test]
    fn configured_prefixes_are_checked() {
        assert!(check_path_prefix("/orders").is_ok());
        for bad in ["orders", "/a b", "/a?x", "//a", "/a/../b", ""] {
            assert!(check_path_prefix(bad).is_err(), "{bad}");
        }
    }
}
