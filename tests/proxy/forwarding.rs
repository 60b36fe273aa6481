//! What the upstream is told of how the request reached the gateway, through a real gateway
//! to orders-api's `/echo` (which answers with what it received): the path rewritten by
//! `strip_prefix` / `add_prefix` after normalising (what is routed is what is forwarded),
//! `X-Forwarded-Proto` / `-Host` / `-Prefix` the gateway's own — a client's values replaced,
//! their `_` spellings removed — RFC 7239 `Forwarded` appended where the route asks, and
//! `https` over the TLS listener, HTTP/1 and HTTP/2 alike.

use crate::common;

use common::echoed as received;
use common::tls::Ca;
use common::{free_port, http, Gateway, Upstream};
use serde_json::Value;
use std::process::Command;

fn config(up: &Upstream) -> String {
    format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[[routes]]
name = "api"
path_prefix = "/api/"
upstream = "orders"
strip_prefix = true
add_prefix = "/echo"
forwarded = true

[[routes]]
name = "echo"
path_prefix = "/echo"
upstream = "orders"
"#,
        addr = up.addr()
    )
}

#[test]
fn the_upstream_gets_the_rewritten_path_and_the_gateways_forwarding_headers() {
    let up = Upstream::start("orders");
    let gw = Gateway::start(&config(&up));
    let request = format!(
        "GET /api//items/%31?x=1 HTTP/1.1\r\nHost: shop.example:{port}\r\n\
         X-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example\r\n\
         X_Forwarded_Prefix: /admin\r\nForwarded: for=192.0.2.1\r\nConnection: close\r\n\r\n",
        port = gw.port
    );
    let resp = http::raw(gw.port, request.as_bytes()).unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
    let echo = resp.json();
    // Normalised, routed by /api, then /api swapped for /echo; the query as sent.
    assert_eq!(echo["path"], "/echo/items/1");
    assert_eq!(echo["query"], "x=1");
    let host = format!("shop.example:{}", gw.port);
    assert_eq!(received(&echo, "x-forwarded-proto"), ["http"]);
    assert_eq!(
        received(&echo, "x-forwarded-host"),
        std::slice::from_ref(&host)
    );
    assert_eq!(received(&echo, "x-forwarded-prefix"), ["/api"]);
    assert!(received(&echo, "x_forwarded_prefix").is_empty());
    assert_eq!(
        received(&echo, "forwarded"),
        [format!(
            "for=192.0.2.1, for=127.0.0.1;host=\"{host}\";proto=http"
        )]
    );

    // A route without the options: the path as routed, no prefix, no Forwarded added.
    let echo = gw.get("/echo/plain").json();
    assert_eq!(echo["path"], "/echo/plain");
    assert!(received(&echo, "x-forwarded-prefix").is_empty());
    assert!(received(&echo, "forwarded").is_empty());
    assert_eq!(received(&echo, "x-forwarded-proto"), ["http"]);
}

#[test]
fn over_the_tls_listener_the_upstream_is_told_https_on_http1_and_http2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let cert = ca.issue(dir.path(), "api", "api cert", &["api.test"]);
    let up = Upstream::start("orders");
    let tls_port = free_port();
    let gw = Gateway::start(&format!(
        "[server.tls]\nlisten = \"127.0.0.1:{tls_port}\"\n\
         [[server.tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"\n{}",
        cert.cert.display(),
        cert.key.display(),
        config(&up)
    ));
    for version in ["--http1.1", "--http2"] {
        let out = Command::new("curl")
            .args(["-sS", version, "--cacert", ca_file.to_str().unwrap()])
            .args(["--resolve", &format!("api.test:{tls_port}:127.0.0.1")])
            .args(["-H", "X-Forwarded-Proto: http"])
            .arg(format!("https://api.test:{tls_port}/api/x"))
            .output()
            .expect("run curl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let echo: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(echo["path"], "/echo/x", "{version}");
        assert_eq!(received(&echo, "x-forwarded-proto"), ["https"], "{version}");
        let host = format!("api.test:{tls_port}");
        assert_eq!(
            received(&echo, "x-forwarded-host"),
            std::slice::from_ref(&host),
            "{version}"
        );
        assert_eq!(
            received(&echo, "forwarded"),
            [format!("for=127.0.0.1;host=\"{host}\";proto=https")],
            "{version}"
        );
    }
    drop(gw);
}
