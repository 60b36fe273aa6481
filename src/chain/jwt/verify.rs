//! One token checked against one issuer's rules and keys: pure, the time an argument.
//!
//! In order: the compact form and its size; the header's `alg` on the issuer's allow-list
//! (`none` is not an algorithm the JOSE crate knows, so it never gets this far); the key for
//! its `kid` that verifies that algorithm; the signature, `exp` and `nbf` (with the leeway),
//! `iss` and `aud` (one of the issuer's audiences) by `jsonwebtoken`; then `iat` not in the
//! future, the required claims, a client id, and the plan.

use super::claims::{ClaimPath, Claims};
use super::keys::{KeySet, NoKey};
use crate::chain::auth::Plan;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Longest token read; longer ones are refused before any decoding.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// What an issuer's tokens must satisfy, and how their claims become an identity.
#[derive(Debug)]
pub struct IssuerRules {
    /// The configured name (`[issuers.NAME]`): namespaces its client ids.
    pub name: Arc<str>,
    /// The `iss` its tokens carry.
    pub issuer: String,
    /// A token's `aud` must name one of these.
    pub audiences: Vec<String>,
    pub algorithms: Vec<Algorithm>,
    /// Seconds of clock skew allowed on `exp`, `nbf` and `iat`.
    pub leeway: u64,
    /// Claims a token must carry besides `exp`, `iss` and `aud`.
    pub required: Vec<ClaimPath>,
    /// The claim naming the caller (`sub` by default).
    pub client_id_claim: ClaimPath,
    /// The claim choosing the plan, and its values' plans.
    pub plan_claim: Option<ClaimPath>,
    pub plans: BTreeMap<String, Arc<Plan>>,
    /// The plan of tokens whose claim is absent or maps to none.
    pub default_plan: Arc<Plan>,
    /// The claim naming the caller's groups.
    pub groups_claim: Option<ClaimPath>,
}

/// A verified token's identity.
#[derive(Debug)]
pub struct Verified {
    pub claims: Claims,
    /// The client id claim's value, as the token has it.
    pub subject: String,
    pub plan: Arc<Plan>,
    /// The groups its `groups_claim` names (none without one).
    pub groups: Vec<Arc<str>>,
    /// `exp`, in Unix seconds: nothing of this token is used after it (plus the leeway).
    pub expires: u64,
}

/// Most groups taken from a token, and the longest name: the rest are not read.
pub const MAX_TOKEN_GROUPS: usize = 64;
pub const MAX_GROUP_LEN: usize = 128;

/// The groups a claim's value names: a list of strings, or one string of names separated
/// by spaces or commas; bounded in count and length (a longer name is left out).
pub fn groups_of(value: Option<&serde_json::Value>) -> Vec<Arc<str>> {
    let names: Vec<&str> = match value {
        Some(serde_json::Value::Array(items)) => items.iter().filter_map(|v| v.as_str()).collect(),
        Some(serde_json::Value::String(text)) => text
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|n| !n.is_empty())
            .collect(),
        _ => Vec::new(),
    };
    names
        .into_iter()
        .filter(|n| !n.is_empty() && n.len() <= MAX_GROUP_LEN)
        .take(MAX_TOKEN_GROUPS)
        .map(Arc::from)
        .collect()
}

/// Why a token is refused. Details never quote the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// Not a signed JWT in compact form, undecodable, or too long.
    Malformed,
    /// `alg` not allowed for the issuer (or an algorithm its key does not verify).
    Algorithm,
    /// No accepted issuer has the token's `iss`.
    UnknownIssuer,
    /// No key has the token's `kid` (after a refresh, when one was allowed).
    UnknownKey,
    Signature,
    Expired,
    NotYetValid,
    /// `iat` after now (beyond the leeway).
    IssuedInFuture,
    Audience,
    Issuer,
    /// A required claim is missing (its name).
    MissingClaim(String),
    /// A claim cannot be read one way, or is unusable as what it is configured for.
    InvalidClaim(String),
    /// The issuer's keys were never loaded (its JWKS endpoint has not answered yet).
    NoKeys,
    /// Tokens from this address failed their checks too often lately
    /// (`server.token_failure_limit`): not verified.
    TooManyFailures,
}

impl TokenError {
    /// The `error_description` and problem detail.
    pub fn detail(&self) -> String {
        match self {
            TokenError::Malformed => "the token is not a well-formed signed JWT".into(),
            TokenError::Algorithm => "the token's algorithm is not accepted".into(),
            TokenError::UnknownIssuer => "the token's issuer is not accepted here".into(),
            TokenError::UnknownKey => "the token is signed with an unknown key".into(),
            TokenError::Signature => "the token's signature is not valid".into(),
            TokenError::Expired => "the token has expired".into(),
            TokenError::NotYetValid => "the token is not valid yet".into(),
            TokenError::IssuedInFuture => "the token is issued in the future".into(),
            TokenError::Audience => "the token is not meant for this API (aud)".into(),
            TokenError::Issuer => "the token's issuer is not accepted here".into(),
            TokenError::MissingClaim(c) => format!("the token lacks the claim {c}"),
            TokenError::InvalidClaim(why) => format!("the token's claims are not usable: {why}"),
            TokenError::NoKeys => {
                "the identity provider's keys are not available yet; this is not caused by the request"
                    .into()
            }
            TokenError::TooManyFailures => "too many tokens from this address failed their checks lately; retry after the time in Retry-After".into(),
        }
    }

    /// A short label for metrics and the access log.
    pub fn reason(&self) -> &'static str {
        match self {
            TokenError::Malformed => "malformed",
            TokenError::Algorithm => "algorithm",
            TokenError::UnknownIssuer | TokenError::Issuer => "issuer",
            TokenError::UnknownKey => "unknown_key",
            TokenError::Signature => "signature",
            TokenError::Expired => "expired",
            TokenError::NotYetValid | TokenError::IssuedInFuture => "not_yet_valid",
            TokenError::Audience => "audience",
            TokenError::MissingClaim(_) | TokenError::InvalidClaim(_) => "claims",
            TokenError::NoKeys => "no_keys",
            TokenError::TooManyFailures => "too_many_failures",
        }
    }

    /// The token's signature was checked before it was refused (a failure that cost the
    /// gateway a verification: what `server.token_failure_limit` counts).
    pub fn was_verified(&self) -> bool {
        matches!(
            self,
            TokenError::Signature
                | TokenError::Expired
                | TokenError::NotYetValid
                | TokenError::IssuedInFuture
                | TokenError::Audience
                | TokenError::Issuer
                | TokenError::MissingClaim(_)
                | TokenError::InvalidClaim(_)
        )
    }
}

/// Whether `token` has the shape of a signed JWT (three base64url parts, the first an object
/// with an `alg`): how an `Authorization: Bearer` value is told from an API key.
pub fn looks_like_jwt(token: &[u8]) -> bool {
    if token.len() > MAX_TOKEN_BYTES || token.iter().filter(|&&b| b == b'.').count() != 2 {
        return false;
    }
    std::str::from_utf8(token)
        .ok()
        .and_then(|t| jsonwebtoken::decode_header(t).ok())
        .is_some()
}

/// The `iss` a token claims, unverified: only to choose which issuer's keys check it.
pub fn claimed_issuer(token: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Iss {
        iss: Option<String>,
    }
    jsonwebtoken::dangerous::insecure_decode_claims::<Iss>(token)
        .ok()
        .and_then(|c| c.iss)
}

/// Checks `token` against `rules` with `keys` at `now` (Unix seconds).
pub fn verify(
    rules: &IssuerRules,
    keys: &KeySet,
    token: &str,
    now: u64,
) -> Result<Verified, TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Malformed);
    }
    let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
    if !rules.algorithms.contains(&header.alg) {
        return Err(TokenError::Algorithm);
    }
    let key = match keys.find(header.kid.as_deref(), header.alg) {
        Ok(key) => key,
        Err(NoKey::Unknown) => return Err(TokenError::UnknownKey),
        Err(NoKey::Unsuitable) => return Err(TokenError::Algorithm),
    };
    let mut validation = Validation::new(header.alg);
    validation.leeway = rules.leeway;
    validation.set_issuer(&[&rules.issuer]);
    validation.set_audience(&rules.audiences);
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    validation.validate_nbf = true;
    let data = jsonwebtoken::decode::<Claims>(token, key, &validation).map_err(|e| {
        match e.kind() {
            ErrorKind::InvalidSignature => TokenError::Signature,
            ErrorKind::ExpiredSignature => TokenError::Expired,
            ErrorKind::ImmatureSignature => TokenError::NotYetValid,
            ErrorKind::InvalidAudience => TokenError::Audience,
            ErrorKind::InvalidIssuer => TokenError::Issuer,
            ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => TokenError::Algorithm,
            ErrorKind::MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
            ErrorKind::InvalidClaimFormat(c) => {
                TokenError::InvalidClaim(format!("claim {c} has the wrong type"))
            }
            // The signature holds (it is checked first): the claims are what cannot be read.
            ErrorKind::Json(j) => TokenError::InvalidClaim(j.to_string()),
            _ => TokenError::Malformed,
        }
    })?;
    let claims = data.claims;
    if claims
        .seconds("iat")
        .is_some_and(|iat| iat > (now + rules.leeway) as f64)
    {
        return Err(TokenError::IssuedInFuture);
    }
    if let Some(missing) = rules.required.iter().find(|c| !claims.contains(c)) {
        return Err(TokenError::MissingClaim(missing.to_string()));
    }
    let subject = claims
        .text(&rules.client_id_claim)
        .map_err(TokenError::InvalidClaim)?
        .ok_or_else(|| TokenError::MissingClaim(rules.client_id_claim.to_string()))?;
    let plan = match &rules.plan_claim {
        Some(claim) => claims
            .text(claim)
            .ok()
            .flatten()
            .and_then(|value| rules.plans.get(&value))
            .unwrap_or(&rules.default_plan),
        None => &rules.default_plan,
    };
    let expires = claims.seconds("exp").map_or(0, |e| e.max(0.0) as u64);
    let groups = rules
        .groups_claim
        .as_ref()
        .map(|claim| groups_of(claims.get(claim)))
        .unwrap_or_default();
    Ok(Verified {
        plan: Arc::clone(plan),
        groups,
        subject,
        expires,
        claims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn rules() -> IssuerRules {
        let free = Arc::new(Plan::new("free", vec![]));
        let pro = Arc::new(Plan::new("pro", vec![]));
        IssuerRules {
            name: "idp".into(),
            issuer: "https://idp.example".into(),
            audiences: vec!["orders".into(), "billing".into()],
            algorithms: vec![Algorithm::HS256],
            leeway: 5,
            required: vec![ClaimPath::parse("org.id").unwrap()],
            client_id_claim: ClaimPath::parse("sub").unwrap(),
            plan_claim: Some(ClaimPath::parse("tier").unwrap()),
            plans: BTreeMap::from([("gold".to_owned(), pro)]),
            default_plan: free,
            groups_claim: Some(ClaimPath::parse("groups").unwrap()),
        }
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    #[test]
    fn groups_come_from_a_list_or_a_string_and_are_bounded() {
        let names = |v: serde_json::Value| -> Vec<String> {
            groups_of(Some(&v)).iter().map(|g| g.to_string()).collect()
        };
        assert_eq!(names(json!(["a", "b", 3, ""])), ["a", "b"]);
        assert_eq!(names(json!("a b,c  d")), ["a", "b", "c", "d"]);
        assert!(names(json!({"a": 1})).is_empty());
        assert!(groups_of(None).is_empty());
        let many: Vec<String> = (0..100).map(|i| format!("g{i}")).collect();
        assert_eq!(names(json!(many)).len(), MAX_TOKEN_GROUPS);
        assert!(names(json!(["x".repeat(MAX_GROUP_LEN + 1)])).is_empty());
    }

    fn token(claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap()
    }

    fn good() -> serde_json::Value {
        json!({"iss": "https://idp.example", "aud": "billing", "sub": "u-1",
               "exp": now() + 60, "iat": now(), "org": {"id": "acme"}, "tier": "gold"})
    }

    fn check(claims: serde_json::Value) -> Result<Verified, TokenError> {
        verify(
            &rules(),
            &KeySet::secret(SECRET).unwrap(),
            &token(claims),
            now(),
        )
    }

    fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
        let mut c = good();
        c[field] = value;
        c
    }

    fn without(field: &str) -> serde_json::Value {
        let mut c = good();
        c.as_object_mut().unwrap().remove(field);
        c
    }

    #[test]
    fn a_good_token_names_its_subject_and_plan() {
        let v = check(good()).unwrap();
        assert_eq!(v.subject, "u-1");
        assert_eq!(&*v.plan.name, "pro");
        let v = check(with("tier", json!("unknown"))).unwrap();
        assert_eq!(&*v.plan.name, "free");
    }

    #[test]
    fn each_rule_refuses_what_breaks_it() {
        let n = now();
        assert_eq!(
            check(with("exp", json!(n - 60))).err(),
            Some(TokenError::Expired)
        );
        assert_eq!(
            check(with("nbf", json!(n + 60))).err(),
            Some(TokenError::NotYetValid)
        );
        assert_eq!(
            check(with("iat", json!(n + 60))).err(),
            Some(TokenError::IssuedInFuture)
        );
        assert!(
            check(with("iat", json!(n + 3))).is_ok(),
            "within the leeway"
        );
        assert_eq!(
            check(with("aud", json!("other"))).err(),
            Some(TokenError::Audience)
        );
        assert!(check(with("aud", json!(["x", "orders"]))).is_ok());
        assert_eq!(
            check(with("iss", json!("https://evil.example"))).err(),
            Some(TokenError::Issuer)
        );
        assert!(matches!(
            check(without("exp")).err(),
            Some(TokenError::MissingClaim(c)) if c == "exp"
        ));
        assert!(matches!(
            check(without("org")).err(),
            Some(TokenError::MissingClaim(c)) if c == "org.id"
        ));
        assert!(matches!(
            check(without("sub")).err(),
            Some(TokenError::MissingClaim(c)) if c == "sub"
        ));
        let e = check(with("sub", json!({"a": 1}))).err();
        assert!(matches!(e, Some(TokenError::InvalidClaim(_))), "{e:?}");
    }

    #[test]
    fn forged_and_malformed_tokens_are_refused() {
        let keys = KeySet::secret(SECRET).unwrap();
        let r = rules();
        let good = token(good());
        // Another secret.
        let other = encode(
            &Header::new(Algorithm::HS256),
            &super::tests::good(),
            &EncodingKey::from_secret(b"another secret, just as long!!!!").unwrap(),
        )
        .unwrap();
        assert_eq!(
            verify(&r, &keys, &other, now()).err(),
            Some(TokenError::Signature)
        );
        // alg none: the header names an algorithm that does not exist for the crate.
        let (_, rest) = good.split_once('.').unwrap();
        let none = format!(
            "{}.{}",
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0",
            rest.rsplit_once('.').unwrap().0
        );
        assert_eq!(
            verify(&r, &keys, &format!("{none}."), now()).err(),
            Some(TokenError::Malformed)
        );
        // An algorithm the issuer does not allow.
        let hs384 = encode(
            &Header::new(Algorithm::HS384),
            &super::tests::good(),
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap();
        assert_eq!(
            verify(&r, &keys, &hs384, now()).err(),
            Some(TokenError::Algorithm)
        );
        for broken in [
            "",
            "abc",
            &good[..good.len() / 2],
            &format!("{good}.x"),
            &"a".repeat(MAX_TOKEN_BYTES + 1),
        ] {
            assert!(verify(&r, &keys, broken, now()).is_err(), "{broken}");
        }
        // Claims with two readings, properly signed.
        let header = good.split('.').next().unwrap();
        let payload = base64_url(
            format!(
                r#"{{"iss":"https://idp.example","aud":"orders","exp":{},"org":{{"id":"a"}},"sub":"a","SUB":"b"}}"#,
                now() + 60
            )
            .as_bytes(),
        );
        let message = format!("{header}.{payload}");
        let signature = jsonwebtoken::crypto::sign(
            message.as_bytes(),
            &EncodingKey::from_secret(SECRET).unwrap(),
            Algorithm::HS256,
        )
        .unwrap();
        assert!(matches!(
            verify(&r, &keys, &format!("{message}.{signature}"), now()).err(),
            Some(TokenError::InvalidClaim(_))
        ));
    }

    fn base64_url(data: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in data.chunks(3) {
            let n =
                chunk.iter().fold(0u32, |acc, &b| (acc << 8) | b as u32) << (8 * (3 - chunk.len()));
            for i in 0..=chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }

    #[test]
    fn jwt_shapes_are_told_from_api_keys() {
        assert!(looks_like_jwt(token(good()).as_bytes()));
        assert!(!looks_like_jwt(b"alice-demo-key-0001"));
        assert!(!looks_like_jwt(b"a.b.c"));
        assert_eq!(
            claimed_issuer(&token(good())).as_deref(),
            Some("https://idp.example")
        );
    }
}
