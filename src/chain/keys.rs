//! What a keyed limit counts by: a key made of parts of the request — the client address, the
//! authenticated client, a header, a field of the body, or the route itself (one count for
//! everybody) — combined (`["ip", "body:username"]` is per address *and* account).
//!
//! Raw input never names state: each part is normalised (trimmed; text lower-cased, so that
//! `Ada@Example.com` and `ada@example.com` are one account — which can only make a limit
//! stricter), and the parts go through a keyed hash (HMAC-SHA-256 with `store.key_hash_secret`,
//! shared by every instance so that all of them name the same state). A 100 KB value is a
//! 32-character partition like any other, and store keys reveal nothing about the values.

use crate::chain::body::{BodyFields, Field};
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use std::fmt::Write;
use std::sync::Arc;

/// One part of a limit's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    /// The client address, after trusted proxies and prefix grouping.
    Ip,
    /// The authenticated client's id (routes with `auth = "api_key"`).
    Client,
    /// The route itself: one count for every request of the route.
    Route,
    /// A request header (lower-case name); more than one value is refused.
    Header(http::HeaderName),
    /// A top-level string field of a JSON or form-urlencoded body.
    Body(Arc<str>),
}

impl KeyPart {
    /// `ip`, `client`, `route`, `header:<name>`, `body:<field>`.
    pub fn parse(text: &str) -> Result<KeyPart, String> {
        match text.split_once(':') {
            None => match text {
                "ip" => Ok(KeyPart::Ip),
                "client" => Ok(KeyPart::Client),
                "route" => Ok(KeyPart::Route),
                _ => Err(format!(
                    "{text:?}: expected \"ip\", \"client\", \"route\", \"header:NAME\" or \"body:FIELD\""
                )),
            },
            Some(("header", name)) => http::HeaderName::from_bytes(name.as_bytes())
                .map(KeyPart::Header)
                .map_err(|_| format!("{name:?} is not a header name")),
            Some(("body", field))
                if !field.is_empty()
                    && field.len() <= 64
                    && field
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) =>
            {
                Ok(KeyPart::Body(field.into()))
            }
            Some(("body", field)) => Err(format!(
                "{field:?}: a body field name is 1 to 64 characters of A-Z a-z 0-9 _ - ."
            )),
            Some(_) => Err(format!(
                "{text:?}: expected \"ip\", \"client\", \"route\", \"header:NAME\" or \"body:FIELD\""
            )),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            KeyPart::Ip => "ip".into(),
            KeyPart::Client => "client".into(),
            KeyPart::Route => "route".into(),
            KeyPart::Header(h) => format!("header:{h}"),
            KeyPart::Body(f) => format!("body:{f}"),
        }
    }
}

/// What a request lacking a key part gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// 400 problem+json (the default: omitting a field must not skip a login limit).
    Reject,
    /// The limit does not apply to this request.
    Skip,
    /// Every request lacking the part shares one count.
    Shared,
}

impl Missing {
    pub fn as_str(self) -> &'static str {
        match self {
            Missing::Reject => "reject",
            Missing::Skip => "skip",
            Missing::Shared => "shared",
        }
    }
}

/// The request values key parts are read from.
pub struct KeyInputs<'a> {
    /// The grouped client address (`identity::group_key`), if an IP connection.
    pub ip: Option<u128>,
    pub client: Option<&'a str>,
    pub route: &'a str,
    pub headers: &'a HeaderMap,
    /// The body's fields, when the route reads them and the body could be read.
    pub body: Option<&'a BodyFields>,
}

/// Why a key could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The request lacks this part (no such header, field, or readable body; no client).
    Missing(String),
    /// A header given more than once: which one counts would be the client's choice.
    Ambiguous(String),
}

/// The secret of the keyed hash.
#[derive(Clone)]
pub struct KeyHasher {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher(<secret>)")
    }
}

impl KeyHasher {
    pub fn new(secret: &[u8]) -> KeyHasher {
        KeyHasher {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"),
        }
    }

    /// The partition for `parts` of a request: `k:` and 32 hex digits, or why not. With
    /// `Missing::Shared`, a missing part is the same fixed value for every request.
    pub fn partition(
        &self,
        parts: &[KeyPart],
        missing: Missing,
        inputs: &KeyInputs<'_>,
    ) -> Result<String, KeyError> {
        let mut mac = self.mac.clone();
        for part in parts {
            // Tag and length before each value: no two part lists hash alike by accident.
            let tag = part.describe();
            mac.update(&(tag.len() as u32).to_be_bytes());
            mac.update(tag.as_bytes());
            match value(part, inputs) {
                Ok(v) => {
                    mac.update(&[1]);
                    mac.update(&(v.len() as u64).to_be_bytes());
                    mac.update(&v);
                }
                Err(KeyError::Missing(_)) if missing == Missing::Shared => mac.update(&[0]),
                Err(e) => return Err(e),
            }
        }
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(34);
        out.push_str("k:");
        for b in &digest[..16] {
            let _ = write!(out, "{b:02x}");
        }
        Ok(out)
    }
}

/// The normalised bytes of one part.
fn value(part: &KeyPart, inputs: &KeyInputs<'_>) -> Result<Vec<u8>, KeyError> {
    match part {
        KeyPart::Ip => inputs
            .ip
            .map(|ip| ip.to_be_bytes().to_vec())
            .ok_or_else(|| KeyError::Missing("the client address".into())),
        KeyPart::Client => inputs
            .client
            .map(|c| c.as_bytes().to_vec())
            .ok_or_else(|| KeyError::Missing("an authenticated client".into())),
        KeyPart::Route => Ok(inputs.route.as_bytes().to_vec()),
        KeyPart::Header(name) => {
            let mut values = inputs.headers.get_all(name).iter();
            let first = values
                .next()
                .ok_or_else(|| KeyError::Missing(format!("the {name} header")))?;
            if values.next().is_some() {
                return Err(KeyError::Ambiguous(format!(
                    "the {name} header is given more than once"
                )));
            }
            normalise(first.as_bytes())
                .ok_or_else(|| KeyError::Missing(format!("the {name} header")))
        }
        KeyPart::Body(field) => {
            let missing = || KeyError::Missing(format!("the body field {field:?}"));
            match inputs.body.map_or(Field::Absent, |b| b.field(field)) {
                Field::Value(v) => normalise(v.as_bytes()).ok_or_else(missing),
                Field::Absent => Err(missing()),
                Field::Repeated => Err(KeyError::Ambiguous(format!(
                    "the body field {field:?} is given more than once"
                ))),
            }
        }
    }
}

/// Trimmed and lower-cased (Unicode, when the bytes are UTF-8); `None` when empty.
fn normalise(raw: &[u8]) -> Option<Vec<u8>> {
    let trimmed = raw.trim_ascii();
    if trimmed.is_empty() {
        return None;
    }
    Some(match std::str::from_utf8(trimmed) {
        Ok(text) => text.trim().to_lowercase().into_bytes(),
        Err(_) => trimmed.to_ascii_lowercase(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn inputs<'a>(headers: &'a HeaderMap, body: Option<&'a BodyFields>) -> KeyInputs<'a> {
        KeyInputs {
            ip: Some(0x7f00_0001),
            client: None,
            route: "login",
            headers,
            body,
        }
    }

    #[test]
    fn parts_parse_and_describe_themselves() {
        for text in [
            "ip",
            "client",
            "route",
            "header:x-tenant-id",
            "body:username",
        ] {
            assert_eq!(KeyPart::parse(text).unwrap().describe(), text);
        }
        for bad in [
            "",
            "ipv4",
            "header:",
            "header:bad name",
            "body:",
            "body:a b",
            "cookie:x",
        ] {
            assert!(KeyPart::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_short_hashes_that_reveal_nothing_and_agree_across_instances() {
        let h = KeyHasher::new(b"secret");
        let headers = HeaderMap::new();
        let body = BodyFields::from_pairs([("username", "Ada@Example.com ")]);
        let parts = [KeyPart::Body("username".into())];
        let a = h
            .partition(&parts, Missing::Reject, &inputs(&headers, Some(&body)))
            .unwrap();
        assert_eq!(a.len(), 34);
        assert!(a.starts_with("k:") && !a.contains("ada"));
        // The same account, spelled differently, on another instance with the same secret.
        let same = BodyFields::from_pairs([("username", "ada@example.com")]);
        let b = KeyHasher::new(b"secret")
            .partition(&parts, Missing::Reject, &inputs(&headers, Some(&same)))
            .unwrap();
        assert_eq!(a, b);
        // Another secret names other state.
        let c = KeyHasher::new(b"other")
            .partition(&parts, Missing::Reject, &inputs(&headers, Some(&same)))
            .unwrap();
        assert_ne!(a, c);
        // A huge value is a key like any other.
        let huge = "x".repeat(100_000);
        let big = BodyFields::from_pairs([("username", huge.as_str())]);
        let d = h
            .partition(&parts, Missing::Reject, &inputs(&headers, Some(&big)))
            .unwrap();
        assert_eq!(d.len(), 34);
    }

    #[test]
    fn parts_combine_and_missing_parts_follow_the_choice() {
        let h = KeyHasher::new(b"s");
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant-id", HeaderValue::from_static("acme"));
        let ip_only = [KeyPart::Ip];
        let ip_and_tenant = [KeyPart::Ip, KeyPart::Header("x-tenant-id".parse().unwrap())];
        let i = inputs(&headers, None);
        assert_ne!(
            h.partition(&ip_only, Missing::Reject, &i).unwrap(),
            h.partition(&ip_and_tenant, Missing::Reject, &i).unwrap()
        );
        let account = [KeyPart::Body("username".into())];
        assert!(matches!(
            h.partition(&account, Missing::Reject, &i),
            Err(KeyError::Missing(_))
        ));
        let shared = h.partition(&account, Missing::Shared, &i).unwrap();
        let empty = BodyFields::from_pairs([("username", "  ")]);
        assert_eq!(
            h.partition(&account, Missing::Shared, &inputs(&headers, Some(&empty))),
            Ok(shared),
            "an empty value is a missing one"
        );
        headers.append("x-tenant-id", HeaderValue::from_static("other"));
        assert!(matches!(
            h.partition(&ip_and_tenant, Missing::Shared, &inputs(&headers, None)),
            Err(KeyError::Ambiguous(_))
        ));
    }
}
