//! Per-request work of the gateway core, measured one piece at a time (no network):
//! route matching, the request-path check, request-id generation, problem bodies.
//! Run with `cargo bench --bench core`; results and machine in BENCHMARKS.md.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::sync::Arc;
use turnstile::chain::headers;
use turnstile::chain::path;
use turnstile::chain::problem::{self, Kind};
use turnstile::chain::request_id;
use turnstile::chain::router::{RouteSpec, Router};
use turnstile::config::Config;
use turnstile::limit::{Algorithm, Decision, Policy};
use turnstile::Metrics;
use turnstile::Snapshot;

fn router() -> Router {
    let config = Config::parse(
        r#"
[upstreams.u]
servers = ["127.0.0.1:1"]
[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "u"
[[routes]]
name = "order-reports"
path_prefix = "/orders/reports"
upstream = "u"
methods = ["GET"]
[[routes]]
name = "users"
path_prefix = "/users"
host = "api.example.com"
upstream = "u"
[[routes]]
name = "root"
path_prefix = "/"
upstream = "u"
"#,
    )
    .expect("bench config is valid");
    Router::new(config.routes.iter().map(|r| RouteSpec {
        prefix: r.path_prefix.clone(),
        host: r.host.clone(),
        methods: r.methods.clone(),
    }))
}

fn bench(c: &mut Criterion) {
    let r = router();
    let get = http::Method::GET;
    c.bench_function("router/find longest prefix", |b| {
        b.iter(|| {
            r.find(
                black_box(Some("api.example.com:8080")),
                &get,
                black_box("/orders/reports/2026"),
            )
        })
    });
    c.bench_function("router/find fallback", |b| {
        b.iter(|| r.find(black_box(None), &get, black_box("/static/app.js")))
    });
    c.bench_function("request_path/normalize", |b| {
        b.iter(|| path::normalize(black_box("/orders/12345/items/7")).is_ok())
    });
    c.bench_function("request_id/generate", |b| b.iter(request_id::generate));
    c.bench_function("problem/render 404", |b| {
        b.iter(|| {
            problem::render(
                Kind::RouteNotFound,
                black_box("no route matches GET /x"),
                Some("0123456789abcdef"),
            )
        })
    });
}

fn headers_and_snapshot(c: &mut Criterion) {
    let ip = Policy::new("ip", Algorithm::TokenBucket, 50, 1000, 100);
    let minute = Policy::new("per-minute", Algorithm::SlidingWindow, 100, 60_000, 100);
    let d = Decision {
        allowed: true,
        limit: 100,
        remaining: 42,
        reset_ms: 17_250,
        retry_after_ms: 0,
    };
    c.bench_function("headers/RateLimit-Policy 2 policies", |b| {
        b.iter(|| headers::policy_header([black_box(&ip), black_box(&minute)].into_iter()))
    });
    c.bench_function("headers/RateLimit 2 policies", |b| {
        b.iter(|| {
            headers::ratelimit_header([(black_box(&ip), &d), (black_box(&minute), &d)].into_iter())
        })
    });
    let mut status = turnstile::chain::headers::LimitStatus::default();
    status.push(&ip, d);
    status.push(&minute, d);
    status.push_policy_header(http::HeaderValue::from_static("\"ip\";q=100;w=2"));
    status.push_policy_header(http::HeaderValue::from_static("\"per-minute\";q=100;w=60"));
    c.bench_function("headers/LimitStatus::headers (cached policy parts)", |b| {
        b.iter(|| status.headers(false))
    });

    let config = Config::parse(
        "[upstreams.u]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"orders\"\npath_prefix = \"/orders\"\nupstream = \"u\"\n[[routes]]\nname = \"root\"\npath_prefix = \"/\"\nupstream = \"u\"\n",
    )
    .expect("valid");
    let metrics = Arc::new(Metrics::new());
    let handle =
        arc_swap::ArcSwap::from_pointee(Snapshot::build(config, None, &metrics).expect("builds"));
    let get = http::Method::GET;
    c.bench_function("snapshot/load_full + route lookup", |b| {
        b.iter(|| {
            let snapshot = handle.load_full();
            snapshot.router.find(None, &get, black_box("/orders/42"))
        })
    });
}

/// What a keyed limit adds to a request before the store call: reading the login form's
/// field and hashing the key.
fn keyed(c: &mut Criterion) {
    use turnstile::chain::body::BodyFields;
    use turnstile::chain::partition::{KeyHasher, KeyInputs, KeyPart, Missing};
    let hasher = KeyHasher::new(b"bench-key-hash-secret");
    let headers = http::HeaderMap::new();
    let form = b"username=ada%40example.com&password=correct+horse+battery+staple";
    c.bench_function("keys/parse a form body", |b| {
        b.iter(|| {
            BodyFields::parse(
                &[b"application/x-www-form-urlencoded"],
                black_box(&form[..]),
            )
        })
    });
    let body = BodyFields::parse(&[b"application/x-www-form-urlencoded"], form);
    let inputs = KeyInputs {
        ip: Some(0x7f00_0001),
        addr: None,
        client: None,
        route: "login",
        headers: &headers,
        query: None,
        body: Some(&body),
        token: None,
        cert: None,
    };
    let account = [KeyPart::parse("body:username").expect("a key part")];
    let pair = [KeyPart::Ip, account[0].clone()];
    let unicode = BodyFields::from_pairs([("username", "Jos\u{e9}.Ｇarcía@example.com")]);
    let unicode_inputs = KeyInputs {
        body: Some(&unicode),
        token: None,
        cert: None,
        ..inputs
    };
    c.bench_function("keys/partition body:username (non-ASCII)", |b| {
        b.iter(|| hasher.partition(black_box(&account), Missing::Reject, &unicode_inputs))
    });
    c.bench_function("keys/partition body:username", |b| {
        b.iter(|| hasher.partition(black_box(&account), Missing::Reject, &inputs))
    });
    c.bench_function("keys/partition ip + body:username", |b| {
        b.iter(|| hasher.partition(black_box(&pair), Missing::Reject, &inputs))
    });
}

/// What a shedding pool adds to a request: a slot, the latency sample, the slot's release
/// (uncontended; under contention the gate's mutex is shared by the pool's requests).
fn shedding(c: &mut Criterion) {
    use std::time::Duration;
    use turnstile::upstream::shed::controller::ControllerSettings;
    use turnstile::upstream::shed::{Gate, GateSettings, Priority};
    let gate = Arc::new(Gate::new(GateSettings {
        controller: ControllerSettings {
            min_limit: 4,
            max_limit: 1000,
            initial_limit: 100,
            tolerance: 1.5,
            window: Duration::from_millis(250),
            baseline_interval: Duration::from_secs(30),
            smoothing: 0.2,
        },
        queue: 50,
        queue_timeout: Duration::from_millis(50),
        reserve_critical: 0.1,
        reserve_default: 0.2,
    }));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    c.bench_function("shedding/block_on alone (subtract)", |b| {
        b.iter(|| runtime.block_on(async { black_box(1) }))
    });
    c.bench_function("shedding/acquire + record + release", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut permit = gate.acquire(Priority::Default).await.unwrap();
                permit.record(Duration::from_micros(black_box(900)));
            })
        })
    });
}

/// What tracing adds to a request: off, nothing runs (the proxy's `Option` is `None`); on, the
/// context is read (or made) at the start, and a sampled request's spans are built and
/// encoded at its end (the encoding runs on the export thread).
fn tracing(c: &mut Criterion) {
    use std::time::{Duration, Instant};
    use turnstile::trace::export::ExportSettings;
    use turnstile::trace::otlp::{encode, request, Compression, Protocol};
    use turnstile::trace::span::Facts;
    use turnstile::trace::{begin, ParentBased, TraceSettings};
    let settings = |ratio: f64| TraceSettings {
        sample_ratio: ratio,
        parent_based: ParentBased::Always,
        max_sampled_per_second: None,
        export: ExportSettings {
            endpoint: "http://127.0.0.1:4318/v1/traces".into(),
            shown_endpoint: "http://127.0.0.1:4318/v1/traces".into(),
            protocol: turnstile::trace::otlp::Protocol::Json,
            compression: turnstile::trace::otlp::Compression::None,
            headers: Vec::new(),
            ca_pem: None,
            service_name: "bench".into(),
            queue: 1,
            batch: 1,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
        },
    };
    let mut with_parent = http::HeaderMap::new();
    with_parent.insert(
        "traceparent",
        http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
    );
    let none = http::HeaderMap::new();
    let unsampled = settings(0.0);
    c.bench_function("trace/begin, client context (unsampled)", |b| {
        b.iter(|| begin(&unsampled, black_box(&with_parent), true))
    });
    c.bench_function("trace/begin, new trace (unsampled)", |b| {
        b.iter(|| begin(&unsampled, black_box(&none), true))
    });
    let facts = Facts {
        method: "GET",
        route: Some("orders"),
        path: "/orders/7",
        status: 200,
        decision: "allowed",
        limited_by: None,
        client: Some("ada"),
        store_kind: "redis",
        upstream_addr: Some("127.0.0.1:9001".into()),
        upstream_pool: Some("orders"),
        upstream_attempts: 1,
    };
    let mut trace = begin(&settings(1.0), &none, true);
    let now = Instant::now();
    trace.limits = Some((now, now));
    trace.store = Some((now, now));
    trace.upstream = Some((now, Some(now)));
    trace.upstream_status = Some(200);
    c.bench_function("trace/finish a sampled request (4 spans)", |b| {
        b.iter(|| trace.finish(black_box(&facts)))
    });
    let spans = trace.finish(&facts);
    c.bench_function("trace/encode 4 spans as OTLP JSON (export thread)", |b| {
        b.iter(|| {
            let r = request("bench", black_box(&spans));
            encode(&r, Protocol::Json, Compression::None)
        })
    });
    c.bench_function(
        "trace/encode 4 spans as OTLP protobuf (export thread)",
        |b| {
            b.iter(|| {
                let r = request("bench", black_box(&spans));
                encode(&r, Protocol::Protobuf, Compression::None)
            })
        },
    );
}

criterion_group!(
    benches,
    bench,
    headers_and_snapshot,
    keyed,
    shedding,
    tracing
);
criterion_main!(benches);
