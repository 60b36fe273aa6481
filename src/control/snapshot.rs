//! Everything a request needs, built from one validated [`Config`]. The live snapshot sits in
//! an `ArcSwap`; each request loads it once, at the start, and uses that one value until it
//! ends, so a reload in the middle of a request never mixes two configurations.
//!
//! Stateful parts are reused from the previous snapshot when their definition did not change
//! (upstream pools with their health state, per-IP tables with their buckets, the store with
//! its counters), so rebuilding a snapshot does not reset them.

use crate::chain::auth::{Client, KeyRing, Plan};
use crate::chain::router::Router;
use crate::control::config::{
    Config, ConfigError, IpLimitChoice, IpLimitConfig, RouteConfig, StoreConfig,
};
use crate::control::upstream::Pool;
use crate::limit::ip::IpLimiter;
use crate::limit::store::Store;
use crate::limit::{Policy, Scope};
use crate::ops::metrics::{Metrics, RouteMetrics};
use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::sync::Arc;

pub type SnapshotHandle = Arc<ArcSwap<Snapshot>>;

/// Which per-IP table a route uses: the shared server default, or its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum IpTableId {
    ServerDefault,
    Route(String),
}

pub struct IpTable {
    pub config: IpLimitConfig,
    pub max_tracked: usize,
    pub limiter: Arc<IpLimiter>,
}

pub struct Snapshot {
    pub config: Arc<Config>,
    pub router: Router,
    /// Same order as `config.routes` (the router returns indexes into this).
    pub routes: Vec<Route>,
    pub pools: BTreeMap<String, Arc<Pool>>,
    pub ip_tables: BTreeMap<IpTableId, IpTable>,
    pub keys: KeyRing,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    /// Counters of requests no route matched.
    pub unrouted: RouteMetrics,
}

/// Label used for requests that matched no route.
pub const UNROUTED: &str = "(none)";

pub struct Route {
    pub config: RouteConfig,
    /// The per-client concurrency limit of this route, and its rendered `RateLimit-Policy`.
    pub concurrency: Option<(Policy, http::HeaderValue)>,
    /// The route name, shared cheaply with limiter keys.
    pub name: Arc<str>,
    pub pool: Arc<Pool>,
    pub ip_limiter: Option<Arc<IpLimiter>>,
    pub metrics: RouteMetrics,
    pub upstream_latency: prometheus::Histogram,
}

impl Snapshot {
    /// Builds a snapshot, reusing unchanged stateful parts of `previous`. Fails when a server
    /// name does not resolve.
    pub fn build(
        config: Config,
        previous: Option<&Snapshot>,
        metrics: &Arc<Metrics>,
    ) -> Result<Snapshot, ConfigError> {
        let pools = build_pools(&config, previous)?;
        let lease_ms = concurrency_lease(&config.store).as_millis() as u64;
        let ip_tables = build_ip_tables(&config, previous);
        // Every policy name a route's decisions can be labelled with.
        let mut policy_names: Vec<Arc<str>> = [
            crate::control::config::IP_POLICY_NAME,
            crate::control::config::CONCURRENCY_POLICY_NAME,
            crate::control::config::ROUTE_CONCURRENCY_POLICY_NAME,
        ]
        .map(Arc::from)
        .to_vec();
        for plan in config.plans.values() {
            for p in &plan.limits {
                if !policy_names.contains(&p.name) {
                    policy_names.push(Arc::clone(&p.name));
                }
            }
        }
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let table = match r.ip_limit {
                    IpLimitChoice::ServerDefault => Some(IpTableId::ServerDefault),
                    IpLimitChoice::Off => None,
                    IpLimitChoice::Own(_) => Some(IpTableId::Route(r.name.clone())),
                };
                Route {
                    concurrency: r.max_concurrent.map(|n| {
                        let policy = Policy::concurrency(
                            crate::control::config::ROUTE_CONCURRENCY_POLICY_NAME,
                            n,
                            lease_ms,
                            Scope::Route,
                        );
                        let header = crate::chain::headers::policy_header(std::iter::once(&policy));
                        (
                            policy,
                            http::HeaderValue::from_str(&header).expect("header-safe names"),
                        )
                    }),
                    config: r.clone(),
                    name: Arc::from(r.name.as_str()),
                    pool: Arc::clone(&pools[&r.upstream]),
                    ip_limiter: table
                        .and_then(|id| ip_tables.get(&id))
                        .map(|t| Arc::clone(&t.limiter)),
                    metrics: metrics.route(&r.name, policy_names.iter().cloned()),
                    upstream_latency: metrics.upstream_duration.with_label_values(&[&r.upstream]),
                }
            })
            .collect();
        let store = match previous {
            Some(p) if p.config.store == config.store => Arc::clone(&p.store),
            _ => Arc::new(build_store(&config.store, metrics)?),
        };
        Ok(Snapshot {
            router: Router::new(&config.routes),
            routes,
            pools,
            ip_tables,
            keys: key_ring(&config, lease_ms),
            store,
            unrouted: metrics.route(UNROUTED, []),
            metrics: Arc::clone(metrics),
            config: Arc::new(config),
        })
    }
}

fn build_store(config: &StoreConfig, metrics: &Arc<Metrics>) -> Result<Store, ConfigError> {
    match config {
        StoreConfig::Memory => Ok(Store::memory(Arc::clone(metrics))),
        StoreConfig::Redis(redis, failure) => {
            Store::redis(redis.clone(), *failure, Arc::clone(metrics)).map_err(|e| {
                ConfigError::Invalid(vec![crate::control::config::Problem {
                    path: "store".to_owned(),
                    message: e.to_string(),
                    location: None,
                }])
            })
        }
    }
}

fn build_pools(
    config: &Config,
    previous: Option<&Snapshot>,
) -> Result<BTreeMap<String, Arc<Pool>>, ConfigError> {
    let mut pools = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, up) in &config.upstreams {
        let reused = previous
            .and_then(|p| p.pools.get(name))
            .filter(|pool| pool.config == *up);
        match reused {
            Some(pool) => {
                pools.insert(name.clone(), Arc::clone(pool));
            }
            None => match Pool::new(up) {
                Ok(pool) => {
                    pools.insert(name.clone(), Arc::new(pool));
                }
                Err(problem) => problems.push(problem),
            },
        }
    }
    if problems.is_empty() {
        Ok(pools)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// One table for the server default (if any route uses it) and one per route with its own
/// `ip_limit`; a table whose limit and size are unchanged keeps its buckets.
fn build_ip_tables(config: &Config, previous: Option<&Snapshot>) -> BTreeMap<IpTableId, IpTable> {
    let max_tracked = config.server.max_tracked_ips;
    let mut wanted: BTreeMap<IpTableId, IpLimitConfig> = BTreeMap::new();
    for r in &config.routes {
        match (r.ip_limit, config.server.ip_limit) {
            (IpLimitChoice::ServerDefault, Some(default)) => {
                wanted.insert(IpTableId::ServerDefault, default);
            }
            (IpLimitChoice::Own(own), _) => {
                wanted.insert(IpTableId::Route(r.name.clone()), own);
            }
            _ => {}
        }
    }
    wanted
        .into_iter()
        .map(|(id, cfg)| {
            let reused = previous
                .and_then(|p| p.ip_tables.get(&id))
                .filter(|t| t.config == cfg && t.max_tracked == max_tracked)
                .map(|t| Arc::clone(&t.limiter));
            let limiter =
                reused.unwrap_or_else(|| Arc::new(IpLimiter::new(cfg.policy(), max_tracked)));
            (
                id,
                IpTable {
                    config: cfg,
                    max_tracked,
                    limiter,
                },
            )
        })
        .collect()
}

/// How long a concurrency slot lives unreleased (only the Redis store keeps leases).
fn concurrency_lease(store: &StoreConfig) -> std::time::Duration {
    match store {
        StoreConfig::Redis(redis, _) => redis.concurrency_lease,
        StoreConfig::Memory => crate::control::config::defaults::CONCURRENCY_LEASE,
    }
}

fn key_ring(config: &Config, lease_ms: u64) -> KeyRing {
    let plans: BTreeMap<&str, Arc<Plan>> = config
        .plans
        .values()
        .map(|p| {
            let mut policies = p.limits.clone();
            let mut shadow = p.shadow.clone();
            if let Some(n) = p.max_concurrent {
                let name = crate::control::config::CONCURRENCY_POLICY_NAME;
                policies.push(Policy::concurrency(name, n, lease_ms, Scope::Client));
                shadow.push(false);
            }
            (
                p.name.as_str(),
                Arc::new(Plan::with_shadow(&p.name, policies, shadow).with_lease(p.lease)),
            )
        })
        .collect();
    KeyRing::new(config.clients.iter().flat_map(|c| {
        let client = Arc::new(Client {
            id: Arc::from(c.id.as_str()),
            plan: Arc::clone(&plans[c.plan.as_str()]),
        });
        c.api_keys
            .iter()
            .map(move |digest| (*digest, Arc::clone(&client)))
    }))
}
