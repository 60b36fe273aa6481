//! Whether the machine's CPUs are oversubscribed now: more threads runnable than the CPUs
//! this process may use. Asked only when a call to Redis reaches its bound (`patient.rs`):
//! a timer of the request's own worker may fire on time while the task that reads Redis's
//! replies waits, runnable, on a worker thread the kernel is not running (tokio does not let
//! another worker take the task a worker will run next). That wait is the gateway's, not
//! Redis's; the request's own timer cannot see it, the run queue can.
//!
//! Linux's `/proc/loadavg` names the runnable threads (its fourth field, `running/total`);
//! the CPUs are [`std::thread::available_parallelism`] (affinity and cgroup quota). Read at
//! most once per [`FRESH_FOR`], so a frozen Redis's burst of timeouts reads it a few times,
//! not once per request. Elsewhere (no `/proc`), never oversubscribed: a timeout is Redis's.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

/// How long one reading answers for.
const FRESH_FOR_MS: u64 = 5;

/// Whether more threads are runnable on the machine than this process has CPUs, now (as of
/// at most [`FRESH_FOR_MS`] ago; `now_ms` on [`now_ms`](super::patient::now_ms)'s clock).
pub fn now(now_ms: u64) -> bool {
    static LATEST: Reading = Reading::new();
    LATEST.at(now_ms, || {
        std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|text| runnable(&text))
            .is_some_and(|running| running > cpus())
    })
}

/// The latest reading and when it was taken.
struct Reading {
    /// `now_ms` + 1 when read; 0 = never.
    read_at: AtomicU64,
    over: AtomicBool,
}

impl Reading {
    const fn new() -> Reading {
        Reading {
            read_at: AtomicU64::new(0),
            over: AtomicBool::new(false),
        }
    }

    /// The reading at `now_ms`: the latest if fresh, else `read()`'s.
    fn at(&self, now_ms: u64, read: impl FnOnce() -> bool) -> bool {
        let read_at = self.read_at.load(Ordering::Relaxed);
        if read_at != 0 && now_ms + 1 < read_at + FRESH_FOR_MS {
            return self.over.load(Ordering::Relaxed);
        }
        let over = read();
        self.over.store(over, Ordering::Relaxed);
        self.read_at.store(now_ms + 1, Ordering::Relaxed);
        over
    }
}

/// The CPUs this process may run on.
fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The runnable threads `/proc/loadavg`'s text names (the thread reading it included).
fn runnable(loadavg: &str) -> Option<usize> {
    let field = loadavg.split_ascii_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runnable_threads_are_read_from_loadavg() {
        assert_eq!(runnable("5.17 3.33 2.52 11/140 27707\n"), Some(11));
        assert_eq!(runnable("0.00 0.01 0.05 1/80 1"), Some(1));
        for broken in ["", "0.1 0.2 0.3", "0.1 0.2 0.3 x/80 1", "0.1 0.2 0.3 80 1"] {
            assert_eq!(runnable(broken), None, "{broken:?}");
        }
    }

    #[test]
    fn a_reading_answers_for_a_few_milliseconds() {
        let reading = Reading::new();
        assert!(reading.at(1_000, || true), "read when never read");
        assert!(
            reading.at(1_000 + FRESH_FOR_MS - 1, || false),
            "fresh: kept"
        );
        assert!(
            !reading.at(1_000 + FRESH_FOR_MS, || false),
            "stale: read again"
        );
        assert!(!reading.at(1_000 + FRESH_FOR_MS + 1, || true), "and kept");
        // The machine's own reading parses (what it says depends on the machine).
        now(0);
    }
}
