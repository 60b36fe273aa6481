//! A route that answers itself (`chain/answer.rs` says what): its redirect or fixed answer
//! written, with the request id and, for an allowed origin, the route's CORS headers.

use crate::chain::answer::Answer;
use crate::chain::request_id;
use crate::proxy::context::RequestCtx;
use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HOST, LOCATION};
use http::{HeaderName, HeaderValue};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};

/// Writes the route's answer (`ctx.route` has one).
pub async fn answer(session: &mut Session, ctx: &RequestCtx) -> Result<()> {
    let Some(answer) = ctx.route().and_then(|r| r.config.answer.clone()) else {
        return Ok(());
    };
    let mut extra: Vec<(HeaderName, HeaderValue)> = Vec::new();
    crate::proxy::cors::on_own_answer(ctx, session, &mut extra);
    let (status, body, content_type) = match &*answer {
        Answer::Redirect(redirect) => {
            let req = session.req_header();
            let path = ctx.forward_path.as_deref().unwrap_or(req.uri.path());
            let location = redirect.location(path, req.uri.query()).ok_or_else(|| {
                Error::explain(ErrorType::InvalidHTTPHeader, "the redirect's Location")
            })?;
            extra.push((LOCATION, location));
            (redirect.status, Bytes::new(), None)
        }
        Answer::Respond {
            status,
            body,
            content_type,
        } => (*status, body.clone(), Some(content_type.clone())),
    };
    write(session, ctx, (status, body, content_type), extra).await
}

/// `server.https_redirect`: a plain-HTTP request sent to the same host and path on the TLS
/// listener's `port`, with 308 (the method and body kept). The host is the one the request
/// named (the gateway serves every host its routes do), without its port.
pub async fn to_https(session: &mut Session, ctx: &RequestCtx, port: u16) -> Result<()> {
    let req = session.req_header();
    let authority = req
        .uri
        .host()
        .or_else(|| req.headers.get(HOST).and_then(|h| h.to_str().ok()))
        .unwrap_or("");
    let host = match authority.rsplit_once(':') {
        Some((host, p)) if !host.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    let target = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let location = match port {
        443 => format!("https://{host}{target}"),
        port => format!("https://{host}:{port}{target}"),
    };
    let valid = !host.is_empty() && http::uri::Authority::try_from(host).is_ok();
    let Some(location) = valid
        .then(|| HeaderValue::try_from(location).ok())
        .flatten()
    else {
        let (status, body) = (
            http::StatusCode::BAD_REQUEST,
            Bytes::from_static(b"use https\n"),
        );
        let plain = HeaderValue::from_static("text/plain; charset=utf-8");
        return write(session, ctx, (status, body, Some(plain)), Vec::new()).await;
    };
    let status = http::StatusCode::PERMANENT_REDIRECT;
    write(
        session,
        ctx,
        (status, Bytes::new(), None),
        vec![(LOCATION, location)],
    )
    .await
}

/// Writes an answer of the gateway's own: its status, body and type, and `extra` headers.
async fn write(
    session: &mut Session,
    ctx: &RequestCtx,
    (status, body, content_type): (http::StatusCode, Bytes, Option<HeaderValue>),
    extra: Vec<(HeaderName, HeaderValue)>,
) -> Result<()> {
    let mut resp = ResponseHeader::build_no_case(status, Some(extra.len() + 4))?;
    resp.insert_header(request_id::NAME.clone(), ctx.request_id.clone())?;
    if let Some(content_type) = content_type {
        resp.insert_header(CONTENT_TYPE, content_type)?;
        resp.insert_header(CACHE_CONTROL, "no-store")?;
    }
    let bodiless = matches!(status.as_u16(), 204 | 304);
    if !bodiless {
        resp.insert_header(CONTENT_LENGTH, body.len())?;
    }
    for (name, value) in extra {
        resp.append_header(name, value)?;
    }
    let head_only =
        bodiless || body.is_empty() || session.req_header().method == http::Method::HEAD;
    session
        .write_response_header(Box::new(resp), head_only)
        .await?;
    if !head_only {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(())
}
