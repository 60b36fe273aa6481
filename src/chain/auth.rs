//! API keys → clients. Keys are configured as plaintext or as `sha256:<hex>`; either way only
//! the SHA-256 digest is kept. A presented key is hashed and looked up by digest, so the
//! lookup's timing depends on the digest of what was sent, not on how many leading bytes it
//! shares with a real key; the final comparison is constant-time as well. Keys never appear
//! in `Debug` output, logs, metrics or `/config`.

use crate::limit::Policy;
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Longest key accepted from a request; longer values are refused without hashing.
pub const MAX_KEY_LEN: usize = 256;
pub const API_KEY_HEADER: &str = "x-api-key";
/// [`API_KEY_HEADER`] parsed once (for lookups and removal).
pub const API_KEY: http::HeaderName = http::HeaderName::from_static(API_KEY_HEADER);

/// The SHA-256 digest of an API key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyDigest([u8; 32]);

impl KeyDigest {
    pub fn of(key: &[u8]) -> KeyDigest {
        KeyDigest(Sha256::digest(key).into())
    }

    /// The digest as 64 lower-case hex digits.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses `sha256:<64 hex digits>`.
    pub fn from_hex(hex: &str) -> Option<KeyDigest> {
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(KeyDigest(out))
    }
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyDigest(<redacted>)")
    }
}

/// How a route identifies its callers: any one of the methods it lists (none: anonymous).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Auth {
    pub api_key: bool,
    pub jwt: bool,
    pub client_cert: bool,
}

impl Auth {
    pub const NONE: Auth = Auth {
        api_key: false,
        jwt: false,
        client_cert: false,
    };
    pub const API_KEY: Auth = Auth {
        api_key: true,
        jwt: false,
        client_cert: false,
    };

    /// Whether every request of the route has an identified client (plans apply).
    pub fn identifies(self) -> bool {
        self.api_key || self.jwt || self.client_cert
    }

    /// As configured: `none`, or the methods' names.
    pub fn names(self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.api_key {
            out.push("api_key");
        }
        if self.jwt {
            out.push("jwt");
        }
        if self.client_cert {
            out.push("client_cert");
        }
        if out.is_empty() {
            out.push("none");
        }
        out
    }
}

/// A configured client: its id (the partition key of every per-client limit) and its plan.
#[derive(Debug)]
pub struct Client {
    pub id: Arc<str>,
    pub plan: Arc<Plan>,
    /// The groups the client is in (`groups` of `[[clients]]` and the registry, a token's
    /// `groups_claim`): what `allow_groups` / `deny_groups` name.
    pub groups: Vec<Arc<str>>,
}

/// A named set of limits.
#[derive(Debug)]
pub struct Plan {
    pub name: Arc<str>,
    /// The rate limits, then the client-wide concurrency limit if the plan has one.
    pub policies: Vec<Policy>,
    /// `shadow[i]`: `policies[i]` is a dry run (decides, never blocks).
    pub shadow: Vec<bool>,
    /// `RateLimit-Policy` for the enforced limits, rendered once.
    pub policy_header: http::HeaderValue,
    /// Quota leasing: the most units one instance reserves at once (`None`: no leasing).
    pub lease: Option<u64>,
    /// Load-shedding class of the plan's requests (`None`: the route's).
    pub priority: Option<crate::upstream::shed::Priority>,
    /// Route limits (by name) the plan's clients skip.
    pub exempt_from: Vec<Arc<str>>,
    /// Limits charged from the response: (limit name, the header, the most one charges).
    pub response_costs: Vec<crate::chain::cost::ResponseCost>,
}

impl Plan {
    pub fn new(name: &str, policies: Vec<Policy>) -> Plan {
        let shadow = vec![false; policies.len()];
        Plan::with_shadow(name, policies, shadow)
    }

    pub fn with_shadow(name: &str, policies: Vec<Policy>, shadow: Vec<bool>) -> Plan {
        let enforced = policies
            .iter()
            .zip(&shadow)
            .filter(|(_, s)| !**s)
            .map(|(p, _)| p);
        let header = crate::chain::headers::policy_header(enforced);
        Plan {
            name: name.into(),
            policy_header: http::HeaderValue::from_str(&header)
                .expect("policy names are header-safe"),
            policies,
            shadow,
            lease: None,
            priority: None,
            exempt_from: Vec::new(),
            response_costs: Vec::new(),
        }
    }

    pub fn with_lease(self, lease: Option<u64>) -> Plan {
        Plan { lease, ..self }
    }

    pub fn with_priority(self, priority: Option<crate::upstream::shed::Priority>) -> Plan {
        Plan { priority, ..self }
    }

    pub fn with_response_costs(self, costs: &[crate::chain::cost::ResponseCost]) -> Plan {
        Plan {
            response_costs: costs.to_vec(),
            ..self
        }
    }

    pub fn with_exempt_from(self, names: &[String]) -> Plan {
        Plan {
            exempt_from: names.iter().map(|n| Arc::from(n.as_str())).collect(),
            ..self
        }
    }
}

#[derive(Default)]
pub struct KeyRing {
    /// A digest is already a uniform hash of the key: a fast seeded hash of it is enough
    /// (SipHash cost ~400 instructions per lookup; the stored digests are the operator's, so a
    /// caller cannot crowd their buckets).
    by_digest: HashMap<KeyDigest, Arc<Client>, foldhash::fast::RandomState>,
}

impl KeyRing {
    pub fn new(keys: impl IntoIterator<Item = (KeyDigest, Arc<Client>)>) -> KeyRing {
        KeyRing {
            by_digest: keys.into_iter().collect(),
        }
    }

    /// The client owning `key`, if any.
    pub fn lookup(&self, key: &[u8]) -> Option<&Arc<Client>> {
        let digest = KeyDigest::of(key);
        self.by_digest
            .get_key_value(&digest)
            .filter(|(stored, _)| bool::from(stored.0.ct_eq(&digest.0)))
            .map(|(_, client)| client)
    }

    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

/// Why no usable key could be read from a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKeyError {
    /// No `X-Api-Key` and no `Authorization: Bearer` (or an empty one): 401.
    Missing,
    /// Several different keys in one request (repeated header, or both headers): 400.
    Ambiguous,
    /// More than one `Authorization` header: the field takes one credential (RFC 9110
    /// §11.6.2), and a second one would reach the upstream unseen: 400.
    RepeatedAuthorization,
    /// Too long, or characters a key never has: 401, without a lookup.
    Malformed,
    /// Well formed, but no client has it: 401.
    Unknown,
}

impl ApiKeyError {
    pub fn detail(self) -> &'static str {
        match self {
            ApiKeyError::Missing => {
                "this route needs an API key in X-Api-Key or Authorization: Bearer"
            }
            ApiKeyError::Ambiguous => "the request carries more than one API key",
            ApiKeyError::RepeatedAuthorization => {
                "the request carries more than one Authorization header"
            }
            ApiKeyError::Malformed | ApiKeyError::Unknown => "the API key is not valid",
        }
    }
}

/// Reads the API key from `X-Api-Key` values and `Authorization` values (in that order of
/// preference when both carry the same key). Every value counts: repeated `X-Api-Key`
/// values must agree, and a second `Authorization` header is refused whatever its scheme.
pub fn extract_key<'a>(
    api_key: impl Iterator<Item = &'a [u8]>,
    mut authorization: impl Iterator<Item = &'a [u8]>,
) -> Result<&'a [u8], ApiKeyError> {
    let bearer = authorization.next().and_then(bearer_token);
    if authorization.next().is_some() {
        return Err(ApiKeyError::RepeatedAuthorization);
    }
    let mut found: Option<&[u8]> = None;
    for candidate in api_key.map(<[u8]>::trim_ascii).chain(bearer) {
        if candidate.is_empty() {
            continue;
        }
        match found {
            Some(existing) if existing != candidate => return Err(ApiKeyError::Ambiguous),
            _ => found = Some(candidate),
        }
    }
    let key = found.ok_or(ApiKeyError::Missing)?;
    if key.len() > MAX_KEY_LEN || !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(ApiKeyError::Malformed);
    }
    Ok(key)
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive); other schemes
/// carry no API key.
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let scheme = value.get(..7)?;
    if scheme.eq_ignore_ascii_case(b"bearer ") {
        Some(value[7..].trim_ascii())
    } else {
        None
    }
}

/// [4]: the client owning the request's API key, as `lookup` finds it (the configuration's
/// key ring, then the registry's).
pub fn authenticate(
    headers: &HeaderMap,
    lookup: impl FnOnce(&[u8]) -> Option<Arc<Client>>,
) -> Result<Arc<Client>, ApiKeyError> {
    let key = extract_key(
        headers.get_all(API_KEY).iter().map(HeaderValue::as_bytes),
        headers
            .get_all(AUTHORIZATION)
            .iter()
            .map(HeaderValue::as_bytes),
    )?;
    lookup(key).ok_or(ApiKeyError::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> KeyRing {
        let plan = Arc::new(Plan::new("free", vec![]));
        let ada = Arc::new(Client {
            id: "ada".into(),
            plan: Arc::clone(&plan),
            groups: Vec::new(),
        });
        let bob = Arc::new(Client {
            id: "bob".into(),
            plan,
            groups: Vec::new(),
        });
        let bob_digest =
            KeyDigest::from_hex("4b9c59b7d5c1ee8c3a69b8a8d9c9a3f0c3fe4d1c1ad4b39d4c8cc0c20e1d9a3a")
                .unwrap();
        KeyRing::new([
            (KeyDigest::of(b"ada-secret-key-0001"), ada),
            (bob_digest, bob),
        ])
    }

    #[test]
    fn keys_map_to_clients_by_digest() {
        let r = ring();
        assert_eq!(&*r.lookup(b"ada-secret-key-0001").unwrap().id, "ada");
        assert!(r.lookup(b"ada-secret-key-0002").is_none());
        assert!(r.lookup(b"").is_none());
    }

    #[test]
    fn hex_digests_parse_and_match_the_plaintext_digest() {
        let d = KeyDigest::of(b"abc");
        let hex = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(KeyDigest::from_hex(hex), Some(d));
        assert_eq!(KeyDigest::from_hex(&hex.to_uppercase()), Some(d));
        assert_eq!(KeyDigest::from_hex("abc"), None);
        assert_eq!(KeyDigest::from_hex(&"zz".repeat(32)), None);
        assert_eq!(format!("{d:?}"), "KeyDigest(<redacted>)");
    }

    fn extract(api: &[&str], auth: &[&str]) -> Result<String, ApiKeyError> {
        extract_key(
            api.iter().map(|s| s.as_bytes()),
            auth.iter().map(|s| s.as_bytes()),
        )
        .map(|k| String::from_utf8(k.to_vec()).unwrap())
    }

    #[test]
    fn keys_come_from_x_api_key_or_bearer() {
        assert_eq!(extract(&["k1"], &[]), Ok("k1".into()));
        assert_eq!(extract(&[], &["Bearer k2"]), Ok("k2".into()));
        assert_eq!(extract(&[], &["bearer   k2 "]), Ok("k2".into()));
        assert_eq!(extract(&["k3"], &["Bearer k3"]), Ok("k3".into()));
        assert_eq!(
            extract(&[], &["Basic dXNlcjpwYXNz"]),
            Err(ApiKeyError::Missing)
        );
        assert_eq!(extract(&[], &[]), Err(ApiKeyError::Missing));
        assert_eq!(extract(&[""], &["Bearer "]), Err(ApiKeyError::Missing));
    }

    #[test]
    fn ambiguous_and_malformed_keys_are_refused() {
        assert_eq!(extract(&["k1", "k2"], &[]), Err(ApiKeyError::Ambiguous));
        assert_eq!(
            extract(&["k1"], &["Bearer k2"]),
            Err(ApiKeyError::Ambiguous)
        );
        // A second Authorization header is refused, whatever the schemes and keys.
        for second in [
            ["Basic Zm9vOmJhcg==", "Bearer k1"],
            ["Bearer k1", "Bearer k1"],
        ] {
            assert_eq!(
                extract(&[], &second),
                Err(ApiKeyError::RepeatedAuthorization)
            );
            assert_eq!(
                extract(&["k1"], &second),
                Err(ApiKeyError::RepeatedAuthorization)
            );
        }
        assert_eq!(
            extract(&[&"k".repeat(MAX_KEY_LEN + 1)], &[]),
            Err(ApiKeyError::Malformed)
        );
        assert_eq!(extract(&["has space"], &[]), Err(ApiKeyError::Malformed));
        assert_eq!(extract(&["caf\u{e9}"], &[]), Err(ApiKeyError::Malformed));
    }
}
