//! A request a leaky bucket admitted to wait its turn is held here — a timer, no thread —
//! and then forwarded. Bounded: at most `server.max_delayed` requests wait at once on this
//! instance, at most `server.max_delayed_per_client` of one client (their places are taken
//! before the store counts them: `chain::admission`'s `Place`; beyond, 503 and 429), and
//! never longer than the bucket's burst drains. A request whose client leaves while it waits
//! gives its place and its turn back to the next, with or without a body: HTTP/2, the
//! stream's reset; HTTP/1 without a body, the connection's end seen by an idle read; HTTP/1
//! with one (whose bytes must stay unread for the upstream), the socket's peer hang-up,
//! looked at every [`WATCH_EVERY`].

use crate::chain::admission::Outcome;
use crate::proxy::context::RequestCtx;
use pingora::proxy::Session;
use std::time::{Duration, Instant};

/// How often a held HTTP/1 request with a body is looked at for its client leaving.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

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
    let bodiless = session.is_body_empty();
    let downstream = &mut session.downstream_session;
    // An HTTP/1 connection's socket, when the request has a body: an idle read would read it.
    let h1_socket = downstream
        .as_http1()
        .filter(|_| !bodiless)
        .map(|h1| h1.stream().id());
    let gone = if let Some(fd) = h1_socket {
        tokio::select! {
            _ = sleep => false,
            _ = hung_up(fd) => true,
        }
    } else if let (false, Some(closed)) = (bodiless, downstream.watch_h2_stream_close()) {
        tokio::select! {
            _ = sleep => false,
            _ = closed => true,
        }
    } else {
        tokio::select! {
            _ = sleep => false,
            read = downstream.read_body_or_idle(true) => read.is_err(),
        }
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

/// Resolves once the peer of socket `fd` has hung up (closed, or shut its sending side: the
/// rest of the body can never come), looked at every [`WATCH_EVERY`]; unread bytes stay
/// unread.
async fn hung_up(fd: i32) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if peer_hung_up(fd) {
            return;
        }
    }
}

#[cfg(target_os = "linux")]
fn peer_hung_up(fd: i32) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout; `fd` is the session's own socket, open for
    // as long as the session holds it (and poll on a closed fd only reports POLLNVAL).
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0
        && poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

#[cfg(not(target_os = "linux"))]
fn peer_hung_up(_fd: i32) -> bool {
    false
}
