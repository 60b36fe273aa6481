//! The downstream request phases: `early_request_filter` (deadlines and keep-alive),
//! `request_filter` (the chain: message, path, route, per-IP, API key, plan limits) and
//! `request_body_filter` (the body size as it streams).

use crate::chain::admission::Outcome;
use crate::chain::body::BodyFields;
use crate::chain::forward::X_FORWARDED_FOR;
use crate::chain::identity::{client_ip, group_key};
use crate::chain::partition::KeyInputs;
use crate::chain::reject::Reject;
use crate::chain::{grpc, message, request_id, rewrite, router};
use crate::clock::{Clock, MonotonicClock};
use crate::control::snapshot::Snapshot;
use crate::proxy::conn::GuardedStream;
use crate::proxy::context::RequestCtx;
use crate::proxy::grpc::GRPC_TIMEOUT;
use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use http::Method;
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};
use std::sync::Arc;
use std::time::Instant;

/// The request's headers are in: lift the connection's header deadline, bound pauses in the
/// body, answer pipelined requests in order, and set how long the connection may idle.
pub fn early_request_filter(session: &mut Session, ctx: &mut RequestCtx) {
    let guarded = GuardedStream::of(session.stream()).map(GuardedStream::disarm);
    let limits = &ctx.snapshot.config.server.limits;
    // Requests pipelined behind this one are answered in order on this connection (RFC 9112
    // §9.3.2), each going through the whole chain, instead of being dropped with a close.
    session.set_pipelining_enabled(true);
    session.set_read_timeout(Some(limits.body_timeout));
    // Pingora waits on a client that stops reading without end unless told (HTTP/1 and
    // HTTP/2 alike): each write of the response gets this long.
    session.set_write_timeout(Some(limits.send_timeout));
    // Only where the client asked to keep the connection (HTTP/1.1 by default, HTTP/1.0
    // with `Connection: keep-alive`): setting a timeout would turn keep-alive on. The guard
    // ends an idle guarded connection (0: no timer of Pingora's on every request's read).
    if session.get_keepalive().is_some() {
        let pingora_timeout = match guarded {
            Some(()) => 0,
            None => limits.keepalive_timeout.as_secs().max(1),
        };
        session.set_keepalive(Some(pingora_timeout));
    }
}

/// What the chain made of a request it let through.
pub enum Admitted {
    /// On to the upstream.
    Proxy,
    /// A CORS preflight past the per-IP bucket: the gateway answers it (`proxy/cors.rs`).
    Preflight,
    /// A route that answers itself (`redirect`, `respond`), past the per-IP bucket.
    Answer,
    /// A plain-HTTP request with `server.https_redirect` on, past the per-IP bucket: sent to
    /// this port of the TLS listener.
    ToHttps(u16),
}

/// The request id, then steps [0]–[5] of the chain. `Err`: the caller answers with it.
pub async fn admit(session: &mut Session, ctx: &mut RequestCtx) -> Result<Admitted, Reject> {
    let snapshot = Arc::clone(&ctx.snapshot);
    let (index, addr) = route_admitted(session, ctx, &snapshot)?;
    let route = &snapshot.routes[index];
    let mut record = |policy: &str, outcome: Outcome| route.metrics.decision(policy, outcome);
    let ip = addr.map(|a| group_key(a, snapshot.config.server.grouping));
    if route.rules.ip.is_some() && crate::chain::exempt::skips_ip(&route.rules.exempt, addr) {
        record(crate::limit::IP_POLICY_NAME, Outcome::Exempt);
        ctx.admission.outcome = Outcome::Exempt;
    } else if route.rules.ip.is_some() {
        let now = MonotonicClock.now_ms();
        let checked = ctx.admission.check_ip(&route.rules, ip, now, &mut record);
        if checked.is_err() {
            route.metrics.ip_rejections.inc();
        }
        checked?;
    }
    if let Some(port) = snapshot.config.server.https_redirect {
        if plain_http(session, &snapshot.config.server.trusted_proxies) {
            return Ok(Admitted::ToHttps(port));
        }
    }
    if ctx.preflight {
        // Never authenticated (a browser sends no credentials with it), never charged.
        return Ok(Admitted::Preflight);
    }
    if route.config.answer.is_some() {
        return Ok(Admitted::Answer);
    }
    if route.config.auth.identifies() {
        let accepted = crate::proxy::identify::Accepted {
            ip,
            ..crate::proxy::identify::Accepted::of(route)
        };
        crate::proxy::identify::identify(session, ctx, &accepted)
            .await
            .inspect_err(|_| ctx.admission.unauthorized())?;
    }
    if let (Some(rules), Some(client), Some(id)) =
        (&route.config.callers, &ctx.client, ctx.client_name())
    {
        if !rules.admits(id, &client.plan.name, &client.groups) {
            route.metrics.client_refusals.inc();
            return Err(Reject::ClientRefused(route.rules.name.to_string()));
        }
    }
    if route.reads_cert && ctx.cert.is_none() {
        ctx.cert = crate::proxy::identify::peer_cert(session);
    }
    if let Some((name, max)) = &route.config.cost_from_request {
        let declared = crate::chain::cost::declared(&session.req_header().headers, name, *max)
            .map_err(Reject::BadCost)?;
        ctx.admission.cost = Some(declared);
    }
    let body = if route.config.reads_body() {
        read_key_body(session, ctx, route.config.body_key_bytes)
            .await?
            .map(|bytes| {
                let headers = &session.req_header().headers;
                let types: Vec<&[u8]> = headers
                    .get_all(CONTENT_TYPE)
                    .iter()
                    .map(HeaderValue::as_bytes)
                    .collect();
                BodyFields::parse(&types, &bytes)
            })
    } else {
        None
    };
    let req = session.req_header();
    let inputs = KeyInputs {
        ip,
        addr,
        client: ctx.client.as_ref().map(|c| &*c.id),
        route: &route.rules.name,
        headers: &req.headers,
        query: req.uri.query(),
        body: body.as_ref(),
        token: ctx
            .token
            .as_deref()
            .map(|t| t as &(dyn crate::chain::partition::TokenClaims + Sync)),
        cert: ctx.cert.as_ref(),
    };
    let server = &snapshot.config.server;
    ctx.admission.max_delayed = Some((server.max_delayed, server.max_delayed_per_client));
    let traced = ctx.trace.as_ref().is_some_and(|t| t.sampled);
    ctx.admission.time_store = traced;
    let started = traced.then(Instant::now);
    let checked = ctx
        .admission
        .check_limits(
            &route.rules,
            &snapshot.store,
            ctx.client.as_ref(),
            &inputs,
            request_id::generate,
            &mut record,
        )
        .await;
    if let (Some(started), Some(trace)) = (started, ctx.trace.as_mut()) {
        trace.limits = Some((started, Instant::now()));
        if let Some((from, to, result)) = ctx.admission.store_call {
            trace.store = Some((from, to));
            trace.store_result = Some(result);
        }
    }
    checked.map(|()| Admitted::Proxy)
}

/// [0]–[2]: message checks, the server's address rules (before routing: a refused address
/// learns nothing of the routes), the route, its address rules, and what the route sets up
/// (an upgrade let through, retries' replay buffer and deadline). The route's index and the
/// client address (after trusted proxies).
/// The client reached us over plain HTTP: this connection is not TLS, and no trusted proxy in
/// front says its client used `https`.
fn plain_http(session: &Session, trusted_proxies: &crate::chain::identity::TrustedProxies) -> bool {
    let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
    let peer = session
        .client_addr()
        .and_then(PeerAddr::as_inet)
        .map(|a| a.ip());
    let trusted = peer.is_some_and(|ip| trusted_proxies.contains(ip));
    crate::chain::forwarded::client_scheme(trusted, tls, &session.req_header().headers) == "http"
}

fn route_admitted(
    session: &mut Session,
    ctx: &mut RequestCtx,
    snapshot: &Snapshot,
) -> Result<(usize, Option<std::net::IpAddr>), Reject> {
    check_head(session, ctx)?;
    let addr = client_addr(session, ctx);
    check_server_addresses(snapshot, addr)?;
    let index = route_request(session, ctx)?;
    let route = &snapshot.routes[index];
    if let Some(rules) = &route.config.addresses {
        if !rules.admits(addr) {
            route.metrics.address_refusals.inc();
            return Err(Reject::AddressRefused(Some(route.rules.name.to_string())));
        }
    }
    if ctx.upgrade {
        let offered = session.req_header().headers.get(http::header::UPGRADE);
        message::check_upgrade(&route.config.upgrades, offered.map(HeaderValue::as_bytes))?;
    }
    if let Some(retry) = &route.config.retry {
        // A retried request's body is sent again from Pingora's replay buffer (a body larger
        // than the buffer is not retried), within the whole request's deadline.
        session.enable_retry_buffering();
        if let Some(timeout) = retry.timeout {
            let deadline = ctx.started + timeout;
            ctx.deadline = Some(ctx.deadline.map_or(deadline, |d| d.min(deadline)));
        }
    }
    Ok((index, addr))
}

/// `server.allow_ips` / `deny_ips` (every request, the quota endpoint's too), before routing.
pub fn check_server_addresses(
    snapshot: &Snapshot,
    addr: Option<std::net::IpAddr>,
) -> Result<(), Reject> {
    match &snapshot.config.server.addresses {
        Some(rules) if !rules.admits(addr) => {
            snapshot.unrouted.address_refusals.inc();
            Err(Reject::AddressRefused(None))
        }
        _ => Ok(()),
    }
}

/// [6] The upstream pool's gate, when it sheds load: a place now, after a short wait in its
/// queue, or `Reject::Overloaded` (and what the limits counted is given back).
pub async fn pass_gate(ctx: &mut RequestCtx) -> Result<(), Reject> {
    let snapshot = Arc::clone(&ctx.snapshot);
    let Some(route) = ctx.route.map(|i| &snapshot.routes[i]) else {
        return Ok(());
    };
    let Some(gate) = route.pool.as_ref().and_then(|p| p.gate.clone()) else {
        return Ok(());
    };
    let priority = ctx
        .client
        .as_ref()
        .and_then(|c| c.plan.priority)
        .unwrap_or(route.config.priority);
    let started = ctx.sampled_trace().map(|_| Instant::now());
    let acquired = gate.acquire(priority).await;
    if let (Some(started), Some(trace)) = (started, ctx.sampled_trace()) {
        trace.gate = Some((started, Instant::now()));
    }
    match acquired {
        Ok(permit) => {
            ctx.permit = Some(permit);
            Ok(())
        }
        Err(why) => {
            route.metrics.shed(priority);
            ctx.admission.shed();
            Err(Reject::Overloaded(why))
        }
    }
}

/// The request id, whether it is a gRPC call (and its deadline), and [0] message checks
/// (every request, routed or not).
pub fn check_head(session: &Session, ctx: &mut RequestCtx) -> Result<(), Reject> {
    let req = session.req_header();
    ctx.request_id = match req.headers.get(&request_id::NAME) {
        Some(v) if request_id::is_acceptable(v.as_bytes()) => v.clone(),
        _ => request_id::generate_value(),
    };
    ctx.upgrade = session.is_upgrade_req();
    ctx.grpc = grpc::flavor(req.headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes));
    if ctx.grpc.is_some() {
        if let Some(timeout) = req.headers.get(GRPC_TIMEOUT) {
            let timeout = grpc::timeout(timeout.as_bytes()).map_err(Reject::BadDeadline)?;
            ctx.deadline = Some(ctx.started + timeout);
        }
    }
    // Only a chunked request can hide a second framing header (see check_message).
    let raw_head = req
        .headers
        .contains_key(http::header::TRANSFER_ENCODING)
        .then(|| session.as_http1().map(|h1| h1.get_headers_raw_bytes()))
        .flatten();
    message::check_message(&ctx.snapshot.config.server.limits, req, raw_head.as_deref())
}

/// [1]–[2] the route (after `check_head`); the route's index.
fn route_request(session: &Session, ctx: &mut RequestCtx) -> Result<usize, Reject> {
    let req = session.req_header();
    let snapshot = &ctx.snapshot;
    let host = req
        .uri
        .host()
        .or_else(|| req.headers.get(HOST).and_then(|h| h.to_str().ok()));
    let routed = match crate::chain::cors::preflight_method(&req.method, &req.headers) {
        // A preflight goes where the request it asks about would; to a route with `cors`,
        // it is the gateway's to answer. Elsewhere it is an `OPTIONS` request like any.
        Some(asked) => Method::from_bytes(asked.as_bytes())
            .ok()
            .and_then(|m| router::route(&snapshot.router, host, &m, req.uri.path()).ok())
            .filter(|(i, _)| snapshot.routes[*i].config.cors.is_some()),
        None => None,
    };
    ctx.preflight = routed.is_some();
    let (index, normalized) = match routed {
        Some(routed) => routed,
        None => router::route(&snapshot.router, host, &req.method, req.uri.path())?,
    };
    let config = &snapshot.routes[index].config;
    if let Some(cors) = &config.cors {
        ctx.cors_origin = req
            .headers
            .get(http::header::ORIGIN)
            .is_some_and(|o| cors.allows_origin(o.as_bytes()));
    }
    message::check_content_length(config.max_body_bytes, req)?;
    ctx.route = Some(index);
    let routed = normalized.as_deref().unwrap_or(req.uri.path());
    let rewritten = rewrite::rewrite(
        routed,
        &config.path_prefix,
        config.strip_prefix,
        config.add_prefix.as_deref(),
    );
    ctx.forward_path = rewritten.or(normalized);
    Ok(index)
}

/// The client address (after trusted proxies); `None` on a Unix socket.
pub fn client_addr(session: &Session, ctx: &RequestCtx) -> Option<std::net::IpAddr> {
    let server = &ctx.snapshot.config.server;
    session
        .client_addr()
        .and_then(PeerAddr::as_inet)
        .map(|peer| {
            let forwarded = session.req_header().headers.get_all(&X_FORWARDED_FOR);
            client_ip(
                peer.ip(),
                forwarded.iter().map(HeaderValue::as_bytes),
                &server.trusted_proxies,
            )
        })
}

/// A client address grouped by prefix (the per-IP bucket's key).
pub fn group(ip: std::net::IpAddr, ctx: &RequestCtx) -> u128 {
    group_key(ip, ctx.snapshot.config.server.grouping)
}

/// The body of a request whose keyed limits read body fields, if it is small enough:
/// announced by `Content-Length` and at most `max` bytes (`body_key_bytes`, at most 64 KiB).
/// It is read into Pingora's retry buffer, which is sent to the upstream first: the body
/// arrives there byte for byte. A chunked or larger body is not read (`None`: the fields are
/// missing). A client waiting for `100 Continue` before it sends the body gets it here.
async fn read_key_body(
    session: &mut Session,
    ctx: &mut RequestCtx,
    max: u64,
) -> Result<Option<Bytes>, Reject> {
    let announced = session
        .req_header()
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some(length) = announced.filter(|n| *n <= max) else {
        return Ok(None);
    };
    if length == 0 {
        return Ok(Some(Bytes::new()));
    }
    session.enable_retry_buffering();
    if expects_continue(session.req_header()) {
        session
            .write_continue_response()
            .await
            .map_err(|_| Reject::BadMessage("the request body could not be read"))?;
        ctx.continued = true;
    }
    let mut body = BytesMut::with_capacity(length as usize);
    // Each pause bounded here too, on every protocol (HTTP/2 sessions ignore the session's
    // read timeout; the connection guard bounds them as well).
    let pause = ctx.snapshot.config.server.limits.body_timeout;
    while (body.len() as u64) < length {
        match tokio::time::timeout(pause, session.read_request_body()).await {
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            Ok(Ok(None)) => break,
            Ok(Err(_)) => return Err(Reject::BadMessage("the request body could not be read")),
            Err(_) => return Err(Reject::BadMessage("the request body stalled")),
        }
    }
    Ok(Some(body.freeze()))
}

/// `Expect: 100-continue` (the only expectation there is, RFC 9110 §10.1.1).
fn expects_continue(req: &pingora::http::RequestHeader) -> bool {
    req.headers.get(http::header::EXPECT).is_some_and(|v| {
        v.as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"100-continue")
    })
}

/// Counts the body as it streams: a chunked body larger than the route allows is cut off
/// with 413 (or the connection closed, if the response has started). The bytes of an
/// upgraded connection are not a body: they are not counted.
pub fn request_body_filter(
    upgraded: bool,
    body: &Option<Bytes>,
    ctx: &mut RequestCtx,
) -> Result<()> {
    let Some(chunk) = body.as_ref().filter(|_| !upgraded) else {
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
