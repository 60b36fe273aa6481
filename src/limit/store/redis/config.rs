//! Where the Redis store's counters live, and its bounds.

use std::time::Duration;

/// Where the shared counters live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One node (or a primary behind a stable address).
    Single(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub topology: Topology,
    pub prefix: String,
    /// Bound on every call (connecting included).
    pub timeout: Duration,
    /// How long a concurrency slot lives if its request never releases it (a crashed
    /// gateway): the longest a request can hold a slot.
    pub slot_ttl: Duration,
}
