//! `[issuers.NAME]`: who signs the tokens routes accept, where their keys come from, which
//! algorithms, audiences and claims a token needs, and how claims choose a plan.

use super::checks::*;
use crate::chain::jwt::claims::ClaimPath;
use crate::chain::jwt::keys::KeySet;
use crate::chain::jwt::source::JwksSettings;
use crate::control::config::defaults;
use crate::control::config::file::IssuerFile;
use crate::control::config::model::{IssuerConfig, IssuerKeys, PlanConfig};
use crate::control::config::view::redact_url;
use jsonwebtoken::{Algorithm, AlgorithmFamily};
use std::collections::BTreeMap;

pub(super) fn issuer_config(
    name: &str,
    file: IssuerFile,
    plans: &BTreeMap<String, PlanConfig>,
    problems: &mut Problems,
) -> Option<IssuerConfig> {
    let IssuerFile {
        issuer,
        audiences,
        algorithms,
        jwks_url,
        jwks_ca_file,
        jwks_refresh,
        jwks_min_refresh,
        jwks_timeout,
        keys,
        secret: hmac,
        leeway,
        required_claims,
        client_id_claim,
        plan,
        plan_claim,
        plans: plan_map,
        groups_claim,
    } = file;
    let base = format!("issuers.{name}");
    let errors = problems.errors.len();
    check_name(&base, name, problems);
    if issuer.is_empty() {
        problems.push(
            format!("{base}.issuer"),
            "the `iss` its tokens carry, not empty",
        );
    }
    if audiences.is_empty() || audiences.iter().any(String::is_empty) {
        problems.push(
            format!("{base}.audiences"),
            "at least one audience (a token minted for another API of the same provider must not pass here)",
        );
    }
    let jwks_only = [
        ("jwks_ca_file", jwks_ca_file.is_some()),
        ("jwks_refresh", jwks_refresh.is_some()),
        ("jwks_min_refresh", jwks_min_refresh.is_some()),
        ("jwks_timeout", jwks_timeout.is_some()),
    ];
    let fetched = jwks_url.is_some();
    let keys = match (jwks_url, keys, hmac) {
        (Some(url), None, None) => jwks(
            &base,
            url,
            jwks_ca_file,
            [jwks_refresh, jwks_min_refresh, jwks_timeout],
            problems,
        ),
        (None, Some(source), None) => {
            let path = format!("{base}.keys");
            secret(&path, &source, problems).and_then(|text| {
                KeySet::parse(text.expose().as_bytes())
                    .map_err(|why| problems.push(&path, why))
                    .ok()
                    .map(|_| IssuerKeys::Fixed(text))
            })
        }
        (None, None, Some(source)) => {
            let path = format!("{base}.secret");
            secret(&path, &source, problems).and_then(|text| {
                KeySet::secret(text.expose().as_bytes())
                    .map_err(|why| problems.push(&path, why))
                    .ok()
                    .map(|_| IssuerKeys::Hmac(text))
            })
        }
        _ => {
            problems.push(
                base.clone(),
                "exactly one of jwks_url, keys (public keys) or secret (HMAC)",
            );
            None
        }
    };
    if !fetched {
        for (key, _) in jwks_only.iter().filter(|(_, given)| *given) {
            problems.push(format!("{base}.{key}"), "only with jwks_url");
        }
    }
    let hmac_keys = matches!(keys, Some(IssuerKeys::Hmac(_)));
    let algorithms = match algorithms {
        None if hmac_keys => vec![Algorithm::HS256],
        None => vec![Algorithm::RS256],
        Some(list) => {
            let path = format!("{base}.algorithms");
            if list.is_empty() {
                problems.push(&path, "at least one algorithm");
            }
            list.iter()
                .enumerate()
                .filter_map(|(i, text)| {
                    let at = format!("{path}[{i}]");
                    if text.eq_ignore_ascii_case("none") {
                        problems.push(at, "unsigned tokens (alg none) are never accepted");
                        return None;
                    }
                    let alg: Algorithm = text
                        .parse()
                        .map_err(|_| {
                            problems.push(&at, format!("{text:?}: expected one of RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, HS256, HS384, HS512"))
                        })
                        .ok()?;
                    let hmac_alg = alg.family() == AlgorithmFamily::Hmac;
                    if keys.is_some() && hmac_alg != hmac_keys {
                        problems.push(
                            at,
                            if hmac_keys {
                                format!("{text}: an HMAC secret verifies HS256/384/512 only")
                            } else {
                                format!("{text}: HMAC algorithms need `secret` (a public key is never used as an HMAC secret)")
                            },
                        );
                        return None;
                    }
                    Some(alg)
                })
                .collect()
        }
    };
    let claim = |key: &str, text: &str, problems: &mut Problems| {
        ClaimPath::parse(text)
            .map_err(|why| problems.push(format!("{base}.{key}"), why))
            .ok()
    };
    let required: Vec<ClaimPath> = required_claims
        .unwrap_or_default()
        .iter()
        .filter_map(|c| claim("required_claims", c, problems))
        .collect();
    let client_id_claim = claim(
        "client_id_claim",
        client_id_claim.as_deref().unwrap_or("sub"),
        problems,
    );
    let plan_claim = plan_claim.and_then(|c| claim("plan_claim", &c, problems));
    let groups_claim = groups_claim.and_then(|c| claim("groups_claim", &c, problems));
    let known = |p: &str| plans.contains_key(p);
    if !known(&plan) {
        problems.push(format!("{base}.plan"), unknown_plan(&plan, plans));
    }
    let plan_map = plan_map.unwrap_or_default();
    for (value, p) in &plan_map {
        if !known(p) {
            problems.push(format!("{base}.plans.{value}"), unknown_plan(p, plans));
        }
    }
    if plan_claim.is_none() && !plan_map.is_empty() {
        problems.push(
            format!("{base}.plans"),
            "needs plan_claim: the claim whose value picks the plan",
        );
    }
    let leeway = leeway.map_or(defaults::JWT_LEEWAY, |l| l.0);
    if leeway > defaults::MAX_JWT_LEEWAY {
        problems.push(format!("{base}.leeway"), "at most 5m");
    }
    if problems.errors.len() > errors {
        return None;
    }
    Some(IssuerConfig {
        name: name.to_owned(),
        issuer,
        audiences,
        algorithms,
        keys: keys?,
        leeway,
        required,
        client_id_claim: client_id_claim?,
        plan,
        plan_claim,
        plans: plan_map,
        groups_claim,
    })
}

fn unknown_plan(plan: &str, plans: &BTreeMap<String, PlanConfig>) -> String {
    let known: Vec<&str> = plans.keys().map(String::as_str).collect();
    format!(
        "unknown plan {plan:?}: define [plans.{plan}] or use one of [{}]",
        known.join(", ")
    )
}

fn jwks(
    base: &str,
    url: String,
    ca_file: Option<String>,
    [refresh, min_refresh, timeout]: [Option<crate::control::config::units::HumanDuration>; 3],
    problems: &mut Problems,
) -> Option<IssuerKeys> {
    let path = format!("{base}.jwks_url");
    match url::Url::parse(&url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
        _ => {
            problems.push(
                &path,
                format!("{}: expected an http(s) URL", redact_url(&url)),
            );
            return None;
        }
    }
    let ca_pem = ca_file.and_then(|file| {
        let at = format!("{base}.jwks_ca_file");
        problems.files.push(file.clone().into());
        std::fs::read(&file)
            .map_err(|e| problems.push(at, format!("cannot read {file}: {}", e.kind())))
            .ok()
    });
    let refresh = positive(
        format!("{base}.jwks_refresh"),
        refresh,
        defaults::JWKS_REFRESH,
        problems,
    );
    let min_refresh = positive(
        format!("{base}.jwks_min_refresh"),
        min_refresh,
        defaults::JWKS_MIN_REFRESH,
        problems,
    );
    let timeout = positive(
        format!("{base}.jwks_timeout"),
        timeout,
        defaults::JWKS_TIMEOUT,
        problems,
    );
    Some(IssuerKeys::Jwks(JwksSettings {
        shown_url: redact_url(&url),
        url,
        ca_pem,
        refresh,
        min_refresh,
        timeout,
    }))
}
