//! Where an issuer's keys come from: fixed (PEM / JWK(S) from a file or secret, an HMAC
//! secret), or a JWKS URL the gateway fetches and refreshes.
//!
//! A fetched key set is replaced only by a fetch that yields a usable one: an endpoint that is
//! down, slow or answering garbage leaves the last good set in use (and says so in the
//! status: `/readyz`, the metrics). Fetches happen every `refresh` (the background service
//! asks [`KeySource::refresh_if_due`]), and when a token names a `kid` the set lacks — at
//! most once per `min_refresh`, however many such tokens arrive, so random `kid`s cannot make
//! the gateway hammer the identity provider. A request that needs keys joins the fetch under
//! way (whoever started it) or starts one if allowed, and waits at most `jwks_timeout` for it
//! — never for a fetch queued behind another. A fetch runs as a task of its own, so its result
//! is kept even when nobody waits for it any more. Failures are logged, naming the issuer, at
//! most once per [`LOG_EVERY`] (and once when the endpoint answers again).

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
        /// The issuer's name (its table in the configuration), for the log.
        issuer: String,
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
    /// The fetch under way: ends (its sender dropped) when the fetch is done.
    in_flight: Option<tokio::sync::watch::Receiver<()>>,
    /// When a failure was last logged, and failures not logged since.
    logged_at: Option<Instant>,
    unlogged: u64,
}

/// Fetch failures of one issuer are logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

pub struct KeySource {
    origin: Origin,
    keys: ArcSwapOption<KeySet>,
    /// Bumped each time the key set is replaced (verified-token cache entries name it).
    generation: AtomicU64,
    state: Mutex<FetchState>,
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
            metrics,
        }
    }

    pub fn url(issuer: &str, settings: JwksSettings, metrics: SourceMetrics) -> KeySource {
        let agent = crate::outbound::agent(settings.timeout, settings.ca_pem.as_deref());
        KeySource {
            origin: Origin::Url {
                issuer: issuer.to_owned(),
                settings,
                agent,
            },
            keys: ArcSwapOption::empty(),
            generation: AtomicU64::new(0),
            state: Mutex::new(FetchState::default()),
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

    /// A token named a `kid` that keys of generation `seen` lack (or there are no keys yet):
    /// join the fetch under way, or start one if allowed, and wait for it at most
    /// `jwks_timeout`. `true` when the keys changed since `seen`.
    pub async fn refresh_for_unknown_key(self: &Arc<Self>, seen: u64) -> bool {
        let Origin::Url { settings, .. } = &self.origin else {
            return false;
        };
        if self.generation() != seen {
            return true;
        }
        let Some(mut done) = self.join_or_start(Some(settings.min_refresh)) else {
            return false;
        };
        // Ends when the fetch does (its sender dropped), or at the bound.
        let _ = tokio::time::timeout(settings.timeout, done.changed()).await;
        self.generation() != seen
    }

    /// Fetches when the refresh interval (or the retry after a failure) has passed, and
    /// waits for it (or for the fetch already under way).
    pub async fn refresh_if_due(self: &Arc<Self>) {
        if !matches!(self.origin, Origin::Url { .. }) {
            return;
        }
        let due = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.next_due.is_none_or(|at| at <= Instant::now())
        };
        if due {
            if let Some(mut done) = self.join_or_start(None) {
                let _ = done.changed().await;
            }
        }
    }

    /// The fetch under way; else a new one, if none was tried within `min_refresh` (`None`:
    /// always), started as a task of its own. `None` when none runs.
    fn join_or_start(
        self: &Arc<Self>,
        min_refresh: Option<Duration>,
    ) -> Option<tokio::sync::watch::Receiver<()>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // A fetch whose task ended without clearing it (its runtime shut down) is over.
        if let Some(done) = state.in_flight.as_ref().filter(|d| d.has_changed().is_ok()) {
            return Some(done.clone());
        }
        let allowed =
            min_refresh.is_none_or(|min| state.last_attempt.is_none_or(|at| at.elapsed() >= min));
        if !allowed {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (sender, done) = tokio::sync::watch::channel(());
        state.in_flight = Some(done.clone());
        state.last_attempt = Some(Instant::now());
        drop(state);
        let source = Arc::clone(self);
        runtime.spawn(async move {
            source.fetch().await;
            source
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .in_flight = None;
            // Wakes every request waiting for this fetch.
            drop(sender);
        });
        Some(done)
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

    /// One fetch (started by [`KeySource::join_or_start`]): a usable key set replaces the one
    /// in use.
    async fn fetch(&self) {
        let Origin::Url {
            issuer,
            settings,
            agent,
        } = &self.origin
        else {
            return;
        };
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
                if state.last_error.take().is_some() {
                    log::info!(
                        "issuer {issuer}: keys fetched from {} again ({} key(s))",
                        settings.shown_url,
                        self.metrics.keys.get()
                    );
                    state.logged_at = None;
                    state.unlogged = 0;
                }
                state.next_due = Some(now + settings.refresh);
            }
            Err(why) => {
                self.metrics.failed.inc();
                // The error may quote the URL: never its credentials.
                let why = why.replace(&settings.url, &settings.shown_url);
                if state
                    .logged_at
                    .is_none_or(|at| now.duration_since(at) >= LOG_EVERY)
                {
                    let since = match state.unlogged {
                        0 => String::new(),
                        n => format!(" ({n} more failure(s) since the last line)"),
                    };
                    log::warn!(
                        "issuer {issuer}: fetching its keys from {} failed: {why}; the keys in use stay ({}){since}",
                        settings.shown_url,
                        self.metrics.keys.get()
                    );
                    state.logged_at = Some(now);
                    state.unlogged = 0;
                } else {
                    state.unlogged += 1;
                }
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
