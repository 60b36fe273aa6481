//! The stream every accepted connection is wrapped in: reads held to the connection's
//! deadlines (HTTP/1: `deadline.rs`; HTTP/2: the frame watch of `h2.rs`), one timer for them
//! (`timer.rs`), and Pingora's empty refusals written as problems (`refusal.rs`). Waiting
//! costs no worker: it is one timer on the connection's task.

use super::deadline::{Deadlines, Due};
use super::h2::{Expiry, H2Watch, Limits};
use super::head::{HeadGuard, HeadScan};
use super::refusal::{problem_response, replace_bodiless_error};
use super::timer::{ms_since_start, Timer};
use async_trait::async_trait;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType,
};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A transport stream whose reads end once its deadline has passed.
#[derive(Debug)]
pub struct GuardedStream {
    inner: Stream,
    /// HTTP/1's deadlines (unarmed on HTTP/2).
    deadlines: Deadlines,
    timer: Timer,
    /// A Pingora error response being replaced: our bytes, and how many are written.
    replacing: Option<(Vec<u8>, usize)>,
    /// HTTP/2: the deadlines read off the frames.
    h2: Option<Box<H2Watch>>,
    /// The admin listener: its request head measured as it arrives (`head.rs`), and the
    /// answer being written when it broke a bound.
    head: Option<Box<HeadGuard>>,
}

impl GuardedStream {
    /// An HTTP/1 connection: its first request's headers are due `header_timeout` from now.
    pub fn new(inner: Stream, header_timeout: Duration) -> GuardedStream {
        GuardedStream {
            inner,
            deadlines: Deadlines::new(Instant::now(), header_timeout),
            timer: Timer::default(),
            replacing: None,
            h2: None,
            head: None,
        }
    }

    /// The admin listener's connections: a request line longer than `target_max` (plus a
    /// method and version) is answered 414, a head longer than `head_max` 431, and the
    /// connection ends (`head.rs`).
    pub fn with_head_limits(mut self, target_max: usize, head_max: usize) -> GuardedStream {
        self.head = Some(Box::new(HeadGuard {
            scan: HeadScan::new(target_max, head_max),
            answer: None,
        }));
        self
    }

    /// Writes the answer to a head that broke its bound, then fails the read (Pingora then
    /// closes the connection without writing anything of its own).
    fn poll_refuse(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let Some(HeadGuard {
            answer: Some((bytes, written)),
            ..
        }) = self.head.as_deref_mut()
        else {
            return Poll::Ready(Ok(()));
        };
        while *written < bytes.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => Poll::Pending,
            _ => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "request head too large: answered",
            ))),
        }
    }

    /// An HTTP/2 connection, held to the deadlines of its frames ([`H2Watch`]).
    pub fn http2(inner: Stream, limits: Limits) -> GuardedStream {
        GuardedStream {
            inner,
            deadlines: Deadlines::none(),
            timer: Timer::default(),
            replacing: None,
            h2: Some(Box::new(H2Watch::new(
                limits,
                ms_since_start(Instant::now()),
            ))),
            head: None,
        }
    }

    /// The request's headers are in (called by `early_request_filter`).
    pub fn disarm(&self) {
        self.deadlines.disarm();
    }

    /// The response ended (called by `logging`): see [`Deadlines::arm_idle`].
    pub fn arm_idle(&self, now: Instant, keepalive: Duration, header_timeout: Duration) {
        self.deadlines.arm_idle(now, keepalive, header_timeout);
    }

    /// The guard of a session's stream, if it has one.
    pub fn of(stream: Option<&Stream>) -> Option<&GuardedStream> {
        stream.and_then(|s| s.as_any().downcast_ref::<GuardedStream>())
    }

    /// HTTP/1 reads: after the header deadline they fail; idle past the keep-alive time
    /// they see end of stream.
    fn poll_read_h1(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let Some((wake_at, due)) = self.deadlines.next() else {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        };
        if self.timer.due(cx, wake_at) {
            return Poll::Ready(match due {
                Due::Idle => Ok(()),
                Due::Headers => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "request headers not received in time",
                )),
            });
        }
        let filled = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if due == Due::Idle && buf.filled().len() > filled {
            self.deadlines.request_began();
        }
        if let Some(head) = self.head.as_deref_mut() {
            if head.answer.is_none() {
                if let Some(over) = head.scan.feed(&buf.filled()[filled..]) {
                    let detail = match over.status() {
                        414 => "the request target is longer than this listener accepts",
                        _ => "the request head is larger than this listener accepts",
                    };
                    head.answer = Some((problem_response(over.status(), detail), 0));
                }
            }
            if head.answer.is_some() {
                buf.set_filled(filled);
                return self.poll_refuse(cx);
            }
        }
        read
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
            watch.received(&buf.filled()[filled..], ms_since_start(Instant::now()));
        }
        if read.is_ready() {
            return read;
        }
        let Some((at, why)) = watch.deadline() else {
            return Poll::Pending;
        };
        if !self.timer.due(cx, at) {
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

    /// HTTP/2: bytes written to the client, shown to the watch. Writes are made by the task
    /// that also reads (the connection's): when they move the deadline (the server ended a
    /// stream, opened a window), that task is woken, so its read sets the new timer.
    fn sent_h2(&mut self, cx: &Context<'_>, bufs: &[std::io::IoSlice<'_>], mut written: usize) {
        if let Some(watch) = self.h2.as_mut() {
            let before = watch.deadline();
            let now = ms_since_start(Instant::now());
            for b in bufs {
                if written == 0 {
                    break;
                }
                let n = written.min(b.len());
                watch.sent(&b[..n], now);
                written -= n;
            }
            if watch.deadline() != before {
                cx.waker().wake_by_ref();
            }
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.h2.is_some() {
            self.poll_read_h2(cx, buf)
        } else {
            self.poll_read_h1(cx, buf)
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.h2.is_some() {
            let written = Pin::new(&mut this.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = written {
                this.sent_h2(cx, &[std::io::IoSlice::new(buf)], n);
            }
            return written;
        }
        if this.replacing.is_none() && this.deadlines.armed() {
            this.replacing = replace_bodiless_error(buf).map(|bytes| (bytes, 0));
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
            self.sent_h2(cx, bufs, n);
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
