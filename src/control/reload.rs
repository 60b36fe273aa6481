//! Hot reload: read → validate → build a new snapshot off the request path (reusing every
//! stateful part whose definition did not change) → swap it in with one atomic store.
//! Requests already running keep the snapshot they started with.
//!
//! Triggers: the file changing on disk ([`Watcher`], polling with a debounce, so an
//! editor's write-then-rename, or a write in several chunks, is read once, whole; off with
//! `server.watch_config = false`), `SIGHUP`, and `POST /reload` on the admin listener.
//! Reloads run one at a time; one asked for meanwhile waits for its turn. An invalid file is rejected whole: the running
//! configuration stays, the error (with its TOML path) is logged, returned to `POST /reload`
//! and counted; the last attempts, with what each changed, are kept for `GET /reloads`
//! (`history.rs`). Settings that only take effect at start (listen addresses, threads, pid file,
//! upgrade socket, grace periods, keep-alive pool size) keep their running value and are
//! reported as needing a restart — see docs/operations.md on graceful upgrades. A reload that
//! makes a new store (a new address, topology or credentials) warms it before the swap
//! (`limit/store/redis/warmth.rs`), so no request meets it cold.

use crate::control::config::restart::keep_restart_only_settings;
use crate::control::config::view::render;
use crate::control::config::{Config, ConfigError};
use crate::control::history::{changes, Attempt, History};
use crate::control::snapshot::{Snapshot, SnapshotHandle};
use crate::ops::access_log::AccessLog;
use crate::ops::metrics::Metrics;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// What is known about the configuration currently in effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// 1 for the configuration the process started with, +1 per successful reload.
    pub version: u64,
    /// SHA-256 of the file's bytes (hex, first 16 digits).
    pub hash: String,
    /// Seconds since the Unix epoch.
    pub loaded_at: u64,
    /// Settings changed in the file that only a restart applies (TOML paths).
    pub pending_restart: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// Another reload ran for longer than [`RELOAD_WAIT`] (a file system or DNS lookup
    /// hanging).
    #[error("another reload has been running for too long")]
    Busy,
}

/// How long a reload waits for one already running before giving up with
/// [`ReloadError::Busy`].
pub const RELOAD_WAIT: Duration = Duration::from_secs(30);

/// The outcome of one reload attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// A new snapshot is live.
    Applied(Loaded),
    /// The file has the content already running: nothing to do.
    Unchanged(Loaded),
}

pub struct Reloader {
    path: PathBuf,
    snapshots: SnapshotHandle,
    metrics: Arc<Metrics>,
    access_log: Arc<AccessLog>,
    loaded: Mutex<Loaded>,
    running: tokio::sync::Mutex<()>,
    history: History,
    /// The runtime serving requests, once it runs: where a new store warms (its request
    /// connection's reader runs there).
    requests: std::sync::OnceLock<tokio::runtime::Handle>,
}

/// A reload's result before it is applied: the snapshot, its hash, the settings pending a
/// restart, what changed.
type Built = (Snapshot, String, Vec<String>, Vec<String>);

/// One entry of the history, as the running configuration stands after it.
fn attempt(
    trigger: &str,
    result: &'static str,
    loaded: &Loaded,
    changed: Vec<String>,
    problems: Vec<String>,
) -> Attempt {
    Attempt {
        at: unix_now(),
        trigger: trigger.to_owned(),
        result,
        version: loaded.version,
        hash: loaded.hash.clone(),
        changed,
        problems,
        more: 0,
    }
}

/// Clients whose keys changed while the rest of them did not: `/config` shows only how many
/// keys a client has, so the rendered comparison cannot see a rotation. Named, never shown.
fn key_changes(old: &Config, new: &Config) -> Vec<String> {
    new.clients
        .iter()
        .filter_map(|c| {
            let before = old.clients.iter().find(|o| o.id == c.id)?;
            let same_otherwise = before.plan == c.plan && before.metadata == c.metadata;
            (before.api_keys != c.api_keys && same_otherwise)
                .then(|| format!("clients.{} keys changed", c.id))
        })
        .collect()
}

/// The hash of a configuration: its text and the content of every file it reads, so that a
/// renewed certificate or a rotated secret file is a change like an edit of the text.
pub fn config_hash(text: &str, files: &[PathBuf]) -> String {
    let mut all = text.as_bytes().to_vec();
    for file in files {
        all.extend_from_slice(file.as_os_str().as_encoded_bytes());
        all.push(0);
        match std::fs::read(file) {
            Ok(bytes) => all.extend_from_slice(&bytes),
            Err(_) => all.extend_from_slice(b"<unreadable>"),
        }
        all.push(0);
    }
    content_hash(&all)
}

pub fn content_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The last load or reload attempt: when, and whether it succeeded.
fn note_attempt(metrics: &Metrics, ok: bool) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    metrics.reload_timestamp.set(now);
    metrics.reload_success.set(i64::from(ok));
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Reloader {
    /// `text` is the file content the process started with.
    pub fn new(
        path: PathBuf,
        text: &str,
        snapshots: SnapshotHandle,
        metrics: Arc<Metrics>,
        access_log: Arc<AccessLog>,
    ) -> Reloader {
        let loaded = Loaded {
            version: 1,
            hash: config_hash(text, &snapshots.load().config.files),
            loaded_at: unix_now(),
            pending_restart: Vec::new(),
        };
        metrics.config_version.set(1);
        note_attempt(&metrics, true);
        metrics
            .config_info
            .with_label_values(&[&loaded.hash])
            .set(1);
        let history = History::default();
        history.record(attempt("start", "loaded", &loaded, Vec::new(), Vec::new()));
        Reloader {
            path,
            snapshots,
            metrics,
            access_log,
            loaded: Mutex::new(loaded),
            running: tokio::sync::Mutex::new(()),
            history,
            requests: std::sync::OnceLock::new(),
        }
    }

    /// The runtime serving requests has started (`proxy/warm.rs`): the store warms there now,
    /// as will a new store a reload makes, before it is swapped in.
    pub fn serving_from(&self, runtime: tokio::runtime::Handle) {
        runtime.spawn(self.snapshots.load().store.warm());
        let _ = self.requests.set(runtime);
    }

    /// Warms `snapshot`'s store, if a reload made it (not the running one), in the runtime
    /// serving requests, before the swap: the running store answers meanwhile. Bounded by
    /// the new store's startup grace.
    async fn warm_new_store(&self, snapshot: &Snapshot) {
        let running = self.snapshots.load();
        let (Some(runtime), false) = (
            self.requests.get(),
            Arc::ptr_eq(&running.store, &snapshot.store),
        ) else {
            return;
        };
        drop(running);
        if runtime.spawn(snapshot.store.warm()).await.is_err() {
            log::warn!("the new limiter store's warm-up did not finish: it warms on first use");
        }
    }

    /// The latest load and reload attempts, newest first (`GET /reloads`).
    pub fn history(&self) -> Vec<Attempt> {
        self.history.latest()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The live snapshot.
    pub fn snapshot(&self) -> Arc<crate::control::snapshot::Snapshot> {
        self.snapshots.load_full()
    }

    /// The configuration file and the files it reads (certificates, secrets).
    pub fn watched_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.path.clone()];
        files.extend(self.snapshots.load().config.files.iter().cloned());
        files
    }

    /// Whether the running configuration wants the file watched (`server.watch_config`).
    pub fn watching(&self) -> bool {
        self.snapshots.load().config.server.watch_config
    }

    pub fn loaded(&self) -> Loaded {
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the file and applies it if it is valid and different from what is running.
    /// `trigger` names what asked for it (for the log). Reloads run one at a time: a reload
    /// asked for while another runs waits for it (at most [`RELOAD_WAIT`]) and then reads
    /// the file itself, so when it returns, the file as it was when it was asked for is live
    /// (`Applied`, or `Unchanged` when the other reload already applied it).
    pub async fn reload(&self, trigger: &str) -> Result<Reloaded, ReloadError> {
        let _one_at_a_time = tokio::time::timeout(RELOAD_WAIT, self.running.lock())
            .await
            .map_err(|_| ReloadError::Busy)?;
        let path = self.path.clone();
        let snapshots = Arc::clone(&self.snapshots);
        let metrics = Arc::clone(&self.metrics);
        let current_hash = self.loaded().hash;
        // Reading, parsing and building (DNS lookups included) block: keep them off the
        // async workers.
        let built = tokio::task::spawn_blocking(move || -> Result<Option<Built>, ConfigError> {
            let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let mut config = Config::from_text(&text)?;
            let hash = config_hash(&text, &config.files);
            if hash == current_hash {
                return Ok(None);
            }
            for warning in &config.warnings {
                log::warn!("configuration {}: {warning}", path.display());
            }
            let old = snapshots.load_full();
            let pending = keep_restart_only_settings(&mut config, &old.config);
            let snapshot = Snapshot::build(config, Some(&old), &metrics)?;
            // What changed, read from the configuration as /config shows it (no secret).
            let mut changed = changes(&render(&old.config), &render(&snapshot.config));
            changed.extend(key_changes(&old.config, &snapshot.config));
            Ok(Some((snapshot, hash, pending, changed)))
        })
        .await
        .expect("reload task does not panic");
        match built {
            Ok(None) => {
                log::info!(
                    "configuration {} unchanged ({trigger}): the running one stays",
                    self.path.display()
                );
                self.reopen_access_log(&self.snapshots.load().config.access_log.target);
                self.metrics.reloads.with_label_values(&["unchanged"]).inc();
                note_attempt(&self.metrics, true);
                let loaded = self.loaded();
                let unchanged = attempt(trigger, "unchanged", &loaded, Vec::new(), Vec::new());
                self.history.record(unchanged);
                Ok(Reloaded::Unchanged(loaded))
            }
            Ok(Some((snapshot, hash, pending, changed))) => {
                self.warm_new_store(&snapshot).await;
                // The log's new target first: every request that sees the new snapshot was
                // started after this, so its line cannot be written to the old target.
                self.reopen_access_log(&snapshot.config.access_log.target);
                self.snapshots.store(Arc::new(snapshot));
                let loaded = {
                    let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
                    loaded.version += 1;
                    loaded.hash = hash;
                    loaded.loaded_at = unix_now();
                    loaded.pending_restart = pending;
                    // Under the lock: whoever sees the new version in /config also sees it
                    // in the metrics.
                    self.metrics.reloads.with_label_values(&["ok"]).inc();
                    note_attempt(&self.metrics, true);
                    self.metrics.config_version.set(loaded.version as i64);
                    self.metrics.config_info.reset();
                    self.metrics
                        .config_info
                        .with_label_values(&[&loaded.hash])
                        .set(1);
                    loaded.clone()
                };
                log::info!(
                    "configuration {} reloaded ({trigger}): version {}, hash {}",
                    self.path.display(),
                    loaded.version,
                    loaded.hash
                );
                let applied = attempt(trigger, "applied", &loaded, changed, Vec::new());
                self.history.record(applied);
                if !loaded.pending_restart.is_empty() {
                    log::warn!(
                        "configuration {}: {} changed but only take(s) effect after a restart (or a graceful upgrade); still running with the old value(s)",
                        self.path.display(),
                        loaded.pending_restart.join(", ")
                    );
                }
                Ok(Reloaded::Applied(loaded))
            }
            Err(e) => {
                self.metrics.reloads.with_label_values(&["error"]).inc();
                note_attempt(&self.metrics, false);
                let lines: Vec<String> = e.to_string().lines().map(str::to_owned).collect();
                log::error!(
                    "configuration {} rejected ({trigger}), the running one stays: {}",
                    self.path.display(),
                    lines.join("; ")
                );
                let loaded = self.loaded();
                let rejected = attempt(trigger, "rejected", &loaded, Vec::new(), lines);
                self.history.record(rejected);
                Err(ReloadError::Config(e))
            }
        }
    }
}

impl Reloader {
    /// After log rotation, a reload (SIGHUP) reopens the access log; a new path applies too.
    fn reopen_access_log(&self, target: &crate::ops::access_log::Target) {
        self.access_log.reopen(target.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_short_hex_of_the_content() {
        assert_eq!(content_hash(b"abc"), "ba7816bf8f01cfea");
        assert_ne!(content_hash(b"abc"), content_hash(b"abd"));
    }
}
