//! The gateway's own answer to a gRPC or gRPC-Web call (`chain::grpc`'s codes), written as a
//! "trailers-only" response: HTTP 200 carrying `grpc-status`, `grpc-message` and the metadata
//! the HTTP answer would have had (RateLimit headers, `Retry-After`, and
//! `grpc-retry-pushback-ms` for a retry policy), no body — on HTTP/2 one HEADERS frame that
//! ends the stream.

use crate::chain::grpc;
use crate::chain::problem::Kind;
use crate::chain::request_id;
use crate::proxy::context::RequestCtx;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession as HttpSession;
use pingora::proxy::Session;
use pingora::Result;

pub const GRPC_TIMEOUT: &str = "grpc-timeout";
const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// Writes the answer of `kind` to the call of `flavor`; `extra` holds the HTTP answer's headers,
/// sent as metadata. The status the metrics and the access log count is the HTTP one of
/// `kind` (`ctx.grpc_answer`), the wire carries 200.
pub async fn answer(
    session: &mut Session,
    ctx: &mut RequestCtx,
    flavor: grpc::Flavor,
    kind: Kind,
    detail: &str,
    extra: Vec<(HeaderName, HeaderValue)>,
) -> Result<()> {
    let mut extra = extra;
    crate::proxy::cors::on_own_answer(ctx, session, &mut extra);
    // No case map: the same bytes (`response_head.rs`); gRPC is HTTP/2 anyway.
    let mut resp = ResponseHeader::build_no_case(200, Some(6 + extra.len()))?;
    resp.insert_header(CONTENT_TYPE, flavor.content_type())?;
    resp.insert_header("grpc-status", grpc::code(kind).as_str())?;
    resp.insert_header("grpc-message", grpc::message(detail))?;
    resp.insert_header(request_id::NAME.clone(), ctx.request_id.clone())?;
    for (name, value) in extra {
        if name == RETRY_AFTER {
            let secs = value.to_str().ok().and_then(|s| s.parse().ok());
            if let Some(secs) = secs {
                resp.insert_header(PUSHBACK, grpc::pushback_ms(secs))?;
            }
        }
        resp.append_header(name, value)?;
    }
    ctx.grpc_answer = Some(kind);
    match session.downstream_session.as_mut() {
        HttpSession::H2(h2) => h2.write_response_header(Box::new(resp), true),
        _ => {
            // gRPC-Web (and an HTTP/1 client of gRPC): a well-framed empty answer.
            resp.insert_header(CONTENT_LENGTH, 0)?;
            session.write_response_header(Box::new(resp), false).await?;
            session.write_response_body(None, true).await
        }
    }
}
