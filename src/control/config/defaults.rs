//! Defaults, in one place so the docs (`conf/gateway.toml`) and the code agree.

use crate::limit::store::FailureMode;
use std::time::Duration;

pub const LISTEN: &str = "0.0.0.0:8080";
pub const ADMIN_LISTEN: &str = "127.0.0.1:9090";
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// nginx's `send_timeout` default.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);
pub const CLIENT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_HEADER_BYTES: usize = 32 * 1024;
pub const MAX_HEADER_COUNT: usize = 100;
pub const MAX_URI_LENGTH: usize = 8 * 1024;
pub const MAX_BODY_BYTES: u64 = 10 * 1024 * 1024;
pub const PID_FILE: &str = "/tmp/turnstile.pid";
pub const UPGRADE_SOCK: &str = "/tmp/turnstile_upgrade.sock";
pub const GRACE_PERIOD: Duration = Duration::from_secs(10);
pub const GRACEFUL_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle upstream connections kept for reuse, all pools together. Pingora's own default is
/// 128: a request that finds no idle connection opens a new one, and a connection that
/// finds the pool full is closed, so under more concurrent upstream requests than this most
/// requests paid a connect (measured with `work_stealing = false` at 500 client connections:
/// half the throughput; BENCHMARKS.md).
pub const UPSTREAM_KEEPALIVE_POOL_SIZE: usize = 1024;
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often upstream host names are resolved again.
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(30);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Passive outlier ejection: failures in a row, the first ejection's length, the longest,
/// and the largest share of a pool out at once.
pub const OUTLIER_FAILURES: u32 = 5;
/// A route's retries: tries in all, and the first and longest waits before one.
pub const RETRY_ATTEMPTS: u32 = 2;
pub const RETRY_BACKOFF: Duration = Duration::from_millis(25);
pub const RETRY_MAX_BACKOFF: Duration = Duration::from_millis(250);
pub const OUTLIER_BASE_EJECTION: Duration = Duration::from_secs(30);
pub const OUTLIER_MAX_EJECTION: Duration = Duration::from_secs(300);
pub const OUTLIER_MAX_PERCENT: u8 = 50;
/// An upgraded connection silent this long in one direction is closed (a WebSocket's pings
/// keep a quiet one open: most libraries ping every 20–30 s).
pub const UPGRADE_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);
pub const HEALTH_HOST: &str = "localhost";
pub const MAX_TRACKED_IPS: usize = 100_000;
/// Keyed-limit keys an in-process store tracks.
pub const MAX_TRACKED_KEYS: usize = crate::limit::store::memory::DEFAULT_MAX_KEYED;
pub const STORE_PREFIX: &str = "turnstile";
pub const STORE_TIMEOUT: Duration = Duration::from_millis(20);
pub const ON_STORE_ERROR: FailureMode = FailureMode::FailOpen;
pub const BREAKER_FAILURES: u32 = 5;
/// Decisions one Redis call carries at most while another is in flight (`batch.lua`).
pub const STORE_BATCH_MAX: usize = 64;
/// The largest `store.batch_max` accepted: a batch's reply and arguments stay small.
pub const STORE_BATCH_MAX_LIMIT: usize = 1024;
/// Calls in flight per Redis connection before decisions queue for a batch: a decision
/// arriving just after a call left goes at once rather than waiting for its reply.
pub const STORE_BATCH_IN_FLIGHT: usize = 2;
/// The largest `store.batch_in_flight` accepted.
pub const STORE_BATCH_IN_FLIGHT_LIMIT: usize = 16;
pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(1);
/// How long a new Redis store may take to warm before its routes take requests anyway.
pub const STARTUP_GRACE: Duration = Duration::from_secs(5);
/// The longest `store.startup_grace` may be: a fleet must not stay unready long.
pub const STARTUP_GRACE_LIMIT: Duration = Duration::from_secs(30);
pub const EXPECTED_INSTANCES: u64 = 1;
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
pub const CONCURRENCY_SLOT_TTL: Duration = Duration::from_secs(60);
pub const UNHEALTHY_THRESHOLD: usize = 2;
pub const HEALTHY_THRESHOLD: usize = 1;
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
/// Largest body read for `body:` key parts (Pingora buffers at most 64 KiB for replay).
pub const BODY_KEY_BYTES: u64 = 8 * 1024;
pub const MAX_BODY_KEY_BYTES: u64 = 64 * 1024;

/// Load shedding (`[upstreams.NAME.shedding]`).
pub mod shedding {
    use std::time::Duration;
    pub const MIN_LIMIT: u32 = 4;
    pub const MAX_LIMIT: u32 = 1000;
    pub const INITIAL_LIMIT: u32 = 20;
    pub const TOLERANCE: f64 = 1.5;
    pub const WINDOW: Duration = Duration::from_millis(250);
    pub const BASELINE_INTERVAL: Duration = Duration::from_secs(30);
    pub const SMOOTHING: f64 = 0.2;
    pub const QUEUE: usize = 50;
    pub const QUEUE_TIMEOUT: Duration = Duration::from_millis(50);
    pub const RESERVE_CRITICAL: f64 = 0.1;
    pub const RESERVE_DEFAULT: f64 = 0.2;
}

/// Bearer tokens (`[issuers.NAME]`): clock skew allowed on `exp` / `nbf` / `iat`, and its
/// most.
pub const JWT_LEEWAY: Duration = Duration::from_secs(30);
pub const MAX_JWT_LEEWAY: Duration = Duration::from_secs(300);
/// A JWKS endpoint: fetched this often, at most this often on unknown `kid`s, each fetch
/// bounded by this.
pub const JWKS_REFRESH: Duration = Duration::from_secs(300);
pub const JWKS_MIN_REFRESH: Duration = Duration::from_secs(30);
pub const JWKS_TIMEOUT: Duration = Duration::from_secs(5);
/// Verified tokens remembered (`server.max_cached_tokens`).
pub const MAX_CACHED_TOKENS: usize = 10_000;
