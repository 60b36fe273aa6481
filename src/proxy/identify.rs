//! [4] Who the caller is, from the session: its credential (`chain::credential`) checked the
//! way its kind is checked — an API key against the key ring, a bearer token by its issuer
//! (`chain::jwt`), a client certificate as the TLS listener verified it. Nothing of the
//! limiter is touched for a request that is not identified.

use crate::chain::auth::{self, ApiKeyError, Auth, Client};
use crate::chain::cert::PeerCert;
use crate::chain::credential::TokenFrom;
use crate::chain::credential::{credential, Credential, CredentialError};
use crate::chain::jwt::issuer::{authenticate, Checked, Issuer, TokenCheck};
use crate::chain::reject::Reject;
use crate::clock::{Clock, MonotonicClock};
use crate::control::snapshot::{IpTableId, Route};
use crate::limit::ip::{IpKey, IpLimiter};
use crate::proxy::context::RequestCtx;
use pingora::proxy::Session;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// How a caller may be identified: a route's methods, where its tokens are, whose tokens.
pub struct Accepted<'a> {
    pub auth: Auth,
    pub token_from: &'a TokenFrom,
    pub issuers: &'a [Arc<Issuer>],
    /// The caller's grouped address (failed token checks are counted by it).
    pub ip: Option<IpKey>,
}

impl<'a> Accepted<'a> {
    pub fn of(route: &'a Route) -> Accepted<'a> {
        Accepted {
            auth: route.config.auth,
            token_from: &route.config.token_from,
            issuers: &route.issuers,
            ip: None,
        }
    }
}

/// Sets `ctx.client` (and the token or certificate it came from), or the rejection.
pub async fn identify(
    session: &Session,
    ctx: &mut RequestCtx,
    accepted: &Accepted<'_>,
) -> Result<(), Reject> {
    let snapshot = Arc::clone(&ctx.snapshot);
    let auth = accepted.auth;
    let headers = &session.req_header().headers;
    if auth == Auth::API_KEY {
        let client =
            auth::authenticate(headers, |key| snapshot.lookup_key(key)).map_err(Reject::Key)?;
        ctx.client = Some(client);
        return Ok(());
    }
    if auth.client_cert && ctx.cert.is_none() {
        ctx.cert = peer_cert(session);
    }
    let found = credential(auth, accepted.token_from, headers, ctx.cert.is_some())
        .map_err(Reject::Credential)?;
    match found {
        Credential::ApiKey(key) => {
            let client = snapshot
                .lookup_key(key)
                .ok_or(Reject::Key(ApiKeyError::Unknown))?;
            ctx.client = Some(client);
        }
        Credential::Token(token) => {
            // An address whose tokens failed their checks too often gets no more verified
            // for a while; each failure that cost a verification counts.
            let failures = match (
                snapshot.ip_tables.get(&IpTableId::TokenFailures),
                accepted.ip,
            ) {
                (Some(table), Some(ip)) => Some((&table.limiter, ip)),
                _ => None,
            };
            let may_verify = failures.map(|(limiter, ip): (&Arc<IpLimiter>, IpKey)| {
                move || limiter.peek(ip, MonotonicClock.now_ms()).allowed
            });
            let check = TokenCheck {
                issuers: accepted.issuers,
                cache: &snapshot.identity.tokens,
                hasher: &snapshot.hasher,
                used_claims: &snapshot.identity.used_claims,
                may_verify: may_verify.as_ref().map(|f| f as &(dyn Fn() -> bool + Sync)),
            };
            let checked = authenticate(&check, token, unix_now()).await;
            let metrics = &snapshot.metrics;
            let (identity, how) = checked
                .inspect_err(|e| {
                    metrics.token_checked(e.reason());
                    if let (Some((limiter, ip)), true) = (failures, e.was_verified()) {
                        limiter.check(ip, MonotonicClock.now_ms());
                    }
                })
                .map_err(Reject::Token)?;
            metrics.token_checked(match how {
                Checked::Cached => "cached",
                Checked::Verified => "verified",
            });
            ctx.client = Some(Arc::clone(&identity.client));
            ctx.caller = Some(identity.subject.clone());
            ctx.token = Some(identity);
        }
        Credential::Certificate => {
            let (plan, which) = snapshot
                .identity
                .cert
                .clone()
                .expect("routes with client_cert auth have a certificate plan (checked)");
            let name = ctx
                .cert
                .as_ref()
                .and_then(|c| c.name(which))
                .ok_or(Reject::Credential(CredentialError::UnnamedCertificate))?;
            let id = format!(
                "cert:{}",
                snapshot.hasher.name("cert client", name.as_bytes())
            );
            ctx.caller = Some(name.to_owned());
            ctx.client = Some(Arc::new(Client {
                id: id.into(),
                plan,
                groups: Vec::new(),
            }));
        }
    }
    Ok(())
}

/// The connection's verified client certificate, as the TLS listener read it.
pub fn peer_cert(session: &Session) -> Option<PeerCert> {
    session
        .digest()?
        .ssl_digest
        .as_ref()?
        .extension
        .get::<PeerCert>()
        .cloned()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}
