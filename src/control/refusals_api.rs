//! The admin API for the limiter's refusals (`ops/refusals.rs`): why one request was
//! refused, the latest refusals, and who is being refused most — by this instance and, with
//! a Redis store, by the whole fleet.
//!
//! ```text
//! GET /refusals/{request_id}   why that request was refused (429 or 503)
//! GET /refusals                this instance's latest refusals
//! GET /limited                 who was refused most in the last minute and hour
//! ```
//!
//! The fleet's view merges what every live instance published with its last heartbeat
//! (`background/heartbeat.rs`), so it is up to one heartbeat interval behind; this
//! instance's own part is read at the time of the call.

use crate::control::snapshot::Snapshot;
use crate::ops::refusals::{merge_fleet, read_published, LimitedWindow, HITTERS, RECENT};
use http::StatusCode;
use serde_json::{json, Value};

/// An answer: its status and its JSON body.
pub type Answer = (StatusCode, Value);

/// Callers listed per window.
const LISTED: usize = 20;

/// `GET /limited`: who was refused most, per route and limit, in the last minute and hour.
pub async fn limited(snapshot: &Snapshot) -> Answer {
    let now = crate::ops::access_log::unix_ms();
    let [minute, hour] = snapshot.refusals.limited(now, LISTED);
    (
        StatusCode::OK,
        json!({
            "instance": snapshot.store.instance_id(),
            "minute": minute,
            "hour": hour,
            "fleet": fleet(snapshot, now).await,
            "counters": HITTERS,
            "note": format!("the current and the previous tumbling window; a caller's count is at most its `error` too high; a caller not listed was refused at most `floor` times; every caller with more than 1/{HITTERS} of an instance's refusals in a window is listed"),
        }),
    )
}

/// Every live instance's windows merged: `null` without a shared store, `{"error": …}` when
/// it did not answer.
async fn fleet(snapshot: &Snapshot, now: u64) -> Value {
    if snapshot.store.heartbeat_interval().is_none() {
        return Value::Null;
    }
    let instances = match snapshot.store.fleet().await {
        Ok(instances) => instances,
        Err(e) => return json!({"error": format!("the store did not answer: {}", e.kind())}),
    };
    let mut windows: Vec<[LimitedWindow; 2]> = vec![snapshot.refusals.limited(now, HITTERS)];
    let mut merged = vec![snapshot.store.instance_id().to_owned()];
    for other in instances.iter().filter(|i| !i.this) {
        if let Some(published) = read_published(&other.limited) {
            windows.push(published);
            merged.push(other.id.clone());
        }
    }
    let [minute, hour] = merge_fleet(&windows, LISTED);
    json!({
        "instances": instances.len().max(1),
        "merged": merged,
        "minute": minute,
        "hour": hour,
    })
}

/// `GET /refusals`: this instance's latest refusals, newest first.
pub fn latest(snapshot: &Snapshot) -> Answer {
    (
        StatusCode::OK,
        json!({
            "instance": snapshot.store.instance_id(),
            "kept": RECENT,
            "dropped": snapshot.refusals.dropped(),
            "latest": snapshot.refusals.latest(50),
        }),
    )
}

/// `GET /refusals/{request_id}`: why that request was refused (429 or 503), if it is among
/// this instance's latest.
pub fn refusal(snapshot: &Snapshot, request_id: &str) -> Answer {
    match snapshot.refusals.find(request_id) {
        Some(refusal) => (StatusCode::OK, json!(refusal)),
        None => (
            StatusCode::NOT_FOUND,
            json!({
                "error": format!(
                    "no refusal with this request id among this instance's latest {RECENT}; another instance may have answered it"
                ),
            }),
        ),
    }
}
