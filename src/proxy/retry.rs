//! Retries in the Pingora phases (the policy and the budget are `upstream::retry`'s):
//! `upstream_peer` waits its backoff before a retry, `upstream_response_filter` turns a
//! status the route retries into an error Pingora tries again, `error_while_proxy` decides
//! after a timeout or a reset. The limits were counted once, before the first try: a retry
//! goes through none of the chain again.

use crate::chain::upstream_error;
use crate::proxy::context::RequestCtx;
use crate::upstream::balance::random;
use crate::upstream::retry::{backoff, Reason};
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};
use std::time::Instant;

/// Before each try: the request counts in flight for its pool's retry budget; before a
/// retry, it waits its backoff — within the request's deadline, or it ends with a timeout.
pub async fn before_try(ctx: &mut RequestCtx) -> Result<()> {
    let Some(route) = ctx.route.map(|i| &ctx.snapshot.routes[i]) else {
        return Ok(());
    };
    if let (None, Some(_), Some(pool)) = (&ctx.pool_active, &route.config.retry, &route.pool) {
        ctx.pool_active = Some(pool.budget.enter());
    }
    if !std::mem::take(&mut ctx.retry_pending) {
        return Ok(());
    }
    let Some(policy) = &route.config.retry else {
        return Ok(());
    };
    // Sent `attempts` times so far: this is retry number `attempts`.
    let retry = ctx.attempts.max(1);
    let wait = backoff(policy.backoff, policy.max_backoff, retry, random());
    if let Some(deadline) = ctx.deadline {
        if Instant::now() + wait >= deadline {
            return Error::e_explain(
                ErrorType::ConnectTimedout,
                "the request's deadline passes before its next try",
            );
        }
    }
    tokio::time::sleep(wait).await;
    Ok(())
}

/// Whether to try again after `reason`: the route retries it, tries are left, the method may
/// be repeated, the body is still in the replay buffer, nothing was sent to the client, the
/// deadline has not passed, and the pool's budget has room. Counted either way.
pub fn decide(session: &Session, ctx: &mut RequestCtx, reason: Reason) -> bool {
    let Some(route) = ctx.route.map(|i| &ctx.snapshot.routes[i]) else {
        return false;
    };
    let Some(policy) = &route.config.retry else {
        return false;
    };
    if !policy.retries(reason)
        || ctx.attempts >= policy.attempts
        || !policy.repeats(&session.req_header().method)
        || session.as_ref().retry_buffer_truncated()
        || session.response_written().is_some()
        || ctx.deadline.is_some_and(|d| Instant::now() >= d)
    {
        return false;
    }
    let Some(pool) = &route.pool else {
        return false;
    };
    let metrics = &ctx.snapshot.metrics;
    match pool.budget.try_retry() {
        Some(retrying) => {
            ctx.retrying = Some(retrying);
            ctx.retry_pending = true;
            metrics
                .upstream
                .retries
                .with_label_values(&[&pool.config.name, &reason.label()])
                .inc();
            true
        }
        None => {
            metrics
                .upstream
                .retry_budget_exhausted
                .with_label_values(&[&pool.config.name])
                .inc();
            false
        }
    }
}

/// The upstream answered `status`: an error that makes Pingora try again when the route
/// retries it (the answer is dropped, never charged or shown), `None` to pass it on.
pub fn retry_status(session: &Session, status: u16, ctx: &mut RequestCtx) -> Option<Box<Error>> {
    if !decide(session, ctx, Reason::Status(status)) {
        return None;
    }
    let mut e = Error::explain(
        ErrorType::HTTPStatus(status),
        "the upstream's answer is retried",
    );
    e.set_retry(true);
    Some(e)
}

/// Proxying to the upstream failed after the connection was made: the server's failure
/// counts for outlier detection; a request whose pooled connection turned out dead is sent
/// again (Pingora's own rule, when it is safe); a timeout or a reset is retried by the
/// route's policy.
pub fn error_while_proxy(
    session: &Session,
    mut e: Box<Error>,
    ctx: &mut RequestCtx,
    client_reused: bool,
) -> Box<Error> {
    if ctx.retry_pending {
        // Decided on the answer's status (`retry_status`).
        e.set_retry(true);
        return e;
    }
    let attempt = upstream_error::attempt(&e, false);
    if let (Some(pool), Some(addr), Some(attempt)) = (ctx.pool(), ctx.upstream_addr, attempt) {
        pool.record(addr, attempt);
    }
    if session.req_header().method.is_idempotent() && !session.as_ref().retry_buffer_truncated() {
        e.retry.decide_reuse(client_reused);
    } else {
        e.set_retry(false);
    }
    if !e.retry() {
        let reason = match attempt {
            Some(crate::upstream::outlier::Attempt::Timeout) => Some(Reason::Timeout),
            Some(crate::upstream::outlier::Attempt::Reset) => Some(Reason::Reset),
            _ => None,
        };
        if reason.is_some_and(|r| decide(session, ctx, r)) {
            e.set_retry(true);
        }
    }
    e
}

/// Pingora's WARN "Fail to proxy … retry: true" for a try that is retried reads as a failure
/// even when the retry succeeds: said instead at INFO, as a retry (the final error, if the
/// retries fail too, is still logged as one). `true`: Pingora's line is not written.
pub fn said_retried(ctx: &RequestCtx, error: &Error) -> bool {
    let route = ctx.route().map_or("", |r| &r.config.name);
    log::info!(
        "route {route}: try {} failed ({:?}), retried on another server",
        ctx.attempts,
        error.etype()
    );
    true
}
