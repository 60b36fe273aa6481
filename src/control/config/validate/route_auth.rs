//! A route's `auth` and what comes with bearer tokens: the issuers it accepts, where the token
//! is, whether it reaches the upstream, and the claims forwarded as headers.

use super::checks::*;
use crate::chain::auth::Auth;
use crate::chain::credential::TokenFrom;
use crate::chain::jwt::claims::ClaimPath;
use crate::control::config::file::{AuthFile, AuthMethodFile, ExemptFile};
use crate::control::config::model::{ExemptRule, IssuerConfig, ServerConfig};
use std::collections::BTreeMap;

/// Headers a claim may not be forwarded as: those of the message itself, the credentials,
/// and the ones the gateway sets.
const NOT_FORWARDABLE: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "expect",
    "authorization",
    "cookie",
    crate::chain::forward::CLIENT_ID_HEADER,
    crate::chain::forward::X_FORWARDED_FOR_HEADER,
    crate::chain::request_id::HEADER,
    crate::chain::auth::API_KEY_HEADER,
];

pub(super) fn route_auth(
    base: &str,
    auth: Option<AuthFile>,
    server: &ServerConfig,
    problems: &mut Problems,
) -> Auth {
    let path = format!("{base}.auth");
    let methods = match auth {
        None | Some(AuthFile::None) => return Auth::NONE,
        Some(AuthFile::Methods(methods)) => methods,
    };
    if methods.is_empty() {
        problems.push(&path, "an empty list: write \"none\" for a public route");
    }
    let mut auth = Auth::NONE;
    for (i, m) in methods.iter().enumerate() {
        let seen = match m {
            AuthMethodFile::ApiKey => std::mem::replace(&mut auth.api_key, true),
            AuthMethodFile::Jwt => std::mem::replace(&mut auth.jwt, true),
            AuthMethodFile::ClientCert => std::mem::replace(&mut auth.client_cert, true),
        };
        if seen {
            problems.push(format!("{path}[{i}]"), "listed twice");
        }
    }
    if auth.client_cert {
        match server.tls.as_ref().and_then(|t| t.client_auth.as_ref()) {
            None => problems.push(
                &path,
                "\"client_cert\" needs [server.tls] with client_certificates and client_ca_file",
            ),
            Some(c) if c.plan.is_none() => problems.push(
                &path,
                "\"client_cert\" needs server.tls.client_plan: the plan of callers identified by a certificate",
            ),
            Some(_) => {}
        }
    }
    auth
}

/// The serde fields of a route that only mean something with bearer tokens.
pub(super) struct RouteTokenFiles {
    pub issuers: Option<Vec<String>>,
    pub token_from: Option<String>,
    pub forward_token: Option<bool>,
    pub forward_claims: Option<BTreeMap<String, String>>,
}

pub(super) struct RouteTokens {
    pub issuers: Vec<String>,
    pub token_from: TokenFrom,
    pub forward_token: bool,
    pub forward_claims: Vec<(http::HeaderName, ClaimPath)>,
}

pub(super) fn route_tokens(
    base: &str,
    auth: Auth,
    files: RouteTokenFiles,
    issuers: &BTreeMap<String, IssuerConfig>,
    problems: &mut Problems,
) -> RouteTokens {
    let RouteTokenFiles {
        issuers: named,
        token_from,
        forward_token,
        forward_claims,
    } = files;
    if !auth.jwt {
        for (key, given) in [
            ("issuers", named.is_some()),
            ("token_from", token_from.is_some()),
            ("forward_token", forward_token.is_some()),
            ("forward_claims", forward_claims.is_some()),
        ] {
            if given {
                problems.push(format!("{base}.{key}"), "only with auth including \"jwt\"");
            }
        }
        return RouteTokens {
            issuers: Vec::new(),
            token_from: TokenFrom::Authorization,
            forward_token: false,
            forward_claims: Vec::new(),
        };
    }
    let accepted: Vec<String> = match named {
        Some(list) => {
            if list.is_empty() {
                problems.push(format!("{base}.issuers"), "at least one issuer");
            }
            for (i, name) in list.iter().enumerate() {
                if !issuers.contains_key(name) {
                    let known: Vec<&str> = issuers.keys().map(String::as_str).collect();
                    problems.push(
                        format!("{base}.issuers[{i}]"),
                        format!(
                            "unknown issuer {name:?}: define [issuers.{name}] or use one of [{}]",
                            known.join(", ")
                        ),
                    );
                }
            }
            list
        }
        None => issuers.keys().cloned().collect(),
    };
    if accepted.is_empty() && issuers.is_empty() {
        problems.push(
            format!("{base}.auth"),
            "\"jwt\" needs at least one [issuers.NAME]: who signs the tokens",
        );
    }
    let by_iss: BTreeMap<&str, &str> = accepted
        .iter()
        .filter_map(|n| issuers.get(n).map(|i| (i.issuer.as_str(), n.as_str())))
        .collect();
    if by_iss.len() < accepted.len() && accepted.iter().all(|n| issuers.contains_key(n)) {
        problems.push(
            format!("{base}.issuers"),
            "two accepted issuers have the same `issuer`: a token's iss must name one",
        );
    }
    let token_from = match token_from {
        None => TokenFrom::Authorization,
        Some(text) => TokenFrom::parse(&text).unwrap_or_else(|why| {
            problems.push(format!("{base}.token_from"), why);
            TokenFrom::Authorization
        }),
    };
    let mut forwarded = Vec::new();
    for (header, claim) in forward_claims.unwrap_or_default() {
        let at = format!("{base}.forward_claims.{header}");
        let name = match http::HeaderName::from_bytes(header.as_bytes()) {
            Ok(name) if NOT_FORWARDABLE.contains(&name.as_str()) => {
                problems.push(&at, "a header the gateway or the message itself decides");
                continue;
            }
            Ok(name) => name,
            Err(_) => {
                problems.push(&at, format!("{header:?} is not a header name"));
                continue;
            }
        };
        if let TokenFrom::Header(from) = &token_from {
            if *from == name {
                problems.push(&at, "the header the token is read from");
                continue;
            }
        }
        match ClaimPath::parse(&claim) {
            Ok(path) => forwarded.push((name, path)),
            Err(why) => problems.push(&at, why),
        }
    }
    RouteTokens {
        issuers: accepted,
        token_from,
        forward_token: forward_token.unwrap_or(true),
        forward_claims: forwarded,
    }
}

/// A route's `exempt`: addresses or networks, client ids, and the limit names they skip
/// (checked against the route's and the plans' limits by `check_exemptions`).
pub(super) fn exempt_rules(
    base: &str,
    files: Vec<ExemptFile>,
    problems: &mut Problems,
) -> Vec<ExemptRule> {
    files
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            let at = format!("{base}.exempt[{i}]");
            if f.ips.is_empty() && f.clients.is_empty() {
                problems.push(&at, "say who: ips, clients, or both");
            }
            let nets = f
                .ips
                .iter()
                .enumerate()
                .filter_map(|(j, text)| {
                    text.parse::<ipnet::IpNet>()
                        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                        .map_err(|_| {
                            problems.push(
                                format!("{at}.ips[{j}]"),
                                format!(
                                    "{text:?}: expected an address or a CIDR like \"10.0.0.0/8\""
                                ),
                            )
                        })
                        .ok()
                })
                .collect();
            for (j, id) in f.clients.iter().enumerate() {
                check_name(&format!("{at}.clients[{j}]"), id, problems);
            }
            if f.limits.as_ref().is_some_and(Vec::is_empty) {
                problems.push(
                    format!("{at}.limits"),
                    "an empty list skips nothing: leave it out to skip every limit",
                );
            }
            ExemptRule {
                nets,
                clients: f.clients,
                limits: f.limits,
            }
        })
        .collect()
}
