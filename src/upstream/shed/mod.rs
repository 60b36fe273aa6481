//! Load shedding: how many requests an upstream pool is sent at once, learned from the
//! latency it shows ([`controller`]), and who waits or is turned away when it is at that limit
//! ([`gate`]: priority classes, a bounded queue). Per pool and per gateway instance; opt-in
//! per pool (`[upstreams.NAME.shedding]`).

pub mod controller;
pub mod gate;

pub use gate::{Gate, GateSettings, Permit, Priority, Shed};
