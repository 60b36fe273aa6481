//! Every wait has a bound. HTTP/2 is held to the same bounds as HTTP/1, with raw frames from
//! a real client (the `h2` crate, and bytes on a socket where the frames must be malformed): a
//! request body that stalls ends its connection after `body_timeout` (on a proxied route,
//! freeing the client's concurrency slot long before `read_timeout`; on a keyed route, where
//! the gateway reads the body itself), a header block that never ends after
//! `header_timeout`, and an idle connection after `keepalive_timeout` — over h2c and TLS. A
//! TLS handshake left unfinished, and a half-sent request to the admin listener, end after
//! `header_timeout` (Pingora's own bound is 60 s). A client that stops reading a response
//! (HTTP/1), or grants it no flow-control window (HTTP/2), is given up on after
//! `send_timeout`.

use crate::common;

use bytes::Bytes;
use common::tls::Ca;
use common::{free_port, Gateway, Upstream};
use std::io::{Read, Write};
use std::time::Duration;

const KEY: &str = "h2-bounds-key-0123456789";
/// Longer than any bound the gateway is configured with here, shorter than `read_timeout`:
/// what has not ended by then was not bounded.
const PATIENCE: Duration = Duration::from_secs(20);

fn config(up: &Upstream, tls: &str) -> String {
    format!(
        r#"
{tls}

[upstreams.main]
servers = ["{addr}"]

[plans.p]
limits = [{{ name = "per-hour", algorithm = "sliding_log", limit = 1000, window = "1h" }}]

[[clients]]
id = "ada"
plan = "p"
api_keys = ["{KEY}"]

[[routes]]
name = "upload"
path_prefix = "/echo/upload"
upstream = "main"
auth = "api_key"
max_concurrent = 1
read_timeout = "60s"

[[routes]]
name = "login"
path_prefix = "/echo/login"
upstream = "main"

[[routes.limits]]
name = "per-account"
algorithm = "sliding_window"
limit = 5
window = "15m"
key = ["body:username"]

[[routes]]
name = "other"
path_prefix = "/"
upstream = "main"
"#,
        addr = up.addr()
    )
}

const SERVER: &str = "h2c = true\nheader_timeout = \"1s\"\nbody_timeout = \"1s\"\nsend_timeout = \"1s\"\nkeepalive_timeout = \"1s\"\nkey_hash_secret = \"h2-bounds-secret-0123456789\"";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn request(port: u16, method: &str, path: &str, length: Option<usize>) -> http::Request<()> {
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{path}"))
        .header("x-api-key", KEY)
        .header("content-type", "application/json");
    if let Some(n) = length {
        req = req.header("content-length", n);
    }
    req.body(()).unwrap()
}

/// A new h2c connection to the gateway, its client ready for a request, and the task driving
/// the connection (done when the gateway ends it). `window`: the client's initial stream
/// window (`None`: the default).
async fn h2c(
    port: u16,
    window: Option<u32>,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut builder = h2::client::Builder::new();
    if let Some(window) = window {
        builder.initial_window_size(window);
    }
    let (client, conn) = builder.handshake::<_, Bytes>(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    (client.ready().await.unwrap(), conn)
}

/// Opens an h2c connection, sends `path`'s headers and `first` body bytes of an announced
/// 1000, then stalls. Returns whether the gateway ended the connection within `PATIENCE`.
fn stall_a_body(port: u16, path: &str, first: &[u8]) -> bool {
    runtime().block_on(async {
        let (mut client, conn) = h2c(port, None).await;
        let (_response, mut send) = client
            .send_request(request(port, "POST", path, Some(1000)), false)
            .unwrap();
        send.send_data(Bytes::copy_from_slice(first), false)
            .unwrap();
        // Hold the stream (and the client) open, sending nothing more.
        let ended = tokio::time::timeout(PATIENCE, conn).await.is_ok();
        drop((send, client));
        ended
    })
}

/// A whole request over a new h2c connection: its status.
fn whole(port: u16, path: &str, body: &[u8]) -> u16 {
    runtime().block_on(async {
        let (mut client, _conn) = h2c(port, None).await;
        let (response, mut send) = client
            .send_request(request(port, "POST", path, Some(body.len())), false)
            .unwrap();
        send.send_data(Bytes::copy_from_slice(body), true).unwrap();
        let response = tokio::time::timeout(PATIENCE, response)
            .await
            .expect("an answer")
            .unwrap();
        response.status().as_u16()
    })
}

#[test]
fn a_stalled_body_ends_its_connection_and_frees_the_clients_slot() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(SERVER, &config(&up, ""));
    // The route allows one request of the client at a time; the stalled one holds it.
    let port = gw.port;
    let stalled = std::thread::spawn(move || stall_a_body(port, "/echo/upload", b"{\"a\":"));
    assert!(
        stalled.join().unwrap(),
        "a stalled HTTP/2 body must end at body_timeout, not hold on until read_timeout"
    );
    assert_eq!(
        whole(gw.port, "/echo/upload", b"{}"),
        200,
        "the slot is free again"
    );
}

#[test]
fn a_stalled_body_on_a_keyed_route_ends_its_connection() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(SERVER, &config(&up, ""));
    assert!(
        stall_a_body(gw.port, "/echo/login", b"{\"username\":"),
        "the body the gateway reads for a key must be bounded too"
    );
    let login = br#"{"username":"ada"}"#;
    assert_eq!(whole(gw.port, "/echo/login", login), 200);
}

/// A response far larger than the socket buffers between the gateway and the client.
const LARGE: usize = 64 << 20;

#[test]
fn a_client_that_stops_reading_is_cut_at_send_timeout() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(SERVER, &config(&up, ""));
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    let head = format!("GET /_control/bytes?n={LARGE} HTTP/1.1\r\nHost: t\r\n\r\n");
    tcp.write_all(head.as_bytes()).unwrap();
    // Read nothing for a while: the buffers fill and the gateway's writes wait on us.
    std::thread::sleep(Duration::from_secs(4));
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut received = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    let ended = loop {
        match tcp.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => received += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(ended, "the connection must end, not wait on the client");
    assert!(
        received < LARGE,
        "the gateway gave up on the reader: {received} of {LARGE} bytes arrived"
    );
}

#[test]
fn an_http2_client_that_grants_no_window_has_its_stream_reset_at_send_timeout() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(SERVER, &config(&up, ""));
    let port = gw.port;
    let outcome = runtime().block_on(async {
        // No window for any stream's DATA, and none granted later.
        let (mut client, _conn) = h2c(port, Some(0)).await;
        let path = format!("/_control/bytes?n={}", 1 << 20);
        let (response, _) = client
            .send_request(request(port, "GET", &path, None), true)
            .unwrap();
        let response = tokio::time::timeout(PATIENCE, response)
            .await
            .expect("the response's head")
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        tokio::time::timeout(PATIENCE, body.data()).await
    });
    match outcome {
        Ok(Some(Err(e))) => assert!(e.is_reset(), "the stream alone is reset: {e}"),
        Ok(other) => panic!("the stream must be reset, got {other:?}"),
        Err(_) => panic!("the gateway waited on a window the client never grants"),
    }
}

/// A request waiting on its answer is not an idle connection, however long the client
/// stays silent: an upstream slower than `keepalive_timeout` (1 s here) still answers.
#[test]
fn an_answer_slower_than_keepalive_timeout_still_arrives_over_http2() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(SERVER, &config(&up, ""));
    let port = gw.port;
    let status = runtime().block_on(async {
        let (mut client, _conn) = h2c(port, None).await;
        let (response, _) = client
            .send_request(request(port, "GET", "/orders?delay_ms=3000", None), true)
            .unwrap();
        let response = tokio::time::timeout(PATIENCE, response)
            .await
            .expect("an answer")
            .map_err(|e| e.to_string());
        response.map(|r| r.status().as_u16())
    });
    assert_eq!(
        status,
        Ok(200),
        "the connection was ended as idle under a request"
    );
}

#[test]
fn an_idle_http2_connection_is_closed_after_keepalive_timeout() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(SERVER, &config(&up, ""));
    let port = gw.port;
    let closed = runtime().block_on(async {
        let (mut client, conn) = h2c(port, None).await;
        let (response, _) = client
            .send_request(request(port, "GET", "/echo/a", None), true)
            .unwrap();
        assert_eq!(response.await.unwrap().status(), 200);
        // Now idle, the client keeping its end open.
        let closed = tokio::time::timeout(PATIENCE, conn).await.is_ok();
        drop(client);
        closed
    });
    assert!(closed, "an idle HTTP/2 connection must be closed");
}

#[test]
fn an_idle_http2_connection_over_tls_is_closed_too() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ca_file = ca.write_ca(dir.path());
    let cert = ca.issue(dir.path(), "api", "api", &["api.test"]);
    let tls_port = free_port();
    let up = Upstream::start("a");
    let tls = format!(
        "[server.tls]\nlisten = \"127.0.0.1:{tls_port}\"\n[[server.tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"",
        cert.cert.display(),
        cert.key.display()
    );
    let gw = Gateway::start_with(&SERVER.replace("h2c = true\n", ""), &config(&up, &tls));
    common::wait_until("the TLS listener", || common::port_open(tls_port));
    let closed = runtime().block_on(async {
        let tls = tls_connect(tls_port, &ca_file, b"h2").await;
        let (client, conn) = h2::client::handshake(tls).await.unwrap();
        let conn = tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let (response, _) = client
            .send_request(request(tls_port, "GET", "/echo/a", None), true)
            .unwrap();
        assert_eq!(response.await.unwrap().status(), 200);
        let closed = tokio::time::timeout(PATIENCE, conn).await.is_ok();
        drop(client);
        closed
    });
    assert!(closed, "an idle HTTP/2 connection over TLS must be closed");
    drop(gw);
}

/// HEADERS without END_HEADERS, then nothing: the header block never ends.
#[test]
fn a_header_block_that_never_ends_is_cut_at_header_timeout() {
    let up = Upstream::start("a");
    let gw = Gateway::start_with(SERVER, &config(&up, ""));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]); // SETTINGS, empty
                                                             // HEADERS on stream 1, END_STREAM but not END_HEADERS: `:method GET` (indexed 2).
    bytes.extend_from_slice(&[0, 0, 1, 0x1, 0x1, 0, 0, 0, 1, 0x82]);
    s.write_all(&bytes).unwrap();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false
            }
            Err(_) => break true,
        }
    };
    assert!(closed, "a header block left open must be cut off");
    assert!(!gw.proc.log_text().contains("panicked"));
}

/// Reads until the peer closes (true) or `PATIENCE` passes (false).
fn closes_within_patience(s: &mut std::net::TcpStream) -> bool {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn an_unfinished_tls_handshake_and_a_half_sent_admin_request_end_at_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let cert = ca.issue(dir.path(), "api", "api", &["api.test"]);
    let tls_port = free_port();
    let up = Upstream::start("a");
    let tls = format!(
        "[server.tls]\nlisten = \"127.0.0.1:{tls_port}\"\n[[server.tls.certificates]]\ncert = \"{}\"\nkey = \"{}\"",
        cert.cert.display(),
        cert.key.display()
    );
    let gw = Gateway::start_with(SERVER, &config(&up, &tls));
    common::wait_until("the TLS listener", || common::port_open(tls_port));
    // The start of a ClientHello, then nothing.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0xc8, 0x01]).unwrap();
    assert!(
        closes_within_patience(&mut s),
        "an unfinished TLS handshake must end at header_timeout"
    );
    // Nothing at all after connecting.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    assert!(closes_within_patience(&mut s), "a silent TLS client too");
    // A handshake that completes is not cut: on HTTP/2 (no header deadline per connection,
    // a long idle time) a request sent after the handshake's deadline is answered.
    let patient_port = free_port();
    let patient_tls = tls.replace(&tls_port.to_string(), &patient_port.to_string());
    let _patient = Gateway::start_with(
        "header_timeout = \"1s\"\nkeepalive_timeout = \"30s\"",
        &config(&up, &patient_tls),
    );
    common::wait_until("the TLS listener", || common::port_open(patient_port));
    let ca_file = ca.write_ca(dir.path());
    let status = runtime().block_on(async {
        let tls = tls_connect(patient_port, &ca_file, b"h2").await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (client, conn) = h2::client::handshake(tls).await.unwrap();
        tokio::spawn(conn);
        let mut client = client.ready().await.unwrap();
        let (response, _) = client
            .send_request(request(patient_port, "GET", "/echo/late", None), true)
            .unwrap();
        response.await.unwrap().status().as_u16()
    });
    assert_eq!(status, 200);
    // The admin listener: a request head that never ends.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.admin_port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a").unwrap();
    assert!(
        closes_within_patience(&mut s),
        "a half-sent admin request must end at header_timeout"
    );
    assert_eq!(gw.admin("/healthz").status, 200);
}

/// A TLS connection to `api.test` on `port`, trusting `ca_file`, offering `alpn`.
async fn tls_connect(
    port: u16,
    ca_file: &std::path::Path,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls_pki_types::pem::PemObject;
    use tokio_rustls::rustls;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca_file).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("api.test").unwrap();
    connector.connect(name, tcp).await.unwrap()
}
