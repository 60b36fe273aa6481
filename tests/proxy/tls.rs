//! The TLS listener and HTTP/2, with real clients: certificates from a throwaway CA, `curl
//! --http2` and `openssl s_client` handshakes; SNI picks the certificate, ALPN offers h2,
//! TLS below 1.2 is refused; HTTP/2 requests go through the same chain and limits as HTTP/1
//! ones (429 with its headers included); h2c with prior knowledge; certificates reloaded
//! when their files change, without dropping an open connection; a bad certificate keeps
//! the old one and says why.

use crate::common;

use common::tls::{Ca, Issued};
use common::{free_port, wait_until, Gateway, Upstream};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const KEY: &str = "tls-test-key-0123456789abc";

fn config(up: &Upstream, tls_port: u16, certs: &[&Issued], extra: &str) -> String {
    let mut text = format!("[server.tls]\nlisten = \"127.0.0.1:{tls_port}\"\n{extra}\n");
    for c in certs {
        text.push_str(&format!(
            "[[server.tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"\n",
            c.cert.display(),
            c.key.display()
        ));
    }
    text.push_str(&format!(
        r#"
[upstreams.orders]
servers = ["{addr}"]

[plans.small]
limits = [{{ name = "per-minute", algorithm = "sliding_log", limit = 2, window = "1m" }}]

[[clients]]
id = "ada"
plan = "small"
api_keys = ["{KEY}"]

[[routes]]
name = "orders"
path_prefix = "/orders"
upstream = "orders"
auth = "api_key"
"#,
        addr = up.addr()
    ));
    text
}

/// `curl` over TLS to `host` (resolved to loopback): (HTTP version, status, headers).
fn curl(port: u16, host: &str, ca: &Path, extra: &[&str]) -> (String, u16, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code}",
        ])
        .args(["--cacert", ca.to_str().unwrap()])
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .args(["-H", &format!("X-Api-Key: {KEY}")])
        .args(extra)
        .arg(format!("https://{host}:{port}/orders"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "curl failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text.lines().last().unwrap_or_default().to_owned();
    let (version, status) = last.split_once(' ').unwrap();
    (version.to_owned(), status.parse().unwrap(), text)
}

/// `openssl s_client` handshake output for `servername` (`None`: no SNI).
fn s_client(port: u16, servername: Option<&str>, ca: &Path, extra: &[&str]) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-CAfile", ca.to_str().unwrap()])
        .args(extra)
        .stdin(Stdio::null());
    match servername {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd.output().expect("run openssl");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn sni_picks_the_certificate_and_http2_requests_meet_the_same_limits() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let api = ca.issue(dir.path(), "api", "api cert", &["api.test"]);
    let other = ca.issue(dir.path(), "other", "wildcard cert", &["*.other.test"]);
    let up = Upstream::start("orders");
    let tls_port = free_port();
    let gw = Gateway::start(&config(&up, tls_port, &[&api, &other], ""));

    // ALPN h2: two admitted, the third refused — with the limit's headers, over HTTP/2.
    let (version, status, _) = curl(tls_port, "api.test", &ca_file, &["--http2"]);
    assert_eq!((version.as_str(), status), ("2", 200));
    let (version, status, _) = curl(tls_port, "api.test", &ca_file, &["--http1.1"]);
    assert_eq!((version.as_str(), status), ("1.1", 200));
    let (version, status, headers) = curl(tls_port, "api.test", &ca_file, &["--http2"]);
    assert_eq!((version.as_str(), status), ("2", 429), "{headers}");
    let headers = headers.to_ascii_lowercase();
    assert!(headers.contains("retry-after:"), "{headers}");
    assert!(headers.contains("ratelimit-policy:"), "{headers}");
    assert!(
        headers.contains("content-type: application/problem+json"),
        "{headers}"
    );
    assert_eq!(up.served(), 2);
    assert_eq!(
        gw.metric(
            "turnstile_limiter_decisions_total",
            &[("policy", "per-minute"), ("outcome", "rejected")]
        ),
        1.0
    );

    // SNI: each name gets its certificate, verified against the CA; no SNI, the first.
    let wildcard = s_client(tls_port, Some("x.other.test"), &ca_file, &[]);
    assert!(
        wildcard.contains("CN = wildcard cert") || wildcard.contains("CN=wildcard cert"),
        "{wildcard}"
    );
    assert!(
        wildcard.contains("Verify return code: 0 (ok)"),
        "{wildcard}"
    );
    let named = s_client(
        tls_port,
        Some("api.test"),
        &ca_file,
        &["-alpn", "h2,http/1.1"],
    );
    assert!(named.contains("api cert"), "{named}");
    assert!(named.contains("ALPN protocol: h2"), "{named}");
    let default = s_client(tls_port, None, &ca_file, &[]);
    assert!(default.contains("api cert"), "{default}");
    // Only TLS 1.2 and 1.3.
    let old = s_client(tls_port, Some("api.test"), &ca_file, &["-tls1_1"]);
    assert!(
        old.contains("Cipher is (NONE)") && old.contains("alert"),
        "a TLS 1.1 handshake must fail: {old}"
    );
    let modern = s_client(tls_port, Some("api.test"), &ca_file, &["-tls1_2"]);
    assert!(modern.contains("TLSv1.2"), "{modern}");

    // /config shows the listener, never the key.
    let config = gw.admin("/config").json();
    let tls = &config["config"]["server"]["tls"];
    assert_eq!(tls["certificates"][0]["key"], "set", "{tls}");
    assert!(!config.to_string().contains("api.key"), "{config}");
}

/// `https_redirect`: a plain request is sent (308) to the same host, path and query on the
/// TLS listener; a request over TLS goes through as ever.
#[test]
fn plain_requests_are_redirected_to_the_tls_listener() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let api = ca.issue(dir.path(), "api", "api cert", &["api.test"]);
    let up = Upstream::start("orders");
    let tls_port = free_port();
    let gw = Gateway::start_with("https_redirect = true", &config(&up, tls_port, &[&api], ""));
    let headers = [("Host", "api.test:8080"), ("X-Api-Key", KEY)];
    let plain = common::http::request(gw.port, "POST", "/orders?page=2", &headers, b"{}");
    assert_eq!(plain.status, 308, "{}", plain.text());
    assert_eq!(
        plain.header("location").map(str::to_owned),
        Some(format!("https://api.test:{tls_port}/orders?page=2"))
    );
    let (_, status, _) = curl(tls_port, "api.test", &ca_file, &[]);
    assert_eq!(status, 200);
    assert_eq!(up.served(), 1, "the redirected request was not proxied");
    // No host to send it to: refused, not redirected anywhere.
    let raw = common::http::raw(
        gw.port,
        b"GET /orders HTTP/1.0\r\nX-Api-Key: tls-test-key-0123456789abc\r\n\r\n",
    )
    .unwrap();
    assert_eq!(raw.status, 400, "{}", raw.text());
    assert_eq!(raw.header("location"), None);
    // A client that is no trusted proxy cannot talk its way past the redirect.
    let spoofed = [("Host", "api.test"), ("X-Forwarded-Proto", "https")];
    let spoofed = common::http::request(gw.port, "GET", "/orders", &spoofed, b"");
    assert_eq!(spoofed.status, 308, "{}", spoofed.text());
    assert_eq!(up.served(), 1);
}

#[test]
fn a_trusted_proxy_that_terminated_tls_is_not_redirected() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let api = ca.issue(dir.path(), "api", "api cert", &["api.test"]);
    let up = Upstream::start("orders");
    let server = "https_redirect = true\ntrusted_proxies = [\"127.0.0.1/32\"]";
    let gw = Gateway::start_with(server, &config(&up, free_port(), &[&api], ""));
    let send = |proto: &str| {
        let headers = [
            ("Host", "api.test"),
            ("X-Api-Key", KEY),
            ("X-Forwarded-Proto", proto),
        ];
        common::http::request(gw.port, "GET", "/orders", &headers, b"")
    };
    // The proxy in front says its client used https: proxied (a redirect would loop).
    let ok = send("https");
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(up.served(), 1);
    // Its client used plain HTTP: redirected.
    let plain = send("http");
    assert_eq!(plain.status, 308, "{}", plain.text());
    assert_eq!(up.served(), 1);
}

#[test]
fn h2c_with_prior_knowledge_shares_the_plaintext_port_with_http1() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let api = ca.issue(dir.path(), "api", "api cert", &["api.test"]);
    let up = Upstream::start("orders");
    let gw = Gateway::start_with("h2c = true", &config(&up, free_port(), &[&api], ""));
    let run = |flag: &str| -> String {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{http_code}",
                flag,
            ])
            .args(["-H", &format!("X-Api-Key: {KEY}")])
            .arg(format!("http://127.0.0.1:{}/orders", gw.port))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(run("--http2-prior-knowledge"), "2 200");
    assert_eq!(run("--http1.1"), "1.1 200");
    assert_eq!(run("--http2-prior-knowledge"), "2 429");
}

#[test]
fn certificates_follow_their_files_without_dropping_connections_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let first = ca.issue(dir.path(), "api", "first cert", &["api.test"]);
    let up = Upstream::start("orders");
    let tls_port = free_port();
    let gw = Gateway::start(&config(&up, tls_port, &[&first], ""));
    // A client keeps a TLS connection open across the change.
    let mut client = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-connect",
            &format!("127.0.0.1:{tls_port}"),
        ])
        .args([
            "-servername",
            "api.test",
            "-CAfile",
            ca_file.to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = client.stdin.take().unwrap();
    let mut output = BufReader::new(client.stdout.take().unwrap());
    let mut ask = || -> String {
        write!(
            input,
            "GET /orders HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: {KEY}\r\n\r\n"
        )
        .unwrap();
        input.flush().unwrap();
        let mut status = String::new();
        output.read_line(&mut status).unwrap();
        // Skip the rest of the response (headers, then the body by its length).
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            output.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; length];
        std::io::Read::read_exact(&mut output, &mut body).unwrap();
        status
    };
    assert!(ask().starts_with("HTTP/1.1 200"));

    // The certificate is renewed in place: new handshakes get it, the open connection stays.
    let renewed = ca.issue(dir.path(), "renewed", "renewed cert", &["api.test"]);
    std::fs::copy(&renewed.key, &first.key).unwrap();
    std::fs::copy(&renewed.cert, &first.cert).unwrap();
    wait_until("the renewed certificate to be served", || {
        s_client(tls_port, Some("api.test"), &ca_file, &[]).contains("renewed cert")
    });
    assert!(
        ask().starts_with("HTTP/1.1 200"),
        "the open connection survived"
    );
    assert_eq!(gw.config_version(), 2);

    // A broken certificate: the reload is refused, naming the file's setting, and the
    // renewed certificate keeps being served.
    std::fs::write(&first.cert, "not a certificate").unwrap();
    wait_until("the broken certificate to be refused", || {
        gw.metric("turnstile_config_reloads_total", &[("result", "error")]) >= 1.0
    });
    assert!(gw
        .proc
        .log_text()
        .contains("server.tls.certificates[0].cert"));
    assert!(s_client(tls_port, Some("api.test"), &ca_file, &[]).contains("renewed cert"));
    let (code, out, err) = common::turnstile(&["check", gw.config_path.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("server.tls.certificates[0].cert"), "{err}");
    drop(input);
    let _ = client.kill();
    let _ = client.wait();
}
