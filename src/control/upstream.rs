//! Upstream pools: round robin over the configured servers, skipping those that fail their
//! active HTTP health check. The checks are run by `background::health`, which walks the
//! pools of the current snapshot, so pools created by a reload are checked without any extra
//! wiring. A pool with `shedding` has a [`Gate`]: the door its requests pass first.

use crate::control::config::{HealthCheckConfig, Problem, UpstreamConfig};
use crate::limit::shed::Gate;
use pingora::http::RequestHeader;
use pingora::lb::health_check::HttpHealthCheck;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, LoadBalancer};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub struct Pool {
    pub config: UpstreamConfig,
    /// The configured servers, resolved, in configuration order.
    addrs: Vec<SocketAddr>,
    lb: LoadBalancer<RoundRobin>,
    backends: Vec<Backend>,
    /// When the next health check of this pool is due (`None`: no active checks).
    next_check: Mutex<Option<Instant>>,
    /// Load shedding, when the pool has it.
    pub gate: Option<Arc<Gate>>,
}

impl Pool {
    /// Builds a pool, resolving host names (blocking DNS: call off the request path). The
    /// `previous` pool of the same name keeps its gate — the learned limit and the requests
    /// in flight — when the shedding settings did not change.
    pub fn new(config: &UpstreamConfig, previous: Option<&Arc<Pool>>) -> Result<Pool, Problem> {
        let addrs = config
            .servers
            .iter()
            .enumerate()
            .map(|(i, server)| {
                resolve(server).map_err(|message| Problem {
                    path: format!("upstreams.{}.servers[{i}]", config.name),
                    message,
                    location: None,
                })
            })
            .collect::<Result<Vec<SocketAddr>, Problem>>()?;
        let mut lb = LoadBalancer::<RoundRobin>::try_from_iter(addrs.iter().copied())
            .expect("socket addresses need no lookup");
        if let Some(hc) = &config.health_check {
            lb.set_health_check(Box::new(http_health_check(hc)));
        }
        let backends = lb.backends().get_backend().iter().cloned().collect();
        let gate = config.shedding.map(|settings| {
            previous
                .and_then(|p| p.gate.as_ref())
                .filter(|g| *g.settings() == settings)
                .map_or_else(|| Arc::new(Gate::new(settings)), Arc::clone)
        });
        Ok(Pool {
            config: config.clone(),
            addrs,
            lb,
            backends,
            next_check: Mutex::new(config.health_check.as_ref().map(|_| Instant::now())),
            gate,
        })
    }

    /// The next healthy server in round-robin order, or `None` if every server is down.
    pub fn select(&self) -> Option<SocketAddr> {
        self.lb
            .select(b"", self.backends.len())
            .and_then(|b| b.addr.as_inet().copied())
    }

    pub fn len(&self) -> usize {
        self.backends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Health of every server, in configuration order.
    pub fn health(&self) -> Vec<(SocketAddr, bool)> {
        let backends = self.lb.backends();
        self.addrs
            .iter()
            .map(|addr| {
                let healthy = self
                    .backends
                    .iter()
                    .find(|b| b.addr.as_inet() == Some(addr))
                    .is_some_and(|b| backends.ready(b));
                (*addr, healthy)
            })
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
}

/// `ip:port` as is; `host:port` through the system resolver (the first address wins).
fn resolve(server: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = server.parse::<SocketAddr>() {
        return Ok(addr);
    }
    server
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {server:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{server:?} resolves to no address"))
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
