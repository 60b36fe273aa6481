//! A deliberately small HTTP/1.1 client for tests: one request per connection
//! (`Connection: close`), bytes exactly as given, responses parsed by hand (Content-Length,
//! chunked, or read to EOF). It never normalises what it sends, so tests can send odd input.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }
}

/// Generous: only a hung server hits it, and then the test fails instead of hanging.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `request` (raw bytes) and reads one response.
pub fn raw(port: u16, request: &[u8]) -> std::io::Result<Response> {
    raw_from(None, port, request)
}

/// Like [`raw`], from a chosen local address (any 127.0.0.0/8 address works on loopback), so
/// tests can play several clients.
pub fn raw_from(
    source: Option<std::net::Ipv4Addr>,
    port: u16,
    request: &[u8],
) -> std::io::Result<Response> {
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    raw_between(source.map(std::net::IpAddr::V4), to, request)
}

/// Like [`raw`], from a chosen local address (IPv4 or IPv6; `None`: the system's choice) to a
/// chosen listener address.
pub fn raw_between(
    source: Option<std::net::IpAddr>,
    to: std::net::SocketAddr,
    request: &[u8],
) -> std::io::Result<Response> {
    let mut stream = match source {
        None => TcpStream::connect(to)?,
        Some(ip) => {
            let socket = socket2::Socket::new(
                socket2::Domain::for_address(to),
                socket2::Type::STREAM,
                None,
            )?;
            socket.bind(&std::net::SocketAddr::from((ip, 0)).into())?;
            socket.connect(&to.into())?;
            socket.into()
        }
    };
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(request)?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).or_else(|e| {
        // A reset after a complete response still gives us the response.
        if buf.is_empty() {
            Err(e)
        } else {
            Ok(0)
        }
    })?;
    parse(&buf).map(|(response, _)| response)
}

/// Sends `requests` (several requests in one write, pipelined) and parses every response
/// until the server closes the connection.
pub fn pipelined(port: u16, requests: &[u8]) -> std::io::Result<Vec<Response>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(requests)?;
    let mut buf = Vec::new();
    stream
        .read_to_end(&mut buf)
        .or_else(|e| if buf.is_empty() { Err(e) } else { Ok(0) })?;
    let mut responses = Vec::new();
    let mut rest = &buf[..];
    while !rest.is_empty() {
        let (response, used) = parse(rest)?;
        responses.push(response);
        rest = &rest[used..];
    }
    Ok(responses)
}

/// A request with the given method, path and extra headers; `Host` and `Connection: close`
/// are added unless present.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" || method == "PUT" {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("Connection: close\r\n\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    raw(port, &bytes).unwrap_or_else(|e| panic!("{method} {path} on port {port}: {e}"))
}

pub fn get(port: u16, path: &str) -> Response {
    request(port, "GET", path, &[], b"")
}

pub fn get_with(port: u16, path: &str, headers: &[(&str, &str)]) -> Response {
    request(port, "GET", path, headers, b"")
}

/// One response from the start of `buf`, and how many bytes it took (everything, when its
/// length is only known by the close).
pub fn parse(buf: &[u8]) -> std::io::Result<(Response, usize)> {
    let bad = |msg: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_owned());
    let head_end = find(buf, b"\r\n\r\n").ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad("non-UTF-8 head"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("empty response"))?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = &buf[head_end + 4..];
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let (body, used) =
        if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            dechunk(rest).ok_or_else(|| bad("bad chunked body"))?
        } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            (
                rest.get(..len).ok_or_else(|| bad("short body"))?.to_vec(),
                len,
            )
        } else {
            (rest.to_vec(), rest.len())
        };
    Ok((
        Response {
            status,
            headers,
            body,
        },
        head_end + 4 + used,
    ))
}

/// The body of a chunked message, and the bytes it took (trailers not supported).
fn dechunk(all: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut out = Vec::new();
    let mut data = all;
    loop {
        let line_end = find(data, b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            // The empty line closing the (empty) trailer section.
            let used = all.len() - data.len() + if data.starts_with(b"\r\n") { 2 } else { 0 };
            return Some((out, used));
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
