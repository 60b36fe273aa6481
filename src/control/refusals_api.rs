//! The admin API for the limiter's refusals (`ops/refusals.rs`): why one request was
//! refused, the latest refusals, and who is being refused most — by this instance and, with
//! a Redis store, by the whole fleet.
//!
//! ```text
//! GET /refusals/{request_id}   why that request was refused (429 or 503)
//! GET /refusals?id={request_id}  the same (any id, even one of dots)
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
/// this instance's latest. `raw` is the path's last segment as sent: percent-decoded once,
/// strictly ([`request_id_of`]).
pub fn refusal(snapshot: &Snapshot, raw: &str) -> Answer {
    let request_id = match request_id_of(raw) {
        Ok(id) => id,
        Err(why) => return (StatusCode::BAD_REQUEST, json!({ "error": why })),
    };
    match snapshot.refusals.find(&request_id) {
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

/// `GET /refusals?id=<request id>`: the id's raw (percent-encoded) value, if the query names
/// one. The console asks this way: a browser resolves a path segment of dots (`..`, even as
/// `%2E%2E`) away before it sends it, and `..` is an id the gateway keeps.
pub fn id_in_query(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|p| p.strip_prefix("id="))
}

/// The request id a path segment (or the query's `id`) names: percent-decoded once (`order%3A42` → `order:42`,
/// `tenant%2F7` → `tenant/7`, `a%2Bb%3D%3D` → `a+b==`; `%252F` stays `%2F`, never decoded
/// twice). An id is any of the visible ASCII characters the gateway keeps in `X-Request-Id`,
/// so one id has exactly one spelling here: a `/` must come encoded (a raw one would make
/// `a/b` and `a%2Fb` two paths to one id), and a malformed escape or a decoded byte the
/// gateway would never have kept is refused rather than guessed at.
pub fn request_id_of(raw: &str) -> Result<String, String> {
    if raw.contains('/') {
        return Err("a request id's `/` must be sent percent-encoded (%2F)".into());
    }
    let bytes = raw.as_bytes();
    let mut id = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: u8| (b as char).to_digit(16);
            let pair = bytes
                .get(i + 1..i + 3)
                .and_then(|p| Some((hex(p[0])?, hex(p[1])?)));
            let Some((high, low)) = pair else {
                return Err("a malformed percent-escape in the request id".into());
            };
            id.push((high * 16 + low) as u8);
            i += 3;
        } else {
            id.push(bytes[i]);
            i += 1;
        }
    }
    if !crate::chain::request_id::is_acceptable(&id) {
        return Err(format!(
            "not a request id the gateway keeps: 1 to {} visible ASCII characters",
            crate::chain::request_id::MAX_LEN
        ));
    }
    Ok(String::from_utf8(id).expect("visible ASCII"))
}

#[cfg(test)]
mod tests {
    use super::request_id_of;

    #[test]
    fn ids_real_systems_send_are_decoded_once_and_strictly() {
        for (raw, id) in [
            ("order%3A42", "order:42"),
            ("order:42", "order:42"),
            ("tenant%2F7%2Freq-1", "tenant/7/req-1"),
            (
                "Root%3D1-67891233-abcdef012345678912345678",
                "Root=1-67891233-abcdef012345678912345678",
            ),
            ("a%2Bb%3D%3D", "a+b=="),
            ("a+b==", "a+b=="),
            ("%252F", "%2F"),
            ("0f3a%3Fq%23x", "0f3a?q#x"),
        ] {
            assert_eq!(request_id_of(raw).as_deref(), Ok(id), "{raw}");
        }
        for bad in ["tenant/7", "a%2", "a%zz", "%", "", "a%20b", "%00", "%C3%A9"] {
            assert!(request_id_of(bad).is_err(), "{bad:?} accepted");
        }
    }
}
