//! Per-request work of the gateway core, measured one piece at a time (no network):
//! route matching, the request-path check, request-id generation, problem bodies.
//! Run with `cargo bench --bench core`; results and machine in BENCHMARKS.md.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use turnstile::config::Config;
use turnstile::problem::{self, Kind};
use turnstile::request_id;
use turnstile::router::{check_request_path, Router};

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
    Router::new(&config.routes)
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
    c.bench_function("router/check_request_path", |b| {
        b.iter(|| check_request_path(black_box("/orders/12345/items/7")))
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

criterion_group!(benches, bench);
criterion_main!(benches);
