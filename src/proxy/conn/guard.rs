//! Downstream connections under a deadline for their request headers (slowloris defence).
//!
//! Pingora times out each *read* of a request, so a client trickling one header byte every
//! few seconds could hold a connection for hours. Every accepted connection is therefore
//! wrapped in a [`GuardedStream`] carrying a deadline: a read after it fails with `TimedOut`
//! and the connection is closed. The deadline is armed when the connection opens
//! (`header_timeout`), disarmed by the proxy as soon as a request's headers are complete
//! (`early_request_filter`), and armed again when the response is done: the next request's
//! headers are due `header_timeout` after its first bytes arrive, as on a new connection. Request bodies are covered by the
//! per-read `body_timeout` instead: a pause in an upload, not its total length, is what is
//! suspicious. Waiting costs no worker: it is one timer on the connection's task.
//!
//! The same timer ends idle keep-alive connections: armed after a response, the stream is
//! *idle* until the next request's first bytes arrive, and an idle stream whose
//! `keepalive_timeout` has passed reads as closed (end of stream), which Pingora takes as a
//! client leaving between requests. Pingora's own keep-alive timeout is therefore left off
//! on guarded connections: it would register a second timer on every request's read.
//!
//! The same wrapper gives Pingora's own refusals our problem+json body. Pingora answers some
//! requests itself before any hook runs (an unparseable head, two `Host` headers, an
//! absolute-form target naming another host, `CONNECT`): an empty error response. A response
//! written while the deadline is armed can only be one of those (every response of ours is
//! written after the proxy disarmed it), so [`GuardedStream`] writes the same status with a
//! problem+json body instead (`chain::problem::replace_bodiless_error`).

use super::h2::{Expiry, H2Watch, Limits};
use async_trait::async_trait;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType,
};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `at` as milliseconds since the first use in this process (a compact, atomic-friendly
/// instant; never 0, which means "none").
fn ms_since_base(at: Instant) -> u64 {
    at.saturating_duration_since(base()).as_millis() as u64 + 1
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// A transport stream whose reads fail once its deadline has passed.
#[derive(Debug)]
pub struct GuardedStream {
    inner: Stream,
    /// Milliseconds (see `ms_since_base`) after which reads fail; 0 = no deadline.
    deadline_ms: AtomicU64,
    /// While nothing of the next request has been read: the millisecond after which the
    /// idle connection ends (reads see end of stream); 0 = not idle.
    idle_until_ms: AtomicU64,
    /// Time allowed for a request's headers, from its first bytes.
    header_timeout_ms: AtomicU64,
    timer: Option<(u64, Pin<Box<Sleep>>)>,
    /// A Pingora error response being replaced: our bytes, and how many are written.
    replacing: Option<(Vec<u8>, usize)>,
    /// HTTP/2: the deadlines read off the frames (the fields above stay unarmed).
    h2: Option<Box<H2Watch>>,
}

impl GuardedStream {
    pub fn new(inner: Stream, header_timeout: Duration) -> GuardedStream {
        let header_timeout_ms = header_timeout.as_millis() as u64;
        let deadline = ms_since_base(Instant::now()) + header_timeout_ms;
        GuardedStream {
            inner,
            deadline_ms: AtomicU64::new(deadline),
            idle_until_ms: AtomicU64::new(0),
            header_timeout_ms: AtomicU64::new(header_timeout_ms),
            timer: None,
            replacing: None,
            h2: None,
        }
    }

    /// An HTTP/2 connection, held to the deadlines of its frames ([`H2Watch`]).
    pub fn http2(inner: Stream, limits: Limits) -> GuardedStream {
        GuardedStream {
            inner,
            deadline_ms: AtomicU64::new(0),
            idle_until_ms: AtomicU64::new(0),
            header_timeout_ms: AtomicU64::new(0),
            timer: None,
            replacing: None,
            h2: Some(Box::new(H2Watch::new(
                limits,
                ms_since_base(Instant::now()),
            ))),
        }
    }

    /// Whether `wake_at` (ms since base) has come, on the connection's one timer. A deadline
    /// that moved later leaves the timer where it is (HTTP/2's move on every frame): when it
    /// fires early it is moved to the deadline then — one timer reset per wake-up, not per read.
    fn timer_due(&mut self, cx: &mut Context<'_>, wake_at: u64) -> bool {
        let when =
            |at: u64| tokio::time::Instant::from_std(base() + Duration::from_millis(at.max(1) - 1));
        let Some((at, sleep)) = self.timer.as_mut() else {
            let mut sleep = Box::pin(tokio::time::sleep_until(when(wake_at)));
            let due = sleep.as_mut().poll(cx).is_ready();
            self.timer = Some((wake_at, sleep));
            return due;
        };
        if *at > wake_at {
            sleep.as_mut().reset(when(wake_at));
            *at = wake_at;
        }
        if sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        if *at < wake_at {
            // Fired for an earlier deadline that has moved on.
            sleep.as_mut().reset(when(wake_at));
            *at = wake_at;
            return sleep.as_mut().poll(cx).is_ready();
        }
        true
    }

    /// HTTP/2 reads: what arrives is shown to the watch; while nothing does, the watch's
    /// deadline ends the connection — quietly when idle, with an error when stalled.
    fn poll_read_h2(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let filled = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        let watch = self.h2.as_mut().expect("an HTTP/2 guard");
        if buf.filled().len() > filled {
            watch.received(&buf.filled()[filled..], ms_since_base(Instant::now()));
        }
        if read.is_ready() {
            return read;
        }
        // Nothing to read: the deadline, as it stands now (the frames sent since may have
        // moved it; a timer that fires early is pointed at the new one).
        let Some((at, why)) = self.h2.as_ref().and_then(|w| w.deadline()) else {
            return Poll::Pending;
        };
        if !self.timer_due(cx, at) {
            return Poll::Pending;
        }
        Poll::Ready(match why {
            Expiry::Idle => Ok(()),
            Expiry::Stalled => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "an HTTP/2 request body or header block stalled",
            )),
            Expiry::TooManyStreams => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "too many HTTP/2 streams",
            )),
        })
    }

    /// HTTP/2: bytes written to the client, shown to the watch.
    fn sent_h2(&mut self, bufs: &[std::io::IoSlice<'_>], mut written: usize) {
        if let Some(watch) = self.h2.as_mut() {
            let now = ms_since_base(Instant::now());
            for b in bufs {
                if written == 0 {
                    break;
                }
                let n = written.min(b.len());
                watch.sent(&b[..n], now);
                written -= n;
            }
        }
    }

    /// A response ended at `now`: the connection may idle for `keepalive`, then ends; a
    /// request begun by then must send its headers within `header_timeout` of its first
    /// bytes (the deadline is moved there when they arrive).
    pub fn arm_idle(&self, now: Instant, keepalive: Duration, header_timeout: Duration) {
        let idle_until = ms_since_base(now) + keepalive.as_millis() as u64;
        let header_timeout = header_timeout.as_millis() as u64;
        self.header_timeout_ms
            .store(header_timeout, Ordering::Relaxed);
        self.idle_until_ms.store(idle_until, Ordering::Relaxed);
        // Until the next request begins, only the idle end matters.
        self.deadline_ms
            .store(idle_until + header_timeout, Ordering::Relaxed);
    }

    /// No deadline (the request's headers are in).
    pub fn disarm(&self) {
        self.deadline_ms.store(0, Ordering::Relaxed);
        self.idle_until_ms.store(0, Ordering::Relaxed);
    }

    /// The guard of a session's stream, if it has one.
    pub fn of(stream: Option<&Stream>) -> Option<&GuardedStream> {
        stream.and_then(|s| s.as_any().downcast_ref::<GuardedStream>())
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.h2.is_some() {
            return self.poll_read_h2(cx, buf);
        }
        let deadline = self.deadline_ms.load(Ordering::Relaxed);
        if deadline == 0 {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let idle_until = self.idle_until_ms.load(Ordering::Relaxed);
        let wake_at = if idle_until != 0 {
            idle_until
        } else {
            deadline
        };
        // One timer per connection, moved (not re-created) when the deadline changes; no
        // clock read here.
        let when = tokio::time::Instant::from_std(base() + Duration::from_millis(wake_at - 1));
        match self.timer.as_mut() {
            Some((at, sleep)) if *at != wake_at => {
                sleep.as_mut().reset(when);
                *at = wake_at;
            }
            Some(_) => {}
            None => self.timer = Some((wake_at, Box::pin(tokio::time::sleep_until(when)))),
        }
        if let Some((_, sleep)) = self.timer.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                if idle_until != 0 {
                    // Idle past keepalive_timeout: the connection ends quietly.
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "request headers not received in time",
                )));
            }
        }
        let filled = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if idle_until != 0 && buf.filled().len() > filled {
            // The next request has begun: its headers are due header_timeout from now.
            self.idle_until_ms.store(0, Ordering::Relaxed);
            let timeout = self.header_timeout_ms.load(Ordering::Relaxed);
            let deadline = ms_since_base(Instant::now()) + timeout;
            self.deadline_ms.store(deadline, Ordering::Relaxed);
        }
        read
    }
}

use std::future::Future;

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.replacing.is_none() && self.deadline_ms.load(Ordering::Relaxed) != 0 {
            self.replacing =
                crate::chain::problem::replace_bodiless_error(buf).map(|bytes| (bytes, 0));
        }
        let this = &mut *self;
        if this.h2.is_some() {
            let written = Pin::new(&mut this.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = written {
                this.sent_h2(&[std::io::IoSlice::new(buf)], n);
            }
            return written;
        }
        let Some((bytes, written)) = this.replacing.as_mut() else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        while *written < bytes.len() {
            match Pin::new(&mut this.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *written += n,
                other => return other,
            }
        }
        this.replacing = None;
        // The whole of Pingora's response was "written" (replaced).
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            self.sent_h2(bufs, n);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for GuardedStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for GuardedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

/// TLS facts of the connection (the negotiated ALPN decides HTTP/2).
impl Ssl for GuardedStream {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for GuardedStream {
    fn get_timing_digest(&self) -> Vec<Option<pingora::protocols::TimingDigest>> {
        self.inner.get_timing_digest()
    }
}

impl GetProxyDigest for GuardedStream {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for GuardedStream {
    fn get_socket_digest(&self) -> Option<Arc<pingora::protocols::SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for GuardedStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (tokio::net::TcpStream, GuardedStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let l4: pingora::protocols::l4::stream::Stream = server.into();
        (
            client,
            GuardedStream::new(Box::new(l4), Duration::from_millis(100)),
        )
    }

    #[tokio::test]
    async fn reads_fail_after_the_deadline_even_while_bytes_trickle() {
        let (mut client, mut guarded) = pair().await;
        let writer = tokio::spawn(async move {
            for _ in 0..20 {
                if client.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let mut buf = [0u8; 16];
        let mut got = 0;
        let err = loop {
            match guarded.read(&mut buf).await {
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            got < 20,
            "the deadline must cut the trickle short, read {got} bytes"
        );
        writer.abort();
    }

    #[tokio::test]
    async fn an_idle_stream_ends_quietly_after_the_keepalive_time() {
        let (_client, mut guarded) = pair().await;
        guarded.disarm();
        let ms = Duration::from_millis;
        guarded.arm_idle(Instant::now(), ms(100), ms(5_000));
        let mut buf = [0u8; 16];
        // End of stream, not an error: Pingora closes the connection as a client leaving.
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_request_begun_while_idle_is_held_to_the_header_deadline() {
        let (mut client, mut guarded) = pair().await;
        guarded.disarm();
        let ms = Duration::from_millis;
        // A long idle time: the request begins at once and is due 200 ms after its first
        // bytes, long before the idle time (plus the header time) would end it.
        guarded.arm_idle(Instant::now(), ms(60_000), ms(200));
        client.write_all(b"GET / HT").await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(guarded.read(&mut buf).await.unwrap(), 8);
        let err = tokio::time::timeout(ms(10_000), guarded.read(&mut buf))
            .await
            .expect("cut at its header deadline, not at the idle end")
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_disarmed_stream_reads_normally() {
        let (mut client, mut guarded) = pair().await;
        guarded.disarm();
        tokio::time::sleep(Duration::from_millis(150)).await;
        client.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        guarded.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
    }
}
