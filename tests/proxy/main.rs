//! The gateway in front of real upstreams, over real HTTP/1, HTTP/2 and TLS: routing and what
//! the upstream receives, hostile and ambiguous requests, the bounds on every wait, name
//! resolution, TLS downstream and upstream, identity (bearer tokens, client certificates).
//!
//! One test binary per area (each links the whole crate once); the shared harness is
//! `tests/common/`.

#[path = "../common/mod.rs"]
mod common;

mod addresses;
mod answers;
mod balancing;
mod bounds;
mod bypass;
mod cors;
mod dns;
mod forwarding;
mod gateway;
mod grpc;
mod header_case;
mod header_rules;
mod hostile;
mod jwt;
mod mtls;
mod outliers;
mod readings;
mod retries;
mod tls;
mod upstream_tls;
mod websocket;
