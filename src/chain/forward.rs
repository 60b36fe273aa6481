//! [7] What the upstream receives besides the request itself: the path it was routed by,
//! the client address appended to `X-Forwarded-For`, the request id, the authenticated client
//! as `X-Client-Id`, no credential unless the route forwards it, and no header that could
//! stand in for the ones the gateway controls. [`forward`] is that policy as one function over
//! an [`UpstreamHead`] (Pingora's request header in `proxy/upstream.rs`, a plain one in tests).

use crate::chain::auth::{bearer_token, API_KEY};
use crate::chain::credential::TokenFrom;
use crate::chain::forwarded::{Origin, X_FORWARDED_HOST, X_FORWARDED_PREFIX, X_FORWARDED_PROTO};
use http::header::{AUTHORIZATION, COOKIE, EXPECT};
use http::{HeaderMap, HeaderName, HeaderValue};
use std::net::IpAddr;

/// Header carrying the authenticated client id to the upstream (any incoming one is removed).
pub const CLIENT_ID_HEADER: &str = "x-client-id";
/// The same names, parsed once (statics: [`UpstreamHead::set`] takes them by `'static`
/// reference): lookups, removals and inserts by these do not parse a name per request.
pub static CLIENT_ID: HeaderName = HeaderName::from_static(CLIENT_ID_HEADER);
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static(X_FORWARDED_FOR_HEADER);
pub const X_FORWARDED_FOR_HEADER: &str = "x-forwarded-for";

/// Headers whose upstream value the gateway decides: it sets them (`X-Client-Id`,
/// `X-Forwarded-For`, `X-Request-Id`, `X-Forwarded-Proto` / `-Host` / `-Prefix`) or removes
/// them (`X-Api-Key`).
pub const CONTROLLED_HEADERS: [&str; 7] = [
    CLIENT_ID_HEADER,
    X_FORWARDED_FOR_HEADER,
    super::request_id::HEADER,
    super::auth::API_KEY_HEADER,
    X_FORWARDED_PROTO,
    X_FORWARDED_HOST,
    X_FORWARDED_PREFIX,
];

/// Incoming header names that CGI/WSGI-style upstreams would read as one of `controlled`:
/// they map `-` and `_` alike (`X_Client_Id` and `X-Client-Id` both become
/// `HTTP_X_CLIENT_ID`), so such a header could stand in for one the gateway sets, strips or
/// reads. `controlled` are lower-case names (header names as `http` keeps them): the fixed
/// [`CONTROLLED_HEADERS`] and what a route adds ([`Forward::route_headers`]). Empty (and
/// allocation-free) unless a name has an underscore.
pub fn underscore_aliases<'a, 'c>(
    names: impl Iterator<Item = &'a str>,
    controlled: impl Iterator<Item = &'c str> + Clone,
) -> Vec<&'a str> {
    names
        .filter(|name| name.as_bytes().contains(&b'_'))
        .filter(|name| {
            controlled.clone().any(|controlled| {
                name.len() == controlled.len()
                    && name
                        .bytes()
                        .zip(controlled.bytes())
                        .all(|(a, b)| a.to_ascii_lowercase() == b || (a == b'_' && b == b'-'))
            })
        })
        .collect()
}

/// `X-Forwarded-For` for the upstream: the incoming list(s), then the TCP peer.
pub fn forwarded_for<'a>(
    existing: impl Iterator<Item = &'a [u8]>,
    peer: std::net::IpAddr,
) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(48);
    for value in existing {
        let value = String::from_utf8_lossy(value);
        let value = value.trim();
        if !value.is_empty() {
            out.push_str(value);
            out.push_str(", ");
        }
    }
    write!(out, "{peer}").expect("writing to a String cannot fail");
    out
}

/// [`forwarded_for`] as a header value; the usual case (no list yet) built on the stack and
/// copied once.
fn forwarded_for_value(headers: &HeaderMap, peer: IpAddr) -> Result<HeaderValue, String> {
    use std::io::Write;
    if !headers.contains_key(&X_FORWARDED_FOR) {
        // Longest: an IPv6 address with an embedded IPv4 one, 45 characters.
        let mut buf = [0u8; 64];
        let len = match peer {
            IpAddr::V4(v4) => dotted(v4, &mut buf),
            IpAddr::V6(_) => {
                let mut out = &mut buf[..];
                write!(out, "{peer}").expect("an address fits");
                64 - out.len()
            }
        };
        return HeaderValue::from_bytes(&buf[..len]).map_err(|e| e.to_string());
    }
    let existing = headers.get_all(&X_FORWARDED_FOR);
    let value = forwarded_for(existing.iter().map(HeaderValue::as_bytes), peer);
    HeaderValue::try_from(value).map_err(|e| e.to_string())
}

/// `ip` in dotted decimal into `out` (its length): what `Display` writes, without the
/// formatting machinery (most of this header's cost on every request).
fn dotted(ip: std::net::Ipv4Addr, out: &mut [u8; 64]) -> usize {
    let mut len = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out[len] = b'.';
            len += 1;
        }
        if octet >= 100 {
            out[len] = b'0' + octet / 100;
            len += 1;
        }
        if octet >= 10 {
            out[len] = b'0' + octet / 10 % 10;
            len += 1;
        }
        out[len] = b'0' + octet % 10;
        len += 1;
    }
    len
}

/// The head of the request the upstream receives, as [`forward`] edits it: Pingora's request
/// header (names spelled as the client sent them, `header_case = "preserve"`) or its
/// `http` parts (names lower-case, inserted without being parsed) in `proxy/upstream.rs`.
pub trait UpstreamHead {
    fn headers(&self) -> &HeaderMap;
    /// Sets `name` (one of the gateway's own, parsed once) to `value`, replacing every value
    /// it had.
    fn set(&mut self, name: &'static HeaderName, value: HeaderValue) -> Result<(), String>;
    /// [`UpstreamHead::set`] for a configured name.
    fn set_named(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String>;
    /// Adds a value of a configured name after those it has.
    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String>;
    /// Removes every value of `name`.
    fn remove(&mut self, name: &HeaderName);
    fn query(&self) -> Option<&str>;
    /// Replaces the request target (path and query).
    fn set_target(&mut self, target: &str) -> Result<(), String>;
}

/// What the gateway knows of a request that decides what the upstream receives.
pub struct Forward<'a> {
    /// The TCP peer, if an IP connection.
    pub peer: Option<IpAddr>,
    pub request_id: &'a HeaderValue,
    /// The normal form of the path, when it differs from the one received.
    pub path: Option<&'a str>,
    /// The authenticated client, as the upstream knows it (an API-key client's id, a token's
    /// subject, a certificate's name).
    pub client: Option<&'a str>,
    /// The route passes the client's API key on.
    pub forward_api_key: bool,
    /// The request was identified by a bearer token: where it was, and whether the upstream
    /// gets it.
    pub token: Option<(&'a TokenFrom, bool)>,
    /// Headers set from the token's claims (`None`: the claim is absent; the incoming header
    /// is removed either way).
    pub claims: &'a [(&'a HeaderName, Option<&'a str>)],
    /// The header the route reads bearer tokens from (`token_from = "header:NAME"`), whether
    /// or not this request was identified by one: its `_` spellings never reach the upstream.
    pub token_header: Option<&'a HeaderName>,
    /// The gateway answered `Expect: 100-continue` itself.
    pub continued: bool,
    /// How the client reached the gateway (`X-Forwarded-Proto`, `-Host`, `-Prefix`,
    /// `Forwarded`).
    pub origin: Origin<'a>,
}

impl Forward<'_> {
    /// Every header whose upstream value the gateway decides for this route: the fixed ones,
    /// the route's `forward_claims` headers and its token header.
    fn controlled(&self) -> impl Iterator<Item = &str> + Clone {
        CONTROLLED_HEADERS
            .iter()
            .copied()
            .chain(self.claims.iter().map(|(name, _)| name.as_str()))
            .chain(self.token_header.map(HeaderName::as_str))
    }
}

/// Applies what the upstream receives to `head`: the path the route was chosen by (with the
/// query as received), `X-Forwarded-For` + the TCP peer, `X-Request-Id`, `X-Client-Id` (only
/// the gateway's), no `_` spelling of a controlled header, no `Expect` the gateway already
/// answered, and no API key in any header unless the route forwards it.
pub fn forward(f: &Forward<'_>, head: &mut (impl UpstreamHead + ?Sized)) -> Result<(), String> {
    if let Some(peer) = f.peer {
        head.set(&X_FORWARDED_FOR, forwarded_for_value(head.headers(), peer)?)?;
    }
    head.set(&super::request_id::NAME, f.request_id.clone())?;
    for (name, value) in super::forwarded::headers(&f.origin, head.headers())?.edits() {
        match value {
            Some(value) => head.set(name, value)?,
            None => head.remove(name),
        }
    }
    if let Some(path) = f.path {
        // The upstream acts on the path the route was chosen by.
        let target = match head.query() {
            Some(query) => format!("{path}?{query}"),
            None => path.to_owned(),
        };
        head.set_target(&target)?;
    }
    // Only the gateway says who the client is, also to servers reading `_` as `-`.
    let aliases: Vec<HeaderName> =
        underscore_aliases(head.headers().keys().map(|k| k.as_str()), f.controlled())
            .into_iter()
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .collect();
    for alias in &aliases {
        head.remove(alias);
    }
    head.remove(&CLIENT_ID);
    if f.continued {
        // The client had its `100` from the gateway, which holds the body already.
        head.remove(&EXPECT);
    }
    if let Some(client) = f.client {
        head.set(&CLIENT_ID, header_text(client))?;
        let token = f.token;
        if !f.forward_api_key || token.is_some() {
            // Every value: a key in any of them stays here.
            head.remove(&API_KEY);
        }
        let strip_bearer = match token {
            Some((TokenFrom::Authorization, forward)) => !forward,
            _ => !f.forward_api_key,
        };
        if strip_bearer {
            let bearer = head
                .headers()
                .get_all(AUTHORIZATION)
                .iter()
                .any(|v| bearer_token(v.as_bytes()).is_some());
            if bearer {
                head.remove(&AUTHORIZATION);
            }
        }
        match token {
            Some((TokenFrom::Header(name), false)) => head.remove(name),
            Some((TokenFrom::Cookie(name), false)) => strip_cookie(head, name)?,
            _ => {}
        }
        for (name, value) in f.claims {
            head.remove(name);
            if let Some(value) = value {
                head.set_named(name, header_text(value))?;
            }
        }
    }
    Ok(())
}

/// `text` as a header value: visible ASCII as it is, every other byte (and `%`)
/// percent-encoded, so a claim or name with spaces, controls or Unicode arrives as one
/// unambiguous value.
pub fn header_text(text: &str) -> HeaderValue {
    use std::fmt::Write;
    if text
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b) && b != b'%')
    {
        if let Ok(v) = HeaderValue::from_str(text) {
            return v;
        }
    }
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    HeaderValue::from_str(&out).expect("visible ASCII")
}

/// Removes cookie `name` from every `Cookie` header (dropping a header left empty).
fn strip_cookie(head: &mut (impl UpstreamHead + ?Sized), name: &str) -> Result<(), String> {
    let kept: Vec<String> = head
        .headers()
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| {
            let text = String::from_utf8_lossy(v.as_bytes());
            let pairs: Vec<&str> = text
                .split(';')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .filter(|p| p.split_once('=').is_none_or(|(n, _)| n.trim() != name))
                .collect();
            (!pairs.is_empty()).then(|| pairs.join("; "))
        })
        .collect();
    head.remove(&COOKIE);
    if !kept.is_empty() {
        let value = HeaderValue::try_from(kept.join("; ")).map_err(|e| e.to_string())?;
        head.set_named(&COOKIE, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_decimal_is_what_display_writes() {
        for o in 0..=255u8 {
            let ip = std::net::Ipv4Addr::new(o, 255 - o, o / 10, 9);
            let mut buf = [0u8; 64];
            let len = dotted(ip, &mut buf);
            assert_eq!(std::str::from_utf8(&buf[..len]).unwrap(), ip.to_string());
        }
    }

    #[test]
    fn forwarded_for_appends_the_peer() {
        let peer = "10.0.0.9".parse().unwrap();
        assert_eq!(forwarded_for(std::iter::empty(), peer), "10.0.0.9");
        let existing: [&[u8]; 2] = [b"1.1.1.1, 2.2.2.2", b" 3.3.3.3 "];
        assert_eq!(
            forwarded_for(existing.into_iter(), peer),
            "1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.9"
        );
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
        let fixed = || CONTROLLED_HEADERS.iter().copied();
        assert_eq!(
            underscore_aliases(names.into_iter(), fixed()),
            [
                "x_client_id",
                "X_Forwarded_For",
                "x-client_id",
                "x_api_key",
                "x_request_id"
            ]
        );
        assert!(underscore_aliases(["accept", "host"].into_iter(), fixed()).is_empty());
        // A route's own headers (claims, its token header) are controlled as well.
        let route = fixed().chain(["x-tenant-id", "x-token"]);
        assert_eq!(
            underscore_aliases(["X_Tenant_Id", "x_token", "x_tenant"].into_iter(), route),
            ["X_Tenant_Id", "x_token"]
        );
    }

    /// A request head without Pingora: headers, and the target.
    struct Head {
        headers: HeaderMap,
        target: String,
    }

    impl UpstreamHead for Head {
        fn headers(&self) -> &HeaderMap {
            &self.headers
        }
        fn set(&mut self, name: &'static HeaderName, value: HeaderValue) -> Result<(), String> {
            self.headers.insert(name.clone(), value);
            Ok(())
        }
        fn remove(&mut self, name: &HeaderName) {
            self.headers.remove(name);
        }
        fn set_named(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
            self.headers.insert(name.clone(), value);
            Ok(())
        }
        fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
            self.headers.append(name.clone(), value);
            Ok(())
        }
        fn query(&self) -> Option<&str> {
            self.target.split_once('?').map(|(_, q)| q)
        }
        fn set_target(&mut self, target: &str) -> Result<(), String> {
            self.target = target.to_owned();
            Ok(())
        }
    }

    fn head(target: &str, pairs: &[(&str, &str)]) -> Head {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        Head {
            headers,
            target: target.to_owned(),
        }
    }

    fn inputs<'a>(id: &'a HeaderValue) -> Forward<'a> {
        Forward {
            peer: Some("10.0.0.9".parse().unwrap()),
            request_id: id,
            path: None,
            client: Some("ada"),
            forward_api_key: false,
            token: None,
            claims: &[],
            token_header: None,
            continued: false,
            origin: Origin {
                peer: Some("10.0.0.9".parse().unwrap()),
                trusted: false,
                tls: false,
                host: Some("api.example"),
                prefix: None,
                forwarded: false,
            },
        }
    }

    #[test]
    fn the_upstream_gets_the_gateways_view_and_no_credential() {
        let id = HeaderValue::from_static("req-1");
        let mut h = head(
            "/%6Frders//7?x=1",
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("x-client-id", "mallory"),
                ("x_client_id", "mallory"),
                ("x-api-key", "secret-key"),
                ("authorization", "Bearer secret-key"),
                ("x-request-id", "spoofed"),
                ("expect", "100-continue"),
            ],
        );
        let f = Forward {
            path: Some("/orders/7"),
            continued: true,
            ..inputs(&id)
        };
        forward(&f, &mut h).unwrap();
        let get = |n: &str| h.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(get("x-forwarded-for").as_deref(), Some("1.1.1.1, 10.0.0.9"));
        assert_eq!(get("x-client-id").as_deref(), Some("ada"));
        assert_eq!(get("x-request-id").as_deref(), Some("req-1"));
        assert_eq!(h.target, "/orders/7?x=1");
        for gone in ["x_client_id", "x-api-key", "authorization", "expect"] {
            assert_eq!(get(gone), None, "{gone}");
        }
    }

    #[test]
    fn a_forwarded_key_and_other_authorization_schemes_stay() {
        let id = HeaderValue::from_static("r");
        let mut h = head("/a", &[("x-api-key", "k"), ("authorization", "Basic dTpw")]);
        forward(&inputs(&id), &mut h).unwrap();
        assert!(h.headers.get("x-api-key").is_none());
        assert_eq!(h.headers["authorization"], "Basic dTpw", "not a key");
        let mut h = head("/a", &[("x-api-key", "k")]);
        let f = Forward {
            forward_api_key: true,
            ..inputs(&id)
        };
        forward(&f, &mut h).unwrap();
        assert_eq!(h.headers["x-api-key"], "k");
        // Anonymous: no client header, nothing of the client's removed.
        let mut h = head("/a", &[("x-client-id", "mallory"), ("x-api-key", "k")]);
        let f = Forward {
            client: None,
            peer: None,
            ..inputs(&id)
        };
        forward(&f, &mut h).unwrap();
        assert!(h.headers.get("x-client-id").is_none());
        assert!(h.headers.get("x-forwarded-for").is_none());
        assert_eq!(h.headers["x-api-key"], "k");
        assert_eq!(h.target, "/a");
    }

    #[test]
    fn a_token_route_forwards_claims_and_the_token_only_as_configured() {
        let id = HeaderValue::from_static("r");
        let tenant = HeaderName::from_static("x-tenant-id");
        let tier = HeaderName::from_static("x-tier");
        let claims = [(&tenant, Some("acme")), (&tier, None)];
        let from = TokenFrom::Authorization;
        let mut h = head(
            "/a",
            &[
                ("authorization", "Bearer eyJ.x.y"),
                ("x-tenant-id", "spoofed"),
                ("x-tier", "gold"),
                ("x-api-key", "k"),
            ],
        );
        let f = Forward {
            client: Some("user 1/é"),
            token: Some((&from, true)),
            claims: &claims,
            ..inputs(&id)
        };
        forward(&f, &mut h).unwrap();
        assert_eq!(h.headers["x-client-id"], "user%201/%C3%A9");
        assert_eq!(h.headers["authorization"], "Bearer eyJ.x.y");
        assert_eq!(h.headers["x-tenant-id"], "acme");
        assert!(
            h.headers.get("x-tier").is_none(),
            "absent claim: removed, not set"
        );
        assert!(h.headers.get("x-api-key").is_none());
        // Kept from the upstream: from Authorization, or from a cookie among others.
        let mut h = head("/a", &[("authorization", "Bearer eyJ.x.y")]);
        let f = Forward {
            token: Some((&from, false)),
            ..inputs(&id)
        };
        forward(&f, &mut h).unwrap();
        assert!(h.headers.get("authorization").is_none());
        let cookie = TokenFrom::Cookie("session".into());
        let mut h = head(
            "/a",
            &[("cookie", "a=1; session=eyJ.x.y"), ("cookie", "session=z")],
        );
        let f = Forward {
            token: Some((&cookie, false)),
            ..inputs(&id)
        };
        forward(&f, &mut h).unwrap();
        assert_eq!(h.headers["cookie"], "a=1");
        assert_eq!(header_text("plain-id_1.x"), "plain-id_1.x");
        assert_eq!(header_text("50%"), "50%25");
    }
}
