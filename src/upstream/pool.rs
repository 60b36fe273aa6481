//! Upstream pools: weighted round robin or least request (`balance.rs`) over the servers'
//! addresses, skipping those that fail their active HTTP health check. Host names are resolved when the pool is built and then again
//! every `resolve_interval` (Pingora's service discovery: the pool follows the answer — new
//! addresses are added and health-checked, vanished ones dropped — without a reload). The
//! checks and resolutions are run by `background::health`, which walks the pools of the
//! current snapshot, so pools created by a reload need no extra wiring. A pool with
//! `shedding` has a [`Gate`]: the door its requests pass first. A pool with `tls` carries
//! what its connections need (CA, client certificate), read when it is built.

use crate::clock::{Clock, MonotonicClock};
use crate::upstream::balance::{lighter, random, server_entry, two_of, Balance, Load};
use crate::upstream::config::{HealthCheckConfig, UpstreamConfig};
use crate::upstream::outlier::{Attempt, Outliers, Transition};
use crate::upstream::resolve::NameResolver;
use crate::upstream::retry::RetryBudget;
use crate::upstream::shed::Gate;
use crate::upstream::tls::{peer_tls, PeerTls};
use crate::upstream::Invalid;
use async_trait::async_trait;
use pingora::http::RequestHeader;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::health_check::{HealthCheck, HttpHealthCheck};
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, Backends, LoadBalancer};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The host a backend was resolved from (its SNI and verified name).
#[derive(Debug, Clone)]
pub struct Host(pub Arc<str>);

/// A server as configured: host (name or address), port and weight.
#[derive(Debug, Clone)]
struct Server {
    host: String,
    port: u16,
    weight: u16,
}

impl Server {
    fn is_name(&self) -> bool {
        self.host.parse::<std::net::IpAddr>().is_err()
    }
}

pub struct Pool {
    pub config: UpstreamConfig,
    lb: LoadBalancer<RoundRobin>,
    /// When the next health check is due (`None`: no active checks).
    next_check: Mutex<Option<Instant>>,
    /// When the names are resolved again (`None`: no names, or never again).
    next_resolve: Mutex<Option<Instant>>,
    /// Load shedding, when the pool has it.
    pub gate: Option<Arc<Gate>>,
    pub tls: Option<PeerTls>,
    balance: Balance,
    /// Passive outlier ejection, when the pool has it.
    pub outliers: Option<Arc<Outliers>>,
    /// Its requests and retries in flight (what retries may take).
    pub budget: Arc<RetryBudget>,
    /// The one server of a pool that can only ever choose it (one address, never resolved
    /// again, no health check, no outlier ejection): chosen without a look at the balancer.
    only: Option<Selected>,
}

/// The selected server: its address, in a TLS pool the host it came from, in a
/// least-request pool its requests in flight.
#[derive(Clone)]
pub struct Selected {
    pub addr: SocketAddr,
    pub host: Option<Arc<str>>,
    pub load: Option<Arc<Load>>,
}

impl Selected {
    /// The name the server is verified by: its configured host, else its address.
    pub fn name(&self) -> String {
        match &self.host {
            Some(host) => host.to_string(),
            None => self.addr.ip().to_string(),
        }
    }
}

/// Resolves every server of a pool (Pingora's service discovery).
struct Discovery {
    servers: Vec<Server>,
    resolver: NameResolver,
    /// The answer found while building the pool, handed out by the first discovery.
    initial: Mutex<Option<BTreeSet<Backend>>>,
    /// The pool speaks TLS: backends keep their host.
    tls: bool,
    /// Least request: each address's requests in flight, kept across re-resolutions.
    loads: Option<Mutex<HashMap<SocketAddr, Arc<Load>>>>,
}

impl Discovery {
    /// The backend of `addr`, resolved from `server`.
    fn backend(&self, addr: SocketAddr, server: &Server) -> Backend {
        let load = self.loads.as_ref().map(|loads| {
            let mut loads = loads.lock().expect("not poisoned");
            Arc::clone(loads.entry(addr).or_default())
        });
        backend(addr, &server.host, self.tls, server.weight, load)
    }
}

/// A backend at `addr` with its server's weight; over TLS it carries the `host` it was
/// resolved from (its SNI and verified name), in a least-request pool its load. Plain
/// round-robin ones carry nothing: the load balancer clones the selected backend on every
/// request, extensions included.
fn backend(
    addr: SocketAddr,
    host: &str,
    tls: bool,
    weight: u16,
    load: Option<Arc<Load>>,
) -> Backend {
    let mut b = Backend {
        addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
        weight: usize::from(weight),
        ext: Default::default(),
    };
    if tls {
        b.ext.insert(Host(Arc::from(host)));
    }
    if let Some(load) = load {
        b.ext.insert(load);
    }
    b
}

#[async_trait]
impl ServiceDiscovery for Discovery {
    async fn discover(&self) -> pingora::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        if let Some(initial) = self.initial.lock().expect("not poisoned").take() {
            return Ok((initial, HashMap::new()));
        }
        let mut found = BTreeSet::new();
        for server in &self.servers {
            match self.resolver.lookup(&server.host, server.port).await {
                Ok(addrs) => found.extend(addrs.into_iter().map(|a| self.backend(a, server))),
                Err(e) => {
                    // Keep the pool as it is rather than empty it on a failed lookup.
                    log::warn!(
                        "upstream server {}:{}: {e}; keeping its addresses",
                        server.host,
                        server.port
                    );
                    return Err(pingora::Error::explain(
                        pingora::ErrorType::InternalError,
                        e,
                    ));
                }
            }
        }
        Ok((found, HashMap::new()))
    }
}

impl Pool {
    /// Builds a pool, resolving host names (blocking: call off the request path) and reading
    /// its TLS files. The `previous` pool of the same name keeps its gate — the learned limit
    /// and the requests in flight — when the shedding settings did not change.
    pub fn new(
        config: &UpstreamConfig,
        resolver: &NameResolver,
        previous: Option<&Arc<Pool>>,
        ejections: Option<prometheus::IntCounter>,
    ) -> Result<Pool, Invalid> {
        let problem = |path: String, message: String| Invalid { path, message };
        let mut discovery = Discovery {
            servers: Vec::with_capacity(config.servers.len()),
            resolver: resolver.clone(),
            initial: Mutex::new(None),
            tls: config.tls.is_some(),
            loads: (config.balance == Balance::LeastRequest).then(Mutex::default),
        };
        let mut initial = BTreeSet::new();
        for (i, text) in config.servers.iter().enumerate() {
            let path = format!("upstreams.{}.servers[{i}]", config.name);
            let entry = server_entry(text).map_err(|m| problem(path.clone(), m))?;
            let (host, port) =
                split_host_port(entry.address).map_err(|m| problem(path.clone(), m))?;
            let server = Server {
                host,
                port,
                weight: entry.weight,
            };
            let addrs = resolver
                .lookup_blocking(&server.host, server.port)
                .map_err(|m| problem(path, m))?;
            initial.extend(addrs.into_iter().map(|a| discovery.backend(a, &server)));
            discovery.servers.push(server);
        }
        let has_names = discovery.servers.iter().any(Server::is_name);
        let single = match initial.len() {
            1 => initial.iter().next().and_then(selected),
            _ => None,
        };
        *discovery.initial.get_mut().expect("not poisoned") = Some(initial);
        let mut lb = LoadBalancer::<RoundRobin>::from_backends(Backends::new(Box::new(discovery)));
        // The first discovery hands out what was just resolved: no I/O, no runtime needed.
        futures::executor::block_on(lb.update()).expect("the initial discovery cannot fail");
        // Kept across a reload that leaves the settings as they were (ejections stand).
        let outliers = config.outlier_detection.clone().map(|settings| {
            previous
                .and_then(|p| p.outliers.as_ref())
                .filter(|o| o.settings == settings)
                .map_or_else(|| Arc::new(Outliers::new(settings, ejections)), Arc::clone)
        });
        if let Some(hc) = &config.health_check {
            lb.set_health_check(Box::new(Checked {
                inner: http_health_check(hc),
                outliers: outliers.clone(),
                pool: config.name.clone(),
            }));
        }
        let tls = match &config.tls {
            Some(t) => Some(peer_tls(&config.name, t, config.http2)?),
            None => None,
        };
        let gate = config.shedding.map(|settings| {
            previous
                .and_then(|p| p.gate.as_ref())
                .filter(|g| *g.settings() == settings)
                .map_or_else(|| Arc::new(Gate::new(settings)), Arc::clone)
        });
        let resolving = has_names && !config.resolve_interval.is_zero();
        let only =
            single.filter(|_| !resolving && config.health_check.is_none() && outliers.is_none());
        Ok(Pool {
            only,
            config: config.clone(),
            lb,
            next_check: Mutex::new(config.health_check.as_ref().map(|_| Instant::now())),
            next_resolve: Mutex::new(resolving.then(|| Instant::now() + config.resolve_interval)),
            gate,
            tls,
            balance: config.balance,
            outliers,
            budget: previous
                .map(|p| &p.budget)
                .filter(|b| b.settings == config.retry_budget)
                .map_or_else(
                    || Arc::new(RetryBudget::new(config.retry_budget)),
                    Arc::clone,
                ),
        })
    }

    /// Whether the server at `b` is out of rotation (ejected); notices a return.
    fn ejected(&self, b: &Backend, now_ms: u64) -> bool {
        let (Some(outliers), Some(addr)) = (&self.outliers, b.addr.as_inet()) else {
            return false;
        };
        let (out, returned) = outliers.is_out(addr, now_ms);
        if let Some(t) = returned {
            self.log_transition(t);
        }
        out
    }

    /// Counts how an attempt at `addr` ended (passive outlier detection).
    pub fn record(&self, addr: SocketAddr, attempt: Attempt) {
        if let Some(outliers) = &self.outliers {
            let now_ms = MonotonicClock.now_ms();
            if let Some(t) = outliers.record(addr, attempt, now_ms, self.len()) {
                self.log_transition(t);
            }
        }
    }

    fn log_transition(&self, t: Transition) {
        let pool = &self.config.name;
        match t {
            Transition::Ejected {
                addr,
                failures,
                for_ms,
            } => log::warn!(
                "upstream {pool:?}: server {addr} ejected for {for_ms} ms after {failures} consecutive failures"
            ),
            Transition::Returned { addr } => {
                log::info!("upstream {pool:?}: server {addr} is back in rotation")
            }
        }
    }

    /// Servers out of rotation now, by address (empty without outlier detection).
    pub fn ejected_servers(&self) -> Vec<(SocketAddr, bool)> {
        self.outliers
            .as_ref()
            .map(|o| o.states(MonotonicClock.now_ms()))
            .unwrap_or_default()
    }

    /// A healthy server by the pool's policy, or `None` if every server is down. `avoid`: the
    /// server a retry's previous try failed on — another healthy server is taken if there is
    /// one, that one only if it is the last.
    pub fn select(&self, avoid: Option<SocketAddr>) -> Option<Selected> {
        if let Some(only) = &self.only {
            return Some(only.clone());
        }
        if avoid.is_some() {
            if let Some(other) = self.select_avoiding(avoid) {
                return Some(other);
            }
        }
        self.select_avoiding(None)
    }

    fn select_avoiding(&self, avoid: Option<SocketAddr>) -> Option<Selected> {
        if self.balance == Balance::LeastRequest {
            if let Some(chosen) = self.least_request(avoid) {
                return Some(chosen);
            }
        }
        let n = self.len().max(1);
        if self.outliers.is_none() && avoid.is_none() {
            return selected(&self.lb.select(b"", n)?);
        }
        let now_ms = MonotonicClock.now_ms();
        selected(&self.lb.select_with(b"", n, |b, healthy| {
            healthy && !self.ejected(b, now_ms) && !is(b, avoid)
        })?)
    }

    /// Power of two choices among the healthy servers (`None`: fewer than two servers, or
    /// the draws found none healthy: round robin decides).
    fn least_request(&self, avoid: Option<SocketAddr>) -> Option<Selected> {
        let backends = self.lb.backends();
        let all = backends.get_backend();
        if all.len() < 2 {
            return None;
        }
        let load = |b: &Backend| (b.ext.get::<Arc<Load>>().map_or(0, |l| l.get()), b.weight);
        let weight = |b: &Backend| u16::try_from(b.weight).unwrap_or(u16::MAX);
        let now_ms = MonotonicClock.now_ms();
        let usable = |b: &Backend| backends.ready(b) && !self.ejected(b, now_ms) && !is(b, avoid);
        for _ in 0..3 {
            let (i, j) = two_of(all.len(), random());
            let (a, b) = (all.iter().nth(i)?, all.iter().nth(j)?);
            let pick = match (usable(a), usable(b)) {
                (true, true) => {
                    let (la, lb) = (load(a), load(b));
                    if lighter((la.0, weight(a)), (lb.0, weight(b))) {
                        a
                    } else {
                        b
                    }
                }
                (true, false) => a,
                (false, true) => b,
                (false, false) => continue,
            };
            return selected(pick);
        }
        None
    }

    /// How many addresses the pool has now.
    pub fn len(&self) -> usize {
        self.lb.backends().get_backend().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Health of every current address, in address order.
    pub fn health(&self) -> Vec<(SocketAddr, bool)> {
        let backends = self.lb.backends();
        backends
            .get_backend()
            .iter()
            .filter_map(|b| Some((*b.addr.as_inet()?, backends.ready(b))))
            .collect()
    }

    /// Runs this pool's health check if it is due; returns when the next one is due.
    pub async fn check_if_due(&self, now: Instant) -> Option<Instant> {
        let interval = self.config.health_check.as_ref()?.interval;
        let due = (*self.next_check.lock().expect("not poisoned"))?;
        if due > now {
            return Some(due);
        }
        self.lb.backends().run_health_check(true).await;
        let next = Instant::now() + interval;
        *self.next_check.lock().expect("not poisoned") = Some(next);
        Some(next)
    }

    /// Resolves the pool's names again if it is time; returns when it is next due. A failed
    /// lookup keeps the addresses the pool has.
    pub async fn resolve_if_due(&self, now: Instant) -> Option<Instant> {
        let due = (*self.next_resolve.lock().expect("not poisoned"))?;
        if due > now {
            return Some(due);
        }
        if self.lb.update().await.is_ok() {
            // New addresses are checked before they count as healthy only if checks run.
            self.lb.backends().run_health_check(true).await;
            if let Some(outliers) = &self.outliers {
                let current: Vec<SocketAddr> = self.health().into_iter().map(|(a, _)| a).collect();
                outliers.retain(&current);
            }
        }
        let next = Instant::now() + self.config.resolve_interval;
        *self.next_resolve.lock().expect("not poisoned") = Some(next);
        Some(next)
    }
}

/// Whether `b` is the server `addr` names.
fn is(b: &Backend, addr: Option<SocketAddr>) -> bool {
    addr.is_some() && b.addr.as_inet() == addr.as_ref()
}

fn selected(b: &Backend) -> Option<Selected> {
    Some(Selected {
        addr: *b.addr.as_inet()?,
        host: b.ext.get::<Host>().map(|h| Arc::clone(&h.0)),
        load: b.ext.get::<Arc<Load>>().cloned(),
    })
}

/// `host:port` or `[v6]:port`.
fn split_host_port(server: &str) -> Result<(String, u16), String> {
    if let Ok(addr) = server.parse::<SocketAddr>() {
        return Ok((addr.ip().to_string(), addr.port()));
    }
    let (host, port) = server
        .rsplit_once(':')
        .ok_or_else(|| format!("{server:?} has no port"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("{server:?} has no valid port"))?;
    Ok((host.to_owned(), port))
}

/// The pool's active check; one that passes brings an ejected server back at once.
struct Checked {
    inner: HttpHealthCheck,
    outliers: Option<Arc<Outliers>>,
    pool: String,
}

#[async_trait]
impl HealthCheck for Checked {
    async fn check(&self, target: &Backend) -> pingora::Result<()> {
        let result = self.inner.check(target).await;
        if let (Ok(()), Some(outliers), Some(addr)) =
            (&result, &self.outliers, target.addr.as_inet())
        {
            if outliers.check_passed(addr).is_some() {
                log::info!(
                    "upstream {:?}: server {addr} is back in rotation (its health check passed)",
                    self.pool
                );
            }
        }
        result
    }

    fn health_threshold(&self, success: bool) -> usize {
        self.inner.health_threshold(success)
    }
}

fn http_health_check(cfg: &HealthCheckConfig) -> HttpHealthCheck {
    let mut hc = HttpHealthCheck::new(&cfg.host, false);
    let mut req = RequestHeader::build("GET", cfg.path.as_bytes(), None)
        .expect("validated health check path");
    req.insert_header("Host", &cfg.host)
        .expect("validated health check host");
    req.insert_header("User-Agent", "turnstile-health-check")
        .expect("static header");
    hc.req = req;
    hc.peer_template.options.connection_timeout = Some(cfg.timeout);
    hc.peer_template.options.read_timeout = Some(cfg.timeout);
    hc.peer_template.options.write_timeout = Some(cfg.timeout);
    hc.consecutive_failure = cfg.unhealthy_threshold;
    hc.consecutive_success = cfg.healthy_threshold;
    hc
}
