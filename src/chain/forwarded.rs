//! How the client reached the gateway, as the upstream is told: `X-Forwarded-Proto` (the
//! scheme), `X-Forwarded-Host` (the host the client asked for), `X-Forwarded-Prefix` (the
//! path prefix a route stripped) and, on routes that ask for it, RFC 7239 `Forwarded`.
//!
//! The single-valued headers are the gateway's: a value from a client replaced, except one
//! field value from a trusted proxy (`server.trusted_proxies`), which knows better where the
//! request came from. `Forwarded` is a list like `X-Forwarded-For`: the gateway appends its
//! element, and the upstream trusts as much of the list as it knows proxies for.

use http::header::FORWARDED;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::fmt::Write;
use std::net::IpAddr;

pub const X_FORWARDED_PROTO: &str = "x-forwarded-proto";
pub const X_FORWARDED_HOST: &str = "x-forwarded-host";
pub const X_FORWARDED_PREFIX: &str = "x-forwarded-prefix";
/// The same names parsed once, and `Forwarded`, as the upstream head's edits name them.
static PROTO: HeaderName = HeaderName::from_static(X_FORWARDED_PROTO);
static HOST: HeaderName = HeaderName::from_static(X_FORWARDED_HOST);
static PREFIX: HeaderName = HeaderName::from_static(X_FORWARDED_PREFIX);
static FORWARDED_NAME: HeaderName = FORWARDED;

/// What the gateway knows of how the request reached it.
pub struct Origin<'a> {
    /// The TCP peer, if an IP connection.
    pub peer: Option<IpAddr>,
    /// The peer is a trusted proxy.
    pub trusted: bool,
    /// The client spoke TLS to the gateway.
    pub tls: bool,
    /// `Host` (HTTP/1) or `:authority` (HTTP/2), as received.
    pub host: Option<&'a str>,
    /// The path prefix the route stripped.
    pub prefix: Option<&'a str>,
    /// The route adds an RFC 7239 `Forwarded` element.
    pub forwarded: bool,
}

/// A header the upstream gets (`Some`) or does not get at all (`None`).
pub type Edit = (&'static HeaderName, Option<HeaderValue>);

/// The forwarding headers the upstream gets: each set (`Some`) or removed (`None`); without
/// `forwarded`, `Forwarded` is left as received (the route does not add its element).
pub struct Forwarding {
    pub forwarded: Option<HeaderValue>,
    pub proto: &'static str,
    pub host: Option<HeaderValue>,
    pub prefix: Option<HeaderValue>,
}

impl Forwarding {
    /// Every header the upstream gets or loses, by its name (static: no name is built per
    /// request).
    pub fn edits(self) -> impl Iterator<Item = Edit> {
        let forwarded = self.forwarded.map(|v| (&FORWARDED_NAME, Some(v)));
        forwarded.into_iter().chain([
            (&PROTO, Some(HeaderValue::from_static(self.proto))),
            (&HOST, self.host),
            (&PREFIX, self.prefix),
        ])
    }
}

/// The forwarding headers for a request that arrived with `incoming`: every header of
/// [`Origin`]'s, set or removed.
pub fn headers(o: &Origin<'_>, incoming: &HeaderMap) -> Result<Forwarding, String> {
    let value = |text: &str| HeaderValue::try_from(text).map_err(|e| e.to_string());
    let ours = if o.tls { "https" } else { "http" };
    let proto = client_scheme(o.trusted, o.tls, incoming);
    let host = o
        .trusted
        .then(|| single(incoming, X_FORWARDED_HOST))
        .flatten()
        .filter(|h| is_host(h))
        .or_else(|| o.host.filter(|h| is_host(h)));
    let prefix = o.prefix.or_else(|| {
        o.trusted
            .then(|| single(incoming, X_FORWARDED_PREFIX))
            .flatten()
            .filter(|p| p.starts_with('/'))
    });
    let forwarded = if o.forwarded {
        let mut list: Vec<&str> = incoming
            .get_all(FORWARDED)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .collect();
        let hop = element(o.peer, host, ours);
        list.push(&hop);
        Some(value(&list.join(", "))?)
    } else {
        None
    };
    Ok(Forwarding {
        forwarded,
        proto,
        host: host.map(value).transpose()?,
        prefix: prefix.map(value).transpose()?,
    })
}

/// The scheme the client used: `https` or `http` from one `X-Forwarded-Proto` field of a
/// trusted proxy (which knows how the client reached it), otherwise the gateway's own (`tls`).
/// The upstream's `X-Forwarded-Proto`, and whether `[server] https_redirect` answers a plain
/// request (a trusted TLS-terminating proxy in front would otherwise be redirected forever).
pub fn client_scheme(trusted: bool, tls: bool, incoming: &HeaderMap) -> &'static str {
    trusted
        .then(|| single(incoming, X_FORWARDED_PROTO))
        .flatten()
        .and_then(|v| match v {
            _ if v.eq_ignore_ascii_case("https") => Some("https"),
            _ if v.eq_ignore_ascii_case("http") => Some("http"),
            _ => None,
        })
        .unwrap_or(if tls { "https" } else { "http" })
}

/// The one value of `name`: `None` when absent, repeated, a list, or not text.
fn single<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let text = value.to_str().ok()?.trim();
    (!text.is_empty() && !text.contains(',')).then_some(text)
}

/// A host (and port) as an authority may carry it: letters, digits, `-._~:[]` and the
/// sub-delimiters that hosts use in practice; nothing that would need quoting or escaping.
fn is_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~:[]".contains(&b))
}

/// This hop's `Forwarded` element (RFC 7239 §4): `for` the peer (an IPv6 address quoted and
/// bracketed, `unknown` without one), `host` quoted, `proto`.
fn element(peer: Option<IpAddr>, host: Option<&str>, proto: &str) -> String {
    let mut out = String::with_capacity(64);
    match peer {
        Some(IpAddr::V4(ip)) => {
            let _ = write!(out, "for={ip}");
        }
        Some(IpAddr::V6(ip)) => {
            let _ = write!(out, "for=\"[{ip}]\"");
        }
        None => out.push_str("for=unknown"),
    }
    if let Some(host) = host {
        let _ = write!(out, ";host=\"{host}\"");
    }
    let _ = write!(out, ";proto={proto}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;

    fn origin<'a>(trusted: bool, tls: bool) -> Origin<'a> {
        Origin {
            peer: Some("10.0.0.9".parse().unwrap()),
            trusted,
            tls,
            host: Some("api.example.com:8443"),
            prefix: None,
            forwarded: false,
        }
    }

    fn incoming(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// What the upstream gets of `name`: `None` when it is removed, absent when untouched.
    fn get(edits: &Forwarding, name: &str) -> Option<Option<String>> {
        let edits = Forwarding {
            forwarded: edits.forwarded.clone(),
            host: edits.host.clone(),
            prefix: edits.prefix.clone(),
            ..*edits
        };
        edits
            .edits()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.map(|v| v.to_str().unwrap().to_owned()))
    }

    fn set(v: &str) -> Option<Option<String>> {
        Some(Some(v.to_owned()))
    }

    #[test]
    fn a_client_cannot_choose_the_scheme_host_or_prefix_the_upstream_is_told() {
        let h = incoming(&[
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-prefix", "/admin"),
        ]);
        let edits = headers(&origin(false, false), &h).unwrap();
        assert_eq!(get(&edits, "x-forwarded-proto"), set("http"));
        assert_eq!(get(&edits, "x-forwarded-host"), set("api.example.com:8443"));
        assert_eq!(get(&edits, "x-forwarded-prefix"), Some(None), "removed");
        assert_eq!(get(&edits, "forwarded"), None, "not asked for: untouched");
    }

    #[test]
    fn a_trusted_proxy_says_how_the_client_came_in_once() {
        let h = incoming(&[
            ("x-forwarded-proto", "HTTPS"),
            ("x-forwarded-host", "shop.example"),
        ]);
        let edits = headers(&origin(true, false), &h).unwrap();
        assert_eq!(get(&edits, "x-forwarded-proto"), set("https"));
        assert_eq!(get(&edits, "x-forwarded-host"), set("shop.example"));
        // Twice, or a list: the gateway's own view.
        let h = incoming(&[
            ("x-forwarded-proto", "https"),
            ("x-forwarded-proto", "http"),
            ("x-forwarded-host", "a.example, b.example"),
        ]);
        let edits = headers(&origin(true, true), &h).unwrap();
        assert_eq!(get(&edits, "x-forwarded-proto"), set("https"));
        assert_eq!(get(&edits, "x-forwarded-host"), set("api.example.com:8443"));
    }

    #[test]
    fn forwarded_appends_this_hop_and_a_stripped_prefix_is_named() {
        let h = incoming(&[("forwarded", "for=192.0.2.1;proto=https")]);
        let mut o = origin(false, true);
        o.forwarded = true;
        o.prefix = Some("/api");
        o.peer = Some("2001:db8::1".parse().unwrap());
        let edits = headers(&o, &h).unwrap();
        assert_eq!(
            get(&edits, "forwarded"),
            set("for=192.0.2.1;proto=https, for=\"[2001:db8::1]\";host=\"api.example.com:8443\";proto=https")
        );
        assert_eq!(get(&edits, "x-forwarded-prefix"), set("/api"));
        // A host that would need quoting is left out, not escaped.
        o.host = Some("bad\"host");
        let edits = headers(&o, &incoming(&[])).unwrap();
        assert_eq!(
            get(&edits, "forwarded"),
            set("for=\"[2001:db8::1]\";proto=https")
        );
        assert_eq!(get(&edits, "x-forwarded-host"), Some(None));
    }
}
