//! CORS on the wire (`chain/cors.rs` decides): a preflight answered by the gateway, and the
//! headers every answer to an allowed origin carries — the upstream's responses and the
//! gateway's own refusals alike, so that a page can read why it was refused.

use crate::chain::cors::{Cors, Refusal, RESPONSE_NAMES};
use crate::chain::header_rules::RuleHead;
use crate::chain::reject::Reject;
use crate::chain::request_id;
use crate::proxy::context::RequestCtx;
use http::header::{HeaderName, HeaderValue, ORIGIN, VARY};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;

/// The request's CORS rules: its route's, or for the quota endpoint the server's.
fn rules(ctx: &RequestCtx) -> Option<&Cors> {
    match ctx.route() {
        Some(route) => route.config.cors.as_deref(),
        None if ctx.quota => ctx.snapshot.config.server.cors.as_deref(),
        None => None,
    }
}

/// The rules and the request's origin, when its answers carry CORS headers.
pub fn allowed<'a>(
    ctx: &'a RequestCtx,
    session: &'a Session,
) -> Option<(&'a Cors, &'a HeaderValue)> {
    if !ctx.cors_origin {
        return None;
    }
    Some((rules(ctx)?, session.req_header().headers.get(ORIGIN)?))
}

/// A request for the quota endpoint (`ctx.quota`): whether `[server] cors` allows its origin,
/// and whether it is a preflight for the gateway to answer.
pub fn quota_request(session: &Session, ctx: &mut RequestCtx) {
    let Some(cors) = ctx.snapshot.config.server.cors.as_deref() else {
        return;
    };
    let req = session.req_header();
    ctx.cors_origin = req
        .headers
        .get(ORIGIN)
        .is_some_and(|o| cors.allows_origin(o.as_bytes()));
    ctx.preflight = crate::chain::cors::preflight_method(&req.method, &req.headers).is_some();
}

/// Answers a preflight (`ctx.preflight`) the rules allow with 204 and what they allow; a
/// refused one is returned, for the caller to answer (403). Counted per route (the quota
/// endpoint's are not).
pub async fn answer_preflight(session: &mut Session, ctx: &RequestCtx) -> Result<Option<Reject>> {
    if rules(ctx).is_none() {
        return Ok(None);
    }
    let counts = ctx.route().map(|route| &route.metrics.preflights);
    let headers = &session.req_header().headers;
    let method = headers
        .get(&crate::chain::cors::REQUEST_METHOD)
        .map(HeaderValue::as_bytes)
        .unwrap_or_default();
    let answer = match allowed(ctx, session) {
        None => Err(Refusal::Origin),
        Some((cors, origin)) => cors.preflight(origin, method, headers),
    };
    let count = |i: usize| {
        if let Some(counts) = counts {
            counts[i].inc();
        }
    };
    match answer {
        Ok(headers) => {
            count(0);
            let mut resp = ResponseHeader::build_no_case(204, Some(headers.len() + 1))?;
            resp.insert_header(request_id::NAME.clone(), ctx.request_id.clone())?;
            for (name, value) in headers {
                resp.append_header(name, value)?;
            }
            session.write_response_header(Box::new(resp), true).await?;
            Ok(None)
        }
        Err(why) => {
            count(1);
            Ok(Some(Reject::CorsRefused(why)))
        }
    }
}

/// An upstream's response on a route with `cors`: to an allowed `origin`, the gateway's CORS
/// headers; the upstream's own are replaced (taken away for any other origin), or kept
/// when the route says `upstream = "keep"` and it sent some. `Vary: Origin` either way: the
/// answer depends on it.
pub fn on_response(
    cors: &Cors,
    origin: Option<&HeaderValue>,
    head: &mut dyn RuleHead,
) -> Result<(), String> {
    let upstream_said = head
        .headers()
        .contains_key(http::header::ACCESS_CONTROL_ALLOW_ORIGIN);
    if cors.keep_upstream && upstream_said {
        return Ok(());
    }
    for name in &RESPONSE_NAMES {
        head.remove(name);
    }
    let Some(origin) = origin else {
        return head.append(&VARY, HeaderValue::from_static("Origin"));
    };
    for (name, value) in cors.actual(origin) {
        if name == VARY {
            head.append(&name, value)?;
        } else {
            head.replace(&name, value)?;
        }
    }
    Ok(())
}

/// The gateway's own answer to an allowed origin: its CORS headers, added to `extra` (to a
/// gRPC call, with the status headers a browser's gRPC-Web client reads exposed).
pub fn on_own_answer(
    ctx: &RequestCtx,
    session: &Session,
    extra: &mut Vec<(HeaderName, HeaderValue)>,
) {
    if let Some((cors, origin)) = allowed(ctx, session) {
        extra.extend(match ctx.grpc {
            Some(_) => cors.actual_grpc(origin),
            None => cors.actual(origin),
        });
    }
}
