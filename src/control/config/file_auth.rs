//! The serde mirror of who the callers are: `[issuers.NAME]` (who signs the bearer tokens a
//! route accepts), a route's `auth` and `exempt`, the TLS listener's client certificates,
//! and `[registry]` (clients managed at runtime). Checked and typed by
//! `validate/issuers.rs`, `validate/route_auth.rs` and `validate/registry.rs`.

use super::units::{HumanDuration, SecretSource};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// `[issuers.NAME]`: an identity provider whose signed tokens (JWT) identify callers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerFile {
    /// The `iss` its tokens carry.
    pub issuer: String,
    /// A token's `aud` must name one of these.
    pub audiences: Vec<String>,
    /// Accepted `alg`s (default `["RS256"]`, or `["HS256"]` with `secret`).
    pub algorithms: Option<Vec<String>>,
    /// Keys fetched from this URL (a JWKS document), refreshed in the background.
    pub jwks_url: Option<String>,
    /// The CA the JWKS endpoint's certificate chains to (default: Mozilla's roots).
    pub jwks_ca_file: Option<String>,
    pub jwks_refresh: Option<HumanDuration>,
    /// Least time between two fetches (a token with an unknown `kid` asks for one).
    pub jwks_min_refresh: Option<HumanDuration>,
    pub jwks_timeout: Option<HumanDuration>,
    /// Fixed public keys: PEM, a JWK or a JWKS document (literal, `{ env }` or `{ file }`).
    pub keys: Option<SecretSource>,
    /// An HMAC secret (HS256/384/512) for internal tokens.
    pub secret: Option<SecretSource>,
    /// Clock skew allowed on `exp`, `nbf`, `iat` (default "30s").
    pub leeway: Option<HumanDuration>,
    /// Claims a token must carry besides `exp`, `iss`, `aud` and the client id claim.
    pub required_claims: Option<Vec<String>>,
    /// The claim naming the caller (default `sub`; a dotted path reaches nested claims).
    pub client_id_claim: Option<String>,
    /// The plan of its tokens, unless `plan_claim` maps them to another.
    pub plan: String,
    pub plan_claim: Option<String>,
    /// `plan_claim` value → plan name.
    pub plans: Option<BTreeMap<String, String>>,
    /// The claim naming the caller's groups (a list of strings, or one string of names
    /// separated by spaces or commas): what routes' `allow_groups` / `deny_groups` name.
    pub groups_claim: Option<String>,
}

/// One way a route identifies callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMethodFile {
    ApiKey,
    Jwt,
    ClientCert,
}

/// A route's `auth`: `"none"`, one method, or a list of methods any one of which identifies
/// the caller (`["api_key", "jwt"]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFile {
    None,
    Methods(Vec<AuthMethodFile>),
}

const AUTH_SHAPE: &str =
    "\"none\", \"api_key\", \"jwt\", \"client_cert\", or a list of the last three";

impl<'de> Deserialize<'de> for AuthFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<AuthFile, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AuthFile;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(AUTH_SHAPE)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AuthFile, E> {
                if v == "none" {
                    return Ok(AuthFile::None);
                }
                method(v).map(|m| AuthFile::Methods(vec![m]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AuthFile, A::Error> {
                let mut out = Vec::new();
                while let Some(text) = seq.next_element::<String>()? {
                    out.push(method(&text)?);
                }
                Ok(AuthFile::Methods(out))
            }
        }
        deserializer.deserialize_any(V)
    }
}

fn method<E: de::Error>(text: &str) -> Result<AuthMethodFile, E> {
    match text {
        "api_key" => Ok(AuthMethodFile::ApiKey),
        "jwt" => Ok(AuthMethodFile::Jwt),
        "client_cert" => Ok(AuthMethodFile::ClientCert),
        other => Err(E::custom(format_args!(
            "unknown auth {other:?}: expected {AUTH_SHAPE}"
        ))),
    }
}

/// Whether the TLS listener asks for client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientCertModeFile {
    /// Asked for; a connection without one is accepted (routes decide).
    Optional,
    /// A connection without a certificate from the CA fails its handshake.
    Required,
}

/// Which name of a client certificate identifies its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientIdentityFile {
    /// The first URI subject alternative name (SPIFFE), else the first DNS one.
    San,
    /// The subject's common name.
    Subject,
}

/// `[registry]`: API clients managed at runtime through the admin API — in the shared store
/// (Redis), or in `server.clients_file` with the memory store.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryFile {
    /// How often every instance asks whether the registry changed (default "1s").
    pub poll: Option<HumanDuration>,
    /// How often every instance reads the whole registry whatever (default "60s").
    pub resync: Option<HumanDuration>,
    /// Bound on one registry call (default "2s").
    pub timeout: Option<HumanDuration>,
    /// What issued keys start with (default "tsk_").
    pub key_prefix: Option<String>,
    pub max_clients: Option<usize>,
    pub max_keys_per_client: Option<usize>,
}

/// One entry of a route's `exempt`: callers from these addresses, or identified as these
/// clients, skip these limits (all of the route's, the plan's and the per-IP one by default).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExemptFile {
    #[serde(default)]
    pub ips: Vec<String>,
    #[serde(default)]
    pub clients: Vec<String>,
    pub limits: Option<Vec<String>>,
}
