//! A bearer token → the caller: the cache first, else the issuer the route accepts (chosen by
//! the token's `iss` when it accepts several), its keys (refreshed once when the token names
//! a key they lack), the checks of `verify`, and the identity the gateway keeps.
//!
//! The client id of a token is `jwt:<issuer>:<32 hex>`: namespaced by the issuer (an API-key
//! client of any name can never collide with it, nor two issuers' subjects), and the subject
//! keyed-hashed like every other partition key (bounded, the same on every instance with the
//! same `server.key_hash_secret`, revealing nothing in store keys). The upstream still gets
//! the subject itself in `X-Client-Id`.

use super::cache::{digest, Remembered, TokenCache};
use super::claims::ClaimPath;
use super::source::KeySource;
use super::verify::{claimed_issuer, verify, IssuerRules, TokenError, MAX_TOKEN_BYTES};
use crate::chain::auth::Client;
use crate::chain::partition::{KeyHasher, TokenClaims};
use std::sync::Arc;

/// A configured issuer: its rules and where its keys come from.
pub struct Issuer {
    pub rules: IssuerRules,
    pub source: Arc<KeySource>,
}

/// What the gateway keeps of a verified token.
pub struct TokenIdentity {
    /// The issuer that verified it.
    pub issuer: Arc<Issuer>,
    pub client: Arc<Client>,
    /// The client id claim's value, as the token has it (for `X-Client-Id`).
    pub subject: String,
    /// The claims routes read (key parts, forwarded headers): their text, if usable.
    claims: Vec<(ClaimPath, Option<String>)>,
    expires: u64,
    /// The issuer's key generation it was verified with.
    generation: u64,
}

impl std::fmt::Debug for TokenIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIdentity")
            .field("issuer", &self.issuer.rules.name)
            .field("client", &self.client.id)
            .finish_non_exhaustive()
    }
}

impl TokenIdentity {
    /// A claim a route uses, as text (`None`: absent, or not a string or integer).
    pub fn claim(&self, path: &ClaimPath) -> Option<&str> {
        self.claims
            .iter()
            .find(|(p, _)| p == path)
            .and_then(|(_, v)| v.as_deref())
    }
}

impl Remembered for TokenIdentity {
    fn usable_at(&self, now: u64) -> bool {
        now < self.expires && self.issuer.source.generation() == self.generation
    }
}

impl TokenClaims for TokenIdentity {
    fn claim(&self, path: &ClaimPath) -> Option<&str> {
        TokenIdentity::claim(self, path)
    }
}

/// What authenticating a token needs from the snapshot.
pub struct TokenCheck<'a> {
    /// The issuers the route accepts.
    pub issuers: &'a [Arc<Issuer>],
    pub cache: &'a TokenCache<TokenIdentity>,
    pub hasher: &'a KeyHasher,
    /// Every claim some route reads.
    pub used_claims: &'a [ClaimPath],
    /// Asked before a token not remembered is verified: `false` refuses it unverified
    /// ([`TokenError::TooManyFailures`]; `server.token_failure_limit`).
    pub may_verify: Option<&'a (dyn Fn() -> bool + Sync)>,
}

/// How the identity was had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    Cached,
    Verified,
}

/// The caller of `token` at `now` (Unix seconds).
pub async fn authenticate(
    check: &TokenCheck<'_>,
    token: &str,
    now: u64,
) -> Result<(Arc<TokenIdentity>, Checked), TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Malformed);
    }
    let key = digest(token);
    if let Some(hit) = check.cache.get(&key, now) {
        if check.issuers.iter().any(|i| Arc::ptr_eq(i, &hit.issuer)) {
            return Ok((hit, Checked::Cached));
        }
    }
    let issuer = match check.issuers {
        [only] => only,
        several => {
            let iss = claimed_issuer(token).ok_or(TokenError::UnknownIssuer)?;
            several
                .iter()
                .find(|i| i.rules.issuer == iss)
                .ok_or(TokenError::UnknownIssuer)?
        }
    };
    if check.may_verify.is_some_and(|may| !may()) {
        return Err(TokenError::TooManyFailures);
    }
    let source = &issuer.source;
    let mut generation = source.generation();
    let mut refreshed = false;
    let verified = loop {
        let keys = match source.keys() {
            Some(keys) => keys,
            None if !refreshed => {
                refreshed = true;
                source.refresh_for_unknown_key(generation).await;
                generation = source.generation();
                continue;
            }
            None => return Err(TokenError::NoKeys),
        };
        match verify(&issuer.rules, &keys, token, now) {
            Err(TokenError::UnknownKey) if !refreshed => {
                refreshed = true;
                if !source.refresh_for_unknown_key(generation).await {
                    return Err(TokenError::UnknownKey);
                }
                generation = source.generation();
            }
            other => break other?,
        }
    };
    let rules = &issuer.rules;
    let id = format!(
        "jwt:{}:{}",
        rules.name,
        check.hasher.name("jwt client", verified.subject.as_bytes())
    );
    let claims = check
        .used_claims
        .iter()
        .map(|path| (path.clone(), verified.claims.text(path).ok().flatten()))
        .collect();
    let identity = Arc::new(TokenIdentity {
        issuer: Arc::clone(issuer),
        client: Arc::new(Client {
            id: id.into(),
            plan: Arc::clone(&verified.plan),
            groups: verified.groups.clone(),
        }),
        subject: verified.subject,
        claims,
        expires: verified.expires,
        generation,
    });
    check.cache.insert(key, Arc::clone(&identity), now);
    Ok((identity, Checked::Verified))
}
