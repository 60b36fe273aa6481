//! The deadlines of an HTTP/2 connection, read off its frames as they pass (pure: bytes and
//! times in, a deadline out). Pingora bounds none of these on HTTP/2 — its read timeout does
//! nothing there — so the connection guard does, from what it sees on the wire:
//!
//! - **a request body that stalls**: a stream whose client has not ended its body, whose
//!   flow-control windows let the client send (so the gateway is not the one holding it
//!   back), and which has received no DATA for `body_timeout`;
//! - **a header block that never ends**: HEADERS without END_HEADERS, CONTINUATIONs
//!   trickling, for `header_timeout`;
//! - **an idle connection**: no stream open and nothing received for `keepalive_timeout`. A
//!   stream is open until the server ends or either side resets it: a response still coming
//!   (a slow upstream, a long stream of events) keeps its connection, however long the
//!   client is silent (its own bounds are `read_timeout` and `send_timeout`).
//!
//! Only frame headers are parsed (9 bytes each; the payload of the server's SETTINGS and
//! WINDOW_UPDATE frames for the windows), never HPACK or data. Streams are tracked while
//! open and forgotten when the server ends them or either side resets them; the h2 server bounds how many
//! are open (`SETTINGS_MAX_CONCURRENT_STREAMS`), and this table refuses to grow past
//! [`MAX_TRACKED`] (the connection is then closed as misbehaving).

use std::collections::HashMap;

/// Streams tracked at once; the h2 server allows 100 concurrent ones.
pub const MAX_TRACKED: usize = 1024;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
/// RFC 9113 §6.9.2: every window starts at 65 535 until SETTINGS say otherwise.
const DEFAULT_WINDOW: i64 = 65_535;
const PREFACE_LEN: usize = 24;

/// The times a connection is held to (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub header_ms: u64,
    pub body_ms: u64,
    pub idle_ms: u64,
}

/// Why the connection ends at its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// A request body paused past `body_timeout`, or a header block past `header_timeout`:
    /// the connection fails (its streams are answered with a reset).
    Stalled,
    /// Idle past `keepalive_timeout`: the connection ends quietly.
    Idle,
    /// The client opened more streams than any server allows at once.
    TooManyStreams,
}

struct Stream {
    /// The client has not ended its half (END_STREAM not received).
    body_open: bool,
    /// What the client may still send on this stream.
    window: i64,
    /// Since when the body has been waiting (its last DATA, or when it could send again).
    since_ms: u64,
}

/// One direction's frame boundaries: a frame header being read, or a payload being skipped
/// (or kept, where its content matters).
#[derive(Default)]
struct Frames {
    /// Bytes of the preface still to skip (the client's direction only).
    preface: usize,
    head: [u8; 9],
    head_len: usize,
    /// The current frame's header, once complete: (type, flags, stream, payload left).
    current: Option<(u8, u8, u32, usize)>,
    /// The kept payload of a frame whose content matters.
    payload: Vec<u8>,
}

/// A frame header, and its payload when the watcher reads it.
struct Frame<'a> {
    kind: u8,
    flags: u8,
    stream: u32,
    length: usize,
    payload: &'a [u8],
}

impl Frames {
    /// Feeds `bytes`, calling `on_frame` for each frame header as soon as it is complete
    /// (with an empty payload) — or, for frames whose payload `keep` says to read, once the
    /// payload is complete too.
    fn feed(
        &mut self,
        mut bytes: &[u8],
        keep: impl Fn(u8) -> bool,
        mut on_frame: impl FnMut(Frame<'_>),
    ) {
        if self.preface > 0 {
            let skip = self.preface.min(bytes.len());
            self.preface -= skip;
            bytes = &bytes[skip..];
        }
        while !bytes.is_empty() {
            match self.current {
                None => {
                    let take = (9 - self.head_len).min(bytes.len());
                    self.head[self.head_len..self.head_len + take].copy_from_slice(&bytes[..take]);
                    self.head_len += take;
                    bytes = &bytes[take..];
                    if self.head_len < 9 {
                        return;
                    }
                    self.head_len = 0;
                    let h = self.head;
                    let length = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    let (kind, flags) = (h[3], h[4]);
                    if !keep(kind) {
                        on_frame(Frame {
                            kind,
                            flags,
                            stream,
                            length,
                            payload: &[],
                        });
                    }
                    self.payload.clear();
                    self.current = Some((kind, flags, stream, length));
                    if length == 0 {
                        self.finish(&keep, &mut on_frame);
                    }
                }
                Some((kind, _, _, left)) => {
                    let take = left.min(bytes.len());
                    // Kept payloads are small control frames; a huge one is skipped unread.
                    if keep(kind) && self.payload.len() + take <= 16_384 {
                        self.payload.extend_from_slice(&bytes[..take]);
                    }
                    bytes = &bytes[take..];
                    if let Some((_, _, _, left)) = self.current.as_mut() {
                        *left -= take;
                        if *left == 0 {
                            self.finish(&keep, &mut on_frame);
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self, keep: &impl Fn(u8) -> bool, on_frame: &mut impl FnMut(Frame<'_>)) {
        if let Some((kind, flags, stream, _)) = self.current.take() {
            if keep(kind) {
                on_frame(Frame {
                    kind,
                    flags,
                    stream,
                    length: self.payload.len(),
                    payload: &self.payload,
                });
            }
        }
    }
}

/// What one HTTP/2 connection has open, and so when it must end.
pub struct H2Watch {
    limits: Limits,
    incoming: Frames,
    outgoing: Frames,
    /// Open streams by id (a few per connection, at most [`MAX_TRACKED`]: a fast hasher).
    streams: HashMap<u32, Stream, foldhash::fast::RandomState>,
    /// What the client may still send on the connection as a whole.
    conn_window: i64,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE.
    initial_window: i64,
    /// A header block begun and not ended: since when.
    header_block_ms: Option<u64>,
    /// The highest stream id the client has opened (new streams' ids only grow: HEADERS on
    /// a lower one are trailers, or for a stream already ended).
    last_stream: u32,
    /// When the client last sent anything, or the server last ended a stream: what an idle
    /// connection's keep-alive counts from.
    last_active_ms: u64,
    too_many: bool,
    /// The deadline as of the last frame seen (computed then, read on every idle poll).
    due: Option<(u64, Expiry)>,
}

impl std::fmt::Debug for H2Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Watch")
            .field("open_streams", &self.streams.len())
            .field("deadline", &self.deadline())
            .finish()
    }
}

impl H2Watch {
    /// A connection opened at `now_ms` (the client's preface not yet read).
    pub fn new(limits: Limits, now_ms: u64) -> H2Watch {
        H2Watch {
            limits,
            incoming: Frames {
                preface: PREFACE_LEN,
                ..Frames::default()
            },
            outgoing: Frames::default(),
            streams: HashMap::with_capacity_and_hasher(16, Default::default()),
            conn_window: DEFAULT_WINDOW,
            initial_window: DEFAULT_WINDOW,
            header_block_ms: None,
            last_stream: 0,
            last_active_ms: now_ms,
            too_many: false,
            due: Some((now_ms + limits.idle_ms, Expiry::Idle)),
        }
    }

    /// Bytes received from the client at `now_ms`.
    pub fn received(&mut self, bytes: &[u8], now_ms: u64) {
        if bytes.is_empty() {
            return;
        }
        self.last_active_ms = now_ms;
        let mut incoming = std::mem::take(&mut self.incoming);
        incoming.feed(bytes, |_| false, |f| self.client_frame(f, now_ms));
        self.incoming = incoming;
        self.due = self.compute_deadline();
    }

    /// Bytes sent to the client at `now_ms`.
    pub fn sent(&mut self, bytes: &[u8], now_ms: u64) {
        let mut outgoing = std::mem::take(&mut self.outgoing);
        outgoing.feed(
            bytes,
            |kind| matches!(kind, SETTINGS | WINDOW_UPDATE),
            |f| self.server_frame(f, now_ms),
        );
        self.outgoing = outgoing;
        self.due = self.compute_deadline();
    }

    fn client_frame(&mut self, f: Frame<'_>, now_ms: u64) {
        match f.kind {
            HEADERS => {
                if f.flags & END_HEADERS == 0 {
                    self.header_block_ms.get_or_insert(now_ms);
                } else {
                    self.header_block_ms = None;
                }
                let initial = self.initial_window;
                let full = self.streams.len() >= MAX_TRACKED;
                match self.streams.get_mut(&f.stream) {
                    // Trailers end the body.
                    Some(s) if f.flags & END_STREAM != 0 => s.body_open = false,
                    Some(_) => {}
                    // Not a new stream: one the server has ended already.
                    None if f.stream <= self.last_stream => {}
                    None if full => self.too_many = true,
                    None => {
                        self.last_stream = f.stream;
                        // Without a body (END_STREAM) it waits on the server alone.
                        self.streams.insert(
                            f.stream,
                            Stream {
                                body_open: f.flags & END_STREAM == 0,
                                window: initial,
                                since_ms: now_ms,
                            },
                        );
                    }
                }
            }
            CONTINUATION if f.flags & END_HEADERS != 0 => self.header_block_ms = None,
            DATA => {
                let length = f.length as i64;
                self.conn_window -= length;
                if let Some(s) = self.streams.get_mut(&f.stream) {
                    s.window -= length;
                    s.since_ms = now_ms;
                    if f.flags & END_STREAM != 0 {
                        s.body_open = false;
                    }
                }
            }
            RST_STREAM => {
                self.streams.remove(&f.stream);
            }
            _ => {}
        }
    }

    fn server_frame(&mut self, f: Frame<'_>, now_ms: u64) {
        match f.kind {
            SETTINGS if f.flags & ACK == 0 => {
                for setting in f.payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([setting[0], setting[1]]);
                    let value =
                        u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                    if id == SETTINGS_INITIAL_WINDOW_SIZE {
                        let delta = i64::from(value) - self.initial_window;
                        self.initial_window = i64::from(value);
                        for s in self.streams.values_mut() {
                            let was_blocked = s.window <= 0;
                            s.window += delta;
                            if was_blocked && s.window > 0 {
                                s.since_ms = now_ms;
                            }
                        }
                    }
                }
            }
            WINDOW_UPDATE if f.payload.len() == 4 => {
                let p = f.payload;
                let increment =
                    i64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff);
                if f.stream == 0 {
                    let was_blocked = self.conn_window <= 0;
                    self.conn_window += increment;
                    if was_blocked && self.conn_window > 0 {
                        // Every body could not be sent: their pauses start now.
                        for s in self.streams.values_mut() {
                            s.since_ms = now_ms;
                        }
                    }
                } else if let Some(s) = self.streams.get_mut(&f.stream) {
                    if s.window <= 0 && s.window + increment > 0 {
                        s.since_ms = now_ms;
                    }
                    s.window += increment;
                }
            }
            // The server ended its response or reset the stream: nothing waits on it.
            RST_STREAM => self.ended(f.stream, now_ms),
            HEADERS | DATA if f.flags & END_STREAM != 0 => self.ended(f.stream, now_ms),
            _ => {}
        }
    }

    /// The server is done with `stream`: an idle connection's keep-alive counts from now.
    fn ended(&mut self, stream: u32, now_ms: u64) {
        if self.streams.remove(&stream).is_some() {
            self.last_active_ms = self.last_active_ms.max(now_ms);
        }
    }

    /// When the connection ends if nothing changes, and why (`None`: no deadline).
    pub fn deadline(&self) -> Option<(u64, Expiry)> {
        self.due
    }

    fn compute_deadline(&self) -> Option<(u64, Expiry)> {
        if self.too_many {
            return Some((0, Expiry::TooManyStreams));
        }
        let mut due: Option<(u64, Expiry)> = None;
        let mut earliest = |at: u64, why: Expiry| {
            if due.is_none_or(|(d, _)| at < d) {
                due = Some((at, why));
            }
        };
        if let Some(since) = self.header_block_ms {
            earliest(since + self.limits.header_ms, Expiry::Stalled);
        }
        if self.conn_window > 0 {
            for s in self
                .streams
                .values()
                .filter(|s| s.body_open && s.window > 0)
            {
                earliest(s.since_ms + self.limits.body_ms, Expiry::Stalled);
            }
        }
        if self.streams.is_empty() && self.header_block_ms.is_none() {
            earliest(self.last_active_ms + self.limits.idle_ms, Expiry::Idle);
        }
        due
    }

    /// Streams the server has not ended (nor either side reset).
    #[cfg(test)]
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        header_ms: 100,
        body_ms: 1_000,
        idle_ms: 5_000,
    };

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut out = vec![len[1], len[2], len[3], kind, flags];
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn opened(now: u64) -> H2Watch {
        let mut w = H2Watch::new(LIMITS, now);
        w.received(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", now);
        w.received(&frame(SETTINGS, 0, 0, &[]), now);
        w
    }

    #[test]
    fn an_idle_connection_ends_quietly_after_keepalive() {
        let w = opened(1_000);
        assert_eq!(w.deadline(), Some((6_000, Expiry::Idle)));
    }

    #[test]
    fn a_stalled_body_is_due_body_timeout_after_its_last_data() {
        let mut w = opened(0);
        w.received(&frame(HEADERS, END_HEADERS, 1, b"hpack"), 10);
        assert_eq!(w.deadline(), Some((1_010, Expiry::Stalled)));
        w.received(&frame(DATA, 0, 1, &[0; 100]), 500);
        assert_eq!(w.deadline(), Some((1_500, Expiry::Stalled)));
        // The last DATA ends the body; the stream waits on the server's answer.
        w.received(&frame(DATA, END_STREAM, 1, &[0; 10]), 700);
        assert_eq!(w.open_streams(), 1);
        assert_eq!(w.deadline(), None);
        // The answer ends it: idle from then.
        w.sent(&frame(DATA, END_STREAM, 1, b"ok"), 900);
        assert_eq!(w.open_streams(), 0);
        assert_eq!(w.deadline(), Some((5_900, Expiry::Idle)));
    }

    #[test]
    fn a_body_the_gateway_holds_back_is_not_stalled() {
        let mut w = opened(0);
        w.received(&frame(HEADERS, END_HEADERS, 1, b"h"), 0);
        // The client fills the stream's window: it cannot send more until the server reads.
        w.received(&frame(DATA, 0, 1, &vec![0; 65_535]), 10);
        assert_eq!(
            w.deadline(),
            None,
            "blocked by flow control, not by the client"
        );
        // The server reads and opens the stream's window; the connection's is still shut.
        w.sent(&frame(WINDOW_UPDATE, 0, 1, &65_535u32.to_be_bytes()), 3_000);
        assert_eq!(w.deadline(), None);
        // Both open: the client could send, and its pause starts now.
        w.sent(&frame(WINDOW_UPDATE, 0, 0, &65_535u32.to_be_bytes()), 3_500);
        assert_eq!(w.deadline(), Some((4_500, Expiry::Stalled)));
    }

    #[test]
    fn the_servers_settings_change_every_window() {
        let mut w = opened(0);
        let mut settings = SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes().to_vec();
        settings.extend_from_slice(&10u32.to_be_bytes());
        w.sent(&frame(SETTINGS, 0, 0, &settings), 0);
        w.received(&frame(HEADERS, END_HEADERS, 3, b"h"), 0);
        w.received(&frame(DATA, 0, 3, &[0; 10]), 1);
        assert_eq!(w.deadline(), None);
    }

    #[test]
    fn a_header_block_that_never_ends_is_due_header_timeout() {
        let mut w = opened(0);
        w.received(&frame(HEADERS, END_STREAM, 1, b"part"), 50);
        assert_eq!(w.deadline(), Some((150, Expiry::Stalled)));
        w.received(&frame(CONTINUATION, 0, 1, b"more"), 120);
        assert_eq!(w.deadline(), Some((150, Expiry::Stalled)));
        w.received(&frame(CONTINUATION, END_HEADERS, 1, b"end"), 140);
        // A request without a body, waiting on its answer.
        assert_eq!(w.deadline(), None);
        w.sent(&frame(HEADERS, END_HEADERS | END_STREAM, 1, b"h"), 200);
        assert_eq!(w.deadline(), Some((5_200, Expiry::Idle)));
    }

    #[test]
    fn a_response_still_coming_keeps_its_connection_however_silent_the_client() {
        let mut w = opened(0);
        w.received(&frame(HEADERS, END_HEADERS | END_STREAM, 1, b"get"), 10);
        assert_eq!(w.open_streams(), 1);
        // A slow upstream, then a long stream of events: the client sends nothing.
        w.sent(&frame(HEADERS, END_HEADERS, 1, b"200"), 60_000);
        w.sent(&frame(DATA, 0, 1, b"event"), 3_600_000);
        assert_eq!(w.deadline(), None);
        w.sent(&frame(DATA, END_STREAM, 1, b"last"), 7_200_000);
        assert_eq!(w.deadline(), Some((7_205_000, Expiry::Idle)));
    }

    #[test]
    fn trailers_after_the_server_ended_the_stream_open_nothing() {
        let mut w = opened(0);
        w.received(&frame(HEADERS, END_HEADERS, 1, b"post"), 0);
        // The server answers early (a refusal) while the body is still coming.
        w.sent(&frame(HEADERS, END_HEADERS | END_STREAM, 1, b"413"), 10);
        w.received(&frame(DATA, 0, 1, &[0; 10]), 20);
        w.received(
            &frame(HEADERS, END_HEADERS | END_STREAM, 1, b"trailers"),
            30,
        );
        assert_eq!(w.open_streams(), 0);
        assert_eq!(w.deadline(), Some((5_030, Expiry::Idle)));
    }

    #[test]
    fn streams_the_server_ends_or_either_side_resets_are_forgotten() {
        let mut w = opened(0);
        for id in [1, 3, 5] {
            w.received(&frame(HEADERS, END_HEADERS, id, b"h"), 0);
        }
        assert_eq!(w.open_streams(), 3);
        w.received(&frame(RST_STREAM, 0, 1, &[0, 0, 0, 8]), 1);
        w.sent(&frame(RST_STREAM, 0, 3, &[0, 0, 0, 0]), 1);
        w.sent(&frame(HEADERS, END_HEADERS | END_STREAM, 5, b"h"), 1);
        assert_eq!(w.open_streams(), 0);
    }

    #[test]
    fn frames_split_anywhere_read_the_same() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(HEADERS, END_HEADERS, 1, b"headers"));
        bytes.extend(frame(DATA, 0, 1, &[7; 300]));
        bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, b"get"));
        for chunk in [1, 2, 5, 9, 10, 64] {
            let mut w = H2Watch::new(LIMITS, 0);
            for piece in bytes.chunks(chunk) {
                w.received(piece, 20);
            }
            assert_eq!(w.open_streams(), 2, "chunks of {chunk}");
            assert_eq!(
                w.deadline(),
                Some((1_020, Expiry::Stalled)),
                "chunks of {chunk}"
            );
        }
    }

    #[test]
    fn a_flood_of_streams_is_bounded() {
        let mut w = opened(0);
        for id in 0..(MAX_TRACKED as u32 + 1) {
            w.received(&frame(HEADERS, END_HEADERS, id * 2 + 1, b"h"), 0);
        }
        assert_eq!(w.open_streams(), MAX_TRACKED);
        assert_eq!(w.deadline(), Some((0, Expiry::TooManyStreams)));
    }
}
