//! Every accepted connection, before Pingora's HTTP code sees it: told apart as HTTP/1 or
//! HTTP/2 (ALPN, or the h2c preface) and wrapped in a [`GuardedStream`] (`guard.rs`) that
//! holds it to its deadlines — HTTP/1's header deadline and idle end (`deadline.rs`),
//! HTTP/2's frame deadlines (`h2.rs`), on one timer (`timer.rs`) — and writes Pingora's own
//! empty refusals as problems (`refusal.rs`). The TLS handshake has a deadline of its own
//! (`handshake.rs`). The proxy's hooks make two calls: [`GuardedStream::disarm`] when a
//! request's headers are in, [`GuardedStream::arm_idle`] when its response is done.

mod deadline;
mod guard;
pub mod h2;
mod handshake;
mod head;
mod refusal;
mod timer;

pub use guard::GuardedStream;
pub use handshake::HandshakeDeadline;

use crate::control::snapshot::SnapshotHandle;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use std::sync::Arc;

/// A Pingora app that wraps every accepted connection in a [`GuardedStream`] before handing
/// it to `inner` (the proxy).
pub struct Guarded<A> {
    inner: Arc<A>,
    snapshots: SnapshotHandle,
}

impl<A> Guarded<A> {
    pub fn new(inner: A, snapshots: SnapshotHandle) -> Guarded<A> {
        Guarded {
            inner: Arc::new(inner),
            snapshots,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Guarded<A> {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        handshake::handshake_done(&stream);
        let config = Arc::clone(&self.snapshots.load().config);
        let header_timeout = config.server.limits.header_timeout;
        // A client that sends nothing at all is held to the header deadline here too.
        let http2 = tokio::time::timeout(header_timeout, is_http2(&mut stream, config.server.h2c));
        let Ok(http2) = http2.await else {
            return None;
        };
        let guarded = if http2 {
            // HTTP/2 multiplexes requests on one connection: its deadlines are per stream,
            // read off the frames (Pingora's HTTP/2 server bounds neither bodies nor idle
            // connections). Its framing is strict enough that Pingora's HTTP/1 refusals do not
            // occur.
            let limits = &config.server.limits;
            GuardedStream::http2(
                stream,
                h2::Limits {
                    header_ms: header_timeout.as_millis() as u64,
                    body_ms: limits.body_timeout.as_millis() as u64,
                    idle_ms: limits.keepalive_timeout.as_millis() as u64,
                },
            )
        } else {
            GuardedStream::new(stream, header_timeout)
        };
        self.inner.process_new(Box::new(guarded), shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

/// Whether the connection speaks HTTP/2: negotiated by ALPN over TLS, or (with `h2c`) a
/// plaintext connection opening with the HTTP/2 preface.
async fn is_http2(stream: &mut Stream, h2c: bool) -> bool {
    if stream.get_ssl_digest().is_some() {
        return matches!(
            stream.selected_alpn_proto(),
            Some(pingora::protocols::ALPN::H2)
        );
    }
    if !h2c {
        return false;
    }
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut buf = [0u8; PREFACE.len()];
    matches!(stream.try_peek(&mut buf).await, Ok(true)) && buf == PREFACE
}

/// The admin listener's connections: one request each (the admin answers with
/// `Connection: close`), its head due `header_timeout` after the connection opened — Pingora
/// would wait 60 s for a half-sent request, and the admin has no hook to re-arm a deadline
/// between kept-alive requests — and no longer than the server's `max_uri_length` and
/// `max_header_bytes` (414, 431: `head.rs`).
pub struct Bounded<A> {
    inner: Arc<A>,
    snapshots: SnapshotHandle,
}

impl<A> Bounded<A> {
    pub fn new(inner: A, snapshots: SnapshotHandle) -> Bounded<A> {
        Bounded {
            inner: Arc::new(inner),
            snapshots,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Bounded<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let snapshot = self.snapshots.load();
        let limits = &snapshot.config.server.limits;
        let guarded = GuardedStream::new(stream, limits.header_timeout)
            .with_head_limits(limits.max_uri_length, limits.max_header_bytes);
        self.inner.process_new(Box::new(guarded), shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}
