//! The Pingora glue: the only module that touches a `Session`. Each hook reads what it needs
//! from the request, calls the plain functions of `chain.rs` and friends, and writes the
//! outcome back.
//!
//! Request path (DESIGN.md §2), as wired here:
//! `new_ctx` loads the live snapshot once → `request_filter`: request id, then the chain of
//! `chain.rs` (path check, route, per-IP bucket, API key, plan limits in the store) →
//! `upstream_peer`: round-robin pick of a healthy server (502 when none) →
//! `upstream_request_filter`: `X-Forwarded-For`, `X-Request-Id`, `X-Client-Id`, API key
//! removed → upstream → `response_filter`: `X-Request-Id`, rate-limit headers →
//! `fail_to_proxy`: problem+json for upstream failures (502/504).

pub mod conn;

use crate::chain::auth::{Client, API_KEY_HEADER};
use crate::chain::headers;
use crate::chain::identity;
use crate::chain::problem::{self, Kind};
use crate::chain::request_id;
use crate::chain::{self, LimitStatus, Reject};
use crate::clock::{Clock, MonotonicClock};
use crate::control::config::{Auth, FailureMode, HeadersMode};
use crate::control::snapshot::{Route, Snapshot, SnapshotHandle};
use crate::limit::store::CheckRequest;
use crate::limit::Policy;
use crate::ops::access_log::{AccessLog, Entry as AccessEntry};
use crate::ops::metrics::Outcome;
use crate::proxy::conn::GuardedStream;
use async_trait::async_trait;
use bytes::Bytes;
use http::header::{
    HeaderValue, ALLOW, AUTHORIZATION, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HOST,
    RETRY_AFTER, WWW_AUTHENTICATE,
};
use pingora::prelude::*;
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

/// Error type used when every server of a route's pool is unhealthy.
const NO_HEALTHY_UPSTREAM: ErrorType = ErrorType::Custom("no healthy upstream");

/// Header carrying the authenticated client id to the upstream (any incoming one is removed).
pub const CLIENT_ID_HEADER: &str = "x-client-id";

/// Response header naming the dry-run (shadow) limits that would have rejected the request.
pub const WOULD_LIMIT_HEADER: &str = "x-turnstile-would-limit";

/// The `X-Turnstile-Would-Limit` value, if any dry-run limit would have rejected.
fn would_limit_value(names: &[Arc<str>]) -> Option<HeaderValue> {
    if names.is_empty() {
        return None;
    }
    let joined: Vec<&str> = names.iter().map(|n| &**n).collect();
    HeaderValue::from_str(&joined.join(", ")).ok()
}

pub struct Gateway {
    snapshots: SnapshotHandle,
    clock: MonotonicClock,
    access_log: Arc<AccessLog>,
}

impl Gateway {
    pub fn new(snapshots: SnapshotHandle, access_log: Arc<AccessLog>) -> Gateway {
        Gateway {
            snapshots,
            clock: MonotonicClock,
            access_log,
        }
    }
}

/// Per-request state. Holds the snapshot the request started with.
pub struct RequestCtx {
    snapshot: Arc<Snapshot>,
    route: Option<usize>,
    request_id: HeaderValue,
    upstream_tries: usize,
    client: Option<Arc<Client>>,
    limits: LimitStatus,
    /// When the request was sent upstream (for the upstream latency histogram).
    upstream_sent: Option<Instant>,
    /// When the request started (for the access log).
    started: Instant,
    /// What the limiter did, for the access log.
    decision: &'static str,
    upstream_addr: Option<std::net::SocketAddr>,
    /// Request body bytes received so far.
    body_bytes: u64,
    /// Dry-run limits that would have rejected this request.
    would_limit: Vec<Arc<str>>,
    /// Concurrency slots held until the request ends.
    slots: Option<SlotGuard>,
    /// The normalised path the request was routed by, when it differs from the one received:
    /// the upstream gets this one.
    forward_path: Option<String>,
}

impl RequestCtx {
    fn route(&self) -> Option<&Route> {
        self.route.map(|i| &self.snapshot.routes[i])
    }
}

impl Gateway {
    /// Steps [1]–[5] of the chain; on `Err` the caller writes the rejection.
    async fn admit(&self, session: &Session, ctx: &mut RequestCtx) -> Result<(), Reject> {
        let req = session.req_header();
        // Only a chunked request can hide a second framing header (see check_message).
        let raw_head = req
            .headers
            .contains_key(http::header::TRANSFER_ENCODING)
            .then(|| session.as_http1().map(|h1| h1.get_headers_raw_bytes()))
            .flatten();
        chain::check_message(&ctx.snapshot.config.server.limits, req, raw_head.as_deref())?;
        let host = req
            .uri
            .host()
            .or_else(|| req.headers.get(HOST).and_then(|h| h.to_str().ok()));
        let (index, normalized) = chain::route(&ctx.snapshot, host, &req.method, req.uri.path())?;
        ctx.route = Some(index);
        ctx.forward_path = normalized;
        let snapshot = Arc::clone(&ctx.snapshot);
        let route = &snapshot.routes[index];
        chain::check_content_length(route, req)?;
        if route.ip_limiter.is_some() {
            let peer = session
                .client_addr()
                .and_then(PeerAddr::as_inet)
                .map(|a| a.ip());
            let now = self.clock.now_ms();
            let checked =
                chain::check_ip(&snapshot, route, peer, &req.headers, now, &mut ctx.limits);
            let shadow = route.config.shadow;
            let outcome = match (checked.is_ok(), shadow) {
                (true, _) => Outcome::Allowed,
                (false, false) => Outcome::Rejected,
                (false, true) => Outcome::ShadowRejected,
            };
            route
                .metrics
                .decision(crate::control::config::IP_POLICY_NAME, outcome);
            ctx.decision = outcome.as_str();
            if shadow {
                // A dry run: clients are not shown limits that are not enforced.
                ctx.limits = LimitStatus::default();
                if checked.is_err() {
                    ctx.would_limit
                        .push(Arc::from(crate::control::config::IP_POLICY_NAME));
                }
            } else if let Err(reject) = checked {
                route.metrics.ip_rejections.inc();
                return Err(reject);
            }
        }
        if route.config.auth == Auth::ApiKey {
            let client = chain::authenticate(&snapshot, &req.headers)
                .inspect_err(|_| ctx.decision = "unauthorized")?;
            let admitted = check_plan(&snapshot, route, &client, ctx).await;
            ctx.client = Some(client);
            admitted?;
        }
        Ok(())
    }
}

/// The policies a request of `client` on `route` is decided against, with their shadow flags:
/// the plan's (rate limits, client-wide concurrency), then the route's concurrency limit; on
/// a shadow route every one of them is a dry run.
fn request_policies<'a>(
    route: &Route,
    plan: &'a crate::chain::auth::Plan,
) -> (Cow<'a, [Policy]>, Cow<'a, [bool]>) {
    if route.concurrency.is_none() && !route.config.shadow {
        return (Cow::Borrowed(&plan.policies), Cow::Borrowed(&plan.shadow));
    }
    let mut policies = plan.policies.clone();
    let mut shadow = plan.shadow.clone();
    if let Some((policy, _)) = &route.concurrency {
        policies.push(policy.clone());
        shadow.push(false);
    }
    if route.config.shadow {
        shadow.iter_mut().for_each(|s| *s = true);
    }
    (Cow::Owned(policies), Cow::Owned(shadow))
}

/// [5]: the client's plan limits in the store, and the route's failure mode when the store
/// cannot decide. Decisions that feed headers are recorded in `ctx.limits`; a request admitted
/// with concurrency limits gets the guard that frees its slots when it ends.
async fn check_plan(
    snapshot: &Arc<Snapshot>,
    route: &Route,
    client: &Arc<Client>,
    ctx: &mut RequestCtx,
) -> Result<(), Reject> {
    let (policies, shadow) = request_policies(route, &client.plan);
    // Leasing needs the plan's own limits, all enforced: not on routes adding a concurrency
    // limit or dry-running everything.
    let lease = client
        .plan
        .lease
        .filter(|_| route.concurrency.is_none() && !route.config.shadow);
    let has_concurrency = policies.iter().any(Policy::is_concurrency);
    let lease_id = if has_concurrency {
        request_id::generate()
    } else {
        String::new()
    };
    let request = || CheckRequest {
        client: &client.id,
        route: &route.name,
        policies: &policies,
        shadow: &shadow,
        cost: route.config.cost,
        lease_id: &lease_id,
        now_ms: None,
        lease,
    };
    let (told, verdict, fallback) = match snapshot.store.check(request()).await {
        Ok(verdict) => (None, verdict, false),
        Err(error) => {
            let mode = route.config.on_store_error;
            snapshot.store.note_degraded(&error, mode.as_str());
            let outcome = match mode {
                FailureMode::FailOpen => Outcome::DegradedOpen,
                FailureMode::FailClosed => Outcome::DegradedClosed,
                FailureMode::Local => Outcome::LocalFallback,
            };
            for policy in policies.iter() {
                route.metrics.decision(&policy.name, outcome);
            }
            ctx.decision = outcome.as_str();
            match mode {
                FailureMode::FailOpen => return Ok(()),
                FailureMode::FailClosed => return Err(Reject::Store(error)),
                FailureMode::Local => {
                    // The client is told the divided limits it is actually held to.
                    let (divided, verdict) = snapshot.store.check_fallback(request());
                    (Some(divided), verdict, true)
                }
            }
        }
    };
    if !fallback {
        for ((policy, d), is_shadow) in policies.iter().zip(&verdict.decisions).zip(shadow.iter()) {
            let outcome = match (d.allowed, *is_shadow) {
                (true, _) => Outcome::Allowed,
                (false, false) => Outcome::Rejected,
                (false, true) => Outcome::ShadowRejected,
            };
            route.metrics.decision(&policy.name, outcome);
        }
        ctx.decision = if verdict.allowed() {
            "allowed"
        } else {
            "rejected"
        };
    }
    let told = told.as_deref().unwrap_or(&policies);
    // Headers show the enforced limits only; dry runs are named in X-Turnstile-Would-Limit.
    match (&told, fallback, route.config.shadow) {
        (_, _, true) => {}
        (divided, true, false) => {
            let enforced = divided
                .iter()
                .zip(shadow.iter())
                .filter(|(_, s)| !**s)
                .map(|(p, _)| p);
            let rendered = crate::chain::headers::policy_header(enforced);
            ctx.limits
                .push_policy_header(HeaderValue::from_str(&rendered).expect("header-safe names"));
        }
        (_, false, false) => {
            ctx.limits
                .push_policy_header(client.plan.policy_header.clone());
            if let Some((_, header)) = &route.concurrency {
                ctx.limits.push_policy_header(header.clone());
            }
        }
    }
    for ((policy, d), is_shadow) in told.iter().zip(&verdict.decisions).zip(shadow.iter()) {
        if !*is_shadow {
            ctx.limits.push(policy, *d);
        } else if !d.allowed {
            ctx.would_limit.push(Arc::clone(&policy.name));
        }
    }
    if !verdict.allowed() {
        return Err(Reject::TooManyRequests);
    }
    let held: Vec<Policy> = policies
        .iter()
        .zip(&verdict.decisions)
        .filter(|(p, d)| p.is_concurrency() && d.allowed)
        .map(|(p, _)| p.clone())
        .collect();
    if !held.is_empty() {
        ctx.slots = Some(SlotGuard {
            store: Arc::clone(&snapshot.store),
            client: Arc::clone(&client.id),
            route: Arc::clone(&route.name),
            policies: held,
            lease_id,
            fallback,
        });
    }
    Ok(())
}

/// Concurrency slots a request holds; dropping the guard (when the request's context is
/// dropped: response done, upstream failed, client gone) gives them back.
pub struct SlotGuard {
    store: Arc<crate::limit::store::Store>,
    client: Arc<str>,
    route: Arc<str>,
    policies: Vec<Policy>,
    lease_id: String,
    fallback: bool,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let store = Arc::clone(&self.store);
        let (client, route) = (Arc::clone(&self.client), Arc::clone(&self.route));
        let policies = std::mem::take(&mut self.policies);
        let lease_id = std::mem::take(&mut self.lease_id);
        let fallback = self.fallback;
        let release = async move {
            store
                .release(&client, &route, &policies, &lease_id, fallback)
                .await
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(release);
            }
            // No runtime (shutdown): Redis slots expire with their lease.
            Err(_) => log::debug!("no runtime to release concurrency slots"),
        }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    /// The request's headers are in: lift the connection's header deadline, bound pauses in
    /// the body, and set how long the connection may idle before the next request.
    async fn early_request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(guard) = GuardedStream::of(session.stream()) {
            guard.disarm();
        }
        let limits = &ctx.snapshot.config.server.limits;
        // Requests pipelined behind this one are answered in order on this connection
        // (RFC 9112 §9.3.2), each going through the whole chain, instead of being dropped
        // with a close.
        session.set_pipelining_enabled(true);
        session.set_read_timeout(Some(limits.body_timeout));
        // Only where the client asked to keep the connection (HTTP/1.1 by default, HTTP/1.0
        // with `Connection: keep-alive`): setting a timeout would turn keep-alive on.
        if session.get_keepalive().is_some() {
            session.set_keepalive(Some(limits.keepalive_timeout.as_secs().max(1)));
        }
        Ok(())
    }

    /// Counts the body as it streams: a chunked body larger than the route allows is cut
    /// off with 413 (or the connection closed, if the response has started).
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let Some(chunk) = body.as_ref() else {
            return Ok(());
        };
        ctx.body_bytes += chunk.len() as u64;
        let max = ctx.route().map_or(u64::MAX, |r| r.config.max_body_bytes);
        if ctx.body_bytes > max {
            return Err(Error::explain(
                ErrorType::HTTPStatus(413),
                format!("request body larger than {max} bytes"),
            ));
        }
        Ok(())
    }

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            snapshot: self.snapshots.load_full(),
            route: None,
            request_id: HeaderValue::from_static(""),
            upstream_tries: 0,
            client: None,
            limits: LimitStatus::default(),
            upstream_sent: None,
            started: Instant::now(),
            decision: "not_limited",
            upstream_addr: None,
            body_bytes: 0,
            would_limit: Vec::new(),
            slots: None,
            forward_path: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.request_id = match session.req_header().headers.get(request_id::HEADER) {
            Some(v) if request_id::is_acceptable(v.as_bytes()) => v.clone(),
            _ => {
                HeaderValue::from_str(&request_id::generate()).expect("generated ids are ASCII hex")
            }
        };
        match self.admit(session, ctx).await {
            Ok(()) => Ok(false),
            Err(reject) => {
                respond_reject(session, ctx, &reject).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        ctx.upstream_tries += 1;
        let snapshot = Arc::clone(&ctx.snapshot);
        let route = &snapshot.routes[ctx
            .route
            .expect("request_filter sets the route before proxying")];
        let Some(addr) = route.pool.select() else {
            return Err(Error::explain(
                NO_HEALTHY_UPSTREAM,
                format!(
                    "every server of upstream {:?} is failing its health check",
                    route.pool.config.name
                ),
            ));
        };
        ctx.upstream_addr = Some(addr);
        let mut peer = HttpPeer::new(addr, false, String::new());
        let options = &mut peer.options;
        options.connection_timeout = Some(route.config.connect_timeout);
        options.read_timeout = Some(route.config.read_timeout);
        options.write_timeout = Some(route.config.write_timeout);
        options.idle_timeout = Some(route.pool.config.keepalive_timeout);
        Ok(Box::new(peer))
    }

    /// A connect failure is retried on the next server of the pool (the request has not been
    /// sent yet, so this is safe for every method), at most once per server.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let Some(route) = ctx.route() {
            if ctx.upstream_tries < route.pool.len() {
                e.set_retry(true);
            }
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(peer_ip) = session
            .client_addr()
            .and_then(PeerAddr::as_inet)
            .map(|a| a.ip())
        {
            let forwarded = forwarded_for(
                upstream_request
                    .headers
                    .get_all("x-forwarded-for")
                    .iter()
                    .map(HeaderValue::as_bytes),
                peer_ip,
            );
            upstream_request.insert_header("x-forwarded-for", forwarded)?;
        }
        upstream_request.insert_header(request_id::HEADER, ctx.request_id.clone())?;
        if let Some(path) = &ctx.forward_path {
            // The upstream acts on the path the route was chosen by.
            let target = match upstream_request.uri.query() {
                Some(query) => format!("{path}?{query}"),
                None => path.clone(),
            };
            let uri = http::Uri::try_from(target).map_err(|e| {
                Error::because(ErrorType::InternalError, "normalised request path", e)
            })?;
            upstream_request.set_uri(uri);
        }
        ctx.upstream_sent = Some(Instant::now());
        // Only the gateway says who the client is, also to servers reading `_` as `-`.
        let aliases: Vec<String> =
            chain::underscore_aliases(upstream_request.headers.keys().map(|k| k.as_str()))
                .into_iter()
                .map(str::to_owned)
                .collect();
        for alias in aliases {
            upstream_request.remove_header(&alias);
        }
        upstream_request.remove_header(CLIENT_ID_HEADER);
        if let Some(client) = &ctx.client {
            upstream_request.insert_header(CLIENT_ID_HEADER, &*client.id)?;
        }
        let forward_key = ctx.route().is_some_and(|r| r.config.forward_api_key);
        if ctx.client.is_some() && !forward_key {
            // Every value: a key in any of them stays here.
            upstream_request.remove_header(API_KEY_HEADER);
            let bearer = upstream_request
                .headers
                .get_all(AUTHORIZATION)
                .iter()
                .any(|v| crate::chain::auth::bearer_token(v.as_bytes()).is_some());
            if bearer {
                upstream_request.remove_header(&AUTHORIZATION);
            }
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        _upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let (Some(sent), Some(route)) = (ctx.upstream_sent.take(), ctx.route()) {
            route.upstream_latency.observe(sent.elapsed().as_secs_f64());
        }
        Ok(())
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut RequestCtx) {
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .or_else(|| error.and_then(classify).map(Kind::status))
            .unwrap_or(0);
        match ctx.route() {
            Some(route) => route.metrics.request(status),
            None => ctx.snapshot.unrouted.request(status),
        }
        // The connection may carry another request: its headers get a fresh deadline.
        if let Some(guard) = GuardedStream::of(session.stream()) {
            let limits = &ctx.snapshot.config.server.limits;
            guard.arm(limits.keepalive_timeout + limits.header_timeout);
        }
        if self.access_log.wants(ctx.snapshot.config.access_log.mode) {
            self.access_log.log(access_entry(session, ctx, status));
        }
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        upstream_response.insert_header(request_id::HEADER, ctx.request_id.clone())?;
        if let Some(route) = ctx.route() {
            let show = match route.config.rate_limit_headers {
                HeadersMode::On => true,
                HeadersMode::Off => false,
                HeadersMode::NearLimit => {
                    headers::near_limit(ctx.limits.entries.iter().map(|(_, d)| d))
                }
            };
            if show && !ctx.limits.is_empty() {
                for (name, value) in ctx.limits.headers(route.config.legacy_rate_limit_headers) {
                    upstream_response.insert_header(name, value)?;
                }
            }
        }
        if let Some(value) = would_limit_value(&ctx.would_limit) {
            upstream_response.insert_header(WOULD_LIMIT_HEADER, value)?;
        }
        Ok(())
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let Some(kind) = classify(e) else {
            // The client is gone or sent garbage we cannot answer on; nothing to write.
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        };
        let detail = describe(kind, e, ctx);
        if session.response_written().is_none() {
            session.set_keepalive(None);
            let body = problem::render(kind, &detail, ctx.request_id.to_str().ok());
            if let Err(write_err) = write_problem(session, ctx, kind, body, Vec::new()).await {
                log::debug!("could not write {} response: {write_err}", kind.status());
            }
        }
        FailToProxy {
            error_code: kind.status(),
            can_reuse_downstream: false,
        }
    }
}

/// The access log line of a finished request.
fn access_entry(session: &Session, ctx: &RequestCtx, status: u16) -> AccessEntry {
    let req = session.req_header();
    let client_ip = session
        .client_addr()
        .and_then(PeerAddr::as_inet)
        .map(|peer| {
            let values = req.headers.get_all("x-forwarded-for");
            identity::client_ip(
                peer.ip(),
                values.iter().map(HeaderValue::as_bytes),
                &ctx.snapshot.config.server.trusted_proxies,
            )
        });
    AccessEntry {
        at_ms: crate::ops::access_log::unix_ms(),
        request_id: ctx.request_id.to_str().unwrap_or_default().to_owned(),
        method: req.method.as_str().to_owned(),
        path: req.uri.path().to_owned(),
        route: ctx.route().map(|r| Arc::clone(&r.name)),
        status,
        client_id: ctx.client.as_ref().map(|c| Arc::clone(&c.id)),
        client_ip,
        decision: ctx.decision,
        latency_ms: ctx.started.elapsed().as_secs_f64() * 1000.0,
        upstream: ctx.upstream_addr.map(|a| a.to_string()),
    }
}

/// Maps a proxying error to the problem reported to the client; `None` when the downstream
/// connection is dead and nothing can be written.
pub fn classify(e: &Error) -> Option<Kind> {
    use ErrorType::*;
    let etype = e.etype();
    if *etype == NO_HEALTHY_UPSTREAM {
        return Some(Kind::NoHealthyUpstream);
    }
    if let HTTPStatus(code) = etype {
        return Some(Kind::from_status(*code));
    }
    match e.esource() {
        ErrorSource::Upstream => Some(match etype {
            ConnectTimedout | ReadTimedout | WriteTimedout | TLSHandshakeTimedout => {
                Kind::UpstreamTimeout
            }
            _ => Kind::UpstreamUnavailable,
        }),
        ErrorSource::Downstream => match etype {
            ReadError | WriteError | ConnectionClosed => None,
            ReadTimedout | WriteTimedout => None,
            _ => Some(Kind::BadRequest),
        },
        ErrorSource::Internal | ErrorSource::Unset => Some(match etype {
            ConnectTimedout => Kind::UpstreamTimeout,
            ConnectRefused | ConnectNoRoute | ConnectError | SocketError => {
                Kind::UpstreamUnavailable
            }
            _ => Kind::Internal,
        }),
    }
}

fn describe(kind: Kind, e: &Error, ctx: &RequestCtx) -> String {
    let upstream = ctx.route().map_or("", |r| r.pool.config.name.as_str());
    match kind {
        Kind::NoHealthyUpstream => format!("no healthy server in upstream {upstream:?}"),
        Kind::UpstreamTimeout => format!("upstream {upstream:?} did not answer in time"),
        Kind::UpstreamUnavailable => format!(
            "upstream {upstream:?} could not be reached or failed ({})",
            e.etype().as_str()
        ),
        Kind::BadRequest => "the request could not be parsed".to_owned(),
        _ => kind.title().to_owned(),
    }
}

/// `X-Forwarded-For` for the upstream: the incoming list(s), then the TCP peer.
pub fn forwarded_for<'a>(
    existing: impl Iterator<Item = &'a [u8]>,
    peer: std::net::IpAddr,
) -> String {
    let mut out = String::new();
    for value in existing {
        let value = String::from_utf8_lossy(value);
        let value = value.trim();
        if !value.is_empty() {
            out.push_str(value);
            out.push_str(", ");
        }
    }
    out.push_str(&peer.to_string());
    out
}

/// Writes the response for a request the chain rejected. Rejections keep the connection
/// open (a client told to slow down should not also pay for a new handshake), except for
/// malformed requests.
async fn respond_reject(session: &mut Session, ctx: &RequestCtx, reject: &Reject) -> Result<()> {
    let kind = reject.kind();
    let request_id = ctx.request_id.to_str().ok();
    let mut extra: Vec<(http::HeaderName, HeaderValue)> = Vec::new();
    let body = match reject {
        Reject::TooManyRequests => {
            let legacy = ctx
                .route()
                .is_some_and(|r| r.config.legacy_rate_limit_headers);
            for (name, value) in ctx.limits.headers(legacy) {
                extra.push((http::HeaderName::from_static(name), value));
            }
            extra.push((
                RETRY_AFTER,
                HeaderValue::from(ctx.limits.retry_after_secs()),
            ));
            problem::render_with_policies(
                kind,
                &reject.detail(),
                request_id,
                &ctx.limits.violated(),
            )
        }
        Reject::Store(_) => {
            // Short: the store is usually back (or the breaker decides) within a second.
            extra.push((RETRY_AFTER, HeaderValue::from_static("1")));
            problem::render(kind, &reject.detail(), request_id)
        }
        Reject::MethodNotAllowed { allow, .. } => {
            if let Ok(allow) = HeaderValue::from_str(allow) {
                extra.push((ALLOW, allow));
            }
            problem::render(kind, &reject.detail(), request_id)
        }
        Reject::Key(_) | Reject::UnknownKey if kind == Kind::Unauthorized => {
            extra.push((
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"turnstile\""),
            ));
            problem::render(kind, &reject.detail(), request_id)
        }
        _ => problem::render(kind, &reject.detail(), request_id),
    };
    if let Some(value) = would_limit_value(&ctx.would_limit) {
        extra.push((http::HeaderName::from_static(WOULD_LIMIT_HEADER), value));
    }
    if chain::closes_connection(reject) {
        session.set_keepalive(None);
    }
    write_problem(session, ctx, kind, body, extra).await
}

async fn write_problem(
    session: &mut Session,
    ctx: &RequestCtx,
    kind: Kind,
    body: Vec<u8>,
    extra: Vec<(http::HeaderName, HeaderValue)>,
) -> Result<()> {
    let mut resp = ResponseHeader::build(kind.status(), Some(6 + extra.len()))?;
    resp.insert_header(CONTENT_TYPE, problem::CONTENT_TYPE)?;
    resp.insert_header(CONTENT_LENGTH, body.len())?;
    resp.insert_header(CACHE_CONTROL, "no-store")?;
    resp.insert_header(request_id::HEADER, ctx.request_id.clone())?;
    for (name, value) in extra {
        resp.insert_header(name, value)?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_appends_the_peer() {
        let peer = "10.0.0.9".parse().unwrap();
        assert_eq!(forwarded_for(std::iter::empty(), peer), "10.0.0.9");
        let existing: [&[u8]; 2] = [b"1.1.1.1, 2.2.2.2", b" 3.3.3.3 "];
        assert_eq!(
            forwarded_for(existing.into_iter(), peer),
            "1.1.1.1, 2.2.2.2, 3.3.3.3, 10.0.0.9"
        );
    }

    #[test]
    fn upstream_errors_map_to_502_and_504() {
        let timeout = Error::new(ErrorType::ReadTimedout).into_up();
        assert_eq!(classify(&timeout), Some(Kind::UpstreamTimeout));
        let connect = Error::new(ErrorType::ConnectTimedout).into_up();
        assert_eq!(classify(&connect), Some(Kind::UpstreamTimeout));
        let refused = Error::new(ErrorType::ConnectRefused).into_up();
        assert_eq!(classify(&refused), Some(Kind::UpstreamUnavailable));
        let closed = Error::new(ErrorType::ConnectionClosed).into_up();
        assert_eq!(classify(&closed), Some(Kind::UpstreamUnavailable));
        let none = Error::explain(NO_HEALTHY_UPSTREAM, "x");
        assert_eq!(classify(&none), Some(Kind::NoHealthyUpstream));
    }

    #[test]
    fn dead_downstreams_get_no_response() {
        let gone = Error::new(ErrorType::ConnectionClosed).into_down();
        assert_eq!(classify(&gone), None);
        let garbage = Error::new(ErrorType::InvalidHTTPHeader).into_down();
        assert_eq!(classify(&garbage), Some(Kind::BadRequest));
    }
}
