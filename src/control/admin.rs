//! The admin listener (its own address, loopback by default): `GET /metrics` (Prometheus
//! text), `GET /healthz` (the process is up), `GET /readyz` (ready to serve: configuration
//! loaded, at least one healthy upstream server for every route, keys for every token
//! issuer a route accepts, and a new store warm — its request connection made, within
//! `store.startup_grace`; after that the store is reported but never makes the gateway
//! unready, since every route has decided what to do without it, and a JWKS endpoint
//! failing once keys were had is reported per issuer, the keys in use staying), `GET /config` (the running
//! configuration, secrets redacted, with its version and hash), `POST /reload` (reload the file now; 422 with the problems if it is invalid),
//! `GET /refusals/{request_id}`, `GET /refusals`, `GET /limited` (the limiter's recent
//! refusals and who is refused most, `refusals_api.rs`), and the operator console under `/ui/` (`console.rs`).
//!
//! With `admin.token` set, every request must carry `Authorization: Bearer <token>`
//! (compared in constant time) or gets 401; two `Authorization` headers get 400 (which one
//! counts would be the client's choice). A request naming a host other than the listener's
//! own — `localhost`, the machine's name, an IP literal, or one of `admin.hosts` — gets 421:
//! a page whose name was rebound to this address (DNS rebinding) cannot read or change
//! anything, token or not.

use crate::control::admin_guard::{bearer, cross_site_write, host_allowed, Throttle};
use crate::control::refusals_api;
use crate::control::reload::{ReloadError, Reloaded, Reloader};
use crate::control::snapshot::{IpTableId, Snapshot, SnapshotHandle};
use crate::limit::store::breaker::BreakerState;
use crate::limit::store::StoreHealth;
use crate::ops::metrics::Metrics;
use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde_json::json;
use std::sync::Arc;

pub struct Admin {
    snapshots: SnapshotHandle,
    metrics: Arc<Metrics>,
    reloader: Arc<Reloader>,
    files: crate::control::clients_file::FileClients,
    /// Wrong tokens, per address (`admin_guard.rs`).
    throttle: Throttle,
}

impl Admin {
    pub fn new(snapshots: SnapshotHandle, metrics: Arc<Metrics>, reloader: Arc<Reloader>) -> Admin {
        Admin {
            snapshots,
            metrics,
            reloader,
            files: Default::default(),
            throttle: Throttle::default(),
        }
    }

    /// `POST /reload`; `actor`: the admin token's name, for the reload history.
    async fn reload(&self, actor: Option<&str>) -> Response<Vec<u8>> {
        let trigger = match actor {
            Some(name) => format!("POST /reload by {name}"),
            None => "POST /reload".to_owned(),
        };
        match self.reloader.reload(&trigger).await {
            Ok(Reloaded::Applied(loaded)) => json_response(
                StatusCode::OK,
                &json!({
                    "result": "applied",
                    "version": loaded.version,
                    "hash": loaded.hash,
                    "pending_restart": loaded.pending_restart,
                }),
            ),
            Ok(Reloaded::Unchanged(loaded)) => json_response(
                StatusCode::OK,
                &json!({
                    "result": "unchanged",
                    "version": loaded.version,
                    "hash": loaded.hash,
                    "pending_restart": loaded.pending_restart,
                }),
            ),
            Err(ReloadError::Busy) => json_response(
                StatusCode::CONFLICT,
                &json!({
                    "result": "busy",
                    "error": "another reload has been running for too long; try again",
                }),
            ),
            Err(ReloadError::Config(e)) => {
                let problems: Vec<String> = e.to_string().lines().map(str::to_owned).collect();
                json_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &json!({
                        "result": "rejected",
                        "error": "the configuration file is invalid; the running configuration stays",
                        "problems": problems,
                    }),
                )
            }
        }
    }

    fn config(&self, snapshot: &Snapshot) -> Response<Vec<u8>> {
        let loaded = self.reloader.loaded();
        json_response(
            StatusCode::OK,
            &json!({
                "version": loaded.version,
                "hash": loaded.hash,
                "loaded_at": loaded.loaded_at,
                "path": self.reloader.path().display().to_string(),
                "pending_restart": loaded.pending_restart,
                "config": crate::control::config::view::render(&snapshot.config),
            }),
        )
    }

    /// Gauges that describe current state are set at scrape time, from the live snapshot.
    fn refresh_gauges(&self, snapshot: &Snapshot) {
        let m = &self.metrics;
        m.upstream.healthy.reset();
        for (name, pool) in &snapshot.pools {
            for (addr, healthy) in pool.health() {
                m.upstream
                    .healthy
                    .with_label_values(&[name, &addr.to_string()])
                    .set(i64::from(healthy));
            }
        }
        m.upstream.ejected.reset();
        for (name, pool) in &snapshot.pools {
            for (addr, out) in pool.ejected_servers() {
                m.upstream
                    .ejected
                    .with_label_values(&[name, &addr.to_string()])
                    .set(i64::from(out));
            }
        }
        m.shedding.reset();
        m.shedding_latency.reset();
        for (name, gate) in snapshot
            .pools
            .iter()
            .filter_map(|(name, pool)| Some((name, pool.gate.as_ref()?)))
        {
            let view = gate.view();
            let states = [
                ("limit", i64::from(view.limit)),
                ("in_flight", i64::from(view.in_flight)),
                ("queued", view.queued as i64),
            ];
            for (state, value) in states {
                m.shedding.with_label_values(&[name, state]).set(value);
            }
            let latencies = [("baseline", view.baseline_us), ("window", view.latency_us)];
            for (kind, us) in latencies {
                if let Some(us) = us {
                    m.shedding_latency
                        .with_label_values(&[name, kind])
                        .set(us as f64 / 1e6);
                }
            }
        }
        m.tracked_entries.reset();
        for (id, table) in &snapshot.ip_tables {
            let label = match id {
                IpTableId::ServerDefault => "ip:server".to_owned(),
                IpTableId::Route(r) => format!("ip:{r}"),
                IpTableId::Quota => "quota".to_owned(),
                IpTableId::TokenFailures => "token_failures".to_owned(),
            };
            m.tracked_entries
                .with_label_values(&[&label])
                .set(table.limiter.tracked() as i64);
        }
        let (primary, fallback, leases) = snapshot.store.local_entries();
        m.tracked_entries
            .with_label_values(&["store:leases"])
            .set(leases as i64);
        m.tracked_entries
            .with_label_values(&["store:memory"])
            .set(primary as i64);
        m.tracked_entries
            .with_label_values(&["store:local_fallback"])
            .set(fallback as i64);
        m.set_breaker_state(snapshot.store.breaker_state());
        m.set_store_nodes(&snapshot.store.nodes(), snapshot.store.redirects());
        m.set_store_batches(snapshot.store.batches());
        m.set_decide_path(snapshot.store.decides_with());
        m.set_store_settlements(snapshot.store.settlements());
    }

    fn readiness(&self, snapshot: &Snapshot) -> (bool, serde_json::Value) {
        let unhealthy_routes: Vec<&str> = snapshot
            .routes
            .iter()
            .filter(|r| {
                r.pool
                    .as_ref()
                    .is_some_and(|p| !p.health().iter().any(|(_, healthy)| *healthy))
            })
            .map(|r| &*r.rules.name)
            .collect();
        let breaker = snapshot.store.breaker_state();
        let health = snapshot.store.health();
        // A route's issuer that never had keys cannot identify anybody yet; once it has had
        // some, a failing JWKS endpoint is reported (the keys in use stay), not unready.
        let without_keys: Vec<&str> = snapshot
            .routes
            .iter()
            .filter(|r| r.issuers.iter().any(|i| i.source.keys().is_none()))
            .map(|r| &*r.rules.name)
            .collect();
        // A new store's request connection not made yet (within its startup grace): requests
        // on its routes would wait for it.
        let warming = snapshot.store.warming();
        let mut reasons: Vec<&str> = Vec::new();
        if warming {
            reasons.push("store warming");
        }
        if !unhealthy_routes.is_empty() {
            reasons.push("routes without a healthy upstream server");
        }
        if !without_keys.is_empty() {
            reasons.push("routes whose token issuers have no keys yet");
        }
        let ready = reasons.is_empty();
        let issuers: serde_json::Map<String, serde_json::Value> = snapshot
            .identity
            .issuers
            .iter()
            .map(|(name, issuer)| {
                let status = issuer.source.status();
                (
                    name.clone(),
                    json!({
                        "keys": status.keys,
                        "loaded_seconds_ago": status.age_secs,
                        "last_fetch_error": status.last_error,
                    }),
                )
            })
            .collect();
        let registry = snapshot.registry.as_ref().map(|r| {
            let state = r.state();
            let ring = r.ring();
            json!({
                "version": state.version,
                "clients": state.entries.len(),
                // Seconds since this instance last read the whole registry: how old its copy
                // may be when Redis is down.
                "synced_seconds_ago": state.synced_at.map(|t| t.elapsed().unwrap_or_default().as_secs()),
                "last_error": state.last_error,
                "lost": state.lost,
                "skipped": state.skipped.iter().map(|(id, why)| json!({"id": id, "why": why})).collect::<Vec<_>>(),
                "unserved": ring.unserved.iter().map(|(id, why)| json!({"id": id, "why": why})).collect::<Vec<_>>(),
            })
        });
        let body = json!({
            "ready": ready,
            "not_ready_because": reasons,
            "config": "loaded",
            "registry": registry,
            "routes_without_healthy_upstream": unhealthy_routes,
            "routes_without_issuer_keys": without_keys,
            "issuers": issuers,
            "store": {
                "kind": snapshot.store.kind(),
                "warming": warming,
                // Redis: what decides now — "module" (turnstile's Redis module, asked at
                // every connect) or "lua" (store.decide_with).
                "decides_with": snapshot.store.decides_with(),
                "circuit_breaker": breaker.as_str(),
                // From the latest call (decisions and the heartbeat every interval).
                "status": health.as_str(),
                "reachable": health == StoreHealth::Ok && breaker == BreakerState::Closed,
                "live_instances": snapshot.store.live_instances(),
                // Redis: the connection requests use — "up", or "repairing" since it was
                // lost — and how many times it was repaired.
                "connection": snapshot.store.connection().map(|(up, _)| if up { "up" } else { "repairing" }),
                "connection_repairs": snapshot.store.connection().map(|(_, n)| n),
                // Sentinel: "where is the primary?" asked after timeouts, and how many
                // answers named another node (the connection was left for it).
                "sentinel_questions": snapshot.store.sentinel_questions().map(|(asked, moved)| json!({
                    "asked": asked,
                    "moved": moved,
                })),
                // Redis Cluster: each node with its own breaker; a node's trouble sends only
                // the clients whose keys live there to their routes' failure mode.
                "nodes": snapshot.store.nodes().iter().map(|n| json!({
                    "node": n.addr,
                    "circuit_breaker": n.breaker.as_str(),
                    "status": n.health.as_str(),
                    "slots": n.slots,
                })).collect::<Vec<_>>(),
            },
        });
        (ready, body)
    }
}

/// The request body, at most [`crate::control::clients_api::MAX_BODY`] bytes, each read
/// bounded by `pause`.
async fn read_body(
    session: &mut ServerSession,
    pause: std::time::Duration,
) -> Result<Vec<u8>, Response<Vec<u8>>> {
    use crate::control::clients_api::{problem, MAX_BODY};
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout(pause, session.read_request_body()).await {
            Ok(Ok(Some(chunk))) => {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_BODY {
                    return Err(problem(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "body-too-large",
                        &format!("the body is larger than {MAX_BODY} bytes"),
                    ));
                }
            }
            Ok(Ok(None)) => return Ok(body),
            Ok(Err(_)) | Err(_) => {
                return Err(problem(
                    StatusCode::BAD_REQUEST,
                    "bad-body",
                    "the request body could not be read in time",
                ))
            }
        }
    }
}

fn answer((status, body): refusals_api::Answer) -> Response<Vec<u8>> {
    json_response(status, &body)
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec_pretty(body).expect("json serializes");
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .header("cache-control", "no-store")
        .body(body)
        .expect("valid response")
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        // One request per connection: its head was due header_timeout after the connection
        // opened (the listener's guard), and a kept-alive one would have no deadline.
        session.set_keepalive(None);
        let snapshot = self.snapshots.load_full();
        let req = session.req_header();
        let admin = &snapshot.config.admin;
        let host = req
            .uri
            .authority()
            .map(|a| a.as_str().as_bytes())
            .or_else(|| req.headers.get(http::header::HOST).map(|h| h.as_bytes()));
        if !host_allowed(host, &admin.hosts) {
            return json_response(
                StatusCode::MISDIRECTED_REQUEST,
                &json!({"error": "this listener does not answer for that host name; add it to admin.hosts"}),
            );
        }
        if req.method == http::Method::GET {
            // The console's files hold no data: every call they make needs the token.
            if let Some(resp) = crate::control::console::asset(req.uri.path()) {
                return resp;
            }
        }
        let mut authorization = req.headers.get_all(http::header::AUTHORIZATION).iter();
        let (first, second) = (authorization.next(), authorization.next());
        if second.is_some() {
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({"error": "more than one Authorization header"}),
            );
        }
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        if !admin.tokens.is_empty() {
            if let Some(retry) = self.throttle.refused(peer) {
                self.metrics
                    .admin_auth_failures
                    .with_label_values(&["throttled"])
                    .inc();
                let mut resp = json_response(
                    StatusCode::TOO_MANY_REQUESTS,
                    &json!({"error": "too many wrong admin tokens from this address: try again later"}),
                );
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, http::HeaderValue::from(retry));
                return resp;
            }
        }
        let actor = bearer(first)
            .and_then(|presented| admin.token_named(presented))
            .map(str::to_owned);
        if !admin.tokens.is_empty() && actor.is_none() {
            self.throttle.failed(peer);
            self.metrics
                .admin_auth_failures
                .with_label_values(&["refused"])
                .inc();
            let mut resp = json_response(
                StatusCode::UNAUTHORIZED,
                &json!({"error": "admin token required"}),
            );
            resp.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"turnstile-admin\""),
            );
            return resp;
        }
        if let Some((status, why)) = cross_site_write(req) {
            return json_response(status, &json!({ "error": why }));
        }
        let reading = matches!(req.method, http::Method::GET | http::Method::HEAD);
        if let Some(name) = actor.as_deref().filter(|n| !reading && !admin.may_write(n)) {
            return json_response(
                StatusCode::FORBIDDEN,
                &json!({"error": format!("the token {name:?} may only read (admin.read_tokens): changes need a token of admin.token or admin.tokens")}),
            );
        }
        let (method, path) = (req.method.as_str().to_owned(), req.uri.path().to_owned());
        let query = req.uri.query().map(str::to_owned);
        if path.starts_with("/clients") || path == "/registry/restore" {
            let body = match read_body(session, snapshot.config.server.limits.header_timeout).await
            {
                Ok(body) => body,
                Err(resp) => return resp,
            };
            let api = crate::control::clients_api::ClientsApi {
                snapshot: &snapshot,
                reloader: &self.reloader,
                files: &self.files,
                actor: actor.as_deref(),
            };
            if let Some(resp) = api.handle(&method, &path, &body).await {
                return resp;
            }
        }
        let asked = (method.as_str(), path.as_str(), query.as_deref());
        self.route(&snapshot, asked, actor.as_deref()).await
    }
}

impl Admin {
    /// The answer of every endpoint but the clients API's (the request authorised).
    async fn route(
        &self,
        snapshot: &Snapshot,
        (method, path, query): (&str, &str, Option<&str>),
        actor: Option<&str>,
    ) -> Response<Vec<u8>> {
        match (method, path) {
            ("GET", "/metrics") => {
                self.refresh_gauges(snapshot);
                let body = self.metrics.render();
                Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "text/plain; version=0.0.4")
                    .header("content-length", body.len())
                    .body(body)
                    .expect("valid response")
            }
            ("GET", "/healthz") => json_response(StatusCode::OK, &json!({"status": "ok"})),
            ("GET", "/limited") => answer(refusals_api::limited(snapshot).await),
            ("GET", "/refusals") => match refusals_api::id_in_query(query) {
                Some(raw) => answer(refusals_api::refusal(snapshot, raw)),
                None => answer(refusals_api::latest(snapshot)),
            },
            ("GET", path) if path.starts_with("/refusals/") => {
                answer(refusals_api::refusal(snapshot, &path["/refusals/".len()..]))
            }
            ("GET", "/config") => self.config(snapshot),
            ("GET", "/fleet") => match snapshot.store.fleet().await {
                Ok(instances) => json_response(
                    StatusCode::OK,
                    &json!({"store": snapshot.store.kind(), "instances": instances}),
                ),
                Err(e) => json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &json!({"error": format!("the store did not answer: {}", e.kind())}),
                ),
            },
            ("GET", "/reloads") => json_response(
                StatusCode::OK,
                &json!({
                    "kept": crate::control::history::KEPT,
                    "reloads": self.reloader.history(),
                }),
            ),
            ("POST", "/reload") => self.reload(actor).await,
            ("GET", "/readyz") => {
                let (ready, body) = self.readiness(snapshot);
                let status = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                json_response(status, &body)
            }
            (_, path) => json_response(
                StatusCode::NOT_FOUND,
                &json!({"error": "not found", "path": path}),
            ),
        }
    }
}
