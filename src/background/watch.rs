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
}

impl Watcher {
    pub fn new(reloader: Arc<Reloader>, interval: Duration) -> Watcher {
        Watcher { reloader, interval }
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
        let mut paths = self.reloader.watched_files();
        let mut applied = fingerprint(&paths);
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
