//! Where an issuer's keys come from: fixed (PEM / JWK(S) from a file or secret, an HMAC
//! secret), or a JWKS URL the gateway fetches and refreshes.
//!
//! A fetched key set is replaced only by a fetch that yields a usable one: an endpoint that is
//! down, slow or answering garbage leaves the last good set in use (and says so in the
//! status: `/readyz`, the metrics). Fetches happen every `refresh` (the background service
//! asks [`KeySource::refresh_if_due`]), and when a token names a `kid` the set lacks — at
//! most once per `min_refresh`, however many such tokens arrive, so random `kid`s cannot make
//! the gateway hammer the identity provider. Requests that wait for such a fetch wait for
//! the one under way, bounded by its timeout.

use super::keys::{KeySet, MAX_KEY_SET_BYTES};
use arc_swap::ArcSwapOption;
use prometheus::{IntCounter, IntGauge};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where a JWKS is fetched from, and how often.
#[derive(Clone, PartialEq, Eq)]
pub struct JwksSettings {
    pub url: String,
    /// The URL as shown (no credentials).
    pub shown_url: String,
    pub ca_pem: Option<Vec<u8>>,
    pub refresh: Duration,
    pub min_refresh: Duration,
    pub timeout: Duration,
}

impl std::fmt::Debug for JwksSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwksSettings")
            .field("url", &self.shown_url)
            .field("ca", &self.ca_pem.is_some())
            .field("refresh", &self.refresh)
            .field("min_refresh", &self.min_refresh)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Counters and gauges of one issuer's key source (registered by `ops::metrics`).
#[derive(Clone)]
pub struct SourceMetrics {
    pub fetched: IntCounter,
    pub failed: IntCounter,
    pub keys: IntGauge,
    /// When the key set in use was loaded (Unix seconds; 0: never).
    pub loaded_at: IntGauge,
}

/// What `/readyz` and `/config` say of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceStatus {
    pub keys: usize,
    /// Seconds since the keys in use were loaded (`None`: never loaded).
    pub age_secs: Option<u64>,
    /// The last fetch failed (why, without the URL's credentials); the older set stays.
    pub last_error: Option<String>,
}

enum Origin {
    Fixed,
    Url {
        settings: JwksSettings,
        agent: ureq::Agent,
    },
}

#[derive(Default)]
struct FetchState {
    last_attempt: Option<Instant>,
    next_due: Option<Instant>,
    loaded_at: Option<SystemTime>,
    last_error: Option<String>,
}

pub struct KeySource {
    origin: Origin,
    keys: ArcSwapOption<KeySet>,
    /// Bumped each time the key set is replaced (verified-token cache entries name it).
    generation: AtomicU64,
    state: Mutex<FetchState>,
    /// Held while a fetch runs: requests needing a refresh wait for the one under way.
    fetching: tokio::sync::Mutex<()>,
    metrics: SourceMetrics,
}

impl KeySource {
    pub fn fixed(keys: KeySet, metrics: SourceMetrics) -> KeySource {
        metrics.keys.set(keys.len() as i64);
        metrics.loaded_at.set(unix_now() as i64);
        KeySource {
            origin: Origin::Fixed,
            keys: ArcSwapOption::from_pointee(keys),
            generation: AtomicU64::new(1),
            state: Mutex::new(FetchState {
                loaded_at: Some(SystemTime::now()),
                ..FetchState::default()
            }),
            fetching: tokio::sync::Mutex::new(()),
            metrics,
        }
    }

    pub fn url(settings: JwksSettings, metrics: SourceMetrics) -> KeySource {
        let agent = crate::outbound::agent(settings.timeout, settings.ca_pem.as_deref());
        KeySource {
            origin: Origin::Url { settings, agent },
            keys: ArcSwapOption::empty(),
            generation: AtomicU64::new(0),
            state: Mutex::new(FetchState::default()),
            fetching: tokio::sync::Mutex::new(()),
            metrics,
        }
    }

    /// The keys in use (`None`: never loaded).
    pub fn keys(&self) -> Option<Arc<KeySet>> {
        self.keys.load_full()
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn status(&self) -> SourceStatus {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        SourceStatus {
            keys: self.keys.load().as_ref().map_or(0, |k| k.len()),
            age_secs: state.loaded_at.map(|at| {
                SystemTime::now()
                    .duration_since(at)
                    .unwrap_or_default()
                    .as_secs()
            }),
            last_error: state.last_error.clone(),
        }
    }

    /// A token named a `kid` that keys of generation `seen` lack: fetch again if allowed (or
    /// wait for the fetch under way). `true` when the keys changed since `seen`.
    pub async fn refresh_for_unknown_key(&self, seen: u64) -> bool {
        let Origin::Url { settings, .. } = &self.origin else {
            return false;
        };
        if self.generation() != seen {
            return true;
        }
        // A fetch under way is waited for; otherwise one starts only if allowed.
        let under_way = self.fetching.try_lock().is_err();
        if !under_way && !self.may_fetch(settings.min_refresh) {
            return false;
        }
        let _fetching = self.fetching.lock().await;
        if self.generation() != seen {
            return true;
        }
        if !self.may_fetch(settings.min_refresh) {
            return false;
        }
        self.fetch().await;
        self.generation() != seen
    }

    /// Fetches when the refresh interval (or the retry after a failure) has passed.
    pub async fn refresh_if_due(&self) {
        if !matches!(self.origin, Origin::Url { .. }) {
            return;
        }
        let due = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.next_due.is_none_or(|at| at <= Instant::now())
        };
        if due {
            let _fetching = self.fetching.lock().await;
            self.fetch().await;
        }
    }

    /// When the next periodic fetch is due (`None`: never, fixed keys).
    pub fn next_due(&self) -> Option<Instant> {
        match self.origin {
            Origin::Fixed => None,
            Origin::Url { .. } => Some(
                self.state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .next_due
                    .unwrap_or_else(Instant::now),
            ),
        }
    }

    fn may_fetch(&self, min_refresh: Duration) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .last_attempt
            .is_none_or(|at| at.elapsed() >= min_refresh)
    }

    /// One fetch (the caller holds `fetching`): a usable key set replaces the one in use.
    async fn fetch(&self) {
        let Origin::Url { settings, agent } = &self.origin else {
            return;
        };
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_attempt = Some(Instant::now());
        let (agent, url) = (agent.clone(), settings.url.clone());
        let call = tokio::task::spawn_blocking(move || {
            crate::outbound::get(&agent, &url, MAX_KEY_SET_BYTES)
                .and_then(|body| KeySet::parse(&body))
        });
        // ureq bounds the call; this bounds the wait for a blocking thread too.
        let result = match tokio::time::timeout(settings.timeout + GRACE, call).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the fetch did not complete".to_owned()),
            Err(_) => Err("timed out".to_owned()),
        };
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(keys) => {
                self.metrics.fetched.inc();
                self.metrics.keys.set(keys.len() as i64);
                self.metrics.loaded_at.set(unix_now() as i64);
                self.keys.store(Some(Arc::new(keys)));
                self.generation.fetch_add(1, Ordering::AcqRel);
                state.loaded_at = Some(SystemTime::now());
                state.last_error = None;
                state.next_due = Some(now + settings.refresh);
            }
            Err(why) => {
                self.metrics.failed.inc();
                // The error may quote the URL: never its credentials.
                let why = why.replace(&settings.url, &settings.shown_url);
                state.last_error = Some(why);
                state.next_due = Some(now + settings.min_refresh.min(settings.refresh));
            }
        }
    }
}

/// Extra wait for a blocking thread beyond the call's own timeout.
const GRACE: Duration = Duration::from_secs(1);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}
