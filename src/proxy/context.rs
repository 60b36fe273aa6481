//! What one request carries through the Pingora phases.

use crate::chain::admission::Admission;
use crate::chain::auth::Client;
use crate::chain::cert::PeerCert;
use crate::chain::grpc::Flavor;
use crate::chain::jwt::issuer::TokenIdentity;
use crate::control::snapshot::{Route, Snapshot};
use crate::ops::trace::span::RequestTrace;
use crate::upstream::shed::Permit;
use http::HeaderValue;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Per-request state. Holds the snapshot the request started with: a reload in the middle of
/// a request never mixes two configurations.
pub struct RequestCtx {
    pub snapshot: Arc<Snapshot>,
    /// Index of the route serving the request, once routed.
    pub route: Option<usize>,
    pub request_id: HeaderValue,
    /// Connection attempts to upstream servers so far.
    pub upstream_tries: usize,
    /// The authenticated client.
    pub client: Option<Arc<Client>>,
    /// The verified bearer token the client was identified by.
    pub token: Option<Arc<TokenIdentity>>,
    /// The connection's verified client certificate, when the route reads it.
    pub cert: Option<PeerCert>,
    /// The client as the upstream knows it, when not its id: a token's subject, a
    /// certificate's name (`X-Client-Id`).
    pub caller: Option<String>,
    /// What the limits decided (header parts, dry runs, held slots, the outcome).
    pub admission: Admission,
    /// The request's trace, when tracing is on (boxed: with tracing off, every request's
    /// context — copied as Pingora moves its futures — stays 248 bytes smaller).
    pub trace: Option<Box<RequestTrace>>,
    /// The request's place in its upstream pool, when the pool sheds load: held until the
    /// upstream's response has ended.
    pub permit: Option<Permit>,
    /// When the request was sent upstream (for the upstream latency histogram).
    pub upstream_sent: Option<Instant>,
    /// When the request started (for the access log).
    pub started: Instant,
    pub upstream_addr: Option<SocketAddr>,
    /// Request body bytes received so far.
    pub body_bytes: u64,
    /// The normalised path the request was routed by, when it differs from the one received:
    /// the upstream gets this one.
    pub forward_path: Option<String>,
    /// The gateway answered `Expect: 100-continue` itself (it read the body for a keyed
    /// limit): the upstream is not asked for another `100`.
    pub continued: bool,
    /// The response's reported cost was charged (once per request).
    pub cost_charged: bool,
    /// A leaky bucket held the request this long before it was forwarded (ms).
    pub waited_ms: Option<u64>,
    /// Its client left while a leaky bucket held it (not an error worth a log line).
    pub left_while_waiting: bool,
    /// A gRPC or gRPC-Web call (`content-type: application/grpc…`): the gateway's own answers
    /// are gRPC responses of that flavour.
    pub grpc: Option<Flavor>,
    /// The gateway answered the gRPC call itself, with the status of this HTTP answer.
    pub grpc_answer: Option<crate::chain::problem::Kind>,
    /// The call's deadline (`grpc-timeout`), when it has one.
    pub deadline: Option<Instant>,
    /// An HTTP/1.1 upgrade request (a WebSocket handshake).
    pub upgrade: bool,
    /// The upstream switched protocols: the connection is a tunnel now.
    pub tunnel: bool,
    /// On a route with `cors`: the request's `Origin` is one it allows (every answer carries
    /// the CORS headers, the gateway's refusals too).
    pub cors_origin: bool,
    /// A CORS preflight routed by the method it asks for, to a route with `cors`: the
    /// gateway answers it after the per-IP bucket.
    pub preflight: bool,
    /// For the quota endpoint (no route): its CORS rules are `[server] cors`.
    pub quota: bool,
    /// The request counted in flight to its server (least-request pools).
    pub in_flight: Option<crate::upstream::balance::InFlight>,
    /// Times the request was sent upstream.
    pub attempts: u32,
    /// A retry was decided: the next try waits its backoff first.
    pub retry_pending: bool,
    /// Counted in its pool's retry budget: as a request, and while a retry is in flight.
    pub pool_active: Option<crate::upstream::retry::Active>,
    pub retrying: Option<crate::upstream::retry::Retrying>,
}

impl RequestCtx {
    pub fn new(snapshot: Arc<Snapshot>) -> RequestCtx {
        RequestCtx {
            snapshot,
            route: None,
            request_id: HeaderValue::from_static(""),
            upstream_tries: 0,
            client: None,
            token: None,
            cert: None,
            caller: None,
            admission: Admission::default(),
            permit: None,
            trace: None,
            upstream_sent: None,
            started: Instant::now(),
            upstream_addr: None,
            body_bytes: 0,
            forward_path: None,
            continued: false,
            cost_charged: false,
            waited_ms: None,
            left_while_waiting: false,
            grpc: None,
            grpc_answer: None,
            deadline: None,
            upgrade: false,
            tunnel: false,
            cors_origin: false,
            preflight: false,
            quota: false,
            in_flight: None,
            attempts: 0,
            retry_pending: false,
            pool_active: None,
            retrying: None,
        }
    }

    /// The trace, if this request is sampled (its steps are timed).
    pub fn sampled_trace(&mut self) -> Option<&mut RequestTrace> {
        self.trace.as_deref_mut().filter(|t| t.sampled)
    }

    pub fn route(&self) -> Option<&Route> {
        self.route.map(|i| &self.snapshot.routes[i])
    }

    /// The route's upstream pool (`None` before routing, or on a route that answers itself).
    pub fn pool(&self) -> Option<&crate::upstream::pool::Pool> {
        self.route()?.pool.as_deref()
    }

    /// Who the upstream is told the client is (`X-Client-Id`, `allow_clients`,
    /// `${client_id}`): a token's subject, a certificate's name, else the client's id.
    pub fn client_name(&self) -> Option<&str> {
        self.caller
            .as_deref()
            .or_else(|| self.client.as_ref().map(|c| &*c.id))
    }
}
