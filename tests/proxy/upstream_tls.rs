//! TLS and HTTP/2 to upstreams: a gRPC echo service behind the gateway over TLS with ALPN h2,
//! verified against a CA file, presenting a client certificate (the service asks for one),
//! called over HTTP/2 — message and trailers (`grpc-status`) come back through the gateway,
//! and the chain's limits apply to gRPC calls like to any request. Verification is on unless
//! turned off by name: the wrong CA is a 502.

use crate::common;

use common::grpc::{call, GrpcServer};
use common::tls::Ca;
use common::Gateway;

const KEY: &str = "grpc-test-key-0123456789ab";

fn config(port: u16, dir: &std::path::Path, ca: &str, extra: &str) -> String {
    format!(
        r#"
[upstreams.grpc]
servers = ["127.0.0.1:{port}"]
tls = true
tls_sni = "grpc.test"
tls_ca_file = "{ca}"
tls_client_cert = "{client_cert}"
tls_client_key = "{client_key}"
http2 = true
{extra}

[plans.small]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 3, window = "1m" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "echo"
path_prefix = "/echo.Echo"
upstream = "grpc"
auth = "api_key"
"#,
        client_cert = dir.join("gateway.pem").display(),
        client_key = dir.join("gateway.key").display(),
    )
}

#[test]
fn a_grpc_call_goes_through_over_tls_and_http2_trailers_and_all() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let server = ca.issue(dir.path(), "grpc", "grpc service", &["grpc.test"]);
    ca.issue(dir.path(), "gateway", "the gateway", &["gateway.test"]);
    // The service asks for a client certificate signed by the same CA (mTLS).
    let grpc = GrpcServer::start(&server.cert, &server.key, Some(&ca_file));
    let gw = Gateway::start_with(
        "h2c = true",
        &config(grpc.port, dir.path(), &ca_file.display().to_string(), ""),
    );
    let answer = call(gw.port, "/echo.Echo/Say", b"hello", &[("x-api-key", KEY)]);
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.headers.get("content-type").unwrap(),
        "application/grpc"
    );
    assert_eq!(answer.message, b"hello");
    let trailers = answer.trailers.expect("trailers");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(
        trailers.get("grpc-message").unwrap(),
        "echoed /echo.Echo/Say"
    );
    assert_eq!(trailers.get("x-te-received").unwrap(), "trailers");
    // The limits count gRPC calls like any request.
    for _ in 0..2 {
        assert_eq!(
            call(gw.port, "/echo.Echo/Say", b"x", &[("x-api-key", KEY)]).status,
            200
        );
    }
    // Refused as a gRPC status (trailers-only: HTTP 200, no message, no trailers).
    let refused = call(gw.port, "/echo.Echo/Say", b"x", &[("x-api-key", KEY)]);
    assert_eq!(refused.status, 200);
    assert_eq!(refused.headers.get("grpc-status").unwrap(), "8");
    assert!(refused.headers.contains_key("retry-after"));
    assert!(refused.message.is_empty() && refused.trailers.is_none());
}

#[test]
fn the_upstreams_certificate_is_verified_unless_that_is_turned_off_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let server = ca.issue(dir.path(), "grpc", "grpc service", &["grpc.test"]);
    ca.issue(dir.path(), "gateway", "the gateway", &["gateway.test"]);
    let grpc = GrpcServer::start(&server.cert, &server.key, None);
    // Another CA: the service's certificate does not chain to it.
    let other_dir = tempfile::tempdir().unwrap();
    let other_ca = Ca::new().write_ca(other_dir.path());
    let gw = Gateway::start_with(
        "h2c = true",
        &config(grpc.port, dir.path(), &other_ca.display().to_string(), ""),
    );
    let refused = call(gw.port, "/echo.Echo/Say", b"hello", &[("x-api-key", KEY)]);
    assert_eq!(
        refused.headers.get("grpc-status").unwrap(),
        "14",
        "UNAVAILABLE"
    );
    gw.assert_counted(
        "turnstile_requests_total",
        &[("route", "echo"), ("status", "502")],
        1.0,
    );
    let skipping = Gateway::start_with(
        "h2c = true",
        &config(
            grpc.port,
            dir.path(),
            &other_ca.display().to_string(),
            "tls_insecure_skip_verify = true",
        ),
    );
    let answer = call(
        skipping.port,
        "/echo.Echo/Say",
        b"hello",
        &[("x-api-key", KEY)],
    );
    assert_eq!(answer.status, 200);
    assert_eq!(answer.message, b"hello");
}

#[test]
fn without_tls_sni_the_server_is_verified_by_the_host_it_is_configured_by() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let named = ca.issue(dir.path(), "named", "named service", &["localhost"]);
    let other = ca.issue(dir.path(), "other", "other service", &["grpc.test"]);
    ca.issue(dir.path(), "gateway", "the gateway", &["gateway.test"]);
    let by_name = |port: u16| {
        config(port, dir.path(), &ca_file.display().to_string(), "").replace(
            &format!("servers = [\"127.0.0.1:{port}\"]\ntls = true\ntls_sni = \"grpc.test\""),
            &format!("servers = [\"localhost:{port}\"]\ntls = true"),
        )
    };
    // The certificate names the configured host: verified, answered.
    let grpc = GrpcServer::start(&named.cert, &named.key, None);
    let config = by_name(grpc.port);
    assert!(!config.contains("tls_sni"));
    let gw = Gateway::start_with("h2c = true", &config);
    let answer = call(gw.port, "/echo.Echo/Say", b"hello", &[("x-api-key", KEY)]);
    assert_eq!(answer.status, 200);
    assert_eq!(answer.message, b"hello");
    // It names another host: the same setup is refused.
    let grpc = GrpcServer::start(&other.cert, &other.key, None);
    let gw = Gateway::start_with("h2c = true", &by_name(grpc.port));
    let refused = call(gw.port, "/echo.Echo/Say", b"hello", &[("x-api-key", KEY)]);
    assert_eq!(
        refused.headers.get("grpc-status").unwrap(),
        "14",
        "UNAVAILABLE"
    );
    gw.assert_counted(
        "turnstile_requests_total",
        &[("route", "echo"), ("status", "502")],
        1.0,
    );
}

/// Two pools to one server, one trusting the test CA and one only the system roots: the
/// second never rides on a connection the first one's trust accepted (Pingora's pool key
/// leaves the CA out), and a reload that drops the CA file stops the first one too.
#[test]
fn a_pooled_connection_serves_only_pools_whose_trust_accepted_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let server = ca.issue(dir.path(), "grpc", "grpc service", &["localhost"]);
    let grpc = GrpcServer::start(&server.cert, &server.key, None);
    let pools = |trusted_ca: &str| {
        format!(
            r#"
[upstreams.trusted]
servers = ["127.0.0.1:{port}"]
tls = true
tls_sni = "localhost"
{trusted_ca}
http2 = true

[upstreams.system]
servers = ["127.0.0.1:{port}"]
tls = true
tls_sni = "localhost"
http2 = true

[[routes]]
name = "trusted"
path_prefix = "/echo.Echo"
upstream = "trusted"

[[routes]]
name = "system"
path_prefix = "/other.Echo"
upstream = "system"
"#,
            port = grpc.port
        )
    };
    let with_ca = pools(&format!("tls_ca_file = \"{}\"", ca_file.display()));
    let gw = Gateway::start_with("h2c = true", &with_ca);
    // UNAVAILABLE: the gateway could not reach the service (its 502).
    let system = |gw: &Gateway| {
        call(gw.port, "/other.Echo/Say", b"x", &[])
            .grpc_status()
            .map(str::to_owned)
    };
    let unavailable = Some("14".to_owned());
    assert_eq!(
        system(&gw),
        unavailable,
        "the test CA is not among the system roots"
    );
    for _ in 0..3 {
        let answer = call(gw.port, "/echo.Echo/Say", b"hello", &[]);
        assert_eq!(answer.status, 200);
        // The trusted pool's connection is open and idle in Pingora's pool now.
        assert_eq!(
            system(&gw),
            unavailable,
            "reused the other pool's connection"
        );
    }
    // Without the CA file the trusted pool trusts the system roots only: refused too.
    gw.rewrite(&pools(""));
    common::wait_until("the reload", || gw.config_version() == 2);
    let refused = call(gw.port, "/echo.Echo/Say", b"hello", &[]);
    assert_eq!(refused.grpc_status(), Some("14"));
    assert_eq!(system(&gw), unavailable);
}
