//! The floor under turnstile's proxy path — a bench-only binary, not part of the product.
//!
//! Two minimal keep-alive HTTP/1 reverse proxies to one origin, both on Pingora, so
//! `benches/load/floor.sh` can measure what each layer costs per request next to nginx and
//! turnstile in the same run:
//!
//! - `proxy`: bare `pingora-proxy` — a `ProxyHttp` whose only hook names the upstream peer
//!   (what turnstile builds on; everything else is Pingora's defaults).
//! - `forwarding`: the same, also adding the headers turnstile's pass-through adds
//!   (`X-Forwarded-For`, `X-Request-Id`, `X-Forwarded-Proto`, `X-Forwarded-Host` upstream,
//!   `X-Request-Id` downstream) through Pingora's own header API, as any Pingora proxy would:
//!   the floor for a gateway that forwards them.
//! - `redis`: `forwarding`, and before the upstream one `EVALSHA` per request through the
//!   `redis` crate's `ConnectionManager` (the connection turnstile decides on), with a key
//!   and arguments of a one-limit decision's size and a reply of its shape: the floor of a
//!   gateway that asks Redis once per request through that crate, whatever it decides.
//! - `core`: no `pingora-proxy` at all — `pingora-core`'s HTTP server session, its HTTP/1
//!   connector and connection pool, and a loop that copies the request header and body up
//!   and the response header and body down. It does only what a plain keep-alive HTTP/1
//!   exchange needs: no upgrades, no retries, no HTTP/2, no filters, no error pages.
//!
//! Usage: `cargo bench --bench floor -- <proxy|forwarding|redis|core> <listen addr> <origin addr>
//! <threads> [redis url]`.
//! Without arguments (as `cargo test --all-targets` and `cargo bench` run it) it prints this
//! usage and exits.

use async_trait::async_trait;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora::connectors::http::v1::Connector;
use pingora::prelude::*;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use pingora::services::listening::Service;
use std::sync::Arc;
use std::time::Duration;

// The allocator turnstile uses, so the comparison is of the proxy paths alone.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long an idle upstream connection stays in the pool.
const IDLE: Duration = Duration::from_secs(60);

/// `pingora-core` only: one exchange per call, the downstream connection handed back for
/// the next request when both sides allow keep-alive.
struct CoreLoop {
    connector: Connector,
    origin: HttpPeer,
}

impl CoreLoop {
    /// One request: `None` when a side failed (the downstream connection is then closed).
    async fn exchange(&self, down: &mut ServerSession) -> Option<()> {
        let (mut up, _reused) = self.connector.get_http_session(&self.origin).await.ok()?;
        let header = down.req_header().clone();
        up.write_request_header(Box::new(header)).await.ok()?;
        while let Some(chunk) = down.read_request_body().await.ok()? {
            up.write_body(&chunk).await.ok()?;
        }
        up.finish_body().await.ok()?;
        up.read_response().await.ok()?;
        let header = up.resp_header()?.clone();
        down.write_response_header(Box::new(header)).await.ok()?;
        while let Some(chunk) = up.read_body_bytes().await.ok()? {
            down.write_response_body(chunk, false).await.ok()?;
        }
        self.connector
            .release_http_session(up, &self.origin, Some(IDLE))
            .await;
        Some(())
    }
}

#[async_trait]
impl HttpServerApp for CoreLoop {
    async fn process_new_http(
        self: &Arc<Self>,
        mut down: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if !down.read_request().await.ok()? {
            return None;
        }
        let keepalive = if *shutdown.borrow() { None } else { Some(60) };
        down.set_keepalive(keepalive);
        self.exchange(&mut down).await?;
        let settings = HttpPersistentSettings::for_session(&down);
        let stream = down.finish().await.ok()??;
        Some(ReusedHttpStream::from_reusable_stream(stream, settings))
    }
}

/// Bare `pingora-proxy`: the upstream is the only decision (and, when `forwarding`, the
/// forwarding headers; with `redis`, one script call per request too).
struct BareProxy {
    origin: HttpPeer,
    forwarding: bool,
    redis: Option<FloorRedis>,
}

/// A script answering as `check.lua` does for one admitted limit: one string.
const SCRIPT: &str = "return '1 ' .. ARGV[2] .. ' 1 999999 1000 0 '";

/// One `ConnectionManager`, made on first use inside Pingora's runtime (its driver task
/// lives there), and the script's SHA.
struct FloorRedis {
    url: String,
    conn: tokio::sync::OnceCell<(redis::aio::ConnectionManager, String)>,
}

impl FloorRedis {
    async fn call(&self, client: &str) -> Option<()> {
        let (conn, sha) = self
            .conn
            .get_or_init(|| async {
                let client = redis::Client::open(self.url.as_str()).expect("redis url");
                let mut conn = redis::aio::ConnectionManager::new(client)
                    .await
                    .expect("redis");
                let sha: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(SCRIPT)
                    .query_async(&mut conn)
                    .await
                    .expect("SCRIPT LOAD");
                (conn, sha)
            })
            .await;
        // A one-limit decision's size: its key, then the time, cost, slot and the limit's six.
        let mut cmd = redis::Cmd::with_capacity(32, 512);
        cmd.arg("EVALSHA").arg(sha.as_str()).arg(1);
        cmd.arg(format!(
            "turnstile:{{{client}}}:redis1:per-s@tb2:1000000/1000/1000000"
        ));
        cmd.arg("")
            .arg(1)
            .arg("")
            .arg("per-s")
            .arg("tb")
            .arg(1_000_000)
            .arg(1000);
        cmd.arg(1_000_000).arg("0");
        let reply: String = cmd.query_async(&mut conn.clone()).await.ok()?;
        reply.starts_with("1 ").then_some(())
    }
}

/// A request id per request, 32 hex digits (as long as the ids turnstile makes).
fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:032x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[async_trait]
impl ProxyHttp for BareProxy {
    type CTX = Option<String>;

    fn new_ctx(&self) -> Self::CTX {
        None
    }

    async fn request_filter(&self, session: &mut Session, _ctx: &mut Self::CTX) -> Result<bool> {
        let Some(redis) = &self.redis else {
            return Ok(false);
        };
        let client = session
            .req_header()
            .headers
            .get("x-api-key")
            .and_then(|k| k.to_str().ok())
            .unwrap_or("anonymous");
        match redis.call(client).await {
            Some(()) => Ok(false),
            None => Err(Error::explain(
                ErrorType::InternalError,
                "redis call failed",
            )),
        }
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if !self.forwarding {
            return Ok(());
        }
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        let host = req.headers.get("host").cloned();
        let id = request_id();
        req.insert_header("x-forwarded-for", peer)?;
        req.insert_header("x-request-id", id.clone())?;
        req.insert_header("x-forwarded-proto", "http")?;
        if let Some(host) = host {
            req.insert_header("x-forwarded-host", host)?;
        }
        *ctx = Some(id);
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if let Some(id) = ctx.take() {
            resp.insert_header("x-request-id", id)?;
        }
        Ok(())
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.origin.clone()))
    }
}

fn main() {
    // `cargo bench` adds `--bench`: only the positional arguments count.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (mode, listen, origin, threads, redis_url) = match args.as_slice() {
        [mode, listen, origin, threads] => (mode, listen, origin, threads, None),
        [mode, listen, origin, threads, url] => (mode, listen, origin, threads, Some(url)),
        _ => {
            println!(
                "floor (bench-only): cargo bench --bench floor -- <proxy|forwarding|redis|core> <listen> <origin> <threads> [redis url]"
            );
            return;
        }
    };
    let threads: usize = threads.parse().expect("threads: a number");
    let origin = HttpPeer::new(origin.as_str(), false, String::new());
    // Stopped by the bench script with SIGTERM: exit at once rather than after Pingora's
    // graceful-shutdown wait (minutes by default), which held `make bench-floor` open.
    let mut conf = pingora::server::configuration::ServerConf::new().expect("pingora defaults");
    conf.grace_period_seconds = Some(0);
    conf.graceful_shutdown_timeout_seconds = Some(1);
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    match mode.as_str() {
        "core" => {
            let app = CoreLoop {
                connector: Connector::new(None),
                origin,
            };
            let mut service = Service::new("floor core".into(), app);
            service.add_tcp(listen);
            service.threads = Some(threads);
            server.add_service(service);
        }
        "proxy" | "forwarding" | "redis" => {
            let forwarding = mode != "proxy";
            let redis = (mode == "redis").then(|| FloorRedis {
                url: redis_url
                    .expect("redis: a Redis URL after <threads>")
                    .clone(),
                conn: tokio::sync::OnceCell::new(),
            });
            let proxy = BareProxy {
                origin,
                forwarding,
                redis,
            };
            let mut service = http_proxy_service(&server.configuration, proxy);
            service.add_tcp(listen);
            service.threads = Some(threads);
            server.add_service(service);
        }
        other => panic!("unknown mode {other:?}: proxy, forwarding, redis or core"),
    }
    server.run_forever();
}
