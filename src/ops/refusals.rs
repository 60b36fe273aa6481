//! What this instance refused lately, in fixed memory, for the admin API: the last
//! [`RECENT`] refusals of the limiter (429, and 503 when the store could not decide) by
//! request id (`GET /refusals/{request_id}`), and who was refused most, per route and limit,
//! in this and the previous minute and hour (`GET /limited`: Space-Saving summaries of
//! [`HITTERS`] counters each, `ops/hitters.rs`).
//!
//! Recording is on the refusal path only (an admitted request records nothing) and never
//! waits: a refusal that finds a summary busy (another thread recording) is counted in
//! `dropped` instead. The caller is named as the limiter knows it — the client id, or the
//! address for a caller not identified — never by a credential.

use crate::ops::hitters::{merge, Hitter, SpaceSaving, Summary};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Refusals kept for lookup by request id.
pub const RECENT: usize = 1024;
/// Counters per window summary: every caller refused more than 1/`HITTERS` of a window's
/// refusals is listed, each count at most its `error` too high.
pub const HITTERS: usize = 64;

/// One limit that refused a request, as it stood then.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RefusedLimit {
    pub name: String,
    pub limit: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub retry_after_ms: u64,
    /// A keyed limit's partition as the store names it (`k:` and a hash of the key parts,
    /// never the raw value); absent for a client's or address's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// One refused request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Refusal {
    pub request_id: String,
    pub at_unix_ms: u64,
    pub status: u16,
    pub route: String,
    /// `client:<id>`, or `address:<ip>` for a caller not identified.
    pub caller: String,
    /// The problem's detail, as the client read it.
    pub reason: String,
    /// The limits that refused it (empty for a 503: the store did not decide).
    pub limits: Vec<RefusedLimit>,
    pub retry_after_s: u64,
    pub instance: String,
}

/// A tumbling window's summary and the one before it.
struct Window {
    len_ms: u64,
    started_ms: u64,
    current: SpaceSaving,
    previous: SpaceSaving,
}

impl Window {
    fn new(len_ms: u64) -> Window {
        Window {
            len_ms,
            started_ms: 0,
            current: SpaceSaving::new(HITTERS),
            previous: SpaceSaving::new(HITTERS),
        }
    }

    /// Moves to the window `now` is in.
    fn roll(&mut self, now: u64) {
        let start = now - now % self.len_ms;
        if start == self.started_ms {
            return;
        }
        if start == self.started_ms + self.len_ms {
            std::mem::swap(&mut self.current, &mut self.previous);
        } else {
            self.previous.clear();
        }
        self.current.clear();
        self.started_ms = start;
    }
}

pub struct Refusals {
    recent: Mutex<VecDeque<Refusal>>,
    minute: Mutex<Window>,
    hour: Mutex<Window>,
    dropped: AtomicU64,
}

impl Default for Refusals {
    fn default() -> Refusals {
        Refusals {
            recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            minute: Mutex::new(Window::new(60_000)),
            hour: Mutex::new(Window::new(3_600_000)),
            dropped: AtomicU64::new(0),
        }
    }
}

/// Who was refused most by one route's limit, in one window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limited {
    pub route: String,
    pub limit: String,
    /// `client:<id>`, `address:<ip>`, or for a keyed limit `key:k:<hash>`.
    pub caller: String,
    pub count: u64,
    /// How much of `count` may belong to callers it displaced.
    pub error: u64,
}

impl Refusals {
    /// Keeps `refusal` (at `now`, Unix milliseconds), never waiting for a lock.
    pub fn record(&self, refusal: Refusal, now: u64) {
        // A keyed limit counts its key (hashed), every other limit the caller. Made once
        // for both windows.
        let route = &refusal.route;
        let counted: Vec<String> = match refusal.limits.is_empty() {
            true => vec![hitter_key(
                route,
                "(store unavailable)",
                "",
                &refusal.caller,
            )],
            false => refusal
                .limits
                .iter()
                .map(|l| match &l.key {
                    Some(key) => hitter_key(route, &l.name, "key:", key),
                    None => hitter_key(route, &l.name, "", &refusal.caller),
                })
                .collect(),
        };
        for window in [&self.minute, &self.hour] {
            let Ok(mut w) = window.try_lock() else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            w.roll(now);
            for key in &counted {
                w.current.add(key);
            }
        }
        match self.recent.try_lock() {
            Ok(mut recent) => {
                if recent.len() == RECENT {
                    recent.pop_front();
                }
                recent.push_back(refusal);
            }
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The refusal of the request with this id, if it is among the last [`RECENT`].
    pub fn find(&self, request_id: &str) -> Option<Refusal> {
        lock(&self.recent)
            .iter()
            .rev()
            .find(|r| r.request_id == request_id)
            .cloned()
    }

    /// The last `n` refusals, newest first.
    pub fn latest(&self, n: usize) -> Vec<Refusal> {
        lock(&self.recent).iter().rev().take(n).cloned().collect()
    }

    /// Who was refused most in the minute and the hour up to `now` (this window and the one
    /// before it, merged), `n` at most each.
    pub fn limited(&self, now: u64, n: usize) -> [LimitedWindow; 2] {
        let merged = |window: &Mutex<Window>| {
            let mut w = lock(window);
            w.roll(now);
            let both = [w.current.summary(HITTERS), w.previous.summary(HITTERS)];
            LimitedWindow::of(merge(&both, n))
        };
        [merged(&self.minute), merged(&self.hour)]
    }

    /// What this instance publishes for the fleet's view (beside its heartbeat): its
    /// minute and hour, [`HITTERS`] callers each, as JSON; "" when it refused nobody.
    pub fn published(&self, now: u64) -> String {
        let windows = self.limited(now, HITTERS);
        match windows.iter().all(|w| w.refusals == 0) {
            true => String::new(),
            false => serde_json::to_string(&windows).unwrap_or_default(),
        }
    }

    /// Refusals not recorded because a summary or the buffer was busy.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Who was refused most in one window: how many refusals it counted, the callers refused
/// most, and how often any caller not listed was refused at most.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitedWindow {
    pub refusals: u64,
    pub floor: u64,
    pub top: Vec<Limited>,
}

impl LimitedWindow {
    fn of(summary: Summary) -> LimitedWindow {
        LimitedWindow {
            refusals: summary.total,
            floor: summary.floor,
            top: summary.top.into_iter().filter_map(limited_of).collect(),
        }
    }

    fn summary(&self) -> Summary {
        Summary {
            total: self.refusals,
            floor: self.floor,
            top: self
                .top
                .iter()
                .map(|l| Hitter {
                    key: hitter_key(&l.route, &l.limit, "", &l.caller),
                    count: l.count,
                    error: l.error,
                })
                .collect(),
        }
    }
}

/// The most another instance's published summaries may hold (bytes): anything longer,
/// or not as [`Refusals::published`] writes it, is left out of the fleet's view.
pub const PUBLISHED_MAX: usize = 256 * 1024;

/// Another instance's published minute and hour, if they read as this version writes them.
pub fn read_published(text: &str) -> Option<[LimitedWindow; 2]> {
    if text.is_empty() || text.len() > PUBLISHED_MAX {
        return None;
    }
    let windows: [LimitedWindow; 2] = serde_json::from_str(text).ok()?;
    windows
        .iter()
        .all(|w| w.top.len() <= HITTERS)
        .then_some(windows)
}

/// The fleet's minute and hour: every instance's windows merged, `n` callers each. Counts
/// keep their bounds across instances (`ops/hitters.rs::merge`).
pub fn merge_fleet(instances: &[[LimitedWindow; 2]], n: usize) -> [LimitedWindow; 2] {
    let window = |i: usize| {
        let parts: Vec<Summary> = instances.iter().map(|w| w[i].summary()).collect();
        LimitedWindow::of(merge(&parts, n))
    };
    [window(0), window(1)]
}

/// Route, limit and caller (`kind` then `caller`) in one summary key, with a separator no
/// name or caller holds. (On the refusal path: no formatting machinery.)
fn hitter_key(route: &str, limit: &str, kind: &str, caller: &str) -> String {
    let mut key = String::with_capacity(route.len() + limit.len() + kind.len() + caller.len() + 2);
    for part in [route, "\u{1f}", limit, "\u{1f}", kind, caller] {
        key.push_str(part);
    }
    key
}

fn limited_of(h: Hitter) -> Option<Limited> {
    let mut parts = h.key.splitn(3, '\u{1f}');
    Some(Limited {
        route: parts.next()?.to_owned(),
        limit: parts.next()?.to_owned(),
        caller: parts.next()?.to_owned(),
        count: h.count,
        error: h.error,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(id: &str, caller: &str, limit: &str) -> Refusal {
        Refusal {
            request_id: id.into(),
            at_unix_ms: 0,
            status: 429,
            route: "orders".into(),
            caller: caller.into(),
            reason: "limit".into(),
            limits: vec![RefusedLimit {
                name: limit.into(),
                limit: 10,
                remaining: 0,
                reset_ms: 1,
                retry_after_ms: 1,
                key: None,
            }],
            retry_after_s: 1,
            instance: "i".into(),
        }
    }

    #[test]
    fn refusals_are_found_by_request_id_and_the_oldest_leave_first() {
        let r = Refusals::default();
        for i in 0..RECENT + 5 {
            r.record(refusal(&format!("id-{i}"), "client:a", "per-minute"), 1_000);
        }
        assert!(r.find("id-0").is_none());
        assert_eq!(r.find("id-5").unwrap().request_id, "id-5");
        assert_eq!(r.latest(2)[0].request_id, format!("id-{}", RECENT + 4));
    }

    #[test]
    fn the_minute_list_forgets_what_is_older_than_the_previous_minute() {
        let r = Refusals::default();
        for _ in 0..3 {
            r.record(refusal("x", "client:a", "per-minute"), 60_000);
        }
        r.record(refusal("y", "client:b", "per-minute"), 120_000);
        let [minute, hour] = r.limited(120_500, 10);
        assert_eq!(minute.top[0].caller, "client:a");
        assert_eq!(
            (minute.top[0].count, minute.top[1].count, minute.refusals),
            (3, 1, 4)
        );
        assert_eq!(hour.top.len(), 2);
        let [minute, hour] = r.limited(240_000, 10);
        assert!(minute.top.is_empty() && minute.refusals == 0, "{minute:?}");
        assert_eq!(hour.top[0].count, 3);
    }

    #[test]
    fn a_keyed_limit_counts_its_hashed_key_and_instances_merge_through_what_they_publish() {
        let a = Refusals::default();
        let mut keyed = refusal("k", "client:a", "per-tenant");
        keyed.limits[0].key = Some("k:0f0f".into());
        a.record(keyed.clone(), 1_000);
        a.record(keyed, 1_000);
        a.record(refusal("x", "client:a", "per-minute"), 1_000);
        let b = Refusals::default();
        assert_eq!(b.published(1_000), "", "nothing refused: nothing published");
        for _ in 0..3 {
            b.record(refusal("y", "client:a", "per-minute"), 1_500);
        }
        let published = [a.published(2_000), b.published(2_000)];
        let read: Vec<[LimitedWindow; 2]> = published
            .iter()
            .map(|p| read_published(p).expect("reads back"))
            .collect();
        let [minute, _] = merge_fleet(&read, 10);
        assert_eq!(minute.refusals, 6);
        let counts: Vec<(&str, &str, u64)> = minute
            .top
            .iter()
            .map(|l| (l.limit.as_str(), l.caller.as_str(), l.count))
            .collect();
        assert_eq!(
            counts,
            [
                ("per-minute", "client:a", 4),
                ("per-tenant", "key:k:0f0f", 2)
            ]
        );
        assert!(read_published("{not json").is_none());
        assert!(read_published(&"x".repeat(PUBLISHED_MAX + 1)).is_none());
    }
}
