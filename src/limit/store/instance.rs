//! The id this process goes by in the fleet's heartbeats (`lua/heartbeat.lua`) and in what
//! it publishes (refusals, `GET /fleet`).

/// `<host>-<pid>-<random>`: unique per process, readable in `ZRANGE <prefix>:instances`.
pub fn new_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{host}-{}-{:08x}", std::process::id(), h.finish() as u32)
}
