//! turnstile's Redis module: a request's limits decided in native code inside Redis, on the
//! keys and in the stored form of the Lua scripts (`lua/`), so that gateways with and without
//! it share one Redis and every script it does not replace (leases, charges, refunds,
//! releases, give-backs) keeps working on what it wrote.
//!
//! Commands:
//! - `TURNSTILE.DECIDE numkeys key… arg…`: `lua/check.lua` — the same keys, arguments and
//!   reply — for every algorithm: token and leaky buckets, fixed, calendar and sliding
//!   windows, sliding logs, concurrency slots. Keys are declared
//!   by position (as EVAL's are), so a Redis Cluster routes the call, redirects it (`MOVED`,
//!   `ASK`) and refuses one spanning slots (`CROSSSLOT`) exactly as it does a script.
//! - `TURNSTILE.USAGE numkeys key… arg…`: `lua/usage.lua` — what a client has left of each
//!   limit, read without writing.
//! - `TURNSTILE.BATCH numkeys key… m member…`: `lua/batch.lua`'s layout with its keys
//!   declared — many decisions and quota questions in one call, on one clock reading, each
//!   member answering alone ("E <message>" when it cannot run). Charges, refunds and
//!   releases stay the Lua scripts' — the gateway sends a batch carrying one to `batch.lua`
//!   whole (a member of their kinds sent here answers "M": not run, nothing written, and
//!   is sent alone, as a Cluster member whose slot moved is) — and so does a
//!   Cluster's batch of many slots (its keys after its arguments: refused whole).
//! - `TURNSTILE.VERSION`: the module's version and what it decides.
//!
//! Writes are replicated as their effects (`SET … PXAT`, `HSET`, `PEXPIREAT`), never as the
//! command: a replica must not decide again on its own clock. No panic crosses into Redis:
//! a command that panicked answers an error and, having written nothing before its decision
//! was whole, leaves the keyspace as it was.
//!
//! Load: `redis-server --loadmodule /path/to/libturnstile_module.so` (Redis 7.0 or later).

pub mod algorithm;
pub mod args;
pub mod fuzzing;
pub mod leaky;
pub mod logs;

// The Redis glue: compiled into what Redis loads (feature `module`, the default); the unit
// tests build it without registering it, so it is dead code there.
#[cfg(feature = "module")]
#[cfg_attr(test, allow(dead_code, unused_imports))]
mod commands;
#[cfg(feature = "module")]
#[cfg_attr(test, allow(dead_code))]
mod decide;
#[cfg(feature = "module")]
#[cfg_attr(test, allow(dead_code))]
mod store;

/// The module's version, as `TURNSTILE.VERSION` and `MODULE LIST` report it.
pub const VERSION: i32 = 1;
