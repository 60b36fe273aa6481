//! The snapshot's identity parts, built from a `Config`: the issuers of bearer tokens (each
//! keeping its fetched keys across reloads while its keys' settings are unchanged), the
//! verified-token cache, the claims routes read, and who a client certificate makes a caller.

use crate::chain::auth::Plan;
use crate::chain::cert::ClientIdentity;
use crate::chain::jwt::cache::TokenCache;
use crate::chain::jwt::claims::ClaimPath;
use crate::chain::jwt::issuer::{Issuer, TokenIdentity};
use crate::chain::jwt::keys::KeySet;
use crate::chain::jwt::source::KeySource;
use crate::chain::jwt::verify::IssuerRules;
use crate::chain::partition::KeyPart;
use crate::control::config::{Config, ConfigError, IssuerConfig, IssuerKeys, Problem};
use crate::ops::metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct Identity {
    pub issuers: BTreeMap<String, Arc<Issuer>>,
    pub tokens: Arc<TokenCache<TokenIdentity>>,
    /// Every claim a route reads (`jwt:` key parts, `forward_claims`).
    pub used_claims: Vec<ClaimPath>,
    /// Callers identified by a client certificate: their plan and which name identifies them.
    pub cert: Option<(Arc<Plan>, ClientIdentity)>,
}

impl Identity {
    pub fn build(
        config: &Config,
        plans: &BTreeMap<String, Arc<Plan>>,
        previous: Option<(&Config, &Identity)>,
        metrics: &Metrics,
    ) -> Result<Identity, ConfigError> {
        let mut issuers = BTreeMap::new();
        for (name, cfg) in &config.issuers {
            let kept = previous.and_then(|(old_config, old)| {
                let same = old_config
                    .issuers
                    .get(name)
                    .is_some_and(|o| o.keys == cfg.keys);
                same.then(|| old.issuers.get(name).map(|i| Arc::clone(&i.source)))
                    .flatten()
            });
            let source = match kept {
                Some(source) => source,
                None => Arc::new(key_source(cfg, metrics)?),
            };
            issuers.insert(
                name.clone(),
                Arc::new(Issuer {
                    rules: rules(cfg, plans),
                    source,
                }),
            );
        }
        let tokens = match previous {
            Some((_, old)) if old.tokens.max() == config.server.max_cached_tokens => {
                Arc::clone(&old.tokens)
            }
            _ => Arc::new(TokenCache::new(config.server.max_cached_tokens)),
        };
        let mut used_claims: Vec<ClaimPath> = Vec::new();
        for route in &config.routes {
            let parts = route
                .limits
                .iter()
                .flat_map(|l| &l.key)
                .filter_map(|p| match p {
                    KeyPart::Claim(c) => Some(c),
                    _ => None,
                });
            for claim in parts.chain(route.forward_claims.iter().map(|(_, c)| c)) {
                if !used_claims.contains(claim) {
                    used_claims.push(claim.clone());
                }
            }
        }
        let cert = config
            .server
            .tls
            .as_ref()
            .and_then(|t| t.client_auth.as_ref())
            .and_then(|c| c.plan.as_ref().map(|p| (Arc::clone(&plans[p]), c.identity)));
        Ok(Identity {
            issuers,
            tokens,
            used_claims,
            cert,
        })
    }
}

fn rules(cfg: &IssuerConfig, plans: &BTreeMap<String, Arc<Plan>>) -> IssuerRules {
    IssuerRules {
        name: Arc::from(cfg.name.as_str()),
        issuer: cfg.issuer.clone(),
        audiences: cfg.audiences.clone(),
        algorithms: cfg.algorithms.clone(),
        leeway: cfg.leeway.as_secs(),
        required: cfg.required.clone(),
        client_id_claim: cfg.client_id_claim.clone(),
        plan_claim: cfg.plan_claim.clone(),
        groups_claim: cfg.groups_claim.clone(),
        plans: cfg
            .plans
            .iter()
            .map(|(value, plan)| (value.clone(), Arc::clone(&plans[plan])))
            .collect(),
        default_plan: Arc::clone(&plans[&cfg.plan]),
    }
}

fn key_source(cfg: &IssuerConfig, metrics: &Metrics) -> Result<KeySource, ConfigError> {
    let counters = metrics.key_source(&cfg.name);
    let fixed = |keys: Result<KeySet, String>, field: &str| {
        keys.map(|k| KeySource::fixed(k, counters.clone()))
            .map_err(|message| {
                ConfigError::Invalid(vec![Problem {
                    path: format!("issuers.{}.{field}", cfg.name),
                    message,
                    location: None,
                }])
            })
    };
    match &cfg.keys {
        IssuerKeys::Jwks(settings) => Ok(KeySource::url(&cfg.name, settings.clone(), counters)),
        IssuerKeys::Fixed(text) => fixed(KeySet::parse(text.expose().as_bytes()), "keys"),
        IssuerKeys::Hmac(secret) => fixed(KeySet::secret(secret.expose().as_bytes()), "secret"),
    }
}
