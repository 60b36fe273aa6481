//! An issuer's verification keys: parsed from a JWKS document, from PEM public keys, or an
//! HMAC secret, and chosen per token by its `kid` and `alg`.
//!
//! A key only ever verifies the algorithms of its own kind (an RSA key never verifies an
//! HMAC signature, which is how "algorithm confusion" forges tokens with a public key as the
//! secret); a JWK that names its `alg` verifies only that one, an EC key only its curve's.
//! Symmetric (`oct`) keys are never taken from a key set — an HMAC secret is configured as a
//! secret — and entries that cannot be used (unknown types, `use` other than `sig`, broken
//! numbers) are skipped and counted, not fatal: one bad entry must not take the others down.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

/// Largest key set document read (a JWKS endpoint's answer, a key file).
pub const MAX_KEY_SET_BYTES: usize = 1 << 20;
/// Most keys kept from one document.
pub const MAX_KEYS: usize = 64;

/// One verification key.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    /// The algorithms it verifies.
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

/// An issuer's keys at one moment.
#[derive(Clone, Default)]
pub struct KeySet {
    keys: Vec<Key>,
    /// Entries of the document that could not be used.
    pub skipped: usize,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("keys", &self.keys.len())
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// Why no key verifies a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoKey {
    /// No key has the token's `kid` (a refresh may bring it).
    Unknown,
    /// Keys exist, but none for this algorithm, or the token names none of several.
    Unsuitable,
}

impl KeySet {
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// An HMAC secret (HS256/384/512).
    pub fn secret(secret: &[u8]) -> Result<KeySet, String> {
        if secret.len() < 32 {
            return Err("an HMAC secret needs at least 32 bytes".into());
        }
        let key = DecodingKey::from_secret(secret).map_err(|e| e.to_string())?;
        Ok(KeySet {
            keys: vec![Key {
                kid: None,
                algorithms: vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512],
                key,
            }],
            skipped: 0,
        })
    }

    /// A JWKS document (`{"keys": [...]}`), a single JWK, or PEM public keys.
    pub fn parse(text: &[u8]) -> Result<KeySet, String> {
        if text.len() > MAX_KEY_SET_BYTES {
            return Err(format!("longer than {MAX_KEY_SET_BYTES} bytes"));
        }
        let trimmed = text.trim_ascii_start();
        if trimmed.starts_with(b"{") {
            Self::from_json(trimmed)
        } else if trimmed.starts_with(b"-----BEGIN") {
            Self::from_pem(trimmed)
        } else {
            Err("neither a JWKS / JWK document nor PEM public keys".into())
        }
    }

    fn from_json(text: &[u8]) -> Result<KeySet, String> {
        let doc: Value = serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
        let entries: Vec<Value> = match doc {
            Value::Object(mut o) => match o.remove("keys") {
                Some(Value::Array(keys)) => keys,
                Some(_) => return Err("\"keys\" is not an array".into()),
                None => vec![Value::Object(o)],
            },
            _ => return Err("not a JSON object".into()),
        };
        let mut set = KeySet::default();
        for entry in entries {
            match serde_json::from_value::<Jwk>(entry)
                .ok()
                .and_then(|jwk| from_jwk(&jwk))
            {
                Some(key) if set.keys.len() < MAX_KEYS => set.keys.push(key),
                _ => set.skipped += 1,
            }
        }
        if set.keys.is_empty() {
            return Err(format!(
                "no usable signing key ({} entries skipped)",
                set.skipped
            ));
        }
        Ok(set)
    }

    fn from_pem(text: &[u8]) -> Result<KeySet, String> {
        let text = std::str::from_utf8(text).map_err(|_| "PEM that is not text".to_owned())?;
        let mut set = KeySet::default();
        for block in text.split_inclusive("-----END PUBLIC KEY-----") {
            let block = block.trim();
            if block.is_empty() {
                continue;
            }
            if !block.starts_with("-----BEGIN PUBLIC KEY-----") {
                return Err("only PEM public keys (BEGIN PUBLIC KEY) are read".into());
            }
            let bytes = block.as_bytes();
            let key = if let Ok(k) = DecodingKey::from_rsa_pem(bytes) {
                Key {
                    kid: None,
                    algorithms: RSA.to_vec(),
                    key: k,
                }
            } else if let Ok(k) = DecodingKey::from_ec_pem(bytes) {
                Key {
                    kid: None,
                    algorithms: vec![Algorithm::ES256, Algorithm::ES384],
                    key: k,
                }
            } else if let Ok(k) = DecodingKey::from_ed_pem(bytes) {
                Key {
                    kid: None,
                    algorithms: vec![Algorithm::EdDSA],
                    key: k,
                }
            } else {
                return Err("a PEM public key that is not RSA, EC or Ed25519".into());
            };
            if set.keys.len() == MAX_KEYS {
                return Err(format!("more than {MAX_KEYS} keys"));
            }
            set.keys.push(key);
        }
        if set.keys.is_empty() {
            return Err("no PEM public key".into());
        }
        Ok(set)
    }

    /// The key for a token's `kid` (if any) and `alg`. A key without a `kid` serves any token
    /// when it is the only one suitable for the algorithm.
    pub fn find(&self, kid: Option<&str>, alg: Algorithm) -> Result<&DecodingKey, NoKey> {
        let suits = |k: &&Key| k.algorithms.contains(&alg);
        if let Some(kid) = kid {
            if let Some(k) = self
                .keys
                .iter()
                .filter(suits)
                .find(|k| k.kid.as_deref() == Some(kid))
            {
                return Ok(&k.key);
            }
            if self.keys.iter().any(|k| k.kid.as_deref() == Some(kid)) {
                return Err(NoKey::Unsuitable);
            }
            let mut unnamed = self.keys.iter().filter(suits).filter(|k| k.kid.is_none());
            return match (unnamed.next(), unnamed.next()) {
                (Some(k), None) => Ok(&k.key),
                _ => Err(NoKey::Unknown),
            };
        }
        let mut suitable = self.keys.iter().filter(suits);
        match (suitable.next(), suitable.next()) {
            (Some(k), None) => Ok(&k.key),
            _ => Err(NoKey::Unsuitable),
        }
    }
}

const RSA: [Algorithm; 6] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// A public signing key of a JWK, or `None` when it is not one we can use.
fn from_jwk(jwk: &Jwk) -> Option<Key> {
    if matches!(&jwk.common.public_key_use, Some(u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let family: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => RSA.to_vec(),
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            vec![Algorithm::EdDSA]
        }
        // Secrets are configured as secrets, never read from a key set.
        _ => return None,
    };
    let algorithms = match jwk.common.key_algorithm {
        None => family,
        Some(named) => {
            let alg: Algorithm = named.to_string().parse().ok()?;
            if !family.contains(&alg) {
                return None;
            }
            vec![alg]
        }
    };
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        algorithms,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED_JWK: &str = r#"{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"ed1"}"#;

    #[test]
    fn unusable_entries_are_skipped_not_fatal() {
        let doc = format!(
            r#"{{"keys":[{ED_JWK},{{"kty":"oct","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}},{{"kty":"RSA"}},{{"kty":"EC","crv":"P-521","x":"AA","y":"AA"}},{{"kty":"OKP","crv":"Ed25519","x":"AA","use":"enc"}}]}}"#
        );
        let set = KeySet::parse(doc.as_bytes()).unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(set.skipped, 4);
        assert!(KeySet::parse(br#"{"keys":[{"kty":"oct","k":"AAAA"}]}"#).is_err());
        assert!(KeySet::parse(b"garbage").is_err());
        assert!(KeySet::parse(br#"{"keys":{}}"#).is_err());
    }

    #[test]
    fn keys_are_chosen_by_kid_and_only_for_their_own_algorithms() {
        let set = KeySet::parse(ED_JWK.as_bytes()).unwrap();
        assert!(set.find(Some("ed1"), Algorithm::EdDSA).is_ok());
        assert_eq!(
            set.find(Some("ed1"), Algorithm::HS256).err(),
            Some(NoKey::Unsuitable)
        );
        assert_eq!(
            set.find(Some("other"), Algorithm::EdDSA).err(),
            Some(NoKey::Unknown)
        );
        // No kid: the one suitable key.
        assert!(set.find(None, Algorithm::EdDSA).is_ok());
        assert!(set.find(None, Algorithm::RS256).is_err());
    }

    #[test]
    fn a_secret_verifies_hmac_only_and_must_be_long_enough() {
        let set = KeySet::secret(&[7u8; 32]).unwrap();
        assert!(set.find(None, Algorithm::HS256).is_ok());
        assert!(set.find(Some("any"), Algorithm::HS512).is_ok());
        assert!(set.find(None, Algorithm::RS256).is_err());
        assert!(KeySet::secret(b"short").is_err());
    }
}
