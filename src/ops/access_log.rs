//! The access log: one JSON line per request (`[access_log] mode = "on"`), or per sampled
//! request (`"sampled"`, a fixed fraction), to stdout or a file.
//!
//! Off the hot path: a request hands a small owned [`Record`] to a bounded channel; a writer
//! thread formats and writes it (buffered, flushed whenever the channel runs dry). If the
//! writer cannot keep up, entries are dropped and counted
//! (`turnstile_access_log_dropped_total`) — the log never slows requests down. The file is
//! reopened on every reload (so `SIGHUP` after log rotation works) and when its path changes.
//! API keys are never logged: the entry carries the client id.

use prometheus::IntCounter;
use serde::Serialize;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{
    sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError,
};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    Off,
    On,
    /// Log this fraction of requests (0 < f <= 1), spread evenly.
    Sampled(f64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Stdout,
    File(PathBuf),
}

/// Entries waiting for the writer; beyond this they are dropped.
const QUEUE: usize = 16 * 1024;

/// One request, as logged.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Milliseconds since the Unix epoch (rendered as RFC 3339 by the writer).
    #[serde(skip)]
    pub at_ms: u64,
    pub request_id: String,
    pub method: String,
    /// Path only: query strings can carry secrets.
    pub path: String,
    pub route: Option<Arc<str>>,
    pub status: u16,
    pub client_id: Option<Arc<str>>,
    pub client_ip: Option<IpAddr>,
    /// What the limiter did: an [`Outcome`](crate::chain::admission::Outcome) by name
    /// (`docs/observability.md` lists them).
    pub decision: &'static str,
    /// The limit that refused the request, by name (never its key).
    pub limited_by: Option<Arc<str>>,
    pub latency_ms: f64,
    pub upstream: Option<String>,
    /// Times the request was sent upstream (more than 1: retried).
    pub attempts: u32,
    /// The request's trace (when tracing is on), to find its spans.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

enum Message {
    Line(Box<Record>),
    Reopen(Target),
}

pub struct AccessLog {
    sender: SyncSender<Message>,
    sampled: AtomicU64,
    dropped: IntCounter,
}

impl AccessLog {
    /// Starts the writer thread.
    pub fn start(target: Target, dropped: IntCounter) -> AccessLog {
        let (sender, receiver) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_loop(receiver, target))
            .expect("spawn the access log writer");
        AccessLog {
            sender,
            sampled: AtomicU64::new(0),
            dropped,
        }
    }

    /// Whether this request should be logged under `mode` (cheap: one atomic add when
    /// sampling, none otherwise).
    pub fn wants(&self, mode: Mode) -> bool {
        match mode {
            Mode::Off => false,
            Mode::On => true,
            Mode::Sampled(fraction) => {
                // Request n is logged when floor((n+1)·f) > floor(n·f): exactly f of them,
                // evenly spread.
                let n = self.sampled.fetch_add(1, Ordering::Relaxed) as f64;
                ((n + 1.0) * fraction).floor() > (n * fraction).floor()
            }
        }
    }

    pub fn log(&self, entry: Record) {
        match self.sender.try_send(Message::Line(Box::new(entry))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped.inc(),
        }
    }

    /// Reopens the output (after a reload, or log rotation). Lines logged after this call
    /// go to the new output, lines logged before it to the old one: the writer handles
    /// messages in the order they were sent.
    pub fn reopen(&self, target: Target) {
        let _ = self.sender.send(Message::Reopen(target));
    }
}

fn open(target: &Target) -> Box<dyn Write + Send> {
    match target {
        Target::Stdout => Box::new(std::io::stdout()),
        Target::File(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => Box::new(f),
            Err(e) => {
                log::error!(
                    "cannot open access log {}: {e}; writing to stdout",
                    path.display()
                );
                Box::new(std::io::stdout())
            }
        },
    }
}

fn write_loop(receiver: Receiver<Message>, target: Target) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, open(&target));
    loop {
        let message = match receiver.recv_timeout(Duration::from_millis(200)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => {
                let _ = out.flush();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        };
        handle(&mut out, message);
        // Everything already queued is written before the one flush, so lines show up
        // promptly without a write(2) per line under load.
        loop {
            match receiver.try_recv() {
                Ok(message) => handle(&mut out, message),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    let _ = out.flush();
                    return;
                }
            }
        }
        let _ = out.flush();
    }
}

fn handle(out: &mut std::io::BufWriter<Box<dyn Write + Send>>, message: Message) {
    match message {
        Message::Line(entry) => {
            let _ = write_entry(out, &entry);
        }
        Message::Reopen(target) => {
            let _ = out.flush();
            *out = std::io::BufWriter::with_capacity(64 * 1024, open(&target));
        }
    }
}

fn write_entry(out: &mut impl Write, entry: &Record) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Line<'a> {
        ts: String,
        #[serde(flatten)]
        entry: &'a Record,
    }
    let line = Line {
        ts: crate::ops::logging::rfc3339_millis(entry.at_ms),
        entry,
    };
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")
}

pub use crate::ops::logging::unix_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_logs_exactly_the_fraction() {
        let log = AccessLog::start(Target::Stdout, IntCounter::new("x", "x").unwrap());
        let logged = (0..1000).filter(|_| log.wants(Mode::Sampled(0.1))).count();
        assert_eq!(logged, 100);
        assert!(!log.wants(Mode::Off));
        assert!(log.wants(Mode::On));
    }

    fn entry(path: &str) -> Record {
        Record {
            at_ms: 0,
            request_id: "r".into(),
            method: "GET".into(),
            path: path.into(),
            route: None,
            status: 200,
            client_id: None,
            client_ip: None,
            decision: "not_limited",
            limited_by: None,
            latency_ms: 0.1,
            upstream: None,
            attempts: 0,
            trace_id: None,
        }
    }

    /// Lines in a log file (only whole lines: the writer may be mid-way through one).
    fn lines_of(path: &std::path::Path) -> Vec<String> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        whole.lines().map(str::to_owned).collect()
    }

    fn wait_for_lines(path: &std::path::Path, n: usize) -> Vec<String> {
        // Bounded by the writer's idle flush tick (200 ms) many times over.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let lines = lines_of(path);
            if lines.len() >= n || std::time::Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_burst_from_many_threads_loses_no_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let dropped = IntCounter::new("x", "x").unwrap();
        let log = Arc::new(AccessLog::start(
            Target::File(path.clone()),
            dropped.clone(),
        ));
        // Lines queue up faster than the writer drains them: every queued line must be
        // written (an earlier writer consumed one queued message per flush check).
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        log.log(entry(&format!("/t{t}/{i}")));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(dropped.get(), 0, "the queue holds 16 Ki lines");
        let lines = wait_for_lines(&path, 4000);
        assert_eq!(lines.len(), 4000);
        let mut paths: Vec<String> = lines
            .iter()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["path"].to_string())
            .collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), 4000, "every line exactly once");
    }

    #[test]
    fn lines_logged_after_a_reopen_go_to_the_new_target_and_none_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.log"), dir.path().join("b.log"));
        let log = AccessLog::start(Target::File(a.clone()), IntCounter::new("x", "x").unwrap());
        for i in 0..300 {
            log.log(entry(&format!("/a/{i}")));
        }
        log.reopen(Target::File(b.clone()));
        for i in 0..300 {
            log.log(entry(&format!("/b/{i}")));
        }
        let in_b = wait_for_lines(&b, 300);
        let in_a = wait_for_lines(&a, 300);
        assert_eq!((in_a.len(), in_b.len()), (300, 300));
        assert!(in_a.iter().all(|l| l.contains("\"/a/")));
        assert!(in_b.iter().all(|l| l.contains("\"/b/")));
    }

    #[test]
    fn entries_are_one_json_line_each() {
        let entry = Record {
            at_ms: 0,
            request_id: "r1".into(),
            method: "GET".into(),
            path: "/orders".into(),
            route: Some("orders".into()),
            status: 200,
            client_id: Some("ada".into()),
            client_ip: Some("10.0.0.1".parse().unwrap()),
            decision: "allowed",
            limited_by: None,
            latency_ms: 1.5,
            upstream: Some("127.0.0.1:9001".into()),
            attempts: 1,
            trace_id: None,
        };
        let mut out = Vec::new();
        write_entry(&mut out, &entry).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ts"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["route"], "orders");
        assert_eq!(v["client_id"], "ada");
        assert_eq!(v["decision"], "allowed");
        assert_eq!(v["status"], 200);
    }

    /// `docs/observability.md`'s access-log table names every field a line has, and each
    /// decision a line can carry.
    #[test]
    fn the_documented_fields_are_the_written_ones() {
        let docs = include_str!("../../docs/observability.md");
        let section = docs
            .split_once("## Access log\n")
            .and_then(|(_, rest)| rest.split("\n## ").next())
            .expect("an access log section");
        let documented: std::collections::BTreeSet<&str> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        let entry = Record {
            at_ms: 0,
            request_id: "r1".into(),
            method: "GET".into(),
            path: "/".into(),
            route: None,
            status: 200,
            client_id: None,
            client_ip: None,
            decision: "allowed",
            limited_by: None,
            latency_ms: 0.0,
            upstream: None,
            attempts: 0,
            trace_id: Some("t".into()),
        };
        let mut out = Vec::new();
        write_entry(&mut out, &entry).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let written: std::collections::BTreeSet<&str> =
            v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(written, documented);
        let decision_row = section
            .lines()
            .find(|l| l.starts_with("| `decision`"))
            .unwrap();
        for outcome in crate::chain::admission::Outcome::ALL {
            assert!(
                decision_row.contains(&format!("`{}`", outcome.as_str())),
                "decision {} is not documented",
                outcome.as_str()
            );
        }
    }
}
