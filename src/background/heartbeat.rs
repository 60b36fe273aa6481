//! Background heartbeat: while the shared store is up, this instance announces itself in it
//! and learns how many instances are alive — the number the local fallback divides limits
//! by when the store goes away, and publishes who it refused most lately (the fleet's view
//! of `GET /limited`). On shutdown it gives back the unspent units of its quota
//! leases and withdraws itself.

use crate::control::snapshot::SnapshotHandle;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::time::Duration;

pub struct Heartbeat {
    snapshots: SnapshotHandle,
}

impl Heartbeat {
    pub fn new(snapshots: SnapshotHandle) -> Heartbeat {
        Heartbeat { snapshots }
    }
}

/// Heartbeats between two whole publications even when nothing changed: a Redis that lost
/// its data (or an instance that was taken for gone and left the hash) has it again soon.
const REPUBLISH_EVERY: u32 = 30;

/// What to publish of `now` after `last` was: "=" when nothing changed (Redis keeps it), so
/// an instance that refuses nobody new sends a byte, not its summaries, each heartbeat.
fn to_publish(now: String, last: &mut Option<String>) -> String {
    if !now.is_empty() && last.as_deref() == Some(now.as_str()) {
        return "=".to_owned();
    }
    *last = Some(now.clone());
    now
}

/// How long to wait before looking again when the store has no heartbeat (memory store).
const IDLE: Duration = Duration::from_secs(1);

/// The most a failed heartbeat waits before it is tried again: an instance whose first beat
/// failed (its store not reachable yet, a machine too busy to make the connection in time)
/// is counted by the others within a second of the store answering, not a whole interval
/// later.
const RETRY: Duration = Duration::from_secs(1);

#[async_trait]
impl BackgroundService for Heartbeat {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // What the store holds of this instance's summaries, as far as it knows.
        let mut last: Option<String> = None;
        let mut beats = 0u32;
        loop {
            let snapshot = self.snapshots.load_full();
            let store = std::sync::Arc::clone(&snapshot.store);
            let wait = match store.heartbeat_interval() {
                Some(interval) => {
                    beats = beats.wrapping_add(1);
                    if beats % REPUBLISH_EVERY == 0 {
                        last = None;
                    }
                    let now = crate::ops::access_log::unix_ms();
                    let limited = to_publish(snapshot.refusals.published(now), &mut last);
                    match store.heartbeat(false, &limited).await {
                        Ok(_) => interval,
                        Err(e) => {
                            log::debug!("heartbeat failed: {e}");
                            // Whether it was written is unknown: send it whole next time.
                            last = None;
                            interval.min(RETRY)
                        }
                    }
                }
                None => IDLE,
            };
            tokio::select! {
                _ = shutdown.changed() => {
                    let back = store.give_back_leases().await;
                    if back > 0 {
                        log::info!("gave back {back} unspent leased unit(s)");
                    }
                    if store.heartbeat_interval().is_some() {
                        let _ = store.heartbeat(true, "").await;
                    }
                    return;
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::to_publish;

    #[test]
    fn unchanged_summaries_are_sent_as_a_marker_and_changed_ones_whole() {
        let mut last = None;
        assert_eq!(to_publish("{a}".into(), &mut last), "{a}");
        assert_eq!(to_publish("{a}".into(), &mut last), "=");
        assert_eq!(to_publish("{b}".into(), &mut last), "{b}");
        assert_eq!(to_publish(String::new(), &mut last), "");
        assert_eq!(to_publish(String::new(), &mut last), "");
        assert_eq!(to_publish("{b}".into(), &mut last), "{b}");
    }
}
