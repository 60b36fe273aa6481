//! A route's `allow_clients` / `deny_clients` / `allow_plans` / `deny_plans` /
//! `allow_groups` / `deny_groups`: only on routes that identify their callers, no empty allow
//! list, no name both allowed and denied, every plan defined, every group one a client of
//! the file is in (a warning with a registry, which may add it; so is an unknown client id).

use super::checks::Problems;
use crate::chain::auth::Auth;
use crate::chain::callers::{CallerRules, Names};
use crate::control::config::model::{ClientConfig, PlanConfig, RouteConfig};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The four lists as written in the file.
pub(super) struct CallerFiles {
    pub allow_clients: Option<Vec<String>>,
    pub deny_clients: Option<Vec<String>>,
    pub allow_plans: Option<Vec<String>>,
    pub deny_plans: Option<Vec<String>>,
    pub allow_groups: Option<Vec<String>>,
    pub deny_groups: Option<Vec<String>>,
}

pub(super) fn caller_rules(
    base: &str,
    auth: Auth,
    files: CallerFiles,
    problems: &mut Problems,
) -> Option<Arc<CallerRules>> {
    let mut list = |key: &str, names: Option<Vec<String>>| {
        if names.as_ref().is_some_and(Vec::is_empty) && key.starts_with("allow") {
            problems.push(
                format!("{base}.{key}"),
                "an empty allow list lets no client in: remove the key to let every client in",
            );
        }
        Names::new(names.unwrap_or_default())
    };
    let rules = CallerRules {
        allow_clients: list("allow_clients", files.allow_clients),
        deny_clients: list("deny_clients", files.deny_clients),
        allow_plans: list("allow_plans", files.allow_plans),
        deny_plans: list("deny_plans", files.deny_plans),
        allow_groups: list("allow_groups", files.allow_groups),
        deny_groups: list("deny_groups", files.deny_groups),
    };
    if rules.is_empty() {
        return None;
    }
    if !auth.identifies() {
        problems.push(
            format!("{base}.auth"),
            "allow_clients, deny_clients, allow_plans, deny_plans, allow_groups and deny_groups need callers identified: set auth (api_key, jwt or client_cert)",
        );
    }
    for (kind, allow, deny) in [
        ("clients", &rules.allow_clients, &rules.deny_clients),
        ("plans", &rules.allow_plans, &rules.deny_plans),
        ("groups", &rules.allow_groups, &rules.deny_groups),
    ] {
        for name in allow.iter().filter(|n| deny.contains(n)) {
            problems.push(
                format!("{base}.deny_{kind}"),
                format!("{name:?} is in allow_{kind} too: it would be refused"),
            );
        }
    }
    Some(Arc::new(rules))
}

/// Plans the routes name exist; client ids not in the file are warned about where no
/// registry can add them (on API-key routes: a token's subject is in no file).
pub(super) fn check_callers(
    routes: &[RouteConfig],
    plans: &BTreeMap<String, PlanConfig>,
    clients: &[ClientConfig],
    registry: bool,
    problems: &mut Problems,
) {
    for (i, route) in routes.iter().enumerate() {
        let Some(rules) = &route.callers else {
            continue;
        };
        for (key, names) in [
            ("allow_plans", &rules.allow_plans),
            ("deny_plans", &rules.deny_plans),
        ] {
            for plan in names.iter().filter(|p| !plans.contains_key(*p)) {
                problems.push(
                    format!("routes[{i}].{key}"),
                    format!("unknown plan {plan:?}: define [plans.{plan}]"),
                );
            }
        }
        // A group no client of the file is in: an error, unless the registry or a token's
        // `groups_claim` can name it.
        for (key, names) in [
            ("allow_groups", &rules.allow_groups),
            ("deny_groups", &rules.deny_groups),
        ] {
            for group in names
                .iter()
                .filter(|g| !clients.iter().any(|c| c.groups.iter().any(|cg| cg == *g)))
            {
                let message = format!("unknown group {group:?}: no client in [[clients]] is in it");
                match registry || route.auth.jwt {
                    true => problems.warn(format!("routes[{i}].{key}"), message),
                    false => problems.push(format!("routes[{i}].{key}"), message),
                }
            }
        }
        // A token's subject or a certificate's name is no `[[clients]]` id.
        if registry || route.auth.jwt || route.auth.client_cert {
            continue;
        }
        for (key, names) in [
            ("allow_clients", &rules.allow_clients),
            ("deny_clients", &rules.deny_clients),
        ] {
            for id in names
                .iter()
                .filter(|id| !clients.iter().any(|c| c.id == *id))
            {
                problems.warn(
                    format!("routes[{i}].{key}"),
                    format!("no client {id:?} in [[clients]] (and no registry to add it)"),
                );
            }
        }
    }
}
