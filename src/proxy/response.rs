//! The response phases: `response_filter` (the route's `response_headers` rules, request id and `RateLimit` headers on proxied
//! responses), our own answers (rejections and upstream failures as problem+json), and
//! `logging` (metrics, the access log, the next request's header deadline).

use crate::chain::forward::X_FORWARDED_FOR;
use crate::chain::header_rules::Vars;
use crate::chain::headers::{self, would_limit_value, HeadersMode, WOULD_LIMIT};
use crate::chain::identity;
use crate::chain::jwt::verify::TokenError;
use crate::chain::problem::{self, Kind};
use crate::chain::reject::{closes_connection, Reject};
use crate::chain::request_id;
use crate::chain::upstream_error::{classify, describe};
use crate::ops::access_log::{unix_ms, AccessLog, Record};
use crate::ops::trace::span::Facts;
use crate::ops::trace::Tracer;
use crate::proxy::conn::GuardedStream;
use crate::proxy::context::RequestCtx;
use crate::proxy::response_head::edit_response;
use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ALLOW, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER,
    WWW_AUTHENTICATE,
};
use pingora::http::ResponseHeader;
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::proxy::{FailToProxy, Session};
use pingora::{Error, Result};
use std::sync::Arc;
use std::time::Instant;

/// A proxied response: the request id, the `RateLimit` headers (per the route's
/// `rate_limit_headers`), and the dry-run limits that would have rejected it — names as
/// `[server] response_header_case` says (`response_head.rs`).
pub fn response_filter(
    response: &mut ResponseHeader,
    ctx: &RequestCtx,
    session: &Session,
) -> Result<()> {
    let case = ctx.snapshot.config.server.response_header_case;
    let rules = ctx
        .route()
        .and_then(|r| Some((r, r.config.response_headers.as_deref()?)));
    let client_ip = rules.and_then(|_| crate::proxy::request::client_addr(session, ctx));
    edit_response(response, case, |head| {
        // The route's rules first: no rule may name the gateway's headers below (checked at
        // load), and they are set after, whatever the upstream said.
        if let Some((route, rules)) = rules {
            let vars = Vars {
                client_id: ctx.client_name(),
                plan: ctx.client.as_ref().map(|c| &*c.plan.name),
                route: &route.rules.name,
                request_id: &ctx.request_id,
                client_ip,
            };
            head.apply(rules, &vars)?;
        }
        head.set(&request_id::NAME, ctx.request_id.clone())?;
        let limits = &ctx.admission.limits;
        if let Some(route) = ctx.route() {
            let show = match route.config.rate_limit_headers {
                HeadersMode::On => true,
                HeadersMode::Off => false,
                HeadersMode::NearLimit => {
                    headers::near_limit(limits.entries.iter().map(|(_, d)| d))
                }
            };
            if show && !limits.is_empty() {
                for (name, value) in limits.headers(route.config.legacy_rate_limit_headers) {
                    head.set(name, value)?;
                }
            }
        }
        if let Some(value) = would_limit_value(&ctx.admission.would_limit) {
            head.set(&WOULD_LIMIT, value)?;
        }
        if let Some(waited) = ctx.waited_ms {
            head.set(&DELAY, HeaderValue::from(waited))?;
        }
        if let Some(cors) = ctx.route().and_then(|r| r.config.cors.as_deref()) {
            let origin = crate::proxy::cors::allowed(ctx, session).map(|(_, o)| o);
            head.cors(cors, origin)?;
        }
        Ok(())
    })
}

/// On a response a leaky bucket held: how long it waited for its turn (milliseconds).
pub static DELAY: HeaderName = HeaderName::from_static("x-turnstile-delay-ms");

/// Writes the response for a request the chain rejected. Rejections keep the connection open
/// (a client told to slow down should not also pay for a new handshake), except for
/// malformed requests.
pub async fn respond_reject(
    session: &mut Session,
    ctx: &mut RequestCtx,
    reject: &Reject,
) -> Result<()> {
    let kind = reject.kind();
    let request_id = ctx.request_id.to_str().ok();
    let limits = &ctx.admission.limits;
    let mut extra: Vec<(HeaderName, HeaderValue)> = Vec::new();
    let body = match reject {
        Reject::TooManyRequests => {
            let legacy = ctx
                .route()
                .is_some_and(|r| r.config.legacy_rate_limit_headers);
            for (name, value) in limits.headers(legacy) {
                extra.push((name.clone(), value));
            }
            extra.push((RETRY_AFTER, HeaderValue::from(limits.retry_after_secs())));
            problem::render_with_policies(kind, &reject.detail(), request_id, &limits.violated())
        }
        Reject::Store(_)
        | Reject::Overloaded(_)
        | Reject::TooManyWaiting
        | Reject::WaitingShareTaken
        | Reject::Token(TokenError::TooManyFailures) => {
            // Short: the store is usually back (or the breaker decides) within a second, and a
            // shedding pool's limit moves every window.
            extra.push((RETRY_AFTER, HeaderValue::from_static("1")));
            problem::render(kind, &reject.detail(), request_id)
        }
        Reject::MethodNotAllowed { allow, .. } => {
            if let Ok(allow) = HeaderValue::from_str(allow) {
                extra.push((ALLOW, allow));
            }
            problem::render(kind, &reject.detail(), request_id)
        }
        Reject::Token(TokenError::NoKeys) => {
            extra.push((RETRY_AFTER, HeaderValue::from_static("5")));
            problem::render(kind, &reject.detail(), request_id)
        }
        Reject::Token(e) => {
            // RFC 6750 §3: the error code, and a description that never quotes the token.
            let challenge = format!(
                "Bearer realm=\"turnstile\", error=\"invalid_token\", error_description=\"{}\"",
                e.detail().replace('"', "'")
            );
            if let Ok(value) = HeaderValue::try_from(challenge) {
                extra.push((WWW_AUTHENTICATE, value));
            }
            problem::render(kind, &reject.detail(), request_id)
        }
        Reject::Key(_) | Reject::Credential(_) if kind == Kind::Unauthorized => {
            extra.push((
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"turnstile\""),
            ));
            problem::render(kind, &reject.detail(), request_id)
        }
        _ => problem::render(kind, &reject.detail(), request_id),
    };
    if let Some(value) = would_limit_value(&ctx.admission.would_limit) {
        extra.push((WOULD_LIMIT.clone(), value));
    }
    if matches!(reject, Reject::TooManyRequests | Reject::Store(_)) {
        record_refusal(session, ctx, reject, kind);
    }
    if closes_connection(reject) {
        session.set_keepalive(None);
    }
    if let Some(flavor) = ctx.grpc {
        return crate::proxy::grpc::answer(session, ctx, flavor, kind, &reject.detail(), extra)
            .await;
    }
    write_problem(session, ctx, kind, body, extra).await
}

/// Proxying failed (upstream unreachable, timed out, no healthy server): a problem+json
/// answer if nothing was written yet; the connection is not reused.
pub async fn fail_to_proxy(session: &mut Session, e: &Error, ctx: &mut RequestCtx) -> FailToProxy {
    let Some(kind) = classify(e) else {
        // The client is gone or sent garbage we cannot answer on; nothing to write.
        return FailToProxy {
            error_code: 0,
            can_reuse_downstream: false,
        };
    };
    let upstream = ctx.pool().map_or("", |p| p.config.name.as_str());
    let detail = describe(kind, e, upstream);
    if session.response_written().is_none() {
        session.set_keepalive(None);
        let written = if let Some(flavor) = ctx.grpc {
            crate::proxy::grpc::answer(session, ctx, flavor, kind, &detail, Vec::new()).await
        } else {
            let body = problem::render(kind, &detail, ctx.request_id.to_str().ok());
            write_problem(session, ctx, kind, body, Vec::new()).await
        };
        if let Err(write_err) = written {
            log::debug!("could not write {} response: {write_err}", kind.status());
        }
    }
    FailToProxy {
        error_code: kind.status(),
        can_reuse_downstream: false,
    }
}

async fn write_problem(
    session: &mut Session,
    ctx: &RequestCtx,
    kind: Kind,
    body: Vec<u8>,
    extra: Vec<(HeaderName, HeaderValue)>,
) -> Result<()> {
    // No case map: Pingora writes the standard names titled and ours lower-case, the same
    // bytes a case map would record (`response_head.rs`), without keeping one.
    let mut extra = extra;
    crate::proxy::cors::on_own_answer(ctx, session, &mut extra);
    let mut resp = ResponseHeader::build_no_case(kind.status(), Some(6 + extra.len()))?;
    resp.insert_header(CONTENT_TYPE, problem::CONTENT_TYPE)?;
    resp.insert_header(CONTENT_LENGTH, body.len())?;
    resp.insert_header(CACHE_CONTROL, "no-store")?;
    resp.insert_header(request_id::NAME.clone(), ctx.request_id.clone())?;
    for (name, value) in extra {
        resp.insert_header(name, value)?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await
}

/// The request is over: count it, log it, and give the connection's next request a fresh
/// header deadline.
pub fn logging(
    access_log: &AccessLog,
    tracer: Option<&Tracer>,
    session: &Session,
    error: Option<&Error>,
    ctx: &RequestCtx,
) {
    // A gRPC call the gateway answered itself is counted by the HTTP answer's status (its
    // wire status is 200, which would hide every rejection).
    let status = ctx
        .grpc_answer
        .map(Kind::status)
        .or_else(|| session.response_written().map(|r| r.status.as_u16()))
        .or_else(|| error.and_then(classify).map(Kind::status))
        .unwrap_or(0);
    let metrics = match ctx.route() {
        Some(route) => &route.metrics,
        None => &ctx.snapshot.unrouted,
    };
    metrics.request(status);
    let now = Instant::now();
    metrics
        .duration
        .observe(now.saturating_duration_since(ctx.started).as_secs_f64());
    // The connection may carry another request: it may idle, then its headers get a deadline.
    if let Some(guard) = GuardedStream::of(session.stream()) {
        let limits = &ctx.snapshot.config.server.limits;
        guard.arm_idle(now, limits.keepalive_timeout, limits.header_timeout);
    }
    if access_log.wants(ctx.snapshot.config.access_log.mode) {
        access_log.log(access_entry(session, ctx, status));
    }
    if let (Some(tracer), Some(trace)) = (tracer, ctx.trace.as_ref().filter(|t| t.sampled)) {
        tracer.submit(trace.finish(&trace_facts(session, ctx, status)));
    }
}

/// What a finished request's spans say about it.
fn trace_facts<'a>(session: &'a Session, ctx: &'a RequestCtx, status: u16) -> Facts<'a> {
    let req = session.req_header();
    Facts {
        method: req.method.as_str(),
        route: ctx.route().map(|r| &*r.rules.name),
        path: req.uri.path(),
        status,
        decision: ctx.admission.outcome.as_str(),
        limited_by: ctx.admission.limits.violated().first().copied(),
        client: ctx.client.as_ref().map(|c| &*c.id),
        store_kind: ctx.snapshot.store.kind(),
        upstream_addr: ctx.upstream_addr.map(|a| a.to_string()),
        upstream_pool: ctx.pool().map(|p| p.config.name.as_str()),
        upstream_attempts: ctx.attempts,
    }
}

/// Keeps a limiter's refusal for `GET /refusals/{request_id}` and `GET /limited`.
fn record_refusal(session: &Session, ctx: &RequestCtx, reject: &Reject, kind: Kind) {
    use crate::ops::refusals::{Refusal, RefusedLimit};
    let limits = &ctx.admission.limits;
    let violated = limits.violated();
    let refused = limits
        .entries
        .iter()
        .filter(|(p, _)| violated.contains(&&*p.name))
        .map(|(p, d)| RefusedLimit {
            name: p.name.to_string(),
            limit: d.limit,
            remaining: d.remaining,
            reset_ms: d.reset_ms,
            retry_after_ms: d.retry_after_ms,
            key: ctx
                .admission
                .refused_keys
                .iter()
                .find(|(name, _)| *name == p.name)
                .map(|(_, key)| key.to_string()),
        })
        .collect();
    let caller = match (&ctx.client, client_ip(session, ctx)) {
        (Some(client), _) => ["client:", &client.id].concat(),
        (None, Some(ip)) => format!("address:{ip}"),
        (None, None) => "unknown".to_owned(),
    };
    let now = unix_ms();
    let refusal = Refusal {
        request_id: ctx.request_id.to_str().unwrap_or_default().to_owned(),
        at_unix_ms: now,
        status: kind.status(),
        route: ctx.route().map_or("", |r| &*r.rules.name).to_owned(),
        caller,
        reason: reject.detail(),
        limits: refused,
        retry_after_s: match reject {
            Reject::TooManyRequests => limits.retry_after_secs(),
            _ => 1,
        },
        instance: ctx.snapshot.store.instance_id().to_owned(),
    };
    ctx.snapshot.refusals.record(refusal, now);
}

/// The caller's address: the peer, or what a trusted proxy before it says (`X-Forwarded-For`).
fn client_ip(session: &Session, ctx: &RequestCtx) -> Option<std::net::IpAddr> {
    let peer = session.client_addr().and_then(PeerAddr::as_inet)?;
    let values = session.req_header().headers.get_all(&X_FORWARDED_FOR);
    Some(identity::client_ip(
        peer.ip(),
        values.iter().map(HeaderValue::as_bytes),
        &ctx.snapshot.config.server.trusted_proxies,
    ))
}

/// The access log line of a finished request.
fn access_entry(session: &Session, ctx: &RequestCtx, status: u16) -> Record {
    let req = session.req_header();
    let client_ip = client_ip(session, ctx);
    Record {
        at_ms: unix_ms(),
        request_id: ctx.request_id.to_str().unwrap_or_default().to_owned(),
        method: req.method.as_str().to_owned(),
        path: req.uri.path().to_owned(),
        route: ctx.route().map(|r| Arc::clone(&r.rules.name)),
        status,
        client_id: ctx.client.as_ref().map(|c| Arc::clone(&c.id)),
        client_ip,
        decision: ctx.admission.outcome.as_str(),
        limited_by: ctx
            .admission
            .limits
            .violated()
            .first()
            .map(|name| Arc::from(*name)),
        latency_ms: ctx.started.elapsed().as_secs_f64() * 1000.0,
        upstream: ctx.upstream_addr.map(|a| a.to_string()),
        attempts: ctx.attempts,
        trace_id: ctx.trace.as_ref().map(|t| t.trace_id.to_hex()),
    }
}

/// Pingora's ERROR "Fail to proxy" for an end that is no failure of the gateway's: an upgraded
/// connection (a WebSocket) closed because a side was silent for the route's
/// `upgrade_idle_timeout` — said instead at INFO, by its name. `true`: Pingora's line is not
/// written.
pub fn said_otherwise(ctx: &RequestCtx, error: &pingora::Error) -> bool {
    if !ctx.tunnel || !matches!(error.etype(), pingora::ErrorType::ReadTimedout) {
        return false;
    }
    let Some(route) = ctx.route() else {
        return false;
    };
    let side = match error.esource() {
        pingora::ErrorSource::Upstream => "upstream",
        _ => "client",
    };
    log::info!(
        "route {}: upgraded connection closed: the {side} sent nothing for upgrade_idle_timeout ({:?})",
        route.config.name,
        route.config.upgrade_idle_timeout
    );
    true
}
