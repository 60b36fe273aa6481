//! OpenTelemetry tracing through a real gateway, a real Redis and a real upstream, exported to
//! an OTLP receiver the test starts: a client's trace is continued (parent/child links,
//! attributes), the upstream receives the context, unsampled requests export nothing but
//! still pass the context on, tracing off leaves `traceparent` untouched, and a collector
//! that is down costs spans (counted), not requests.

use crate::common;

use common::otlp::OtlpReceiver;
use common::redis::RedisServer;
use common::{wait_until, Gateway, Upstream};
use serde_json::Value;

const KEY: &str = "tracing-key-0123456789abcd";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn parent(trace: &str, flags: &str) -> String {
    format!("00-{trace}-{CLIENT_SPAN}-{flags}")
}

fn config(up: &Upstream, redis: &RedisServer, tracing: &str) -> String {
    format!(
        r#"
{tracing}

[store]
kind = "redis"
url = "{redis}"
timeout = "500ms"

[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-minute", algorithm = "sliding_window", limit = 100, window = "1m" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "echo"
path_prefix = "/echo"
upstream = "orders"
auth = "api_key"
"#,
        redis = redis.url(),
        addr = up.addr(),
    )
}

fn tracing_table(receiver: &OtlpReceiver, extra: &str) -> String {
    format!(
        "[tracing]\nendpoint = \"{}\"\nservice_name = \"edge\"\nexport_interval = \"50ms\"\n{extra}",
        receiver.endpoint()
    )
}

/// The headers the upstream received (the echo route's answer).
fn received(resp: &common::http::Response, name: &str) -> Vec<String> {
    resp.json()["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == name)
        .map(|h| h[1].as_str().unwrap().to_owned())
        .collect()
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn of_trace(receiver: &OtlpReceiver, trace: &str) -> Vec<Value> {
    receiver
        .spans()
        .into_iter()
        .filter(|s| s["traceId"] == trace)
        .collect()
}

#[test]
fn a_clients_trace_is_continued_through_the_limiter_the_store_and_the_upstream() {
    let receiver = OtlpReceiver::start();
    let redis = RedisServer::start();
    let up = Upstream::start("orders");
    // The client's flag is followed: it comes from a trusted proxy (loopback here).
    let gw = Gateway::start_with(
        "trusted_proxies = [\"127.0.0.1/32\"]",
        &config(&up, &redis, &tracing_table(&receiver, "sample_ratio = 0.0")),
    );
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let resp = gw.get_with(
        "/echo/orders?secret=hunter2",
        &[
            ("X-Api-Key", KEY),
            ("traceparent", &parent(trace, "01")),
            ("tracestate", "rojo=00f067aa0ba902b7"),
        ],
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    // The upstream continues the same trace, under a span of the gateway.
    let sent = received(&resp, "traceparent");
    assert_eq!(sent.len(), 1, "{sent:?}");
    let fields: Vec<&str> = sent[0].split('-').collect();
    assert_eq!((fields[0], fields[1], fields[3]), ("00", trace, "01"));
    assert_ne!(fields[2], CLIENT_SPAN);
    assert_eq!(received(&resp, "tracestate"), ["rojo=00f067aa0ba902b7"]);

    wait_until("the request's spans to be exported", || {
        of_trace(&receiver, trace).len() >= 4
    });
    let spans = of_trace(&receiver, trace);
    let named = |name: &str| -> &Value {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
    };
    let server = named("GET echo");
    let limits = named("rate limits");
    let store = named("store check");
    let upstream = named("upstream");
    assert_eq!(server["parentSpanId"], CLIENT_SPAN);
    assert_eq!(server["kind"], 2);
    assert_eq!(limits["parentSpanId"], server["spanId"]);
    assert_eq!(store["parentSpanId"], limits["spanId"]);
    assert_eq!(upstream["parentSpanId"], server["spanId"]);
    assert_eq!(
        upstream["spanId"], fields[2],
        "the upstream's parent is the upstream span"
    );
    assert_eq!(
        attr(server, "http.response.status_code").unwrap()["intValue"],
        "200"
    );
    assert_eq!(attr(server, "http.route").unwrap()["stringValue"], "echo");
    assert_eq!(
        attr(limits, "turnstile.decision").unwrap()["stringValue"],
        "allowed"
    );
    assert_eq!(
        attr(limits, "turnstile.client").unwrap()["stringValue"],
        "ada"
    );
    assert_eq!(attr(store, "db.system").unwrap()["stringValue"], "redis");
    assert_eq!(
        attr(store, "turnstile.store.result").unwrap()["stringValue"],
        "ok"
    );
    assert_eq!(
        attr(upstream, "http.response.status_code").unwrap()["intValue"],
        "200"
    );
    for s in [server, limits, store, upstream] {
        let start: u64 = s["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u64 = s["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(start > 0 && start <= end, "{s}");
    }
    // Children lie within the request's span.
    let bound = |s: &Value, f: &str| -> u64 { s[f].as_str().unwrap().parse().unwrap() };
    assert!(bound(store, "startTimeUnixNano") >= bound(server, "startTimeUnixNano"));
    assert!(bound(upstream, "endTimeUnixNano") <= bound(server, "endTimeUnixNano"));
    let resource = &receiver.bodies()[0]["resourceSpans"][0]["resource"]["attributes"];
    assert!(resource.to_string().contains("edge"), "{resource}");
    // No key, no query string, no header value.
    let raw = receiver.raw();
    assert!(!raw.contains(KEY) && !raw.contains("hunter2") && !raw.contains("rojo"));
    assert!(gw.metric("turnstile_trace_spans_total", &[("result", "exported")]) >= 4.0);
    // /config shows the tracing settings.
    let config = gw.admin("/config").json();
    assert_eq!(config["config"]["tracing"]["service_name"], "edge");
}

#[test]
fn unsampled_requests_pass_the_context_on_and_export_nothing() {
    let receiver = OtlpReceiver::start();
    let redis = RedisServer::start();
    let up = Upstream::start("orders");
    let gw = Gateway::start(&config(
        &up,
        &redis,
        &tracing_table(&receiver, "sample_ratio = 0.0\nparent_based = true"),
    ));
    let quiet = "11111111111111111111111111111111";
    let resp = gw.get_with(
        "/echo/a",
        &[("X-Api-Key", KEY), ("traceparent", &parent(quiet, "00"))],
    );
    let sent = received(&resp, "traceparent");
    assert!(
        sent[0].starts_with(&format!("00-{quiet}-")) && sent[0].ends_with("-00"),
        "{sent:?}"
    );
    // A request without context: a new trace, not sampled at ratio 0 — still propagated.
    let resp = gw.get_with("/echo/b", &[("X-Api-Key", KEY)]);
    let fresh = received(&resp, "traceparent");
    assert_eq!(fresh.len(), 1);
    assert!(fresh[0].ends_with("-00"), "{fresh:?}");
    // A sampled request after them: once its spans arrive, the earlier ones would have too.
    let loud = "22222222222222222222222222222222";
    gw.get_with(
        "/echo/c",
        &[("X-Api-Key", KEY), ("traceparent", &parent(loud, "01"))],
    );
    wait_until("the sampled request's spans", || {
        !of_trace(&receiver, loud).is_empty()
    });
    let spans = receiver.spans();
    assert!(spans.iter().all(|s| s["traceId"] == loud), "{spans:#?}");
}

#[test]
fn tracing_off_leaves_the_clients_context_untouched() {
    let redis = RedisServer::start();
    let up = Upstream::start("orders");
    let gw = Gateway::start(&config(&up, &redis, ""));
    let value = parent("33333333333333333333333333333333", "01");
    let resp = gw.get_with("/echo/a", &[("X-Api-Key", KEY), ("traceparent", &value)]);
    assert_eq!(received(&resp, "traceparent"), [value]);
    assert!(gw.admin("/config").json()["config"]["tracing"].is_null());
    assert_eq!(gw.metric("turnstile_trace_spans_total", &[]), 0.0);
}

#[test]
fn a_collector_that_is_down_costs_spans_not_requests() {
    let receiver = OtlpReceiver::start();
    receiver.fail(true);
    let redis = RedisServer::start();
    let up = Upstream::start("orders");
    let gw = Gateway::start(&config(
        &up,
        &redis,
        &tracing_table(&receiver, "export_timeout = \"200ms\""),
    ));
    for _ in 0..5 {
        assert_eq!(gw.get_with("/echo/a", &[("X-Api-Key", KEY)]).status, 200);
    }
    wait_until("the failed exports to be counted", || {
        gw.metric(
            "turnstile_trace_spans_total",
            &[("result", "dropped_export")],
        ) >= 5.0
    });
    // The collector is back: spans flow again.
    receiver.fail(false);
    assert_eq!(gw.get_with("/echo/b", &[("X-Api-Key", KEY)]).status, 200);
    wait_until("spans to be exported again", || {
        !receiver.spans().is_empty()
    });
}

/// A client cannot force sampling: its `traceparent` flag is followed only from trusted
/// proxies by default, and however traces are sampled, at most `max_sampled_per_second` a
/// second are.
#[test]
fn a_client_cannot_force_sampling_and_sampled_traces_are_capped() {
    let receiver = OtlpReceiver::start();
    let up = Upstream::start("orders");
    // One Redis per gateway: the plan's 100 a minute is not what this test counts.
    let (r1, r2, r3) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    // The upstream receives the gateway's decision in the traceparent's flags.
    let sampled = |gw: &Gateway, n: usize| {
        // Low trace ids (an all-zero one is invalid): a ratio by id would sample them all.
        (1..=n)
            .filter(|i| {
                let trace = format!("{i:032x}");
                let resp = gw.get_with(
                    "/echo/a",
                    &[("X-Api-Key", KEY), ("traceparent", &parent(&trace, "01"))],
                );
                received(&resp, "traceparent")[0].ends_with("-01")
            })
            .count()
    };
    let untrusted = Gateway::start(&config(
        &up,
        &r1,
        &tracing_table(&receiver, "sample_ratio = 0.01"),
    ));
    let n = sampled(&untrusted, 90);
    // 1 % by trace id: a handful at most, never the 90 the client asked for.
    assert!(n <= 10, "{n} of 90 flagged requests sampled");
    let trusted = Gateway::start_with(
        "trusted_proxies = [\"127.0.0.1/32\"]",
        &config(&up, &r2, &tracing_table(&receiver, "sample_ratio = 0.01")),
    );
    assert_eq!(
        sampled(&trusted, 20),
        20,
        "a trusted proxy's flag is followed"
    );
    let capped = Gateway::start(&config(
        &up,
        &r3,
        &tracing_table(&receiver, "sample_ratio = 1.0\nmax_sampled_per_second = 5"),
    ));
    let started = std::time::Instant::now();
    let n = sampled(&capped, 90);
    let seconds = started.elapsed().as_secs() + 1;
    assert!(
        n as u64 <= 5 * (seconds + 1),
        "{n} sampled in about {seconds} s with a cap of 5 a second"
    );
    assert!(n >= 5, "the first second's five are sampled");
}

#[test]
fn the_collectors_password_never_reaches_the_log() {
    let redis = RedisServer::start();
    let up = Upstream::start("orders");
    // Nothing listens there: every export fails and is logged.
    let dead = common::free_port();
    let tracing = format!(
        "[tracing]\nendpoint = \"http://otel:pw-do-not-log-7f3a@127.0.0.1:{dead}/v1/traces\"\nexport_interval = \"50ms\"\nexport_timeout = \"200ms\""
    );
    let gw = Gateway::start(&config(&up, &redis, &tracing));
    assert_eq!(gw.get_with("/echo/a", &[("X-Api-Key", KEY)]).status, 200);
    wait_until("the failed export to be logged", || {
        gw.proc.log_text().contains("exporting")
    });
    let log = gw.proc.log_text();
    assert!(!log.contains("pw-do-not-log-7f3a"), "{log}");
    assert!(log.contains("otel:***@127.0.0.1"), "{log}");
    let config = gw.admin("/config").text();
    assert!(!config.contains("pw-do-not-log-7f3a"), "{config}");
}

/// A collector as hosted ones are: https with its own CA, an API key in a header, protobuf,
/// gzip — configured in the file (the key a secret from the environment) or entirely through
/// the standard OTEL_* variables.
#[test]
fn spans_reach_an_https_collector_that_wants_a_header_as_protobuf_or_json() {
    use common::otlp::Options;
    let dir = tempfile::tempdir().unwrap();
    let ca = common::tls::Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let cert = ca.issue(dir.path(), "collector", "collector", &["127.0.0.1"]);
    const COLLECTOR_KEY: &str = "collector-key-do-not-log-5f2c";
    let receiver = OtlpReceiver::start_with(Options {
        tls: Some((&cert.cert, &cert.key)),
        require: Some(("x-collector-key", COLLECTOR_KEY)),
    });
    let redis = RedisServer::start();
    let up = Upstream::start("orders");
    let from_file = format!(
        "[tracing]\nendpoint = \"{}\"\nca_file = \"{}\"\ncompression = \"gzip\"\nexport_interval = \"50ms\"\nheaders = {{ \"x-collector-key\" = {{ env = \"OTLP_COLLECTOR_KEY\" }} }}",
        receiver.endpoint(),
        ca_file.display()
    );
    let gw = Gateway::start_env(
        "",
        "",
        &config(&up, &redis, &from_file),
        &[("OTLP_COLLECTOR_KEY", COLLECTOR_KEY)],
    );
    assert_eq!(gw.get_with("/echo/a", &[("X-Api-Key", KEY)]).status, 200);
    wait_until("spans at the https collector", || {
        !receiver.spans().is_empty()
    });
    let first = &receiver.received()[0];
    assert_eq!(first.content_type, "application/x-protobuf");
    assert_eq!(first.content_encoding.as_deref(), Some("gzip"));
    assert_eq!(receiver.refused(), 0);
    let shown = gw.admin("/config").text();
    assert!(!shown.contains(COLLECTOR_KEY), "{shown}");
    assert!(
        shown.contains("x-collector-key"),
        "the header's name is shown: {shown}"
    );
    drop(gw);
    // The same collector through the standard variables alone, as JSON.
    let before = receiver.received().len();
    let port = receiver.endpoint().replace("/v1/traces", "");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", port.as_str()),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-collector-key=collector-key-do-not-log-5f2c",
        ),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca_file.to_str().unwrap()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_SERVICE_NAME", "edge-from-env"),
    ];
    let gw = Gateway::start_env(
        "",
        "",
        &config(&up, &redis, "[tracing]\nexport_interval = \"50ms\""),
        &env,
    );
    assert_eq!(gw.get_with("/echo/b", &[("X-Api-Key", KEY)]).status, 200);
    wait_until("spans sent as configured by the environment", || {
        receiver.received().len() > before
    });
    let last = receiver.received().pop().unwrap();
    assert_eq!(last.content_type, "application/json");
    assert_eq!(
        last.body["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
        "edge-from-env"
    );
    // A wrong key: the collector refuses, the spans are counted as dropped, the key is in
    // no log line.
    drop(gw);
    let gw = Gateway::start_env(
        "",
        "",
        &config(&up, &redis, &from_file),
        &[("OTLP_COLLECTOR_KEY", "the-wrong-key-1234")],
    );
    assert_eq!(gw.get_with("/echo/c", &[("X-Api-Key", KEY)]).status, 200);
    wait_until("the refused export to be counted", || {
        gw.metric(
            "turnstile_trace_spans_total",
            &[("result", "dropped_export")],
        ) >= 1.0
    });
    assert!(receiver.refused() >= 1);
    assert!(!gw.proc.log_text().contains("the-wrong-key-1234"));
}
