//! The upstream phases: `upstream_peer` (a healthy server of the route's pool),
//! `fail_to_connect` (retry on the next server), `upstream_request_filter` (what the upstream
//! receives) and `upstream_response_filter` (its latency).

use crate::chain::credential::TokenFrom;
use crate::chain::forward::{forward, Forward};
use crate::chain::forwarded::Origin;
use crate::chain::header_rules::Vars;
use crate::chain::upstream_error::{self, NO_HEALTHY_UPSTREAM};
use crate::chain::{grpc, rewrite};
use crate::ops::trace::context::{traceparent, TRACEPARENT, TRACESTATE};
use crate::proxy::context::RequestCtx;
use crate::proxy::grpc::GRPC_TIMEOUT;
use crate::proxy::upstream_head::{edit_head, RuleEdit};
use crate::upstream::balance::InFlight;
use crate::upstream::config::HeaderCase;
use crate::upstream::outlier::Attempt;
use http::header::{HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::proxy::Session;
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType, Result};
use std::sync::Arc;
use std::time::Instant;

/// The next healthy server of the route's pool (502 when none is).
pub fn upstream_peer(ctx: &mut RequestCtx) -> Result<Box<HttpPeer>> {
    ctx.upstream_tries += 1;
    let snapshot = Arc::clone(&ctx.snapshot);
    let route = &snapshot.routes[ctx
        .route
        .expect("request_filter sets the route before proxying")];
    let Some(pool) = &route.pool else {
        // A route that answers itself never gets here (`proxy/answer.rs`).
        return Err(Error::explain(
            NO_HEALTHY_UPSTREAM,
            "the route has no upstream",
        ));
    };
    // A retry (or a connect tried again) goes to another server than the last try's.
    let Some(server) = pool.select(ctx.upstream_addr) else {
        return Err(Error::explain(
            NO_HEALTHY_UPSTREAM,
            format!(
                "every server of upstream {:?} is failing its health check",
                pool.config.name
            ),
        ));
    };
    ctx.upstream_addr = Some(server.addr);
    // A retried connect moves the count to the new server (the old guard drops).
    ctx.in_flight = server.load.as_ref().map(InFlight::start);
    let mut peer = match &pool.tls {
        Some(tls) => {
            let sni = tls.sni.clone().unwrap_or_else(|| server.name());
            let mut peer = HttpPeer::new(server.addr, true, sni);
            peer.options.verify_cert = tls.verify;
            peer.options.verify_hostname = tls.verify;
            peer.options.ca = tls.ca.clone();
            peer.client_cert_key = tls.client_cert.clone();
            peer.group_key = tls.group_key;
            peer
        }
        None => HttpPeer::new(server.addr, false, String::new()),
    };
    if pool.config.http2 {
        // h2 only: by ALPN over TLS, with prior knowledge without (gRPC needs HTTP/2).
        peer.options.set_http_version(2, 2);
    }
    // A gRPC call's deadline bounds every wait for the upstream.
    let left = match ctx.deadline {
        Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Some(left),
            _ => {
                return Err(Error::explain(
                    ErrorType::ConnectTimedout,
                    "the call's grpc-timeout passed before it was sent upstream",
                ))
            }
        },
        None => None,
    };
    // And a retrying route's per-try timeout bounds each try's reads and writes.
    let per_try = route.config.retry.as_ref().and_then(|r| r.per_try_timeout);
    let left = match (left, per_try) {
        (Some(l), Some(p)) => Some(l.min(p)),
        (l, p) => l.or(p),
    };
    let within = |timeout: std::time::Duration| Some(left.map_or(timeout, |l| l.min(timeout)));
    let options = &mut peer.options;
    options.connection_timeout = within(route.config.connect_timeout);
    // An upgrade request's reads wait as long as an upgraded connection may idle.
    options.read_timeout = within(match ctx.upgrade {
        true => route.config.upgrade_idle_timeout,
        false => route.config.read_timeout,
    });
    options.write_timeout = within(route.config.write_timeout);
    options.idle_timeout = Some(pool.config.keepalive_timeout);
    Ok(Box::new(peer))
}

/// A connect failure is retried on the next server of the pool (the request has not been
/// sent yet, so this is safe for every method), at most once per server.
pub fn fail_to_connect(ctx: &RequestCtx, mut e: Box<Error>) -> Box<Error> {
    if let (Some(pool), Some(addr), Some(attempt)) = (
        ctx.pool(),
        ctx.upstream_addr,
        upstream_error::attempt(&e, true),
    ) {
        pool.record(addr, attempt);
    }
    if let Some(pool) = ctx.pool() {
        if ctx.upstream_tries < pool.len() {
            e.set_retry(true);
        }
    }
    e
}

/// What the upstream receives (`chain::forward`'s policy, applied to Pingora's request
/// header), and the trace context it continues.
pub fn upstream_request_filter(
    session: &Session,
    upstream_request: &mut RequestHeader,
    ctx: &mut RequestCtx,
) -> Result<()> {
    let forward_api_key = ctx.route().is_some_and(|r| r.config.forward_api_key);
    let route = ctx.route.map(|i| &ctx.snapshot.routes[i]);
    let token = ctx
        .token
        .as_ref()
        .zip(route)
        .map(|(_, r)| (&r.config.token_from, r.config.forward_token));
    let claims: Vec<(&http::HeaderName, Option<&str>)> = match (route, ctx.token.as_deref()) {
        (Some(r), Some(t)) => r
            .config
            .forward_claims
            .iter()
            .map(|(name, claim)| (name, t.claim(claim)))
            .collect(),
        (Some(r), None) => r
            .config
            .forward_claims
            .iter()
            .map(|(n, _)| (n, None))
            .collect(),
        _ => Vec::new(),
    };
    let peer = session
        .client_addr()
        .and_then(PeerAddr::as_inet)
        .map(|a| a.ip());
    let req = session.req_header();
    let origin = Origin {
        peer,
        trusted: peer.is_some_and(|ip| ctx.snapshot.config.server.trusted_proxies.contains(ip)),
        tls: session.digest().is_some_and(|d| d.ssl_digest.is_some()),
        host: req.uri.authority().map(|a| a.as_str()).or_else(|| {
            req.headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        }),
        prefix: route.and_then(|r| rewrite::stripped(&r.config.path_prefix, r.config.strip_prefix)),
        forwarded: route.is_some_and(|r| r.config.forwarded),
    };
    let policy = Forward {
        peer,
        request_id: &ctx.request_id,
        path: ctx.forward_path.as_deref(),
        client: ctx.client_name(),
        forward_api_key,
        token,
        claims: &claims,
        token_header: route.and_then(|r| match &r.config.token_from {
            TokenFrom::Header(name) => Some(name),
            _ => None,
        }),
        continued: ctx.continued,
        origin,
    };
    // The upstream learns how much of the caller's deadline is left.
    let deadline = ctx
        .deadline
        .map(|d| grpc::timeout_value(d.saturating_duration_since(Instant::now())));
    // The upstream continues the trace under the gateway's `upstream` span (also when not
    // sampled: the decision travels in the flags).
    let trace = ctx.trace.as_ref().map(|t| {
        (
            traceparent(t.trace_id, t.upstream_span, t.sampled),
            t.tracestate.as_ref(),
        )
    });
    let case = ctx.pool().map_or(HeaderCase::Lower, |pool| {
        if pool.config.http2 {
            HeaderCase::Lower
        } else {
            pool.config.header_case
        }
    });
    let rules = route.and_then(|r| r.config.request_headers.as_deref());
    let client_ip = rules.and_then(|_| crate::proxy::request::client_addr(session, ctx));
    edit_head(upstream_request, case, |head| {
        forward(&policy, head)?;
        if let (Some(rules), Some(route)) = (rules, route) {
            let vars = Vars {
                client_id: policy.client,
                plan: ctx.client.as_ref().map(|c| &*c.plan.name),
                route: &route.rules.name,
                request_id: &ctx.request_id,
                client_ip,
            };
            rules.apply(&vars, &mut RuleEdit(head))?;
        }
        if let Some(left) = deadline {
            head.set(&GRPC_TIMEOUT_NAME, value(left)?)?;
        }
        if let Some((parent, state)) = trace {
            head.set(&TRACEPARENT_NAME, value(parent)?)?;
            match state {
                Some(state) => head.set(&TRACESTATE_NAME, state.clone())?,
                None => head.remove(&TRACESTATE_NAME),
            }
        }
        Ok::<_, String>(())
    })
    .map_err(|e| Error::explain(ErrorType::InternalError, e))?;
    ctx.upstream_sent = Some(Instant::now());
    ctx.attempts += 1;
    if let Some(trace) = ctx.trace.as_mut() {
        if trace.sampled {
            trace.upstream = Some((Instant::now(), None));
        }
    }
    Ok(())
}

static GRPC_TIMEOUT_NAME: HeaderName = HeaderName::from_static(GRPC_TIMEOUT);
static TRACEPARENT_NAME: HeaderName = HeaderName::from_static(TRACEPARENT);
static TRACESTATE_NAME: HeaderName = HeaderName::from_static(TRACESTATE);

/// `text` as a header value, without a copy.
fn value(text: String) -> std::result::Result<HeaderValue, String> {
    HeaderValue::try_from(text).map_err(|e| e.to_string())
}

/// The upstream answered: how this try went counts for outlier detection.
pub fn record_answer(response: &ResponseHeader, ctx: &RequestCtx) {
    if let (Some(pool), Some(addr)) = (ctx.pool(), ctx.upstream_addr) {
        pool.record(addr, Attempt::Answered(response.status.as_u16()));
    }
}

/// The upstream answered: its latency, per pool, also the shedding controller's sample; the
/// cost the response reports is charged.
pub fn upstream_response_filter(response: &ResponseHeader, ctx: &mut RequestCtx) {
    crate::proxy::charge::charge_from_response(response, ctx);
    if let Some(trace) = ctx.sampled_trace() {
        if let Some((_, answered)) = trace.upstream.as_mut() {
            *answered = Some(Instant::now());
        }
        trace.upstream_status = Some(response.status.as_u16());
    }
    if let (Some(sent), Some(route)) = (ctx.upstream_sent.take(), ctx.route()) {
        let latency = sent.elapsed();
        if let Some(histogram) = &route.upstream_latency {
            histogram.observe(latency.as_secs_f64());
        }
        if let Some(permit) = ctx.permit.as_mut() {
            permit.record(latency);
        }
    }
}

/// The upstream's response has ended: its place in the pool is free for the next request
/// (rather than when the client has read everything).
pub fn upstream_response_body_filter(end_of_stream: bool, ctx: &mut RequestCtx) {
    if end_of_stream {
        ctx.permit = None;
        ctx.in_flight = None;
    }
}

/// The upstream switched protocols (a WebSocket): from here the connection is a tunnel. Its
/// client side may idle `upgrade_idle_timeout` (instead of `body_timeout`; the upstream side
/// got it at connect), its concurrency slots are kept for as long as it is open (as every
/// request's are), and its place in a shedding pool is freed (the handshake is what the gate
/// measured; a tunnel's lifetime is not a latency).
pub fn upgraded(session: &mut Session, ctx: &mut RequestCtx) {
    ctx.tunnel = true;
    if let Some(route) = ctx.route() {
        session.set_read_timeout(Some(route.config.upgrade_idle_timeout));
    }
    ctx.permit = None;
}

/// Proxying failed (the server's failure was counted by `error_while_proxy`): a timeout
/// waiting for the upstream is a latency sample too (the longest there is); a refused
/// connection is not (it says nothing about how busy the pool is).
pub fn upstream_failed(e: &Error, ctx: &mut RequestCtx) {
    let timed_out = *e.esource() == pingora::ErrorSource::Upstream
        && matches!(
            e.etype(),
            pingora::ErrorType::ReadTimedout | pingora::ErrorType::WriteTimedout
        );
    if let (true, Some(sent), Some(permit)) = (timed_out, ctx.upstream_sent.take(), &mut ctx.permit)
    {
        permit.record(sent.elapsed());
    }
    ctx.permit = None;
    ctx.in_flight = None;
}
