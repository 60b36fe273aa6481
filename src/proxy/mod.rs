//! The Pingora glue: the only code that touches a `Session`. Each hook of [`Gateway`]'s
//! `ProxyHttp` implementation hands the session and the request's context to one function of
//! the phase files, which call the plain steps of `chain/` and write the outcome back:
//!
//! ```text
//! new_ctx                  the live snapshot, loaded once for the whole request
//! early_request_filter     request.rs   header deadline off, body timeout, keep-alive, pipelining
//! request_filter           request.rs   request id, then the chain [0]–[5], then the upstream
//!                                       pool's shedding gate [6] → our answer (─► logging) or on
//! request_body_filter      request.rs   body size as it streams → 413
//! upstream_peer            upstream.rs  a healthy server of the route's pool → 502 (─► fail_to_proxy)
//!   │ connect fails ─► fail_to_connect  upstream.rs  retry? ─ yes ─► upstream_peer again
//!   │                                                      └ no ──► fail_to_proxy
//! upstream_request_filter  upstream.rs  chain::forward: normalised path, X-Forwarded-For,
//!                                       X-Request-Id, X-Client-Id, no API key
//!   │ the request or response fails ─► fail_to_proxy
//! upstream_response_filter upstream.rs  upstream latency (and the shedding controller's sample)
//! upstream_response_body_filter          the pool's shedding place freed at the end
//! response_filter          response.rs  X-Request-Id, RateLimit headers
//! fail_to_proxy            response.rs  problem+json: 502 unreachable · 504 timeout (─► logging)
//!                          (our answers to a gRPC call: grpc.rs, a trailers-only gRPC status)
//! logging                  response.rs  metrics, access log, next request's header deadline
//! ```
//!
//! (Pingora's `docs/user_guide/phase_chart.md` has the whole graph: its connect retries go
//! back to `upstream_peer`, any failure after it to `fail_to_proxy`, every path ends in
//! `logging`.)
//!
//! `conn/` wraps every accepted connection (the header deadline and idle end on HTTP/1, the
//! frame deadlines on HTTP/2; Pingora's own refusals as problem+json); `warm.rs` starts the
//! service with its store warming.

mod answer;
mod charge;
pub mod conn;
mod context;
mod cors;
mod delay;
mod grpc;
mod identify;
mod quota;
mod request;
mod response;
mod response_head;
mod retry;
pub mod tls;
mod upstream;
mod upstream_head;
pub mod warm;

pub use context::RequestCtx;

use crate::control::snapshot::SnapshotHandle;
use crate::ops::access_log::AccessLog;
use crate::ops::trace::Tracer;
use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, Result};
use std::sync::Arc;

pub struct Gateway {
    snapshots: SnapshotHandle,
    access_log: Arc<AccessLog>,
    /// `None`: tracing is off (`[tracing]` absent).
    tracer: Option<Arc<Tracer>>,
}

impl Gateway {
    pub fn new(
        snapshots: SnapshotHandle,
        access_log: Arc<AccessLog>,
        tracer: Option<Arc<Tracer>>,
    ) -> Gateway {
        Gateway {
            snapshots,
            access_log,
            tracer,
        }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::new(self.snapshots.load_full())
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        request::early_request_filter(session, ctx);
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        if let Some(tracer) = &self.tracer {
            let trusted = &ctx.snapshot.config.server.trusted_proxies;
            let trusted_peer = session
                .client_addr()
                .and_then(|a| a.as_inet())
                .is_some_and(|a| trusted.contains(a.ip()));
            ctx.trace = Some(Box::new(
                tracer.begin(&session.req_header().headers, trusted_peer),
            ));
        }
        if quota::is_quota(session, ctx) {
            ctx.quota = true;
            cors::quota_request(session, ctx);
            let addr = request::client_addr(session, ctx);
            let ip = addr.map(|a| request::group(a, ctx));
            let checked = request::check_head(session, ctx)
                .and_then(|()| request::check_server_addresses(&ctx.snapshot, addr));
            let answered = match checked {
                Ok(()) => quota::answer(session, ctx, ip).await,
                Err(reject) => Err(reject),
            };
            if let Err(reject) = answered {
                response::respond_reject(session, ctx, &reject).await?;
            }
            return Ok(true);
        }
        let admitted = match request::admit(session, ctx).await {
            Ok(request::Admitted::Answer) => {
                answer::answer(session, ctx).await?;
                return Ok(true);
            }
            Ok(request::Admitted::ToHttps(port)) => {
                answer::to_https(session, ctx, port).await?;
                return Ok(true);
            }
            Ok(request::Admitted::Preflight) => match cors::answer_preflight(session, ctx).await? {
                None => return Ok(true),
                Some(refused) => Err(refused),
            },
            Ok(request::Admitted::Proxy) => match delay::wait_turn(session, ctx).await {
                delay::Waited::Turn => request::pass_gate(ctx).await,
                delay::Waited::Gone => {
                    return Error::e_explain(
                        pingora::ErrorType::ConnectionClosed,
                        "the client left while its request waited its turn",
                    )
                }
            },
            Err(reject) => Err(reject),
        };
        match admitted {
            Ok(()) => Ok(false),
            Err(reject) => {
                response::respond_reject(session, ctx, &reject).await?;
                Ok(true)
            }
        }
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        request::request_body_filter(session.was_upgraded(), body, ctx)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        retry::before_try(ctx).await?;
        upstream::upstream_peer(ctx)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        e: Box<Error>,
    ) -> Box<Error> {
        upstream::fail_to_connect(ctx, e)
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        upstream::upstream_request_filter(session, upstream_request, ctx)
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        upstream::record_answer(upstream_response, ctx);
        let status = upstream_response.status.as_u16();
        if let Some(e) = retry::retry_status(session, status, ctx) {
            return Err(e);
        }
        upstream::upstream_response_filter(upstream_response, ctx);
        Ok(())
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let e = e.more_context(format!("Peer: {peer}"));
        retry::error_while_proxy(session, e, ctx, client_reused)
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        upstream::upstream_response_body_filter(end_of_stream, ctx);
        Ok(None)
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if upstream_response.status == http::StatusCode::SWITCHING_PROTOCOLS && ctx.upgrade {
            upstream::upgraded(session, ctx);
        }
        response::response_filter(upstream_response, ctx, session)
    }

    fn suppress_error_log(&self, _session: &Session, ctx: &RequestCtx, error: &Error) -> bool {
        ctx.left_while_waiting || response::said_otherwise(ctx, error)
    }

    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        ctx: &RequestCtx,
        error: &Error,
        context: pingora::proxy::ProxyWarnLogContext,
    ) -> bool {
        context == pingora::proxy::ProxyWarnLogContext::UpstreamRetry
            && retry::said_retried(ctx, error)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        upstream::upstream_failed(e, ctx);
        response::fail_to_proxy(session, e, ctx).await
    }

    async fn logging(&self, session: &mut Session, error: Option<&Error>, ctx: &mut RequestCtx) {
        response::logging(
            &self.access_log,
            self.tracer.as_deref(),
            session,
            error,
            ctx,
        );
    }
}
