//! Client certificates (mTLS) on the TLS listener, with `curl --cert`: a certificate from the
//! configured CA identifies its holder (its name as `X-Client-Id`, its plan's limits), a
//! route asking for one refuses requests without it while other routes serve them, a
//! certificate from another CA never completes a handshake, and `required` (by reload)
//! refuses connections without one.

use crate::common;

use common::tls::{Ca, Issued};
use common::{free_port, wait_until, Gateway, Upstream};
use std::path::Path;
use std::process::Command;

fn config(up: &Upstream, tls_port: u16, server: &Issued, ca: &Path, mode: &str) -> String {
    format!(
        r#"
[server.tls]
listen = "127.0.0.1:{tls_port}"
client_certificates = "{mode}"
client_ca_file = "{ca}"
client_plan = "partners"

[[server.tls.certificates]]
cert = "{cert}"
key = "{key}"

[upstreams.api]
servers = ["{addr}"]

[plans.partners]
limits = [{{ name = "per-hour", algorithm = "sliding_log", limit = 3, window = "1h" }}]

[[routes]]
name = "partners"
path_prefix = "/echo/partners"
upstream = "api"
auth = "client_cert"

[[routes]]
name = "public"
path_prefix = "/echo/public"
upstream = "api"
limits = [{{ name = "per-cert", algorithm = "sliding_log", limit = 2, window = "1h", key = ["cert:subject"], missing = "skip" }}]
"#,
        ca = ca.display(),
        cert = server.cert.display(),
        key = server.key.display(),
        addr = up.addr()
    )
}

/// `curl` to `path` over TLS, with a client certificate if given: the status and body, or
/// `None` when no HTTP answer came (the handshake failed).
fn curl(port: u16, ca: &Path, client: Option<&Issued>, path: &str) -> Option<(u16, String)> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-w", "\n%{http_code}", "--max-time", "10"])
        .args(["--cacert", ca.to_str().unwrap()])
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")]);
    if let Some(c) = client {
        cmd.args(["--cert", c.cert.to_str().unwrap()])
            .args(["--key", c.key.to_str().unwrap()]);
    }
    let out = cmd
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .expect("run curl");
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n')?;
    Some((status.parse().ok()?, body.to_owned()))
}

fn client_id(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["headers"]
        .as_array()?
        .iter()
        .find_map(|h| (h[0] == "x-client-id").then(|| h[1].as_str().unwrap().to_owned()))
}

#[test]
fn a_client_certificate_identifies_its_holder_where_a_route_asks_for_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let server = ca.issue(dir.path(), "server", "gateway", &["localhost"]);
    let svc_a = ca.issue(dir.path(), "svc-a", "svc-a", &["svc-a.partners.test"]);
    let svc_b = ca.issue(dir.path(), "svc-b", "svc-b", &["svc-b.partners.test"]);
    let other_ca = Ca::new();
    let outsider = other_ca.issue(dir.path(), "outsider", "svc-a", &["svc-a.partners.test"]);
    let up = Upstream::start("api");
    let tls_port = free_port();
    let gw = Gateway::start(&config(&up, tls_port, &server, &ca_file, "optional"));
    wait_until("the TLS listener", || common::port_open(tls_port));

    // svc-a is identified by its first SAN, on the partners plan: 3 per hour.
    let statuses: Vec<u16> = (0..5)
        .map(|_| {
            curl(tls_port, &ca_file, Some(&svc_a), "/echo/partners")
                .unwrap()
                .0
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let (_, body) = curl(tls_port, &ca_file, Some(&svc_b), "/echo/partners").unwrap();
    assert_eq!(client_id(&body).as_deref(), Some("svc-b.partners.test"));

    // Without a certificate: the partners route refuses, the public one serves.
    let (status, body) = curl(tls_port, &ca_file, None, "/echo/partners").unwrap();
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("client certificate"), "{body}");
    assert_eq!(
        curl(tls_port, &ca_file, None, "/echo/public").unwrap().0,
        200
    );
    // A cert: key part counts per certificate subject on any route of the listener.
    let per_cert: Vec<u16> = (0..3)
        .map(|_| {
            curl(tls_port, &ca_file, Some(&svc_b), "/echo/public")
                .unwrap()
                .0
        })
        .collect();
    assert_eq!(per_cert, [200, 200, 429]);

    // A certificate of another CA (same names) never completes the handshake. Each refusal
    // is counted; the log gets one line for them all (a client cannot fill it).
    let lines = |gw: &Gateway| {
        gw.proc
            .log_text()
            .matches("Downstream handshake error")
            .count()
    };
    let before = lines(&gw);
    for _ in 0..5 {
        assert_eq!(
            curl(tls_port, &ca_file, Some(&outsider), "/echo/public"),
            None
        );
    }
    wait_until("the refusals counted", || {
        gw.metric(
            "turnstile_tls_handshake_failures_total",
            &[("reason", "failed")],
        ) >= 5.0
    });
    assert!(lines(&gw) <= before + 1, "{}", gw.proc.log_text());
    assert!(
        lines(&gw) >= 1,
        "the first refusal of the interval is logged"
    );

    // Required, by reload: no certificate, no connection; a good one still works.
    gw.rewrite(&config(&up, tls_port, &server, &ca_file, "required"));
    wait_until("the reload", || gw.config_version() == 2);
    assert_eq!(curl(tls_port, &ca_file, None, "/echo/public"), None);
    let (status, _) = curl(tls_port, &ca_file, Some(&svc_b), "/echo/partners").unwrap();
    assert_eq!(status, 200);
}
