//! The request path's allocation budget: the real gateway (its Pingora server built by
//! `turnstile::server::build`, running in this process) behind a counting global allocator,
//! driven by an allocation-free client over keep-alive HTTP/1, against a real upstream and a
//! real Redis. Each mode's allocations per request must stay within its budget
//! (BENCHMARKS.md lists each and what the allocations are for): a future change that adds
//! work to every request fails here instead of slipping through as noise in a benchmark.
//!
//! Counts, not time: the number of allocations a request makes does not depend on how busy
//! the machine is. (Timers and clock reads cannot be counted from inside the process;
//! `make bench-floor` counts them with uprobes.)

#[path = "../common/mod.rs"]
mod common;

use common::jwks::{now, JwksServer, Signer};
use common::redis::RedisServer;
use common::{free_port, wait_until, Upstream};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts every allocation (and reallocation) of the process.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEY: &str = "budget-client-key-0123456789";
const SECRET: &str = "budget-key-hash-secret-0123456789abcdef";

/// Requests measured per mode (after as many to warm up).
const REQUESTS: u64 = 2000;

/// A keep-alive HTTP/1 client that allocates nothing per request: one request's bytes,
/// written again and again, and the response read into a fixed buffer.
struct Client {
    stream: TcpStream,
    request: Vec<u8>,
    buf: Box<[u8; 65536]>,
}

impl Client {
    fn new(port: u16, request: String) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the gateway");
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        Client {
            stream,
            request: request.into_bytes(),
            buf: Box::new([0; 65536]),
        }
    }

    /// One request; its status. The response must carry `Content-Length`.
    fn send(&mut self) -> u16 {
        self.stream.write_all(&self.request).expect("write");
        let mut filled = 0;
        loop {
            let n = self.stream.read(&mut self.buf[filled..]).expect("read");
            assert!(n > 0, "the gateway closed the connection");
            filled += n;
            let head = &self.buf[..filled];
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let length = content_length(&head[..end]);
            if filled >= end + 4 + length {
                assert_eq!(filled, end + 4 + length, "one response at a time");
                let status = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
                return status;
            }
        }
    }
}

fn content_length(head: &[u8]) -> usize {
    head.split(|b| *b == b'\n')
        .find_map(|line| {
            let line = std::str::from_utf8(line).ok()?.trim();
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .expect("a Content-Length")
}

/// Allocations per request of `client`'s request (every one answered `status`).
fn allocations_per_request(client: &mut Client, status: u16) -> f64 {
    for _ in 0..REQUESTS {
        assert_eq!(client.send(), status);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..REQUESTS {
        assert_eq!(client.send(), status);
    }
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    (after - before) as f64 / REQUESTS as f64
}

fn request(path: &str, headers: &str, body: &str) -> String {
    let length = if body.is_empty() {
        String::new()
    } else {
        format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        )
    };
    let method = if body.is_empty() { "GET" } else { "POST" };
    format!("{method} {path} HTTP/1.1\r\nHost: budget\r\n{headers}{length}\r\n{body}")
}

/// Every mode and its budget: allocations per request beyond bare pingora-proxy's, measured in
/// the same process (today's count, with a little room: BENCHMARKS.md). A change that needs
/// more must say why there and raise it here.
const BUDGETS: [(&str, f64); 6] = [
    ("pass-through", 15.0),
    ("per-IP", 20.0),
    ("API key + one Redis limit", 37.0),
    ("cached bearer token", 37.0),
    ("keyed body limit", 55.0),
    // The pool keeps the client's spelling of names: Pingora's header edited in place, each
    // insert parsing its name and growing two maps (the path every request took before
    // heads were edited as `http` parts).
    ("pass-through, header_case = \"preserve\"", 34.0),
];

#[test]
fn each_mode_stays_within_its_allocation_budget() {
    let up = Upstream::start("budget");
    let redis = RedisServer::start();
    let signer = Signer::rsa("budget");
    let idp = JwksServer::start(&[&signer]);
    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (free_port(), free_port());
    let config = format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
threads = 1
key_hash_secret = "{SECRET}"
pid_file = "{dir}/turnstile.pid"
upgrade_sock = "{dir}/upgrade.sock"

[admin]
listen = "127.0.0.1:{admin}"

[store]
kind = "redis"
url = "{redis}"
timeout = "2s"

[upstreams.api]
servers = ["{upstream}"]

[upstreams.legacy]
servers = ["{upstream}"]
header_case = "preserve"

[plans.one]
limits = [{{ name = "per-hour", algorithm = "fixed_window", limit = 100000000, window = "1h" }}]

[[clients]]
id = "budget"
plan = "one"
api_keys = ["{KEY}"]

[issuers.idp]
issuer = "https://idp.test/"
audiences = ["budget"]
jwks_url = "{jwks}"
plan = "one"

[[routes]]
name = "pass"
path_prefix = "/echo/pass"
upstream = "api"

[[routes]]
name = "legacy"
path_prefix = "/echo/legacy"
upstream = "legacy"

[[routes]]
name = "ip"
path_prefix = "/echo/ip"
upstream = "api"
ip_limit = {{ rate = "100000000/s", burst = 100000000 }}

[[routes]]
name = "key"
path_prefix = "/echo/key"
upstream = "api"
auth = "api_key"

[[routes]]
name = "token"
path_prefix = "/echo/token"
upstream = "api"
auth = "jwt"

[[routes]]
name = "login"
path_prefix = "/echo/login"
upstream = "api"
body_key_bytes = "4KiB"

[[routes.limits]]
name = "per-user"
algorithm = "fixed_window"
limit = 100000000
window = "1h"
key = ["body:username"]
"#,
        dir = dir.path().display(),
        redis = redis.url(),
        upstream = up.addr(),
        jwks = idp.url(),
    );
    let path = dir.path().join("turnstile.toml");
    std::fs::write(&path, config).unwrap();
    let opt = pingora::server::configuration::Opt {
        upgrade: false,
        daemon: false,
        nocapture: false,
        test: false,
        conf: None,
    };
    let mut server = turnstile::server::build(&path, opt).expect("the gateway builds");
    // The reference: bare pingora-proxy (only `upstream_peer`), in the same server.
    let bare = free_port();
    let mut reference = pingora::proxy::http_proxy_service(
        &server.configuration,
        BareProxy {
            origin: pingora::upstreams::peer::HttpPeer::new(up.addr(), false, String::new()),
        },
    );
    reference.add_tcp(&format!("127.0.0.1:{bare}"));
    reference.threads = Some(1);
    server.add_service(reference);
    std::thread::spawn(move || server.run_forever());
    wait_until("the gateway", || {
        common::port_open(port) && common::port_open(bare)
    });

    let token = signer.sign(&serde_json::json!({
        "iss": "https://idp.test/", "aud": "budget", "sub": "budget-user",
        "exp": now() + 3600, "iat": now(),
    }));
    let requests = [
        request("/echo/pass/x", "", ""),
        request("/echo/ip/x", "", ""),
        request("/echo/key/x", &format!("X-Api-Key: {KEY}\r\n"), ""),
        request(
            "/echo/token/x",
            &format!("Authorization: Bearer {token}\r\n"),
            "",
        ),
        request("/echo/login", "", r#"{"username": "ada@example.com"}"#),
        request("/echo/legacy/x", "", ""),
    ];
    wait_until("the issuer's keys", || {
        Client::new(port, requests[3].clone()).send() == 200
    });
    let reference =
        allocations_per_request(&mut Client::new(bare, request("/echo/pass/x", "", "")), 200);
    println!("bare pingora-proxy: {reference:.1} allocations per request");
    let mut over = Vec::new();
    for ((mode, budget), request) in BUDGETS.iter().zip(requests) {
        let per_request = allocations_per_request(&mut Client::new(port, request), 200);
        println!(
            "{mode}: {per_request:.1} allocations per request, {:+.1} over bare pingora-proxy (budget {budget})",
            per_request - reference
        );
        if per_request - reference > *budget {
            over.push(format!("{mode}: {:.1} > {budget}", per_request - reference));
        }
    }
    assert!(over.is_empty(), "over budget: {over:?}");
}

/// Bare `pingora-proxy`: the upstream is its only decision (as in `benches/floor.rs`).
struct BareProxy {
    origin: pingora::upstreams::peer::HttpPeer,
}

#[async_trait::async_trait]
impl pingora::proxy::ProxyHttp for BareProxy {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(
        &self,
        _session: &mut pingora::proxy::Session,
        _ctx: &mut (),
    ) -> pingora::Result<Box<pingora::upstreams::peer::HttpPeer>> {
        Ok(Box::new(self.origin.clone()))
    }
}
