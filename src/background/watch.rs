//! Reload triggers: the configuration file changing on disk (polled, debounced) and SIGHUP.
//! The third trigger, `POST /reload`, is the admin listener's.

use crate::control::reload::Reloader;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Polls the file's metadata; a change is applied once the file has stopped changing for
/// one poll interval (an editor's save is several writes and renames).
pub struct Watcher {
    reloader: Arc<Reloader>,
    interval: Duration,
    /// The watched files, and their state, as the running configuration was loaded: taken
    /// here, at startup before any listener opens, not when the service first runs — on a
    /// busy machine that can be after a change, which would then never be seen as one.
    paths: Vec<PathBuf>,
    loaded: Option<Vec<(SystemTime, u64)>>,
}

impl Watcher {
    pub fn new(reloader: Arc<Reloader>, interval: Duration) -> Watcher {
        let paths = reloader.watched_files();
        let loaded = fingerprint(&paths);
        Watcher {
            reloader,
            interval,
            paths,
            loaded,
        }
    }
}

/// Modification time and length of every file (`None` while one is missing).
fn fingerprint(paths: &[PathBuf]) -> Option<Vec<(SystemTime, u64)>> {
    paths
        .iter()
        .map(|path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}

#[async_trait]
impl BackgroundService for Watcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // The config file and the files it reads (certificates, keys, secret files).
        let mut paths = self.paths.clone();
        let mut applied = self.loaded.clone();
        let mut seen = applied.clone();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            let now = fingerprint(&paths);
            if !self.reloader.watching() {
                // Watching is off: changes are for SIGHUP or POST /reload.
                (applied, seen) = (now.clone(), now);
                continue;
            }
            // Debounce: act only when two consecutive polls agree and differ from the last
            // applied state. A missing file (mid-rename) waits for the next poll.
            if now.is_some() && now == seen && now != applied {
                applied = now.clone();
                // The outcome is logged and counted by the reloader.
                let _ = self.reloader.reload("file changed").await;
                // The new configuration may read other files.
                let watched = self.reloader.watched_files();
                if watched != paths {
                    paths = watched;
                    applied = fingerprint(&paths);
                }
            }
            seen = now;
        }
    }
}

/// Reloads on `SIGHUP`.
pub struct SighupListener {
    reloader: Arc<Reloader>,
}

impl SighupListener {
    pub fn new(reloader: Arc<Reloader>) -> SighupListener {
        SighupListener { reloader }
    }
}

#[async_trait]
impl BackgroundService for SighupListener {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                log::error!(
                    "cannot listen for SIGHUP, reload by file change or POST /reload only: {e}"
                );
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                received = hangups.recv() => {
                    if received.is_none() {
                        return;
                    }
                    let _ = self.reloader.reload("SIGHUP").await;
                }
            }
        }
    }
}
