//! A request a leaky bucket admitted to wait its turn is held here — a timer, no thread —
//! and then forwarded. Bounded: at most `server.max_delayed` requests wait at once on this
//! instance (their places are taken before the store counts them: `chain::admission`'s
//! `Place`; beyond, 503), and never longer than the bucket's burst drains. A bodiless request
//! whose client leaves while it waits gives its turn back to the next (HTTP/1: the
//! connection's end is seen by an idle read; HTTP/2: the stream's reset).

use crate::chain::admission::Outcome;
use crate::proxy::context::RequestCtx;
use pingora::proxy::Session;
use std::time::{Duration, Instant};

/// What became of a wait.
pub enum Waited {
    /// Its turn came: forward it.
    Turn,
    /// The client left while it waited: nothing to answer.
    Gone,
}

/// Holds the request until its turn (`ctx.admission.delay_ms`).
pub async fn wait_turn(session: &mut Session, ctx: &mut RequestCtx) -> Waited {
    let delay = ctx.admission.delay_ms;
    if delay == 0 {
        return Waited::Turn;
    }
    let started = Instant::now();
    let sleep = tokio::time::sleep(Duration::from_millis(delay));
    // Only a request without a body can be watched for its client leaving: an idle read of
    // a request with one would read its body.
    let bodiless = session.is_body_empty();
    let gone = if bodiless {
        tokio::select! {
            _ = sleep => false,
            read = session.downstream_session.read_body_or_idle(true) => read.is_err(),
        }
    } else {
        sleep.await;
        false
    };
    // Its place is free again, whatever happens next.
    ctx.admission.place = None;
    if gone {
        ctx.left_while_waiting = true;
        ctx.admission.give_back();
        return Waited::Gone;
    }
    let waited = started.elapsed();
    if let Some(route) = ctx.route() {
        route.metrics.delay.observe(waited.as_secs_f64());
    }
    ctx.waited_ms = Some(waited.as_millis() as u64);
    ctx.admission.outcome = Outcome::Delayed;
    Waited::Turn
}
