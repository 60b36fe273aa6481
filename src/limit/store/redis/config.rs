//! Where the Redis store's counters live, how to reach them, and the store's bounds.

use std::path::PathBuf;
use std::time::Duration;

/// Where the shared counters live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One node (or a primary behind a stable address).
    Single(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
    /// A primary found through Sentinel: the name the sentinels monitor, and the sentinels.
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
}

/// What decides on Redis (`store.decide_with`): the Lua scripts (`lua/`), or turnstile's
/// Redis module (`module/`) where a node has it loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecideWith {
    /// The module where a node has it (asked at every connect), else Lua.
    #[default]
    Auto,
    /// Always the Lua scripts.
    Lua,
    /// Always the module: a connection to a Redis without it fails, naming why.
    Module,
}

impl DecideWith {
    pub fn as_str(self) -> &'static str {
        match self {
            DecideWith::Auto => "auto",
            DecideWith::Lua => "lua",
            DecideWith::Module => "module",
        }
    }
}

/// Credentials that override those of the URLs (ACL user, password). Never printed.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct RedisAuth {
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for RedisAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisAuth")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// TLS material for `rediss://`: a CA file instead of the system roots, and a client
/// certificate. Read when the store is built.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RedisTls {
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key files (both or neither).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub topology: Topology,
    pub auth: RedisAuth,
    pub tls: RedisTls,
    pub prefix: String,
    /// Bound on every call (connecting included).
    pub timeout: Duration,
    /// How long a concurrency slot lives if its request never releases it (a crashed
    /// gateway): the longest a request can hold a slot.
    pub slot_ttl: Duration,
    /// The most decisions one batch call carries (`batch.lua`); 1: no batching.
    pub batch_max: usize,
    /// Calls in flight per connection (per Cluster node) before decisions queue for a batch.
    pub batch_in_flight: usize,
    /// How long a new store (at start, or made by a reload) may take to warm — its request
    /// connection made, authenticated, every script loaded (every primary's, on a Cluster) —
    /// before requests on its routes stop waiting for it (`warmth.rs`).
    pub startup_grace: Duration,
    /// Lua or the module (`DecideWith`).
    pub decide_with: DecideWith,
}
