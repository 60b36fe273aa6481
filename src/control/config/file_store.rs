//! The serde mirror of `[store]`: where the limiter's state lives (memory, one Redis, a
//! Cluster, Sentinel). Checked and typed by `validate/store.rs`.

use super::units::HumanDuration;
use serde::Deserialize;

/// `[store]`: one set of fields whatever the kind (serde's `flatten` does not combine with
/// `deny_unknown_fields`); which of them a kind takes is checked by `validate/store.rs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreFile {
    pub kind: StoreKindFile,
    /// `redis`: the node.
    pub url: Option<String>,
    /// `redis_cluster`: the seed nodes.
    pub nodes: Option<Vec<String>>,
    /// `redis_sentinel`: the name the sentinels monitor the primary under, and the
    /// sentinels (`redis://host:26379`, `rediss://` when they speak TLS).
    pub master_name: Option<String>,
    pub sentinels: Option<Vec<String>>,
    /// ACL user and password, over those of the URL (the password may come from the
    /// environment or a file).
    pub username: Option<String>,
    pub password: Option<super::units::SecretSource>,
    /// TLS (`rediss://`): the CA that signed the server's certificate (default: the
    /// system's roots), and a client certificate and key for servers that ask for one.
    pub tls_ca_file: Option<String>,
    pub tls_client_cert: Option<String>,
    pub tls_client_key: Option<super::units::SecretSource>,
    pub prefix: Option<String>,
    pub timeout: Option<HumanDuration>,
    pub breaker_failures: Option<u32>,
    pub breaker_cooldown: Option<HumanDuration>,
    pub expected_instances: Option<u64>,
    pub heartbeat_interval: Option<HumanDuration>,
    pub concurrency_slot_ttl: Option<HumanDuration>,
    /// The most decisions one Redis call carries (1: every decision its own call).
    pub batch_max: Option<usize>,
    /// Calls in flight per connection before decisions queue for a batch.
    pub batch_in_flight: Option<usize>,
    /// How long a new store may take to warm before its routes take requests anyway.
    pub startup_grace: Option<HumanDuration>,
    /// What decides on Redis: "auto" (the module where loaded), "lua" or "module".
    pub decide_with: Option<crate::limit::store::redis::config::DecideWith>,
    /// Deprecated name of `concurrency_slot_ttl`.
    pub concurrency_lease: Option<HumanDuration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKindFile {
    /// In this process: exact for one instance.
    Memory,
    /// One Redis node shared by every instance.
    Redis,
    /// A Redis Cluster, given by seed nodes.
    RedisCluster,
    /// A Redis primary found through Sentinel (and found again after a failover).
    RedisSentinel,
}

impl StoreKindFile {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKindFile::Memory => "memory",
            StoreKindFile::Redis => "redis",
            StoreKindFile::RedisCluster => "redis_cluster",
            StoreKindFile::RedisSentinel => "redis_sentinel",
        }
    }
}
