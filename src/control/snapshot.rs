//! Everything a request needs, built from one validated [`Config`]. The live snapshot sits in
//! an `ArcSwap`; each request loads it once, at the start, and uses that one value until it
//! ends, so a reload in the middle of a request never mixes two configurations.
//!
//! Stateful parts are reused from the previous snapshot when their definition did not change
//! (upstream pools with their health state, per-IP tables with their buckets, the store with
//! its counters), so rebuilding a snapshot does not reset them.

use crate::chain::admission::{IpRule, KeyedLimit, RouteRules};
use crate::chain::auth::{Client, KeyRing, Plan};
use crate::chain::headers::policy_header;
use crate::chain::jwt::issuer::Issuer;
use crate::chain::partition::KeyHasher;
use crate::chain::router::{RouteSpec, Router};
use crate::control::client_auth::ClientAuth;
use crate::control::config::{
    Config, ConfigError, IpLimitChoice, IpLimitConfig, Problem, RouteConfig, StoreConfig,
};
use crate::control::identity::Identity;
use crate::control::tls::CertStore;
use crate::limit::ip::IpLimiter;
use crate::limit::store::Store;
use crate::limit::{
    Policy, Scope, CONCURRENCY_POLICY_NAME, RESERVED_POLICY_NAMES, ROUTE_CONCURRENCY_POLICY_NAME,
};
use crate::ops::metrics::{Metrics, RouteMetrics};
use crate::registry::state::Registry;
use crate::upstream::pool::Pool;
use crate::upstream::resolve::NameResolver;
use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::sync::Arc;

pub type SnapshotHandle = Arc<ArcSwap<Snapshot>>;

/// Which per-IP table a route uses: the shared server default, or its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum IpTableId {
    ServerDefault,
    Route(String),
    /// The quota endpoint's own bucket per identified client (`server.quota_limit`).
    Quota,
    /// Bearer tokens that failed their checks, per address (`server.token_failure_limit`).
    TokenFailures,
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
    /// Clients managed at runtime in the shared store (`[registry]` with Redis).
    pub registry: Option<Arc<Registry>>,
    /// Every plan by name.
    pub plans: BTreeMap<String, Arc<Plan>>,
    /// Bearer token issuers, the verified-token cache, client certificate callers.
    pub identity: Identity,
    /// The keyed hash of partitions and of token / certificate client ids.
    pub hasher: Arc<KeyHasher>,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    /// The limiter's recent refusals and who was refused most (kept across reloads).
    pub refusals: Arc<crate::ops::refusals::Refusals>,
    /// Counters of requests no route matched.
    pub unrouted: RouteMetrics,
    /// The TLS listener's certificates (chosen per handshake from the live snapshot).
    pub tls: Option<Arc<CertStore>>,
    /// The TLS listener's client certificate verifier, when it asks for certificates.
    pub client_auth: Option<Arc<ClientAuth>>,
}

/// Label used for requests that matched no route.
pub const UNROUTED: &str = "(none)";

pub struct Route {
    pub config: RouteConfig,
    /// What admission needs: the name (shared cheaply with limiter keys), cost, dry run,
    /// failure mode, per-IP table, the route's concurrency limit.
    pub rules: RouteRules,
    /// `None`: the route answers itself (`redirect` / `respond`).
    pub pool: Option<Arc<Pool>>,
    /// With `auth.jwt`: the issuers whose tokens it accepts.
    pub issuers: Vec<Arc<Issuer>>,
    /// A keyed limit reads the client certificate (`cert:` parts).
    pub reads_cert: bool,
    pub metrics: RouteMetrics,
    pub upstream_latency: Option<prometheus::Histogram>,
}

impl Snapshot {
    /// Builds a snapshot, reusing unchanged stateful parts of `previous`. Fails when a server
    /// name does not resolve.
    pub fn build(
        config: Config,
        previous: Option<&Snapshot>,
        metrics: &Arc<Metrics>,
    ) -> Result<Snapshot, ConfigError> {
        let pools = build_pools(&config, previous, metrics)?;
        let slot_ttl_ms = slot_ttl(&config.store).as_millis() as u64;
        let ip_tables = build_ip_tables(&config, previous);
        // Every policy name a route's decisions can be labelled with.
        let mut policy_names: Vec<Arc<str>> = RESERVED_POLICY_NAMES.map(Arc::from).to_vec();
        for route in &config.routes {
            for l in &route.limits {
                if !policy_names.contains(&l.policy.name) {
                    policy_names.push(Arc::clone(&l.policy.name));
                }
            }
        }
        let hasher = Arc::new(KeyHasher::new(
            config
                .server
                .key_hash_secret
                .as_ref()
                .map_or(DEFAULT_KEY_HASH_SECRET, |s| s.expose().as_bytes()),
        ));
        for plan in config.plans.values() {
            for p in &plan.limits {
                if !policy_names.contains(&p.name) {
                    policy_names.push(Arc::clone(&p.name));
                }
            }
        }
        let plans = build_plans(&config, slot_ttl_ms)?;
        let identity = Identity::build(
            &config,
            &plans,
            previous.map(|p| (&*p.config, &p.identity)),
            metrics,
        )?;
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let table = match r.ip_limit {
                    IpLimitChoice::ServerDefault => Some(IpTableId::ServerDefault),
                    IpLimitChoice::Off => None,
                    IpLimitChoice::Own(_) => Some(IpTableId::Route(r.name.clone())),
                };
                let keyed: Vec<KeyedLimit> = r
                    .limits
                    .iter()
                    .map(|l| KeyedLimit {
                        policy: l.policy.clone(),
                        shadow: l.shadow,
                        key: l.key.clone(),
                        missing: l.missing,
                    })
                    .collect();
                let concurrency = r
                    .max_concurrent
                    .map(|n| {
                        let policy = Policy::concurrency(
                            ROUTE_CONCURRENCY_POLICY_NAME,
                            n,
                            slot_ttl_ms,
                            Scope::Route,
                        )
                        .map_err(|e| invalid(&format!("routes.{}.max_concurrent", r.name), e))?;
                        let header = policy_header(std::iter::once(&policy));
                        let header =
                            http::HeaderValue::from_str(&header).expect("header-safe names");
                        Ok::<_, ConfigError>((policy, header))
                    })
                    .transpose()?;
                Ok(Route {
                    rules: RouteRules {
                        name: Arc::from(r.name.as_str()),
                        cost: r.cost,
                        shadow: r.shadow,
                        on_store_error: r.on_store_error,
                        ip: table
                            .and_then(|id| ip_tables.get(&id))
                            .map(|t| IpRule::new(Arc::clone(&t.limiter))),
                        concurrency,
                        keyed_header: KeyedLimit::header(&keyed, r.shadow),
                        keyed,
                        hasher: Arc::clone(&hasher),
                        exempt: r
                            .exempt
                            .iter()
                            .map(|e| crate::chain::exempt::Exemption {
                                nets: e.nets.clone(),
                                clients: e.clients.iter().map(|c| Arc::from(c.as_str())).collect(),
                                limits: e
                                    .limits
                                    .as_ref()
                                    .map(|l| l.iter().map(|n| Arc::from(n.as_str())).collect()),
                            })
                            .collect(),
                        reserve_from: r.reserve_from.clone(),
                    },
                    config: r.clone(),
                    pool: r
                        .upstream
                        .as_ref()
                        .filter(|_| r.answer.is_none())
                        .map(|u| Arc::clone(&pools[u])),
                    issuers: r
                        .issuers
                        .iter()
                        .filter_map(|name| identity.issuers.get(name).cloned())
                        .collect(),
                    reads_cert: r
                        .limits
                        .iter()
                        .flat_map(|l| &l.key)
                        .any(|p| matches!(p, crate::chain::partition::KeyPart::Cert(_))),
                    metrics: metrics.route(
                        &r.name,
                        r.upstream.as_deref().filter(|u| pools[*u].gate.is_some()),
                        policy_names.iter().cloned(),
                    ),
                    upstream_latency: r
                        .upstream
                        .as_ref()
                        .map(|u| metrics.upstream.duration.with_label_values(&[u])),
                })
            })
            .collect::<Result<Vec<Route>, ConfigError>>()?;
        let store = match previous {
            Some(p) if p.config.store == config.store => Arc::clone(&p.store),
            _ => Arc::new(build_store(&config.store, metrics)?),
        };
        let tls = match &config.server.tls {
            Some(t) => Some(Arc::new(
                CertStore::load(&t.certificates).map_err(ConfigError::Invalid)?,
            )),
            None => None,
        };
        let keys = key_ring(&config, &plans);
        let client_auth = match config
            .server
            .tls
            .as_ref()
            .and_then(|t| t.client_auth.as_ref())
        {
            Some(c) => Some(Arc::new(
                ClientAuth::load(c).map_err(|p| ConfigError::Invalid(vec![p]))?,
            )),
            None => None,
        };
        // Last, once nothing can fail: a refused reload leaves the running store (and the
        // registry's plans) as they were.
        store.set_max_tracked_keys(config.server.max_tracked_keys);
        let registry = build_registry(&config, &store, previous, &plans);
        Ok(Snapshot {
            tls,
            client_auth,
            router: Router::new(config.routes.iter().map(|r| RouteSpec {
                prefix: r.path_prefix.clone(),
                host: r.host.clone(),
                methods: r.methods.clone(),
            })),
            routes,
            pools,
            ip_tables,
            keys,
            registry,
            plans,
            identity,
            hasher,
            store,
            refusals: previous.map_or_else(Default::default, |p| Arc::clone(&p.refusals)),
            unrouted: metrics.route(UNROUTED, None, []),
            metrics: Arc::clone(metrics),
            config: Arc::new(config),
        })
    }
}

fn build_store(config: &StoreConfig, metrics: &Arc<Metrics>) -> Result<Store, ConfigError> {
    match config {
        StoreConfig::Memory => Ok(Store::memory(metrics.store())),
        StoreConfig::Redis(redis, failure) => {
            Store::redis(redis.clone(), *failure, metrics.store()).map_err(|e| invalid("store", e))
        }
    }
}

fn build_pools(
    config: &Config,
    previous: Option<&Snapshot>,
    metrics: &Metrics,
) -> Result<BTreeMap<String, Arc<Pool>>, ConfigError> {
    let mut pools = BTreeMap::new();
    let mut problems = Vec::new();
    let resolver = NameResolver::new(&config.server.dns_servers);
    let same_resolver =
        previous.is_none_or(|p| p.config.server.dns_servers == config.server.dns_servers);
    for (name, up) in &config.upstreams {
        let reused = previous
            .and_then(|p| p.pools.get(name))
            .filter(|pool| pool.config == *up && same_resolver);
        match reused {
            Some(pool) => {
                pools.insert(name.clone(), Arc::clone(pool));
            }
            None => match Pool::new(
                up,
                &resolver,
                previous.and_then(|p| p.pools.get(name)),
                Some(metrics.upstream.ejections.with_label_values(&[name])),
            ) {
                Ok(pool) => {
                    pools.insert(name.clone(), Arc::new(pool));
                }
                Err(invalid) => problems.push(Problem {
                    path: invalid.path,
                    message: invalid.message,
                    location: None,
                }),
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
    // The quota endpoint is held to the server's per-IP limit.
    if let (Some(_), Some(default)) = (&config.server.quota_path, config.server.ip_limit) {
        wanted.insert(IpTableId::ServerDefault, default);
    }
    if let (Some(_), Some(own)) = (&config.server.quota_path, config.server.quota_limit) {
        wanted.insert(IpTableId::Quota, own);
    }
    if let (false, Some(own)) = (config.issuers.is_empty(), config.server.token_failure_limit) {
        wanted.insert(IpTableId::TokenFailures, own);
    }
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
            let policy = match id {
                IpTableId::Quota => cfg.policy_named(crate::limit::QUOTA_POLICY_NAME),
                _ => cfg.policy(),
            };
            let limiter = reused.unwrap_or_else(|| Arc::new(IpLimiter::new(policy, max_tracked)));
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

/// The secret keyed limits hash with when `server.key_hash_secret` is not set: the same on
/// every instance, so they agree; not secret, so set one (the config loader warns).
pub const DEFAULT_KEY_HASH_SECRET: &[u8] = b"turnstile keyed limits: set server.key_hash_secret";

/// How long a concurrency slot lives unreleased (only the Redis store keeps slots in time).
fn slot_ttl(store: &StoreConfig) -> std::time::Duration {
    match store {
        StoreConfig::Redis(redis, _) => redis.slot_ttl,
        StoreConfig::Memory => crate::control::config::defaults::CONCURRENCY_SLOT_TTL,
    }
}

/// A problem found while building (the config loader catches these first).
fn invalid(path: &str, e: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid(vec![Problem {
        path: path.to_owned(),
        message: e.to_string(),
        location: None,
    }])
}

impl Snapshot {
    /// The client owning an API key: the configuration's first, then the registry's.
    pub fn lookup_key(&self, key: &[u8]) -> Option<Arc<Client>> {
        self.keys
            .lookup(key)
            .cloned()
            .or_else(|| self.registry.as_ref()?.lookup(key))
    }
}

/// The plan of the client `id`, as the request path would find the client (configuration
/// first, then the registry).
pub fn plan_of(snapshot: &Snapshot, id: &str) -> Option<Arc<Plan>> {
    let name = match snapshot.config.clients.iter().find(|c| c.id == id) {
        Some(c) => c.plan.clone(),
        None => {
            let registry = snapshot.registry.as_ref()?;
            if registry.ring().unserved.iter().any(|(u, _)| u == id) {
                return None;
            }
            registry.state().entries.get(id)?.plan.clone()
        }
    };
    snapshot.plans.get(&name).cloned()
}

/// The registry of a Redis store, kept across reloads while the store and its settings are
/// the same (its copy and its polling go on), told the configuration's plans and client ids.
fn build_registry(
    config: &Config,
    store: &Arc<Store>,
    previous: Option<&Snapshot>,
    plans: &BTreeMap<String, Arc<Plan>>,
) -> Option<Arc<Registry>> {
    let settings = config.registry.clone()?;
    let redis = store.redis_backend()?;
    let registry = previous
        .and_then(|p| p.registry.as_ref().filter(|_| Arc::ptr_eq(&p.store, store)))
        .filter(|r| r.settings == settings)
        .cloned()
        .unwrap_or_else(|| Arc::new(Registry::new(redis, settings)));
    registry.configure(
        plans.clone(),
        config.clients.iter().map(|c| c.id.clone()).collect(),
    );
    Some(registry)
}

/// Every plan, its concurrency limit a policy of its own.
fn build_plans(
    config: &Config,
    slot_ttl_ms: u64,
) -> Result<BTreeMap<String, Arc<Plan>>, ConfigError> {
    let mut plans = BTreeMap::new();
    for p in config.plans.values() {
        let mut policies = p.limits.clone();
        let mut shadow = p.shadow.clone();
        if let Some(n) = p.max_concurrent {
            let policy =
                Policy::concurrency(CONCURRENCY_POLICY_NAME, n, slot_ttl_ms, Scope::Client)
                    .map_err(|e| invalid(&format!("plans.{}.max_concurrent", p.name), e))?;
            policies.push(policy);
            shadow.push(false);
        }
        let plan = Plan::with_shadow(&p.name, policies, shadow)
            .with_lease(p.lease)
            .with_priority(p.priority)
            .with_exempt_from(&p.exempt_from)
            .with_response_costs(&p.response_costs);
        plans.insert(p.name.clone(), Arc::new(plan));
    }
    Ok(plans)
}

fn key_ring(config: &Config, plans: &BTreeMap<String, Arc<Plan>>) -> KeyRing {
    KeyRing::new(config.clients.iter().flat_map(|c| {
        let client = Arc::new(Client {
            id: Arc::from(c.id.as_str()),
            plan: Arc::clone(&plans[&c.plan]),
            groups: c.groups.iter().map(|g| Arc::from(g.as_str())).collect(),
        });
        c.api_keys
            .iter()
            .map(move |digest| (*digest, Arc::clone(&client)))
    }))
}
