//! Every metric in one place (Prometheus, the `prometheus` crate, a registry of our own).
//!
//! Label values come from the configuration (route, upstream, server, policy names) or from
//! small fixed sets (outcome, result, status code), never from request input. Counters the
//! request path touches are resolved once per snapshot ([`RouteMetrics`]), so a request
//! increments atomics and never looks labels up.

use crate::chain::admission::Outcome;
use crate::limit::store::breaker::BreakerState;
use crate::limit::store::metrics::{StoreMetrics, CALL_RESULTS};
use crate::upstream::shed::Priority;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

pub struct Metrics {
    pub registry: Registry,
    requests: IntCounterVec,
    decisions: IntCounterVec,
    ip_rejections: IntCounterVec,
    address_refusals: IntCounterVec,
    client_refusals: IntCounterVec,
    preflights: IntCounterVec,
    store_duration: Histogram,
    store_calls: IntCounterVec,
    store_short_circuits: IntCounter,
    /// Decisions made from a local quota lease (or a remembered refusal), without a store call.
    lease_local: IntCounter,
    breaker_state: IntGaugeVec,
    breaker_transitions: IntCounterVec,
    /// Redis Cluster: each node's own breaker, and the slots it serves (set at scrape).
    node_breaker_state: IntGaugeVec,
    node_slots: IntGaugeVec,
    decide_path: IntGaugeVec,
    /// Redis Cluster: `MOVED` and `ASK` redirects followed.
    redirects: IntCounterVec,
    /// Batches (`batch.lua`): calls, decisions in them, the other members in them (charges,
    /// refunds, releases, quota questions), members sent alone after a batch was refused
    /// whole (set at scrape).
    batches: [IntCounter; 4],
    /// Redis: charges, refunds and releases sent again (`retried`) or `given_up`, by kind.
    settlements: IntCounterVec,
    /// Whole requests (first byte in to response done) per route.
    request_duration: HistogramVec,
    /// How long leaky buckets held requests before forwarding them, per route.
    delays: HistogramVec,
    /// When the configuration was last loaded or a reload failed (Unix seconds), and whether
    /// that attempt succeeded.
    pub reload_timestamp: prometheus::Gauge,
    pub reload_success: IntGauge,
    /// Per upstream pool and server.
    pub upstream: UpstreamMetrics,
    pub reloads: IntCounterVec,
    /// Admin requests refused for their token: `refused` (a wrong or missing token) and
    /// `throttled` (from an address that sent too many wrong ones lately).
    pub admin_auth_failures: IntCounterVec,
    pub config_version: IntGauge,
    pub config_info: IntGaugeVec,
    pub tracked_entries: IntGaugeVec,
    shed: IntCounterVec,
    /// Load shedding per upstream pool: limit, in_flight, queued (set at scrape).
    pub shedding: IntGaugeVec,
    /// Load shedding per upstream pool: the latency baseline and the last window's average.
    pub shedding_latency: GaugeVec,
    live_instances: IntGauge,
    pub access_log_dropped: IntCounter,
    trace_spans: IntCounterVec,
    /// Per issuer: fetches of its JWKS, its keys in use and when they were loaded.
    jwks: (IntCounterVec, IntGaugeVec, IntGaugeVec),
    /// `turnstile_token_checks_total`, resolved per result.
    token_checks: Vec<(&'static str, IntCounter)>,
    /// `turnstile_response_costs_total`, resolved per result.
    response_costs: Vec<(&'static str, IntCounter)>,
}

/// Upstream pools' metrics, per pool (and server).
pub struct UpstreamMetrics {
    /// From sending the request upstream to its response header.
    pub duration: HistogramVec,
    pub healthy: IntGaugeVec,
    /// Passive outlier ejection: ejections per pool, and which servers are out (at scrape).
    pub ejections: IntCounterVec,
    pub ejected: IntGaugeVec,
    /// Retries per pool and reason, and retries the pool's budget refused.
    pub retries: IntCounterVec,
    pub retry_budget_exhausted: IntCounterVec,
}

impl UpstreamMetrics {
    fn new(registry: &Registry) -> UpstreamMetrics {
        UpstreamMetrics {
            duration: histogram_vec(
                registry,
                "turnstile_upstream_duration_seconds",
                "Time from sending the request upstream to its response header, per upstream pool",
                &["upstream"],
            ),
            healthy: gauge_vec(
                registry,
                "turnstile_upstream_server_healthy",
                "1 when the server passes its health check (or has none), else 0",
                &["upstream", "server"],
            ),
            ejections: counter_vec(
                registry,
                "turnstile_upstream_ejections_total",
                "Servers taken out of rotation by passive outlier detection, per upstream pool",
                &["upstream"],
            ),
            ejected: gauge_vec(
                registry,
                "turnstile_upstream_server_ejected",
                "1 while a server is out of rotation (passive outlier detection), per upstream pool and server",
                &["upstream", "server"],
            ),
            retries: counter_vec(
                registry,
                "turnstile_upstream_retries_total",
                "Tries after the first, per upstream pool and reason (timeout, reset, or the status retried)",
                &["upstream", "reason"],
            ),
            retry_budget_exhausted: counter_vec(
                registry,
                "turnstile_upstream_retry_budget_exhausted_total",
                "Retries not made because the pool's retry budget was spent, per upstream pool",
                &["upstream"],
            ),
        }
    }
}

/// What a response's cost header made of a charged limit, and a charge that failed.
pub const RESPONSE_COST_RESULTS: [&str; 5] = ["charged", "capped", "missing", "invalid", "failed"];

/// The results a bearer token check is counted by.
pub const TOKEN_RESULTS: [&str; 13] = [
    "cached",
    "verified",
    "malformed",
    "algorithm",
    "issuer",
    "unknown_key",
    "signature",
    "expired",
    "not_yet_valid",
    "audience",
    "claims",
    "no_keys",
    "too_many_failures",
];

/// `collector`, registered in `registry` (its name unique there).
fn registered<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> C {
    registry
        .register(Box::new(collector.clone()))
        .expect("unique metric");
    collector
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    registered(registry, IntCounter::new(name, help).expect("valid metric"))
}

/// A latency histogram ([`LATENCY_BUCKETS`]) per `labels`.
fn histogram_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    registered(
        registry,
        HistogramVec::new(opts, labels).expect("valid metric"),
    )
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(
        registry,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(
        registry,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    registered(registry, IntGauge::new(name, help).expect("valid metric"))
}

/// Latency buckets from 50 µs (a loopback Redis call) to a minute (a slow upstream, a long
/// upload).
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0,
];

const BREAKER_STATES: [BreakerState; 3] = [
    BreakerState::Closed,
    BreakerState::Open,
    BreakerState::HalfOpen,
];

/// `turnstile_tls_handshake_failures_total{reason}`: `failed` (the handshake failed: refused
/// certificate, none where required, not TLS, the client left) or `timeout` — one process-wide
/// counter, counted by `ops::logging` and registered in every
/// [`Metrics`]' registry.
pub fn tls_handshake_failures() -> &'static prometheus::IntCounterVec {
    static COUNTER: OnceLock<prometheus::IntCounterVec> = OnceLock::new();
    COUNTER.get_or_init(|| {
        prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                "turnstile_tls_handshake_failures_total",
                "TLS handshakes the listener refused or that failed (bad or missing client certificate, not TLS, client gone), by reason: failed, timeout",
            ),
            &["reason"],
        )
        .expect("a valid metric")
    })
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        registered(&registry, tls_handshake_failures().clone());
        let store_duration = Histogram::with_opts(
            HistogramOpts::new(
                "turnstile_store_call_duration_seconds",
                "Duration of store calls that reached the store (answered, failed or timed out)",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let r = &registry;
        let metrics = Metrics {
            store_duration: registered(r, store_duration),
            store_short_circuits: counter(r, "turnstile_store_short_circuits_total", "Store calls not made because the circuit breaker was open"),
            lease_local: counter(r, "turnstile_lease_local_decisions_total", "Decisions made from a local quota lease or a remembered refusal, without a store call"),
            requests: counter_vec(r, "turnstile_requests_total", "Requests by route and response status", &["route", "status"]),
            decisions: counter_vec(r, "turnstile_limiter_decisions_total", "Limiter decisions by route, policy and outcome", &["route", "policy", "outcome"]),
            ip_rejections: counter_vec(r, "turnstile_ip_rejections_total", "Requests rejected by the per-IP limit", &["route"]),
            address_refusals: counter_vec(r, "turnstile_address_refusals_total", "Requests refused for their client address (allow_ips / deny_ips): by the server's rules (route \"(none)\") or the route's", &["route"]),
            preflights: counter_vec(r, "turnstile_cors_preflights_total", "CORS preflights the gateway answered on routes with cors: allowed (204) or refused (403)", &["route", "outcome"]),
            client_refusals: counter_vec(r, "turnstile_client_refusals_total", "Requests refused because the identified client may not call the route (allow_clients, allow_plans, deny_clients, deny_plans)", &["route"]),
            store_calls: counter_vec(r, "turnstile_store_calls_total", "Store calls that reached the store, by result (ok, timeout, unavailable, refused, protocol)", &["result"]),
            breaker_state: gauge_vec(r, "turnstile_circuit_breaker_state", "Store circuit breaker: 1 for the state it is in (closed, open, half_open), 0 for the others", &["state"]),
            request_duration: histogram_vec(r, "turnstile_request_duration_seconds", "Whole requests, from the gateway reading them to the response sent, per route (rejections included)", &["route"]),
            delays: histogram_vec(r, "turnstile_delay_seconds", "How long a leaky bucket held a request before it was forwarded, per route (its _count: requests delayed)", &["route"]),
            reload_timestamp: registered(r, prometheus::Gauge::new("turnstile_config_last_reload_timestamp_seconds", "When the configuration was last loaded or a reload of it failed (Unix time)").expect("valid metric")),
            reload_success: gauge(r, "turnstile_config_last_reload_success", "1 when the last load or reload of the configuration succeeded (or found it unchanged), 0 when it failed"),
            breaker_transitions: counter_vec(r, "turnstile_circuit_breaker_transitions_total", "Circuit breaker state changes, by the state entered", &["to"]),
            node_breaker_state: gauge_vec(r, "turnstile_store_node_breaker_state", "Redis Cluster: each node's own circuit breaker, 1 for the state it is in (closed, open, half_open)", &["node", "state"]),
            decide_path: gauge_vec(r, "turnstile_store_decide_path", "Redis: 1 for what decides now (module: turnstile's Redis module; lua: the scripts), 0 for the other (store.decide_with)", &["path"]),
            node_slots: gauge_vec(r, "turnstile_store_node_slots", "Redis Cluster: hash slots each node serves in this instance's slot map (0: a replica)", &["node"]),
            redirects: counter_vec(r, "turnstile_store_redirects_total", "Redis Cluster: calls sent again where a MOVED or ASK reply said", &["kind"]),
            batches: [
                counter(r, "turnstile_store_batches_total", "Redis: batch calls sent (several decisions that arrived while another call was in flight, decided in one call)"),
                counter(r, "turnstile_store_batched_decisions_total", "Redis: decisions sent in batch calls"),
                counter(r, "turnstile_store_batched_settlements_total", "Redis: charges (costs responses reported), refunds (shed requests), releases (concurrency slots) and quota questions sent in batch calls with the decisions"),
                counter(r, "turnstile_store_batch_fallbacks_total", "Redis: decisions, charges, refunds, releases and quota questions sent one by one after their batch was refused whole (a Cluster slot on the move, a Redis older than 7)"),
            ],
            settlements: counter_vec(r, "turnstile_store_settlements_total", "Redis: charges, refunds and releases of concurrency slots that failed and were sent again until acknowledged (retried), or given up (given_up: what they would fix had expired, the queue was full, or Redis refused them)", &["kind", "result"]),
            upstream: UpstreamMetrics::new(r),
            reloads: counter_vec(r, "turnstile_config_reloads_total", "Configuration reloads by result", &["result"]),
            admin_auth_failures: counter_vec(r, "turnstile_admin_auth_failures_total", "Admin requests refused for their token: refused (wrong or missing), throttled (too many wrong ones from the address lately)", &["outcome"]),
            config_version: gauge(r, "turnstile_config_version", "Number of configurations loaded since start (1 = the initial one)"),
            config_info: gauge_vec(r, "turnstile_config_info", "The loaded configuration's content hash (value 1)", &["hash"]),
            tracked_entries: gauge_vec(r, "turnstile_tracked_entries", "Entries held by in-process limiter tables (per-IP tables, local stores)", &["table"]),
            shed: counter_vec(r, "turnstile_shed_total", "Requests shed (503, never sent upstream) by upstream pool and priority", &["upstream", "priority"]),
            shedding: gauge_vec(r, "turnstile_shedding", "Load shedding per upstream pool: the concurrency limit (state=limit), requests in flight (in_flight) and waiting (queued)", &["upstream", "state"]),
            shedding_latency: registered(r, GaugeVec::new(Opts::new("turnstile_shedding_latency_seconds", "Load shedding per upstream pool: the latency baseline (kind=baseline) and the last window's average (kind=window)"), &["upstream", "kind"]).expect("valid metric")),
            live_instances: gauge(r, "turnstile_live_instances", "Gateway instances seen alive in the store's heartbeats (0 = unknown)"),
            access_log_dropped: counter(r, "turnstile_access_log_dropped_total", "Access log entries dropped because the writer could not keep up"),
            trace_spans: counter_vec(r, "turnstile_trace_spans_total", "Spans of sampled requests by fate: exported, dropped_queue (the export queue was full), dropped_export (the collector did not take them)", &["result"]),
            jwks: (
                counter_vec(r, "turnstile_jwks_fetches_total", "Fetches of an issuer's JWKS by result (ok; error: the keys in use stay)", &["issuer", "result"]),
                gauge_vec(r, "turnstile_jwks_keys", "Keys in use per issuer", &["issuer"]),
                gauge_vec(r, "turnstile_jwks_loaded_timestamp_seconds", "When the keys in use per issuer were loaded (Unix time; 0: never)", &["issuer"]),
            ),
            token_checks: {
                let v = counter_vec(r, "turnstile_token_checks_total", "Bearer tokens checked, by result: cached, verified, or why refused (malformed, algorithm, issuer, unknown_key, signature, expired, not_yet_valid, audience, claims, no_keys), or not checked (too_many_failures)", &["result"]);
                TOKEN_RESULTS.iter().map(|r| (*r, v.with_label_values(&[r]))).collect()
            },
            response_costs: {
                let v = counter_vec(r, "turnstile_response_costs_total", "Limits charged from a response's cost header, by result: charged, capped (above max_response_cost), missing / invalid (the estimate stood), failed (the store did not take the charge after retries)", &["result"]);
                RESPONSE_COST_RESULTS.iter().map(|r| (*r, v.with_label_values(&[r]))).collect()
            },
            registry,
        };
        metrics.register_process_and_build();
        metrics
    }

    /// `process_*` (CPU seconds, resident and virtual memory, open and max file descriptors,
    /// start time, threads; Linux) and `turnstile_build_info`.
    fn register_process_and_build(&self) {
        #[cfg(target_os = "linux")]
        self.registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("unique metric");
        let info = gauge_vec(
            &self.registry,
            "turnstile_build_info",
            "The running build (value 1): its version, the commit it was built from, and its build profile",
            &["version", "commit", "profile"],
        );
        let profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        };
        info.with_label_values(&[env!("CARGO_PKG_VERSION"), crate::COMMIT, profile])
            .set(1);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail on valid metrics");
        out
    }

    /// The breaker's current state (refreshed at every scrape).
    pub fn set_breaker_state(&self, state: BreakerState) {
        self.store().set_breaker_state(state);
    }

    /// Redis Cluster: each node's breaker and slots, and the redirects followed (at scrape).
    pub fn set_store_nodes(
        &self,
        nodes: &[crate::limit::store::redis::NodeStatus],
        (moved, ask): (u64, u64),
    ) {
        for node in nodes {
            for state in BREAKER_STATES {
                self.node_breaker_state
                    .with_label_values(&[node.addr.as_str(), state.as_str()])
                    .set(i64::from(node.breaker == state));
            }
            self.node_slots
                .with_label_values(&[node.addr.as_str()])
                .set(node.slots as i64);
        }
        for (kind, total) in [("moved", moved), ("ask", ask)] {
            let counter = self.redirects.with_label_values(&[kind]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// What decides on Redis now (`None`: the memory store).
    pub fn set_decide_path(&self, path: Option<&str>) {
        for each in ["module", "lua"] {
            self.decide_path
                .with_label_values(&[each])
                .set(i64::from(path == Some(each)));
        }
    }

    /// What the store's batches carried so far (at scrape).
    pub fn set_store_batches(&self, t: crate::limit::store::redis::BatchTotals) {
        let totals = [t.batches, t.decisions, t.settlements, t.alone];
        for (counter, total) in self.batches.iter().zip(totals) {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    pub fn set_store_settlements(
        &self,
        t: crate::limit::store::redis::settlements::SettlementTotals,
    ) {
        use crate::limit::store::redis::settlements::KINDS;
        for (i, kind) in KINDS.iter().enumerate() {
            let kind = format!("{kind:?}").to_ascii_lowercase();
            for (result, total) in [("retried", t.retried[i]), ("given_up", t.given_up[i])] {
                let counter = self.settlements.with_label_values(&[&kind, result]);
                counter.inc_by(total.saturating_sub(counter.get()));
            }
        }
    }

    fn breaker_gauges(&self) -> [IntGauge; 3] {
        BREAKER_STATES.map(|s| self.breaker_state.with_label_values(&[s.as_str()]))
    }

    /// The trace exporter's counters.
    pub fn trace_export(&self) -> crate::ops::trace::export::ExportCounters {
        let c = |result: &str| self.trace_spans.with_label_values(&[result]);
        crate::ops::trace::export::ExportCounters {
            exported: c("exported"),
            dropped_queue: c("dropped_queue"),
            dropped_export: c("dropped_export"),
        }
    }

    /// The store's handles, registered here (the store does not know the registry).
    pub fn store(&self) -> StoreMetrics {
        StoreMetrics {
            calls: CALL_RESULTS.map(|result| self.store_calls.with_label_values(&[result])),
            duration: self.store_duration.clone(),
            short_circuits: self.store_short_circuits.clone(),
            lease_local: self.lease_local.clone(),
            live_instances: self.live_instances.clone(),
            breaker_state: self.breaker_gauges(),
            breaker_transitions: BREAKER_STATES.map(|state| {
                self.breaker_transitions
                    .with_label_values(&[state.as_str()])
            }),
        }
    }

    /// An issuer's key source handles (the source does not know the registry).
    pub fn key_source(&self, issuer: &str) -> crate::chain::jwt::source::SourceMetrics {
        crate::chain::jwt::source::SourceMetrics {
            fetched: self.jwks.0.with_label_values(&[issuer, "ok"]),
            failed: self.jwks.0.with_label_values(&[issuer, "error"]),
            keys: self.jwks.1.with_label_values(&[issuer]),
            loaded_at: self.jwks.2.with_label_values(&[issuer]),
        }
    }

    /// Counts one bearer token check by its result (a fixed set of labels).
    pub fn token_checked(&self, result: &str) {
        if let Some((_, c)) = self.token_checks.iter().find(|(r, _)| *r == result) {
            c.inc();
        }
    }

    /// Counts one charged limit of a response by its result (a fixed set of labels).
    pub fn response_cost(&self, result: &str) {
        if let Some((_, c)) = self.response_costs.iter().find(|(r, _)| *r == result) {
            c.inc();
        }
    }

    /// The counters one route's requests touch, resolved now so requests never look them up.
    /// `upstream`: the route's pool when it sheds load.
    pub fn route(
        self: &Arc<Self>,
        route: &str,
        upstream: Option<&str>,
        policies: impl IntoIterator<Item = Arc<str>>,
    ) -> RouteMetrics {
        let decisions = policies
            .into_iter()
            .map(|policy| {
                let counters = Outcome::DECISIONS.map(|o| {
                    self.decisions
                        .with_label_values(&[route, &policy, o.as_str()])
                });
                (policy, counters)
            })
            .collect();
        RouteMetrics {
            route: route.to_owned(),
            metrics: Arc::clone(self),
            by_status: (0..STATUS_SLOTS).map(|_| OnceLock::new()).collect(),
            ip_rejections: self.ip_rejections.with_label_values(&[route]),
            address_refusals: self.address_refusals.with_label_values(&[route]),
            client_refusals: self.client_refusals.with_label_values(&[route]),
            preflights: [
                self.preflights.with_label_values(&[route, "allowed"]),
                self.preflights.with_label_values(&[route, "refused"]),
            ],
            duration: self.request_duration.with_label_values(&[route]),
            delay: self.delays.with_label_values(&[route]),
            decisions,
            shed: upstream
                .map(|up| Priority::ALL.map(|p| self.shed.with_label_values(&[up, p.as_str()]))),
        }
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

const STATUS_SLOTS: usize = 600;

pub struct RouteMetrics {
    route: String,
    metrics: Arc<Metrics>,
    /// One lazily created counter per status code (an atomic load once created).
    by_status: Box<[OnceLock<IntCounter>]>,
    pub ip_rejections: IntCounter,
    /// Requests refused by `allow_ips` / `deny_ips`.
    pub address_refusals: IntCounter,
    /// Requests refused by `allow_clients` / `allow_plans` / `deny_clients` / `deny_plans`.
    pub client_refusals: IntCounter,
    /// CORS preflights answered: allowed, refused.
    pub preflights: [IntCounter; 2],
    /// Whole requests on this route.
    pub duration: Histogram,
    /// Requests a leaky bucket held, and for how long.
    pub delay: Histogram,
    decisions: HashMap<Arc<str>, [IntCounter; 7], foldhash::fast::RandomState>,
    /// Shed requests of the route's pool, by priority (when it sheds load).
    shed: Option<[IntCounter; 3]>,
}

impl RouteMetrics {
    pub fn request(&self, status: u16) {
        let slot = usize::from(status).min(STATUS_SLOTS - 1);
        self.by_status[slot]
            .get_or_init(|| {
                self.metrics
                    .requests
                    .with_label_values(&[&self.route, &status.to_string()])
            })
            .inc();
    }

    pub fn shed(&self, priority: Priority) {
        if let Some(counters) = &self.shed {
            counters[priority as usize].inc();
        }
    }

    pub fn decision(&self, policy: &str, outcome: Outcome) {
        if let (Some(counters), Some(i)) = (self.decisions.get(policy), outcome.decision_index()) {
            counters[i].inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_counters_land_in_the_labelled_families() {
        let m = Arc::new(Metrics::new());
        let r = m.route("orders", None, [Arc::from("ip"), Arc::from("per-minute")]);
        r.request(200);
        r.request(200);
        r.request(429);
        r.decision("per-minute", Outcome::Rejected);
        r.decision("unknown-policy", Outcome::Rejected); // ignored, not a new label
        r.ip_rejections.inc();
        let text = String::from_utf8(m.render()).unwrap();
        assert!(
            text.contains(r#"turnstile_requests_total{route="orders",status="200"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"turnstile_requests_total{route="orders",status="429"} 1"#));
        assert!(text.contains(r#"turnstile_limiter_decisions_total{outcome="rejected",policy="per-minute",route="orders"} 1"#));
        assert!(text.contains(
            r#"turnstile_limiter_decisions_total{outcome="allowed",policy="ip",route="orders"} 0"#
        ));
        assert!(text.contains(r#"turnstile_ip_rejections_total{route="orders"} 1"#));
        assert!(!text.contains("unknown-policy"));
    }
}
