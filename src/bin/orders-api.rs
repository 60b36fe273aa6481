//! The demo upstream: a small Orders API.
//!
//! ```text
//! orders-api --port N [--name NAME] [--host 127.0.0.1]
//! GET  /orders            list of orders                      200
//! GET  /orders/{id}       one order                           200 / 404
//! POST /orders            create (JSON body)                  202 {"id":…,"status":"accepted"}
//! GET  /healthz           health                              200 / 503 when marked down
//! POST /_control/healthy | /_control/unhealthy               flip /healthz (for demos and tests)
//! POST /_control/delay?ms=N                                   add N ms to every answer (0: none)
//! POST /_control/fail?status=N                                answer every request but /healthz
//!                                                             with status N (500-599; 0: normally)
//! GET  /_control/stats    {"requests": N}: requests served, /_control/* excluded
//! GET  /_control/arrivals {"ms": [...]}: when the last 10000 requests arrived (Unix ms)
//! GET  /_control/bytes?n=N N bytes of 'x' (at most 64 MiB), for clients that read slowly
//! ANY  /echo/...          what the upstream received (method, path, headers, peer, body) as JSON
//! ```
//! Every response carries `X-Upstream-Name: NAME`, so load balancing is visible. Any request may
//! add `?delay_ms=N` (at most 60000) to be answered after a delay (to demonstrate timeouts),
//! `?tokens=N` to have the answer say `x-tokens-used: N` (what an LLM API reports of a call).
//! With `--capacity N`, at most N requests are served at once (each for its delay): the others
//! wait, as on a saturated backend (for load-shedding experiments).

use async_trait::async_trait;
use clap::Parser;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora::server::Server;
use pingora::services::listening::Service;
use serde_json::json;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Parser)]
#[command(name = "orders-api", about = "Demo upstream for turnstile")]
struct Args {
    #[arg(long)]
    port: u16,
    /// Echoed in the X-Upstream-Name header of every response.
    #[arg(long, default_value = "orders-api")]
    name: String,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Most requests served at once (0: no bound); the others wait their turn.
    #[arg(long, default_value_t = 0)]
    capacity: usize,
    /// Milliseconds added to every answer (also set with POST /_control/delay?ms=N).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
}

const MAX_BODY: usize = 1 << 20;
const MAX_DELAY_MS: u64 = 60_000;
/// The largest body `GET /_control/bytes?n=N` answers with.
const MAX_BYTES: usize = 64 << 20;
/// Arrival times remembered (the oldest are forgotten).
const MAX_ARRIVALS: usize = 10_000;

struct OrdersApi {
    name: String,
    /// Added to every answer (ms).
    delay_ms: AtomicU64,
    /// Bounds the requests served at once (`--capacity`).
    capacity: Option<tokio::sync::Semaphore>,
    healthy: AtomicBool,
    /// Every answer has this status (0: none; set with POST /_control/fail?status=N).
    fail_status: AtomicU64,
    next_id: AtomicU64,
    served: AtomicU64,
    /// When the latest requests arrived (Unix ms), to see how evenly they came.
    arrivals: Mutex<VecDeque<u64>>,
}

impl OrdersApi {
    fn reply(&self, status: StatusCode, body: serde_json::Value) -> Response<Vec<u8>> {
        let body = serde_json::to_vec(&body).expect("json serializes");
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .header("content-length", body.len())
            .header("x-upstream-name", &self.name)
            .body(body)
            .expect("valid response parts")
    }

    async fn route(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_owned();
        if path.starts_with("/echo") {
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let query = req.uri.query().unwrap_or("").to_owned();
            let peer = session
                .client_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let body = match read_body(session).await {
                Ok(b) => b,
                Err(status) => {
                    return self.reply(status, json!({"error": "body too large or unreadable"}))
                }
            };
            // The first 4 KiB of the body as received (lossy UTF-8), to show it arrived intact.
            let head = String::from_utf8_lossy(&body[..body.len().min(4096)]).into_owned();
            // `?acao=1`: answers with CORS headers of its own (what a gateway's `cors` does
            // with them is tested).
            let acao = query.split('&').any(|p| p == "acao=1");
            let mut reply = self.reply(
                StatusCode::OK,
                json!({"upstream": self.name, "method": method.as_str(), "path": path,
                       "query": query, "peer": peer, "headers": headers,
                       "body_bytes": body.len(), "body": head}),
            );
            if acao {
                let headers = reply.headers_mut();
                headers.insert("access-control-allow-origin", "*".parse().expect("a value"));
                headers.insert(
                    "access-control-expose-headers",
                    "x-upstream-name".parse().expect("a value"),
                );
            }
            return reply;
        }
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        match (method.as_str(), segments.as_slice()) {
            ("GET", ["healthz"]) => {
                if self.healthy.load(Ordering::Relaxed) {
                    self.reply(StatusCode::OK, json!({"status": "ok"}))
                } else {
                    self.reply(StatusCode::SERVICE_UNAVAILABLE, json!({"status": "down"}))
                }
            }
            ("GET", ["_control", "arrivals"]) => {
                let ms: Vec<u64> = self
                    .arrivals
                    .lock()
                    .map(|a| a.iter().copied().collect())
                    .unwrap_or_default();
                self.reply(StatusCode::OK, json!({ "ms": ms }))
            }
            ("GET", ["_control", "bytes"]) => {
                // A large answer, for clients that read it slowly or not at all.
                let n = req
                    .uri
                    .query()
                    .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("n=")))
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0)
                    .min(MAX_BYTES);
                Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/octet-stream")
                    .header("content-length", n)
                    .body(vec![b'x'; n])
                    .expect("valid response parts")
            }
            ("GET", ["_control", "stats"]) => self.reply(
                StatusCode::OK,
                json!({"requests": self.served.load(Ordering::Relaxed)}),
            ),
            ("POST", ["_control", "delay"]) => {
                let ms = req
                    .uri
                    .query()
                    .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("ms=")))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    .min(MAX_DELAY_MS);
                self.delay_ms.store(ms, Ordering::Relaxed);
                self.reply(StatusCode::OK, json!({"delay_ms": ms}))
            }
            ("POST", ["_control", "fail"]) => {
                let status = req
                    .uri
                    .query()
                    .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("status=")))
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|s| (500..=599).contains(s))
                    .unwrap_or(0);
                self.fail_status.store(status, Ordering::Relaxed);
                self.reply(StatusCode::OK, json!({"fail_status": status}))
            }
            ("POST", ["_control", state @ ("healthy" | "unhealthy")]) => {
                self.healthy.store(*state == "healthy", Ordering::Relaxed);
                self.reply(StatusCode::OK, json!({"status": state}))
            }
            ("GET", ["orders"]) => self.reply(
                StatusCode::OK,
                json!({"orders": [demo_order(1), demo_order(2), demo_order(3)]}),
            ),
            ("GET", ["orders", id]) => match id.parse::<u64>() {
                Ok(id @ 1..=1000) => self.reply(StatusCode::OK, demo_order(id)),
                _ => self.reply(
                    StatusCode::NOT_FOUND,
                    json!({"error": "no such order", "id": id}),
                ),
            },
            ("POST", ["orders"]) => match read_body(session).await {
                Ok(body) => {
                    let item = serde_json::from_slice::<serde_json::Value>(&body)
                        .unwrap_or(serde_json::Value::Null);
                    let id = 1000 + self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
                    self.reply(
                        StatusCode::ACCEPTED,
                        json!({"id": id, "status": "accepted", "order": item}),
                    )
                }
                Err(status) => self.reply(status, json!({"error": "body too large or unreadable"})),
            },
            (_, ["orders", ..]) => self.reply(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"error": "method not allowed"}),
            ),
            _ => self.reply(
                StatusCode::NOT_FOUND,
                json!({"error": "not found", "path": path}),
            ),
        }
    }
}

fn demo_order(id: u64) -> serde_json::Value {
    json!({"id": id, "item": format!("widget-{id}"), "quantity": id % 5 + 1, "status": "shipped"})
}

async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, StatusCode> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_BODY {
                    return Err(StatusCode::PAYLOAD_TOO_LARGE);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(_) => return Err(StatusCode::BAD_REQUEST),
        }
    }
}

fn delay_of(query: Option<&str>) -> Option<Duration> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("delay_ms="))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|ms| Duration::from_millis(ms.min(MAX_DELAY_MS)))
}

#[async_trait]
impl ServeHttp for OrdersApi {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if session.req_header().uri.path().starts_with("/_control/") {
            return self.route(session).await;
        }
        self.served.fetch_add(1, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if let Ok(mut arrivals) = self.arrivals.lock() {
            if arrivals.len() == MAX_ARRIVALS {
                arrivals.pop_front();
            }
            arrivals.push_back(now);
        }
        // A saturated backend: at most `capacity` requests are being served.
        let _turn = match &self.capacity {
            Some(capacity) => capacity.acquire().await.ok(),
            None => None,
        };
        let added = Duration::from_millis(self.delay_ms.load(Ordering::Relaxed));
        let asked = delay_of(session.req_header().uri.query()).unwrap_or_default();
        if !(added + asked).is_zero() {
            tokio::time::sleep(added + asked).await;
        }
        // /healthz keeps its own switch: a server can fail requests and pass its check.
        let failing = self.fail_status.load(Ordering::Relaxed);
        if let Ok(status) = StatusCode::from_u16(failing as u16) {
            if failing != 0 && session.req_header().uri.path() != "/healthz" {
                return self.reply(status, json!({"error": "failing on command"}));
            }
        }
        let tokens = session.req_header().uri.query().and_then(|q| {
            q.split('&')
                .find_map(|pair| pair.strip_prefix("tokens="))
                .map(str::to_owned)
        });
        let mut response = self.route(session).await;
        if let Some(tokens) = tokens.and_then(|t| http::HeaderValue::from_str(&t).ok()) {
            response.headers_mut().insert("x-tokens-used", tokens);
        }
        response
    }
}

fn main() {
    let args = Args::parse();
    let mut conf = pingora::server::configuration::ServerConf::new().expect("pingora defaults");
    conf.threads = args.threads.max(1);
    conf.grace_period_seconds = Some(0);
    conf.graceful_shutdown_timeout_seconds = Some(1);
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let api = OrdersApi {
        name: args.name,
        delay_ms: AtomicU64::new(args.delay_ms),
        capacity: (args.capacity > 0).then(|| tokio::sync::Semaphore::new(args.capacity)),
        healthy: AtomicBool::new(true),
        fail_status: AtomicU64::new(0),
        next_id: AtomicU64::new(0),
        served: AtomicU64::new(0),
        arrivals: Mutex::new(VecDeque::with_capacity(MAX_ARRIVALS)),
    };
    let mut service = Service::new("orders-api".to_owned(), api);
    service.add_tcp(&format!("{}:{}", args.host, args.port));
    server.add_service(service);
    server.run_forever();
}
