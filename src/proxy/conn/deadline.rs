//! An HTTP/1 connection's deadlines (slowloris defence, and the idle keep-alive end).
//!
//! Pingora times out each *read* of a request, so a client trickling one header byte every
//! few seconds could hold a connection for hours. A guarded connection therefore carries a
//! deadline for its request headers: armed when the connection opens (`header_timeout`),
//! disarmed by the proxy as soon as a request's headers are complete (`early_request_filter`),
//! and armed again when the response is done: the next request's headers are due
//! `header_timeout` after its first bytes arrive, as on a new connection. Request bodies are
//! covered by the per-read `body_timeout` instead: a pause in an upload, not its total length,
//! is what is suspicious.
//!
//! The same timer ends idle keep-alive connections: after a response the connection is
//! *idle* until the next request's first bytes arrive, and an idle connection whose
//! `keepalive_timeout` has passed reads as closed (end of stream), which Pingora takes as a
//! client leaving between requests. Pingora's own keep-alive timeout is therefore left off on
//! guarded connections: it would register a second timer on every request's read.
//!
//! The proxy's hooks and the stream both reach these (through `&`): atomics, no lock.

use super::timer::ms_since_start;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Deadlines {
    /// After this (see `ms_since_start`) reads fail; 0 = no deadline.
    headers_due: AtomicU64,
    /// While nothing of the next request has been read: after this the idle connection
    /// ends (reads see end of stream); 0 = not idle.
    idle_until: AtomicU64,
    /// Time allowed for a request's headers, from its first bytes.
    header_timeout_ms: AtomicU64,
}

/// What the connection's next wake-up means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// The request's headers are late: the connection fails.
    Headers,
    /// Idle past `keepalive_timeout`: the connection ends quietly.
    Idle,
}

impl Deadlines {
    /// A connection opened at `now`: its first request's headers are due `header_timeout`
    /// from now.
    pub fn new(now: Instant, header_timeout: Duration) -> Deadlines {
        let timeout = header_timeout.as_millis() as u64;
        Deadlines {
            headers_due: AtomicU64::new(ms_since_start(now) + timeout),
            idle_until: AtomicU64::new(0),
            header_timeout_ms: AtomicU64::new(timeout),
        }
    }

    /// No deadline at all (HTTP/2 connections: theirs are per stream).
    pub fn none() -> Deadlines {
        Deadlines {
            headers_due: AtomicU64::new(0),
            idle_until: AtomicU64::new(0),
            header_timeout_ms: AtomicU64::new(0),
        }
    }

    /// The request's headers are in: no deadline until its response is done.
    pub fn disarm(&self) {
        self.headers_due.store(0, Ordering::Relaxed);
        self.idle_until.store(0, Ordering::Relaxed);
    }

    /// A response ended at `now`: the connection may idle for `keepalive`, then ends; a
    /// request begun by then must send its headers within `header_timeout` of its first
    /// bytes ([`request_began`](Self::request_began) moves the deadline there).
    pub fn arm_idle(&self, now: Instant, keepalive: Duration, header_timeout: Duration) {
        let idle_until = ms_since_start(now) + keepalive.as_millis() as u64;
        let header_timeout = header_timeout.as_millis() as u64;
        self.header_timeout_ms
            .store(header_timeout, Ordering::Relaxed);
        self.idle_until.store(idle_until, Ordering::Relaxed);
        // Until the next request begins, only the idle end matters.
        self.headers_due
            .store(idle_until + header_timeout, Ordering::Relaxed);
    }

    /// Whether a deadline is armed (a response written now is Pingora's own refusal).
    pub fn armed(&self) -> bool {
        self.headers_due.load(Ordering::Relaxed) != 0
    }

    /// When the connection must next wake up, and why (`None`: no deadline).
    pub fn next(&self) -> Option<(u64, Due)> {
        let headers = self.headers_due.load(Ordering::Relaxed);
        if headers == 0 {
            return None;
        }
        match self.idle_until.load(Ordering::Relaxed) {
            0 => Some((headers, Due::Headers)),
            idle => Some((idle, Due::Idle)),
        }
    }

    /// Bytes arrived while idle: the next request has begun, its headers due
    /// `header_timeout` from now. A no-op unless idle.
    pub fn request_began(&self) {
        if self.idle_until.load(Ordering::Relaxed) == 0 {
            return;
        }
        self.idle_until.store(0, Ordering::Relaxed);
        let timeout = self.header_timeout_ms.load(Ordering::Relaxed);
        let due = ms_since_start(Instant::now()) + timeout;
        self.headers_due.store(due, Ordering::Relaxed);
    }
}
