//! [7] What the upstream receives besides the request itself: the client address appended to
//! `X-Forwarded-For`, and no header that could stand in for the ones the gateway controls.

use http::HeaderName;

/// Header carrying the authenticated client id to the upstream (any incoming one is removed).
pub const CLIENT_ID_HEADER: &str = "x-client-id";
/// The same names, parsed once: lookups and removals by these do not parse a name per request.
pub const CLIENT_ID: HeaderName = HeaderName::from_static(CLIENT_ID_HEADER);
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static(X_FORWARDED_FOR_HEADER);
pub const X_FORWARDED_FOR_HEADER: &str = "x-forwarded-for";

/// Headers whose upstream value the gateway decides: it sets them (`X-Client-Id`,
/// `X-Forwarded-For`, `X-Request-Id`) or removes them (`X-Api-Key`).
pub const CONTROLLED_HEADERS: [&str; 4] = [
    CLIENT_ID_HEADER,
    X_FORWARDED_FOR_HEADER,
    super::request_id::HEADER,
    super::auth::API_KEY_HEADER,
];

/// Incoming header names that CGI/WSGI-style upstreams would read as one of
/// [`CONTROLLED_HEADERS`]: they map `-` and `_` alike (`X_Client_Id` and `X-Client-Id` both
/// become `HTTP_X_CLIENT_ID`), so such a header could stand in for the gateway's own. Empty
/// (and allocation-free) unless a name has an underscore.
pub fn underscore_aliases<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    names
        .filter(|name| name.as_bytes().contains(&b'_'))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
