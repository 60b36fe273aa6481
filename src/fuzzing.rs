//! Fuzz targets: the parsers that see untrusted bytes, each with the invariants it must keep.
//! `fuzz/` drives them with libFuzzer (`make fuzz`); `tests/code/fuzz_replay.rs` replays the
//! committed corpus and random inputs through the same functions in `make test`. A crash is
//! a panic here.

use crate::chain::auth::{extract_key, MAX_KEY_LEN};
use crate::chain::headers;
use crate::chain::identity::{client_ip, group_key, parse_entry, Grouping, TrustedProxies};
use crate::control::config::Config;
use crate::limit::{Algorithm, Decision, Policy};
use std::net::IpAddr;

/// The config loader never panics; what it accepts is internally consistent and renders.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text) {
        Ok(config) => {
            for route in &config.routes {
                if let Some(upstream) = &route.upstream {
                    assert!(config.upstreams.contains_key(upstream));
                }
            }
            for client in &config.clients {
                assert!(config.plans.contains_key(&client.plan));
            }
            let view = crate::control::config::view::render(&config).to_string();
            assert!(!view.is_empty());
        }
        Err(e) => {
            // Every error names a path and renders.
            assert!(!e.to_string().is_empty());
            assert!(e.problems().iter().all(|p| !p.path.is_empty()));
        }
    }
}

/// Client-IP extraction never panics and only ever answers the peer or an address that
/// appears in the header.
pub fn client_ip_extraction(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let peer: IpAddr = if selector & 1 == 0 {
        "10.0.0.1".parse().expect("literal")
    } else {
        "203.0.113.5".parse().expect("literal")
    };
    let trusted = TrustedProxies::new(vec![
        "10.0.0.0/8".parse().expect("literal"),
        "fd00::/8".parse().expect("literal"),
    ]);
    let lines: Vec<&[u8]> = rest.split(|&b| b == b'\n').collect();
    let ip = client_ip(peer, lines.iter().copied(), &trusted);
    let appears = lines
        .iter()
        .flat_map(|l| l.split(|&b| b == b','))
        .filter_map(|e| parse_entry(e.trim_ascii()))
        .any(|e| e == ip);
    assert!(
        ip == peer || appears,
        "{ip} is neither the peer nor in the header"
    );
    if !trusted.contains(peer) {
        assert_eq!(ip, peer, "an untrusted peer chose its address");
    }
    let _ = group_key(ip, Grouping::default());
}

/// API-key extraction never panics; a key it returns is short, visible ASCII, and was sent.
pub fn api_key(data: &[u8]) {
    // Lines before a NUL are X-Api-Key values, after it Authorization values.
    let (api, auth) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let api: Vec<&[u8]> = api
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let auth: Vec<&[u8]> = auth
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    if let Ok(key) = extract_key(api.iter().copied(), auth.iter().copied()) {
        assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN);
        assert!(key.iter().all(|b| (0x21..=0x7e).contains(b)));
        assert!(data.windows(key.len()).any(|w| w == key));
    }
}

/// Header rendering: any policy and decision numbers give valid header values with exactly
/// the numbers they were given.
pub fn header_rendering(data: &[u8]) {
    let mut n = data.chunks(8).map(|c| {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(b)
    });
    let mut next = || n.next().unwrap_or(1);
    let name_chars = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.";
    let name: String = data
        .iter()
        .take(32)
        .map(|b| name_chars[*b as usize % name_chars.len()] as char)
        .collect();
    let name = if name.is_empty() {
        "p".to_owned()
    } else {
        name
    };
    let algorithm = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::LeakyBucket,
    ][(next() % 5) as usize];
    let policy = Policy::new(
        &name,
        algorithm,
        next() % (1 << 40) + 1,
        next() % (1 << 40) + 1,
        next() % (1 << 40) + 1,
    );
    let decision = Decision {
        allowed: next() % 2 == 0,
        limit: policy.capacity(),
        remaining: next(),
        reset_ms: next(),
        retry_after_ms: next(),
    };
    let policy_header = headers::policy_header(std::iter::once(&policy));
    let ratelimit = headers::ratelimit_header(std::iter::once((&policy, &decision)));
    for value in [&policy_header, &ratelimit] {
        assert!(
            http::HeaderValue::from_str(value).is_ok(),
            "{value:?} is not a valid header value"
        );
    }
    let (q, w) = policy.quota();
    assert_eq!(policy_header, format!("\"{name}\";q={q};w={w}"));
    assert_eq!(
        ratelimit,
        format!(
            "\"{name}\";r={};t={}",
            decision.remaining,
            headers::secs_ceil(decision.reset_ms)
        )
    );
    assert!(headers::retry_after(decision.retry_after_ms) >= 1);
}

/// Path normalisation never panics, and what it accepts is normal: absolute, no empty or dot
/// segments, no `;`, `\` or ambiguous escapes, and normalising it again changes nothing.
pub fn request_path(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(normal) = crate::chain::path::normalize(path) else {
        return;
    };
    assert!(normal.starts_with('/'));
    assert!(!normal.contains("//"), "{normal:?}");
    assert!(
        !normal.contains(';') && !normal.contains('\\'),
        "{normal:?}"
    );
    assert!(
        !normal.split('/').any(|s| s == "." || s == ".."),
        "{normal:?}"
    );
    let lower = normal.to_ascii_lowercase();
    for escape in ["%2f", "%5c", "%3b", "%25", "%2e", "%00"] {
        assert!(!lower.contains(escape), "{normal:?} keeps {escape}");
    }
    assert_eq!(
        crate::chain::path::normalize(&normal).as_deref(),
        Ok(normal.as_ref())
    );
}

/// Body-field parsing never panics, whatever the bytes and content type; a field it returns
/// was in the body (as sent, or percent-decoded), and folding it never panics either.
pub fn body_fields(data: &[u8]) {
    use crate::chain::body::{query_names, BodyFields, Field};
    use crate::chain::fold;
    let (json, form) = (
        b"application/json".as_slice(),
        b"application/x-www-form-urlencoded",
    );
    for content_type in [json, form.as_slice(), b"text/plain"] {
        let fields = BodyFields::parse(&[content_type], data);
        for name in ["username", "a", ""] {
            if let Field::Value(v) = fields.field(name, &fold::name(name)) {
                assert!(v.len() <= data.len() * 4 + 4);
                let _ = fold::value(v.as_bytes());
            }
        }
    }
    let _ = fold::value(data);
    query_names(data).for_each(drop);
}

/// One reading or a refusal: for a request whose keyed limit reads a body field, whenever the
/// gateway counts it under some value, every modelled framework reading of that field gives
/// nothing or a value that counts the same. `data`: a content-type selector byte, the query
/// string, `\n`, the body.
pub fn one_reading(data: &[u8]) {
    use crate::chain::body::BodyFields;
    use crate::chain::partition::{KeyHasher, KeyInputs, KeyPart, Missing};
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (query, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (&b""[..], rest),
    };
    let Ok(query) = std::str::from_utf8(query) else {
        return;
    };
    let content_type: Option<&[u8]> = match selector % 4 {
        0 => Some(b"application/json"),
        1 => Some(b"application/x-www-form-urlencoded"),
        2 => Some(b"text/plain"),
        _ => None,
    };
    let hasher = KeyHasher::new(b"one reading");
    let headers = http::HeaderMap::new();
    let fields = BodyFields::parse(content_type.as_slice(), body);
    for field in ["username", "user_name"] {
        let parts = [KeyPart::parse(&format!("body:{field}")).expect("a valid part")];
        let key_of = |fields: &BodyFields, query: Option<&str>| {
            let inputs = KeyInputs {
                ip: None,
                addr: None,
                client: None,
                route: "login",
                headers: &headers,
                query,
                body: Some(fields),
                token: None,
                cert: None,
            };
            hasher.partition(&parts, Missing::Reject, &inputs).ok()
        };
        let Some(counted) = key_of(&fields, (!query.is_empty()).then_some(query)) else {
            continue;
        };
        for (reader, value) in readings::all(content_type, query, body, field) {
            let Some(value) = value else { continue };
            let theirs = key_of(&BodyFields::from_pairs([(field, value.as_str())]), None);
            assert!(
                theirs.is_none() || theirs.as_ref() == Some(&counted),
                "{reader} reads {field} as {value:?}, which the gateway counts elsewhere"
            );
        }
    }
}

/// How common frameworks read one field of a request (documented behaviour, modelled).
mod readings {
    use serde::de::{Deserializer, MapAccess, Visitor};

    type Pairs = Vec<(String, String)>;

    /// (framework, the value it reads, if any).
    pub fn all(
        content_type: Option<&[u8]>,
        query: &str,
        body: &[u8],
        field: &str,
    ) -> Vec<(&'static str, Option<String>)> {
        let form_typed = content_type == Some(b"application/x-www-form-urlencoded");
        let json_typed = content_type == Some(b"application/json");
        let amp = form(body, false);
        let semi = form(body, true);
        let query_pairs = form(query.as_bytes(), true);
        let exact = |k: &str| k == field;
        let mut out = vec![
            // encoding/json decodes the first value whatever the type; exact or folded keys.
            (
                "go",
                go(body).and_then(|p| last(&p, |k| go_fold(k) == field)),
            ),
            // Servlet getParameter / Flask request.values: the query, then a form body.
            (
                "query-first",
                first(&query_pairs, exact)
                    .or_else(|| form_typed.then(|| first(&amp, exact)).flatten()),
            ),
        ];
        if form_typed {
            out.extend([
                ("first", first(&amp, exact)),
                ("django", last(&amp, exact)),
                (
                    "aspnet-form",
                    last(&amp, |k| k.to_uppercase() == field.to_uppercase()),
                ),
                ("php", last(&amp, |k| php_name(k) == field)),
                ("semicolons", last(&semi, exact)),
            ]);
        }
        if json_typed {
            let pairs = json(body);
            out.extend([
                ("python-json", pairs.as_ref().and_then(|p| last(p, exact))),
                ("first-json", pairs.as_ref().and_then(|p| first(p, exact))),
                (
                    "system-text-json",
                    pairs
                        .as_ref()
                        .and_then(|p| last(p, |k| k.to_uppercase() == field.to_uppercase())),
                ),
            ]);
        }
        out
    }

    fn form(bytes: &[u8], semicolons: bool) -> Pairs {
        bytes
            .split(|&b| b == b'&' || (semicolons && b == b';'))
            .flat_map(url::form_urlencoded::parse)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    fn first(pairs: &Pairs, matches: impl Fn(&str) -> bool) -> Option<String> {
        pairs
            .iter()
            .find(|(k, _)| matches(k))
            .map(|(_, v)| v.clone())
    }

    fn last(pairs: &Pairs, matches: impl Fn(&str) -> bool) -> Option<String> {
        pairs
            .iter()
            .rev()
            .find(|(k, _)| matches(k))
            .map(|(_, v)| v.clone())
    }

    fn go_fold(key: &str) -> String {
        key.chars()
            .map(|c| match c {
                '\u{17f}' => 's',
                '\u{212a}' => 'k',
                c => c.to_ascii_lowercase(),
            })
            .collect()
    }

    fn php_name(key: &str) -> String {
        key.trim_start_matches(' ')
            .chars()
            .map(|c| if matches!(c, ' ' | '.' | '[') { '_' } else { c })
            .collect()
    }

    /// The whole body as one JSON object's string entries.
    fn json(body: &[u8]) -> Option<Pairs> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let pairs = de.deserialize_map(Entries).ok()?;
        de.end().ok().map(|()| pairs)
    }

    /// The first JSON value of the body, trailing bytes ignored (a stream decoder).
    fn go(body: &[u8]) -> Option<Pairs> {
        let mut de = serde_json::Deserializer::from_slice(body);
        de.deserialize_map(Entries).ok()
    }

    struct Entries;

    impl<'de> Visitor<'de> for Entries {
        type Value = Pairs;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
                if let serde_json::Value::String(v) = v {
                    out.push((k, v));
                }
            }
            Ok(out)
        }
    }
}
