//! Rate limiting end to end: plan and keyed limits, concurrency and shadow limits, quota
//! leasing, several gateways on one real Redis (single node, Cluster, Sentinel, TLS), the Lua
//! scripts held to the Rust reference, Redis failing, stalling and coming back, load shedding.
//!
//! One test binary per area (each links the whole crate once); the shared harness is
//! `tests/common/`.

#[path = "../common/mod.rs"]
mod common;

mod after_decision;
mod batches;
mod callers;
mod cluster_batches;
mod cluster_failover;
mod concurrency_and_shadow;
mod costs;
mod distributed;
mod failure_modes;
mod keyed;
mod leaky;
mod leasing;
mod lua_agrees;
mod module_agrees;
mod module_store;
mod plan_limits;
mod redis_store;
mod redis_transport;
mod shedding;
mod slow_connect;
mod stalls;
