//! A deadline for the TLS handshake. Pingora gives every handshake a fixed 60 s (its accept
//! loop has no setting for it); a client that opens a connection and never finishes its
//! handshake would hold it that long. Before each handshake starts (Pingora's pre-TLS hook),
//! a timer is set for `header_timeout`: if the handshake has not completed by then, the
//! socket is shut down, which fails the handshake at once.
//!
//! The timer knows the connection only by its socket digest, held weakly: once the
//! connection is gone (handshake failed, client left), it does nothing; once the handshake
//! is done ([`handshake_done`], called when the connection reaches the guard), it does
//! nothing either. Pending timers are one entry each in a table, removed when they fire.

use crate::control::snapshot::SnapshotHandle;
use async_trait::async_trait;
use pingora::listeners::PreTlsProcess;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{GetSocketDigest, Stream};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Handshakes under way: their socket digest's address → whether it completed.
fn pending() -> &'static Mutex<HashMap<usize, Arc<AtomicBool>>> {
    static PENDING: OnceLock<Mutex<HashMap<usize, Arc<AtomicBool>>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

/// Pingora's pre-TLS hook: arms each handshake's deadline.
pub struct HandshakeDeadline {
    snapshots: SnapshotHandle,
}

impl HandshakeDeadline {
    pub fn new(snapshots: SnapshotHandle) -> HandshakeDeadline {
        HandshakeDeadline { snapshots }
    }
}

#[async_trait]
impl PreTlsProcess for HandshakeDeadline {
    async fn process(&self, stream: &mut L4Stream) -> pingora::Result<()> {
        let Some(digest) = stream.get_socket_digest() else {
            return Ok(());
        };
        let timeout = self.snapshots.load().config.server.limits.header_timeout;
        let fd = stream.as_raw_fd();
        let key = Arc::as_ptr(&digest) as usize;
        let done = Arc::new(AtomicBool::new(false));
        lock().insert(key, Arc::clone(&done));
        // Held weakly: the allocation (and so `key`) stays this connection's while the timer
        // lives, and the connection itself is not kept alive by it.
        let connection = Arc::downgrade(&digest);
        drop(digest);
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            lock().remove(&key);
            if done.load(Ordering::Acquire) {
                return;
            }
            if let Some(_alive) = connection.upgrade() {
                // SAFETY: `fd` is this connection's socket: the digest is owned by the
                // stream holding the socket, and is alive (held here) for the call, so the
                // socket has not been closed and its descriptor not reused. shutdown(2) on it
                // only ends the handshake's reads and writes; the stream still closes it.
                unsafe {
                    libc::shutdown(fd, libc::SHUT_RDWR);
                }
            }
        });
        Ok(())
    }
}

/// The connection's TLS handshake completed (or it has none): its deadline no longer applies.
pub fn handshake_done(stream: &Stream) {
    let Some(digest) = stream.get_socket_digest() else {
        return;
    };
    let key = Arc::as_ptr(&digest) as usize;
    if let Some(done) = lock().get(&key) {
        done.store(true, Ordering::Release);
    }
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<AtomicBool>>> {
    pending().lock().unwrap_or_else(PoisonError::into_inner)
}
