//! The fleet: the gateway instances that share this store, as their heartbeats tell
//! (`lua/heartbeat.lua`), each with what it says of itself — its version and when it started.
//! For the admin API (`GET /fleet`) and the console.

use super::{Backend, Store, StoreError};
use crate::clock::Clock;
use serde::Serialize;
use std::sync::OnceLock;

/// One live instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instance {
    pub id: String,
    /// Milliseconds since its last heartbeat (Redis's clock).
    pub last_seen_ms: u64,
    /// "" for an instance from before versions were announced.
    pub version: String,
    /// Unix seconds; 0 when not announced.
    pub started_at: u64,
    /// The instance answering.
    pub this: bool,
    /// Who it refused most lately, as it published it ("" for nobody, or a gateway from
    /// before); read with `ops::refusals::read_published`.
    #[serde(skip)]
    pub limited: String,
}

/// What this instance says of itself in its heartbeats: "<version> <started, Unix s>".
pub fn this_instance() -> String {
    static STARTED: OnceLock<u64> = OnceLock::new();
    let started = STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    format!("{} {started}", env!("CARGO_PKG_VERSION"))
}

/// `info` as `this_instance` writes it: (version, started); empty and 0 when unreadable.
fn read_info(info: &str) -> (String, u64) {
    let mut parts = info.split(' ');
    let version = parts.next().unwrap_or_default();
    let started = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    // Bounded: whatever another process wrote is shown as text, never more than this.
    (version.chars().take(64).collect(), started)
}

impl<C: Clock + Clone> Store<C> {
    /// The live instances, this one first. With the memory store, only this one.
    pub async fn fleet(&self) -> Result<Vec<Instance>, StoreError> {
        let Backend::Redis(redis) = &self.backend else {
            let (version, started_at) = read_info(&this_instance());
            return Ok(vec![Instance {
                id: self.instance_id.clone(),
                last_seen_ms: 0,
                version,
                started_at,
                this: true,
                limited: String::new(),
            }]);
        };
        let liveness = self.failure.heartbeat_interval * 3;
        let mut fleet: Vec<Instance> = redis
            .fleet(liveness)
            .await?
            .into_iter()
            .map(|(id, last_seen_ms, info, limited)| {
                let (version, started_at) = read_info(&info);
                Instance {
                    this: id == self.instance_id,
                    id,
                    last_seen_ms,
                    version,
                    started_at,
                    limited,
                }
            })
            .collect();
        fleet.sort_by(|a, b| b.this.cmp(&a.this).then_with(|| a.id.cmp(&b.id)));
        Ok(fleet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_reads_back_and_odd_info_reads_as_unknown() {
        let (version, started) = read_info(&this_instance());
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
        assert!(started > 1_700_000_000);
        assert_eq!(read_info(""), (String::new(), 0));
        assert_eq!(read_info("x".repeat(500).as_str()).0.len(), 64);
    }
}
