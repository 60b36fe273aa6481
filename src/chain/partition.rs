//! What a keyed limit counts by: a key made of parts of the request — the client address, the
//! authenticated client, a header, a field of the body, a claim of the verified token, a name
//! of the client certificate, or the route itself (one count for everybody) — combined
//! (`["ip", "body:username"]` is per address *and* account, `["jwt:org.id"]` per tenant).
//!
//! Raw input never names state: each part is folded to the strictest reading common
//! frameworks share (`chain::fold`: NFKC, case folding, trimmed — `Ada@Example.com`,
//! `ＡＤＡ@example.com` and ` ada@example.com\u{1f}` are one account, which can only make a limit
//! stricter), and the parts go through a keyed hash (HMAC-SHA-256 with
//! `server.key_hash_secret`, shared by every instance so that all of them name the same
//! state). A 100 KB value is a 32-character partition like any other, and store keys reveal
//! nothing about the values.
//!
//! A part the upstream could read otherwise is refused rather than counted (the request gets
//! a 400): a header given twice, holding a list (`acme, r7`: RFC 9110 makes it the same as two
//! lines), or spelled with `_` for `-` beside or instead of the real one (CGI/WSGI servers read
//! `X_Tenant_Id` as `X-Tenant-Id`); a body field the body gives ambiguously (`chain::body`), or
//! named in the query string too (Servlet's `getParameter` and Flask's `request.values` read
//! the query first).

pub use crate::chain::reading::{BodyField, KeyInputs, PartError, TokenClaims};

use crate::chain::fold;
use crate::chain::jwt::claims::ClaimPath;
use crate::chain::reading::{body_field, body_value, digits, header, header_value};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt::Write;

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
    Body(BodyField),
    /// A claim of the request's verified token (routes with `auth` including "jwt").
    Claim(ClaimPath),
    /// A name of the connection's verified client certificate.
    Cert(CertName),
}

/// Which name of a client certificate a key part reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CertName {
    /// The first URI subject alternative name, else the first DNS one.
    San,
    /// The subject's common name.
    Subject,
    /// The SHA-256 of the certificate.
    Fingerprint,
}

impl KeyPart {
    /// `ip`, `client`, `route`, `header:<name>`, `body:<field>`, `jwt:<claim>`,
    /// `cert:san|subject|fingerprint`.
    pub fn parse(text: &str) -> Result<KeyPart, String> {
        match text.split_once(':') {
            None => match text {
                "ip" => Ok(KeyPart::Ip),
                "client" => Ok(KeyPart::Client),
                "route" => Ok(KeyPart::Route),
                _ => Err(format!("{text:?}: expected {PART_SHAPES}")),
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
                Ok(KeyPart::Body(BodyField::new(field)))
            }
            Some(("body", field)) => Err(format!(
                "{field:?}: a body field name is 1 to 64 characters of A-Z a-z 0-9 _ - ."
            )),
            Some(("jwt", claim)) => ClaimPath::parse(claim).map(KeyPart::Claim),
            Some(("cert", name)) => match name {
                "san" => Ok(KeyPart::Cert(CertName::San)),
                "subject" => Ok(KeyPart::Cert(CertName::Subject)),
                "fingerprint" => Ok(KeyPart::Cert(CertName::Fingerprint)),
                _ => Err(format!(
                    "{name:?}: expected \"cert:san\", \"cert:subject\" or \"cert:fingerprint\""
                )),
            },
            Some(_) => Err(format!("{text:?}: expected {PART_SHAPES}")),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            KeyPart::Ip => "ip".into(),
            KeyPart::Client => "client".into(),
            KeyPart::Route => "route".into(),
            KeyPart::Header(h) => format!("header:{h}"),
            KeyPart::Body(f) => format!("body:{}", f.name),
            KeyPart::Claim(c) => format!("jwt:{c}"),
            KeyPart::Cert(CertName::San) => "cert:san".into(),
            KeyPart::Cert(CertName::Subject) => "cert:subject".into(),
            KeyPart::Cert(CertName::Fingerprint) => "cert:fingerprint".into(),
        }
    }
}

/// The shapes a key part is written in (for errors).
pub const PART_SHAPES: &str = "\"ip\", \"client\", \"route\", \"header:NAME\", \"body:FIELD\", \"jwt:CLAIM\" or \"cert:san|subject|fingerprint\"";

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

    /// 32 hex digits naming `value` in `domain` (a token's subject as a client id): the same
    /// on every instance with the same secret, and revealing nothing of the value.
    pub fn name(&self, domain: &str, value: &[u8]) -> String {
        let mut mac = self.mac.clone();
        mac.update(&(domain.len() as u32).to_be_bytes());
        mac.update(domain.as_bytes());
        mac.update(value);
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(32);
        for b in &digest[..16] {
            let _ = write!(out, "{b:02x}");
        }
        out
    }

    /// The partition for `parts` of a request: `k:` and 32 hex digits, or why not. With
    /// `Missing::Shared`, a missing part is the same fixed value for every request.
    pub fn partition(
        &self,
        parts: &[KeyPart],
        missing: Missing,
        inputs: &KeyInputs<'_>,
    ) -> Result<String, PartError> {
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
                Err(PartError::Missing(_)) if missing == Missing::Shared => mac.update(&[0]),
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

/// The folded bytes of one part.
fn value(part: &KeyPart, inputs: &KeyInputs<'_>) -> Result<Vec<u8>, PartError> {
    match part {
        KeyPart::Ip => inputs
            .ip
            .map(|ip| ip.to_be_bytes().to_vec())
            .ok_or_else(|| PartError::Missing("the client address".into())),
        KeyPart::Client => inputs
            .client
            .map(|c| c.as_bytes().to_vec())
            .ok_or_else(|| PartError::Missing("an authenticated client".into())),
        KeyPart::Route => Ok(inputs.route.as_bytes().to_vec()),
        KeyPart::Header(name) => header(inputs.headers, name),
        KeyPart::Body(field) => body_field(inputs, field),
        KeyPart::Claim(path) => inputs
            .token
            .and_then(|t| t.claim(path))
            .and_then(|v| fold::value(v.as_bytes()))
            .map(String::into_bytes)
            .ok_or_else(|| PartError::Missing(format!("the token claim {path}"))),
        KeyPart::Cert(name) => inputs
            .cert
            .and_then(|c| match name {
                CertName::San => c.san.as_deref(),
                CertName::Subject => c.subject.as_deref(),
                CertName::Fingerprint => Some(c.fingerprint.as_str()),
            })
            .and_then(|v| fold::value(v.as_bytes()))
            .map(String::into_bytes)
            .ok_or_else(|| PartError::Missing("a client certificate name".into())),
    }
}

/// The whole number a request states in a header or a body field (a reservation of units,
/// the route's `reserve_from`), read as a key part is — refused where the upstream could
/// read it otherwise — and only as digits (a header's surrounding spaces aside): a sign, a
/// fraction, an exponent or other digits than ASCII are refused, not guessed at. Too large
/// for `u64`: `u64::MAX`.
pub fn whole_number(part: &KeyPart, inputs: &KeyInputs<'_>) -> Result<u64, PartError> {
    use crate::chain::body::Field;
    let not_whole = |what: String| PartError::Ambiguous(format!("{what} is not a whole number"));
    match part {
        KeyPart::Header(name) => {
            let value = header_value(inputs.headers, name)?;
            digits(value.as_bytes().trim_ascii())
                .ok_or_else(|| not_whole(format!("the {name} header")))
        }
        KeyPart::Body(field) => match body_value(inputs, field)? {
            Field::Whole(n) => Ok(n),
            Field::Value(v) => digits(v.as_bytes())
                .ok_or_else(|| not_whole(format!("the body field {:?}", field.name))),
            Field::Absent => Err(PartError::Missing(format!(
                "the body field {:?}",
                field.name
            ))),
            _ => Err(not_whole(format!("the body field {:?}", field.name))),
        },
        other => Err(PartError::Missing(format!(
            "{} cannot hold a number",
            other.describe()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::body::BodyFields;
    use http::HeaderMap;
    use http::HeaderValue;

    fn inputs<'a>(headers: &'a HeaderMap, body: Option<&'a BodyFields>) -> KeyInputs<'a> {
        KeyInputs {
            ip: Some(0x7f00_0001),
            addr: None,
            client: None,
            route: "login",
            headers,
            query: None,
            body,
            token: None,
            cert: None,
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
        let parts = [KeyPart::Body(BodyField::new("username"))];
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
        let account = [KeyPart::Body(BodyField::new("username"))];
        assert!(matches!(
            h.partition(&account, Missing::Reject, &i),
            Err(PartError::Missing(_))
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
            Err(PartError::Ambiguous(_))
        ));
    }

    #[test]
    fn headers_with_another_reading_are_ambiguous() {
        let h = KeyHasher::new(b"s");
        let tenant = [KeyPart::Header("x-tenant-id".parse().unwrap())];
        let decide = |pairs: &[(&str, &str)]| {
            let mut headers = HeaderMap::new();
            for (k, v) in pairs {
                headers.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            h.partition(&tenant, Missing::Skip, &inputs(&headers, None))
        };
        let acme = decide(&[("x-tenant-id", "acme")]).unwrap();
        assert_eq!(decide(&[("x-tenant-id", " ACME ")]), Ok(acme.clone()));
        assert_eq!(decide(&[("x-tenant-id", "ａｃｍｅ")]), Ok(acme));
        for bad in [
            &[("x-tenant-id", "acme, r7")][..],
            &[("x-tenant-id", "acme"), ("x-tenant-id", "r7")],
            &[("x-tenant-id", "acme"), ("x_tenant_id", "r7")],
            &[("x_tenant-id", "r7")],
        ] {
            assert!(
                matches!(decide(bad), Err(PartError::Ambiguous(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(decide(&[]), Err(PartError::Missing(_))));
        assert!(decide(&[("x-tenant-id", "acme"), ("x-tenant-idx", "r7")]).is_ok());
    }

    #[test]
    fn a_body_field_named_in_the_query_too_is_ambiguous() {
        let h = KeyHasher::new(b"s");
        let account = [KeyPart::Body(BodyField::new("username"))];
        let headers = HeaderMap::new();
        let body = BodyFields::from_pairs([("username", "decoy")]);
        let with_query = |query: &'static str| KeyInputs {
            query: Some(query),
            ..inputs(&headers, Some(&body))
        };
        for query in [
            "username=victim",
            "a=1&USERNAME=victim",
            "a=1;user%6Eame=v",
            "username",
        ] {
            assert!(
                matches!(
                    h.partition(&account, Missing::Skip, &with_query(query)),
                    Err(PartError::Ambiguous(_))
                ),
                "{query}"
            );
        }
        assert!(h
            .partition(&account, Missing::Skip, &with_query("next=/home&user=1"))
            .is_ok());
    }

    #[test]
    fn a_reservation_is_one_whole_number_read_one_way() {
        let number =
            |headers: &[(&str, &str)], body: Option<&[u8]>, query: Option<&str>, part: &str| {
                let mut h = HeaderMap::new();
                for (k, v) in headers {
                    h.append(
                        http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                        HeaderValue::from_str(v).unwrap(),
                    );
                }
                let fields = body.map(|b| BodyFields::parse(&[b"application/json"], b));
                let inputs = KeyInputs {
                    query,
                    ..inputs(&h, fields.as_ref())
                };
                whole_number(&KeyPart::parse(part).unwrap(), &inputs)
            };
        let header = "header:x-max-tokens";
        assert_eq!(
            number(&[("x-max-tokens", " 512 ")], None, None, header),
            Ok(512)
        );
        assert_eq!(
            number(
                &[("x-max-tokens", "99999999999999999999999")],
                None,
                None,
                header
            ),
            Ok(u64::MAX)
        );
        assert!(matches!(
            number(&[], None, None, header),
            Err(PartError::Missing(_))
        ));
        for bad in [
            &[("x-max-tokens", "1.5")][..],
            &[("x-max-tokens", "-1")],
            &[("x-max-tokens", "+1")],
            &[("x-max-tokens", "1e3")],
            &[("x-max-tokens", "")],
            &[("x-max-tokens", "1, 2")],
            &[("x-max-tokens", "1"), ("x-max-tokens", "2")],
            &[("x-max-tokens", "1"), ("x_max_tokens", "900")],
        ] {
            assert!(
                matches!(
                    number(bad, None, None, header),
                    Err(PartError::Ambiguous(_))
                ),
                "{bad:?}"
            );
        }
        let body = "body:max_tokens";
        assert_eq!(
            number(&[], Some(br#"{"max_tokens": 256}"#), None, body),
            Ok(256)
        );
        assert_eq!(
            number(&[], Some(br#"{"max_tokens": "256"}"#), None, body),
            Ok(256)
        );
        assert!(matches!(
            number(&[], Some(b"{}"), None, body),
            Err(PartError::Missing(_))
        ));
        for bad in [
            &br#"{"max_tokens": 25.6}"#[..],
            br#"{"max_tokens": -1}"#,
            br#"{"max_tokens": " 256"}"#,
            "{\"max_tokens\": \"２５６\"}".as_bytes(),
            br#"{"max_tokens": 1, "max_tokens": 9000}"#,
            br#"{"max_tokens": 1, "MAX_TOKENS": 9000}"#,
        ] {
            assert!(
                matches!(
                    number(&[], Some(bad), None, body),
                    Err(PartError::Ambiguous(_))
                ),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Also named in the query: some frameworks read it first.
        assert!(matches!(
            number(
                &[],
                Some(br#"{"max_tokens": 256}"#),
                Some("max_tokens=9000"),
                body
            ),
            Err(PartError::Ambiguous(_))
        ));
    }
}
