//! [0] Message checks, before anything else looks at a request: unambiguous framing (request
//! smuggling), an HTTP/1.1 `Host`, and the size limits.

use crate::chain::reject::Reject;
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use pingora::http::RequestHeader;
use std::time::Duration;

/// What a request may cost the gateway before it is refused or cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Total time to receive a request's headers (slowloris); the connection is closed.
    pub header_timeout: Duration,
    /// Longest pause while receiving a request body; the connection is closed.
    pub body_timeout: Duration,
    /// Longest wait for the client to take more of a response (a client that stops
    /// reading); the connection (HTTP/2: the stream) is ended.
    pub send_timeout: Duration,
    /// Idle keep-alive connections are closed after this (whole seconds).
    pub keepalive_timeout: Duration,
    /// Request line plus headers, in bytes → 431.
    pub max_header_bytes: usize,
    /// Number of header fields → 431.
    pub max_header_count: usize,
    /// Request target length → 414.
    pub max_uri_length: usize,
    /// Request body size (routes may lower or raise it) → 413.
    pub max_body_bytes: u64,
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
pub fn check_content_length(max: u64, req: &RequestHeader) -> Result<(), Reject> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(60),
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

/// Which protocol upgrades (`Upgrade: websocket`) a route lets through to its upstream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Upgrades {
    /// Any the upstream accepts (the default).
    #[default]
    Any,
    /// None: an upgrade request is refused.
    Never,
    /// Only these protocols (lower-case names, no version).
    Only(Vec<String>),
}

/// An upgrade request (`upgrade`: its `Upgrade` header) on a route allowing `allowed`: every
/// protocol it offers must be allowed — the upstream may switch to any of them — or 400.
pub fn check_upgrade(allowed: &Upgrades, upgrade: Option<&[u8]>) -> Result<(), Reject> {
    let offered = || {
        upgrade
            .into_iter()
            .flat_map(|v| v.split(|b| *b == b','))
            .map(|p| p.trim_ascii())
            .filter(|p| !p.is_empty())
    };
    match allowed {
        Upgrades::Any => Ok(()),
        Upgrades::Never => Err(Reject::UpgradeRefused(
            "this route does not accept protocol upgrades (Upgrade)".to_owned(),
        )),
        Upgrades::Only(names) => {
            let refused = offered().find(|p| {
                // `websocket`, or `name/version`: the name decides.
                let name = p.split(|b| *b == b'/').next().unwrap_or(p);
                !names
                    .iter()
                    .any(|n| n.as_bytes().eq_ignore_ascii_case(name))
            });
            match refused {
                None => Ok(()),
                Some(p) => Err(Reject::UpgradeRefused(format!(
                    "this route accepts upgrades to {} only, not {:?}",
                    names.join(", "),
                    String::from_utf8_lossy(p)
                ))),
            }
        }
    }
}

#[cfg(test)]
mod upgrade_tests {
    use super::*;

    #[test]
    fn an_upgrade_is_let_through_only_where_every_protocol_offered_is_allowed() {
        let ws = Upgrades::Only(vec!["websocket".into()]);
        assert!(check_upgrade(&Upgrades::Any, Some(b"h2c")).is_ok());
        assert!(check_upgrade(&Upgrades::Never, Some(b"websocket")).is_err());
        assert!(check_upgrade(&ws, Some(b"WebSocket")).is_ok());
        assert!(check_upgrade(&ws, Some(b"websocket/13")).is_ok());
        assert!(check_upgrade(&ws, Some(b"websocket, h2c")).is_err());
        assert!(check_upgrade(&ws, Some(b"h2c")).is_err());
    }
}
