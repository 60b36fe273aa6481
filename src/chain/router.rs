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
//! - a trailing `/` in a prefix is ignored: `/admin/` is `/admin`, and matches `/admin`
//!   itself (which frameworks without strict slashes serve as `/admin/`);
//! - prefixes match case-sensitively, as RFC 3986 paths are; but a path that matches a route
//!   only when letter case is ignored, where the exact match is another (less specific) route,
//!   is refused ([`RouteMatch::CaseMismatch`]): behind a case-insensitive upstream
//!   (Express, ASP.NET) `/ORDERS` would otherwise reach `/orders` past that route's checks.
//!
//! Paths are normalised before they get here (`path.rs`): no empty or dot segments,
//! no `;`, no ambiguous escapes.

use crate::chain::path::normalize;
use crate::chain::reject::Reject;
use http::Method;

/// What the router needs of one route (in configuration order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// The configured `path_prefix` (in normal form).
    pub prefix: String,
    /// Lower-case host name without port; `None` matches any host.
    pub host: Option<String>,
    /// `None` allows every method.
    pub methods: Option<Vec<Method>>,
}

#[derive(Debug, Clone)]
pub struct Router {
    /// Sorted by precedence: longest prefix, host-specific first, then file order.
    entries: Vec<Candidate>,
    /// The configured prefixes, in configuration order (for messages).
    prefixes: Vec<String>,
}

#[derive(Debug, Clone)]
struct Candidate {
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
    /// The path matches this route's prefix only when letter case is ignored, and some
    /// other route exactly (or none at all).
    CaseMismatch(usize),
    NotFound,
}

impl Router {
    pub fn new(routes: impl IntoIterator<Item = RouteSpec>) -> Router {
        let routes: Vec<RouteSpec> = routes.into_iter().collect();
        let mut entries: Vec<Candidate> = routes
            .iter()
            .enumerate()
            .map(|(route, r)| Candidate {
                route,
                prefix: trim_trailing_slash(&r.prefix).into(),
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
        Router {
            entries,
            prefixes: routes.into_iter().map(|r| r.prefix).collect(),
        }
    }

    /// The configured prefix of route `i`.
    pub fn prefix(&self, i: usize) -> &str {
        self.prefixes.get(i).map_or("", String::as_str)
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
                if allowed.is_none() && prefix_matches_ignoring_case(&entry.prefix, path) {
                    // More specific than anything matched so far (entries are in
                    // precedence order): the case decides which route serves this path.
                    return RouteMatch::CaseMismatch(entry.route);
                }
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

/// `prefix` (without a trailing `/`, except the root) matches `path` on a segment boundary.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || prefix == "/" || rest.starts_with('/'),
        None => false,
    }
}

fn prefix_matches_ignoring_case(prefix: &str, path: &str) -> bool {
    let (prefix, path) = (prefix.as_bytes(), path.as_bytes());
    if path.len() < prefix.len() || !path[..prefix.len()].eq_ignore_ascii_case(prefix) {
        return false;
    }
    let rest = &path[prefix.len()..];
    rest.is_empty() || prefix == b"/" || rest[0] == b'/'
}

/// `/admin/` → `/admin`; the root stays `/`.
fn trim_trailing_slash(prefix: &str) -> &str {
    match prefix.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
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

/// [1] + [2]: the index of the route serving this request, and the normalised path (the one
/// routed, and so the one to forward) when it differs from the request's.
pub fn route(
    router: &Router,
    host: Option<&str>,
    method: &Method,
    path: &str,
) -> Result<(usize, Option<String>), Reject> {
    let normal = normalize(path).map_err(|bad| Reject::BadPath(bad.detail()))?;
    let path = normal.as_ref();
    match router.find(host, method, path) {
        RouteMatch::Found(i) => Ok((
            i,
            match normal {
                std::borrow::Cow::Borrowed(_) => None,
                std::borrow::Cow::Owned(p) => Some(p),
            },
        )),
        RouteMatch::CaseMismatch(i) => Err(Reject::CaseMismatch(format!(
            "{path} matches the path prefix {:?} only when letter case is ignored; send the path in the case the route is configured with",
            router.prefix(i)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn route(_name: &str, prefix: &str, host: Option<&str>, methods: Option<&[&str]>) -> RouteSpec {
        RouteSpec {
            prefix: prefix.into(),
            host: host.map(Into::into),
            methods: methods.map(|ms| ms.iter().map(|m| m.parse().unwrap()).collect()),
        }
    }

    fn find(router: &Router, host: Option<&str>, method: &str, path: &str) -> RouteMatch {
        router.find(host, &method.parse().unwrap(), path)
    }

    #[test]
    fn longest_prefix_wins_regardless_of_order() {
        let r = Router::new([
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
        let r = Router::new([
            route("orders", "/orders", None, None),
            route("api", "/api/", None, None),
        ]);
        assert_eq!(find(&r, None, "GET", "/ordersx"), RouteMatch::NotFound);
        assert_eq!(find(&r, None, "GET", "/orders/"), RouteMatch::Found(0));
        assert_eq!(find(&r, None, "GET", "/api/x"), RouteMatch::Found(1));
        // A trailing slash in the prefix is ignored (see below).
        assert_eq!(find(&r, None, "GET", "/api"), RouteMatch::Found(1));
        assert_eq!(find(&r, None, "GET", "/apix"), RouteMatch::NotFound);
    }

    #[test]
    fn host_is_matched_case_insensitively_without_port() {
        let r = Router::new([
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
        let r = Router::new([
            route("read", "/orders", None, Some(&["GET", "HEAD"])),
            route("write", "/orders", None, Some(&["POST"])),
        ]);
        assert_eq!(find(&r, None, "POST", "/orders"), RouteMatch::Found(1));
        assert_eq!(
            find(&r, None, "DELETE", "/orders/1"),
            RouteMatch::MethodNotAllowed("GET, HEAD, POST".into())
        );
        let with_fallback = Router::new([
            route("read", "/orders", None, Some(&["GET"])),
            route("root", "/", None, None),
        ]);
        assert_eq!(
            find(&with_fallback, None, "POST", "/orders"),
            RouteMatch::Found(1)
        );
    }

    #[test]
    fn a_trailing_slash_in_a_prefix_is_ignored() {
        let r = Router::new([
            route("root", "/", None, None),
            route("admin", "/admin/", None, None),
        ]);
        for path in ["/admin", "/admin/", "/admin/users"] {
            assert_eq!(find(&r, None, "GET", path), RouteMatch::Found(1), "{path}");
        }
        assert_eq!(
            find(&r, None, "GET", "/administrator"),
            RouteMatch::Found(0)
        );
    }

    #[test]
    fn a_path_matching_a_route_only_ignoring_case_is_refused() {
        let r = Router::new([
            route("root", "/", None, None),
            route("orders", "/orders", None, None),
            route("v1", "/v1/Items", None, None),
        ]);
        assert_eq!(
            find(&r, None, "GET", "/ORDERS"),
            RouteMatch::CaseMismatch(1)
        );
        assert_eq!(
            find(&r, None, "GET", "/Orders/7"),
            RouteMatch::CaseMismatch(1)
        );
        assert_eq!(
            find(&r, None, "GET", "/v1/items"),
            RouteMatch::CaseMismatch(2)
        );
        assert_eq!(find(&r, None, "GET", "/v1/Items/x"), RouteMatch::Found(2));
        assert_eq!(find(&r, None, "GET", "/ordersX"), RouteMatch::Found(0));
        assert_eq!(find(&r, None, "GET", "/other"), RouteMatch::Found(0));
        // Nothing matches exactly either: still refused, not a plain 404.
        let only = Router::new([route("orders", "/orders", None, None)]);
        assert_eq!(
            find(&only, None, "GET", "/Orders"),
            RouteMatch::CaseMismatch(0)
        );
        assert_eq!(find(&only, None, "GET", "/x"), RouteMatch::NotFound);
    }
}
