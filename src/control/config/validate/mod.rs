//! Serde mirror → typed [`Config`], one file per TOML table: defaults applied, values
//! checked, cross-references resolved. Every field of the mirror is destructured, so adding
//! a field to `file.rs` does not compile until it is handled here. All problems are
//! collected, not just the first.

mod access_log;
mod addresses;
mod admin;
mod answers;
mod callers;
mod checks;
mod clients;
mod cors;
mod header_rules;
mod issuers;
mod plans;
mod registry;
mod retry;
mod route_auth;
mod route_plans;
mod routes;
mod server;
mod shedding;
mod store;
mod tracing;
mod upstreams;

pub use checks::MAX_NAME_LEN;

use self::access_log::*;
use self::admin::*;
use self::checks::*;
use self::clients::*;
use self::issuers::*;
use self::plans::*;
use self::route_plans::*;
use self::routes::*;
use self::server::*;
use self::store::*;
use self::upstreams::*;
use crate::control::config::error::Problem;
use crate::control::config::file::FileConfig;
use crate::control::config::model::{
    Config, IssuerConfig, PlanConfig, RouteConfig, StoreConfig, UpstreamConfig,
};
use std::collections::BTreeMap;

impl TryFrom<FileConfig> for Config {
    type Error = Vec<Problem>;

    fn try_from(file: FileConfig) -> Result<Config, Vec<Problem>> {
        let FileConfig {
            server,
            admin,
            access_log,
            upstreams,
            routes,
            store,
            plans,
            clients,
            issuers,
            registry,
            tracing,
        } = file;
        let mut server = server;
        let clients_file = server.clients_file.take();
        let clients_file_path = clients_file.clone();
        let mut problems = Problems::default();
        let server = server_config(server, &mut problems);
        let admin = admin_config(admin, &mut problems);
        let access_log = access_log_config(access_log, &mut problems);
        let store = store_config(store, &mut problems);
        let registry = registry.map(|r| {
            registry::registry_config(r, &store, clients_file_path.as_deref(), &mut problems)
        });
        let tracing = tracing::tracing_config(tracing, &mut problems);
        let plans: BTreeMap<String, PlanConfig> = plans
            .into_iter()
            .map(|(name, plan)| {
                let cfg = plan_config(&name, plan, &mut problems);
                (name, cfg)
            })
            .collect();
        let mut entries: Vec<(String, _)> = clients
            .into_iter()
            .enumerate()
            .map(|(i, c)| (format!("clients[{i}]"), c))
            .collect();
        entries.extend(clients_from_file(
            clients_file,
            registry.is_some(),
            &mut problems,
        ));
        let clients = clients_config(entries, &plans, &mut problems);
        let issuers: BTreeMap<String, IssuerConfig> = issuers
            .into_iter()
            .filter_map(|(name, issuer)| {
                issuer_config(&name, issuer, &plans, &mut problems).map(|cfg| (name, cfg))
            })
            .collect();
        if let Some(plan) = server
            .tls
            .as_ref()
            .and_then(|t| t.client_auth.as_ref())
            .and_then(|c| c.plan.as_ref())
        {
            if !plans.contains_key(plan) {
                problems.push(
                    "server.tls.client_plan",
                    format!("unknown plan {plan:?}: define [plans.{plan}]"),
                );
            }
        }
        let upstreams: BTreeMap<String, UpstreamConfig> = upstreams
            .into_iter()
            .map(|(name, up)| {
                let cfg = upstream_config(&name, up, &mut problems);
                (name, cfg)
            })
            .collect();
        if routes.is_empty() {
            problems.push("routes", "at least one [[routes]] entry is required");
        }
        let routes: Vec<RouteConfig> = routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| route_config(i, r, &upstreams, &server, &issuers, &mut problems))
            .collect();
        if server.key_hash_secret.is_none()
            && matches!(store, StoreConfig::Redis(..))
            && routes
                .iter()
                .any(|r| !r.limits.is_empty() || r.auth.jwt || r.auth.client_cert)
        {
            // An error, not a warning: one instance without it (or with another) names other
            // keys, splitting every keyed limit across the fleet.
            problems.push(
                "server.key_hash_secret",
                "required with a shared store and keyed limits or token / certificate auth: set the same secret on every instance (with another one, or none, an instance counts every keyed limit and every token's client apart)",
            );
        }
        check_route_overlaps(&routes, &mut problems);
        check_exemptions(&routes, &plans, &mut problems);
        check_costs(&routes, &plans, &mut problems);
        let registered = registry.is_some();
        callers::check_callers(&routes, &plans, &clients, registered, &mut problems);
        if problems.errors.is_empty() {
            Ok(Config {
                server,
                admin,
                access_log,
                upstreams,
                routes,
                store,
                plans,
                clients,
                issuers,
                registry,
                clients_file: clients_file_path.map(Into::into),
                tracing,
                files: problems.files,
                warnings: problems.warnings,
            })
        } else {
            Err(problems.errors)
        }
    }
}
