//! How header names reach an HTTP/1 upstream, read from the raw bytes of the head it receives
//! (a plain TCP server here, not a framework that would fold case): lower-case by default,
//! each as the client spelled it on a pool with `header_case = "preserve"` — and the same
//! values, in the same order, either way. Likewise the response head a client receives, read
//! from its raw bytes: the upstream's names lower-case by default, as it spelled them with
//! `[server] response_header_case = "preserve"`, its reason phrase kept either way.

use crate::common;

use common::{http, Gateway};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// An HTTP/1 server that keeps the head of every request it receives, byte for byte, and
/// answers each with [`ANSWER`].
struct RawUpstream {
    port: u16,
    heads: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl RawUpstream {
    fn start() -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&heads);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = Arc::clone(&kept);
                std::thread::spawn(move || serve(stream, &kept));
            }
        });
        RawUpstream { port, heads }
    }

    /// The head of the latest request, as (name, value) lines in the order received.
    fn last_head(&self) -> Vec<(String, String)> {
        let heads = self.heads.lock().unwrap();
        let head = String::from_utf8(heads.last().expect("a request arrived").clone()).unwrap();
        head.split("\r\n")
            .skip(1)
            .filter(|line| !line.is_empty())
            .map(|line| {
                let (name, value) = line.split_once(':').expect("a header line");
                (name.to_owned(), value.trim().to_owned())
            })
            .collect()
    }
}

/// Requests without bodies, one after another on `stream`, until it closes.
fn serve(mut stream: TcpStream, heads: &Mutex<Vec<Vec<u8>>>) {
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            heads.lock().unwrap().push(buf[..end + 2].to_vec());
            buf.drain(..end + 4);
            if stream.write_all(ANSWER.as_bytes()).is_err() {
                return;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The upstream's answer: a reason phrase of its own, names spelled its way, a repeated one.
const ANSWER: &str = "HTTP/1.1 200 Fine Thanks\r\nContent-Length: 2\r\nX-Upstream-Thing: u\r\n\
                      ETAG: \"v1\"\r\nX-Multi-Out: a\r\nX-Multi-Out: b\r\n\r\nok";

fn config(up: &RawUpstream) -> String {
    format!(
        r#"
[upstreams.lower]
servers = ["127.0.0.1:{port}"]

[upstreams.legacy]
servers = ["127.0.0.1:{port}"]
header_case = "preserve"

[[routes]]
name = "lower"
path_prefix = "/lower"
upstream = "lower"

[[routes]]
name = "legacy"
path_prefix = "/legacy"
upstream = "legacy"
forwarded = true
"#,
        port = up.port
    )
}

/// A request with names spelled every way, a repeated header, a client's forwarding header
/// (which the gateway appends to) and its request id (which it keeps).
fn request(path: &str, port: u16) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: shop.example:{port}\r\nX-Custom-Thing: one\r\n\
         ACCEPT: */*\r\nx-lower: two\r\nX-Multi: a\r\nX-Multi: b\r\n\
         X-Forwarded-For: 192.0.2.7\r\nX-Request-Id: order:42\r\nConnection: close\r\n\r\n"
    )
}

fn send(gw: &Gateway, path: &str) {
    let resp = http::raw(gw.port, request(path, gw.port).as_bytes()).unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());
}

/// The names Pingora writes titled when it keeps no spelling (`titled_header_name_str`).
const TITLED: [&str; 12] = [
    "Accept-Ranges",
    "Age",
    "Cache-Control",
    "Connection",
    "Content-Type",
    "Content-Encoding",
    "Content-Length",
    "Date",
    "Transfer-Encoding",
    "Host",
    "Server",
    "Set-Cookie",
];

fn lowered(head: &[(String, String)]) -> Vec<(String, String)> {
    head.iter()
        .map(|(n, v)| match TITLED.contains(&n.as_str()) {
            true => (n.clone(), v.clone()),
            false => (n.to_ascii_lowercase(), v.clone()),
        })
        .filter(|(n, _)| n != "forwarded")
        .collect()
}

#[test]
fn names_reach_the_upstream_lower_case_by_default_and_as_spelled_where_preserved() {
    let up = RawUpstream::start();
    let gw = Gateway::start(&config(&up));

    send(&gw, "/lower/a");
    let lower = up.last_head();
    for (name, _) in &lower {
        // Pingora writes a dozen standard names titled (`Host`, `Content-Length`, ...).
        let titled = TITLED.contains(&name.as_str());
        assert!(titled || name == &name.to_ascii_lowercase(), "{lower:?}");
    }
    assert_eq!(lower[0].0, "Host");
    let names: Vec<&str> = lower.iter().map(|(n, _)| n.as_str()).collect();
    for ours in ["x-forwarded-for", "x-request-id", "x-forwarded-proto"] {
        assert!(names.contains(&ours), "{ours} in {lower:?}");
    }

    send(&gw, "/legacy/a");
    let legacy = up.last_head();
    let names: Vec<&str> = legacy.iter().map(|(n, _)| n.as_str()).collect();
    for spelled in ["Host", "X-Custom-Thing", "ACCEPT", "x-lower", "X-Multi"] {
        assert!(names.contains(&spelled), "{spelled} in {legacy:?}");
    }
    // The gateway's own names are lower-case in both.
    assert!(names.contains(&"x-forwarded-proto"), "{legacy:?}");

    // The same values in the same order (but for the `Forwarded` element the legacy route
    // adds): only the spelling differs.
    assert_eq!(lowered(&legacy), lower);
    let multi: Vec<&str> = lower
        .iter()
        .filter(|(n, _)| n == "x-multi")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(multi, ["a", "b"]);
    let value = |name: &str| lower.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert_eq!(value("x-forwarded-for"), "192.0.2.7, 127.0.0.1");
    assert_eq!(value("x-request-id"), "order:42");
    assert_eq!(value("x-custom-thing"), "one");
}

/// Reloaded to `preserve` and back: the pool's choice follows the file.
#[test]
fn header_case_follows_a_reload() {
    let up = RawUpstream::start();
    let gw = Gateway::start(&config(&up));
    send(&gw, "/lower/a");
    assert!(up.last_head().iter().any(|(n, _)| n == "x-custom-thing"));
    let preserved = config(&up).replacen(
        "[upstreams.lower]\n",
        "[upstreams.lower]\nheader_case = \"preserve\"\n",
        1,
    );
    gw.rewrite(&preserved);
    assert_eq!(gw.reload().status, 200);
    send(&gw, "/lower/a");
    assert!(up.last_head().iter().any(|(n, _)| n == "X-Custom-Thing"));
}

/// The status line and (name, value) lines of the response head the gateway sends for a
/// request to `path`, read byte for byte.
fn response_head(gw: &Gateway, path: &str) -> (String, Vec<(String, String)>) {
    let mut stream = TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request(path, gw.port).as_bytes()).unwrap();
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes);
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole head");
    let head = String::from_utf8(bytes[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().to_owned();
    let lines = lines
        .map(|line| {
            let (name, value) = line.split_once(':').expect("a header line");
            (name.to_owned(), value.trim().to_owned())
        })
        .collect();
    (status, lines)
}

#[test]
fn response_names_reach_the_client_lower_case_by_default_and_as_spelled_where_preserved() {
    let up = RawUpstream::start();
    let lower_gw = Gateway::start(&config(&up));
    let preserve_gw = Gateway::start_with("response_header_case = \"preserve\"", &config(&up));

    let (status, lower) = response_head(&lower_gw, "/lower/a");
    assert_eq!(
        status, "HTTP/1.1 200 Fine Thanks",
        "the upstream's reason phrase"
    );
    for (name, _) in &lower {
        let titled = TITLED.contains(&name.as_str());
        assert!(titled || name == &name.to_ascii_lowercase(), "{lower:?}");
    }
    let (status, preserved) = response_head(&preserve_gw, "/lower/a");
    assert_eq!(status, "HTTP/1.1 200 Fine Thanks");
    let names: Vec<&str> = preserved.iter().map(|(n, _)| n.as_str()).collect();
    for spelled in ["X-Upstream-Thing", "ETAG", "X-Multi-Out", "x-request-id"] {
        assert!(names.contains(&spelled), "{spelled} in {preserved:?}");
    }
    // The same values in the same order: only the spelling differs.
    assert_eq!(lowered(&preserved), lower);
    let value = |name: &str| lower.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert_eq!(value("x-request-id"), "order:42");
    assert_eq!(value("etag"), "\"v1\"");
    let multi: Vec<&str> = lower
        .iter()
        .filter(|(n, _)| n == "x-multi-out")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(multi, ["a", "b"]);
}
