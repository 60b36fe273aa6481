//! The request path as plain steps over plain data, in the order a request meets them. Each
//! step passes on what the next needs or returns a [`reject::Reject`] describing the answer;
//! the Pingora glue (`proxy/`) only gathers the inputs and writes the outcome.
//!
//! ```text
//! [0] message      framing, Host, sizes           → 400 (smuggling) · 414 · 431 · 413
//! [1] path         normal form                    → 400 ambiguous path
//! [2] address      server's allow_ips / deny_ips  → 403 (before routing), then router:
//!     router       host, path prefix, method      → 404 · 405 · 400 case mismatch,
//!                  then the route's allow_ips / deny_ips → 403
//! [3] admission    per-IP bucket (in process)     → 429 "ip"   (no key lookup, no store call)
//!     redirect     `[server] https_redirect`: a plain-HTTP request → 308 to the TLS listener
//!     cors         a preflight on a route with `cors` (routed by the method it asks for)
//!                  → 204 · 403, never authenticated, sent upstream or charged
//!     answer       a route's own `redirect` / `respond` → its status, never upstream
//! [4] identity     API key, token, certificate → client, plan, groups → 401 · 400 (no
//!                  limiter state created); callers: the route's allow_ / deny_ clients,
//!                  plans, groups → 403, before any limit is spent
//! [5] admission    plan limits in the store, the route's failure mode when it cannot
//!                  decide, concurrency slots      → 429 named policies · 503
//! [6] shedding     the upstream pool's gate (`upstream::shed`, passed by `proxy/request.rs`)
//!                  → 503 overloaded, and `Admission::shed` gives the units back
//! [7] forward      what the upstream receives: normalised path (rewrite: strip_prefix /
//!                  add_prefix), X-Forwarded-For, forwarded: X-Forwarded-Proto / -Host /
//!                  -Prefix and RFC 7239 Forwarded, X-Client-Id / X-Request-Id, no API key;
//!                  then the route's `request_headers` rules (header_rules)
//!     headers      RateLimit headers · problem: problem+json bodies · upstream_error:
//!                  upstream failures → 502 / 504 · grpc: the same answers as gRPC statuses
//!                  for gRPC calls, and `grpc-timeout` as the call's deadline; on the way
//!                  back, `response_headers` rules, then the gateway's own and CORS headers
//! ```
//!
//! Nothing here imports the control plane: the snapshot's parts (router, key ring, a route's
//! admission rules, the store) are passed in.

pub mod address;
pub mod admission;
pub mod answer;
pub mod auth;
pub mod body;
pub mod callers;
pub mod cert;
pub mod cors;
pub mod cost;
pub mod credential;
pub mod exempt;
pub mod fold;
pub mod forward;
pub mod forwarded;
pub mod grpc;
pub mod header_rules;
pub mod headers;
pub mod identity;
pub mod jwt;
pub mod message;
pub mod partition;
pub mod path;
pub mod problem;
pub mod reading;
pub mod reject;
pub mod request_id;
pub mod rewrite;
pub mod router;
pub mod upstream_error;
pub mod usage;
