//! The downstream request phases: `early_request_filter` (deadlines and keep-alive),
//! `request_filter` (the chain: message, path, route, per-IP, API key, plan limits) and
//! `request_body_filter` (the body size as it streams).

use crate::chain::admission::Outcome;
use crate::chain::identity::{client_ip, group_key};
use crate::chain::reject::Reject;
use crate::chain::{auth, message, request_id, router};
use crate::clock::{Clock, MonotonicClock};
use crate::proxy::conn::GuardedStream;
use crate::proxy::context::RequestCtx;
use bytes::Bytes;
use http::header::{HeaderValue, HOST};
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};
use std::sync::Arc;

/// The request's headers are in: lift the connection's header deadline, bound pauses in the
/// body, answer pipelined requests in order, and set how long the connection may idle.
pub fn early_request_filter(session: &mut Session, ctx: &mut RequestCtx) {
    if let Some(guard) = GuardedStream::of(session.stream()) {
        guard.disarm();
    }
    let limits = &ctx.snapshot.config.server.limits;
    // Requests pipelined behind this one are answered in order on this connection (RFC 9112
    // §9.3.2), each going through the whole chain, instead of being dropped with a close.
    session.set_pipelining_enabled(true);
    session.set_read_timeout(Some(limits.body_timeout));
    // Only where the client asked to keep the connection (HTTP/1.1 by default, HTTP/1.0
    // with `Connection: keep-alive`): setting a timeout would turn keep-alive on.
    if session.get_keepalive().is_some() {
        session.set_keepalive(Some(limits.keepalive_timeout.as_secs().max(1)));
    }
}

/// The request id, then steps [0]–[5] of the chain. `Err`: the caller answers with it.
pub async fn admit(session: &Session, ctx: &mut RequestCtx) -> Result<(), Reject> {
    let req = session.req_header();
    ctx.request_id = match req.headers.get(request_id::HEADER) {
        Some(v) if request_id::is_acceptable(v.as_bytes()) => v.clone(),
        _ => HeaderValue::from_str(&request_id::generate()).expect("generated ids are ASCII hex"),
    };
    // Only a chunked request can hide a second framing header (see check_message).
    let raw_head = req
        .headers
        .contains_key(http::header::TRANSFER_ENCODING)
        .then(|| session.as_http1().map(|h1| h1.get_headers_raw_bytes()))
        .flatten();
    let snapshot = Arc::clone(&ctx.snapshot);
    let server = &snapshot.config.server;
    message::check_message(&server.limits, req, raw_head.as_deref())?;
    let host = req
        .uri
        .host()
        .or_else(|| req.headers.get(HOST).and_then(|h| h.to_str().ok()));
    let (index, normalized) = router::route(&snapshot.router, host, &req.method, req.uri.path())?;
    ctx.route = Some(index);
    ctx.forward_path = normalized;
    let route = &snapshot.routes[index];
    message::check_content_length(route.config.max_body_bytes, req)?;
    let mut record = |policy: &str, outcome: Outcome| route.metrics.decision(policy, outcome);
    if route.rules.ip.is_some() {
        let ip = session
            .client_addr()
            .and_then(PeerAddr::as_inet)
            .map(|peer| {
                let forwarded = req.headers.get_all("x-forwarded-for");
                let ip = client_ip(
                    peer.ip(),
                    forwarded.iter().map(HeaderValue::as_bytes),
                    &server.trusted_proxies,
                );
                group_key(ip, server.grouping)
            });
        let now = MonotonicClock.now_ms();
        let checked = ctx.admission.check_ip(&route.rules, ip, now, &mut record);
        if checked.is_err() {
            route.metrics.ip_rejections.inc();
        }
        checked?;
    }
    if route.config.auth == auth::Auth::ApiKey {
        let client = auth::authenticate(&snapshot.keys, &req.headers)
            .map_err(Reject::Key)
            .inspect_err(|_| ctx.admission.unauthorized())?;
        let admitted = ctx
            .admission
            .check_plan(
                &route.rules,
                &snapshot.store,
                &client,
                request_id::generate,
                &mut record,
            )
            .await;
        ctx.client = Some(client);
        admitted?;
    }
    Ok(())
}

/// Counts the body as it streams: a chunked body larger than the route allows is cut off
/// with 413 (or the connection closed, if the response has started).
pub fn request_body_filter(body: &Option<Bytes>, ctx: &mut RequestCtx) -> Result<()> {
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
