//! A small OTLP/HTTP receiver: accepts `POST /v1/traces` in protobuf or JSON (by its
//! `Content-Type`), gzipped or not (`Content-Encoding`), over plain HTTP or TLS; optionally
//! requires a header (401 without it, like a hosted collector); keeps every request decoded
//! (as the protocol's JSON mapping), answers 200 — or 503 when told to fail, like a collector
//! that is down. Keep-alive, as exporters use it.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What one request looked like on the wire.
#[derive(Debug, Clone)]
pub struct Received {
    pub content_type: String,
    pub content_encoding: Option<String>,
    pub body: serde_json::Value,
}

#[derive(Default)]
struct State {
    received: Mutex<Vec<Received>>,
    failing: AtomicBool,
    /// Requests turned away for lacking the required header.
    refused: Mutex<u64>,
}

pub struct OtlpReceiver {
    pub port: u16,
    tls: bool,
    state: Arc<State>,
}

/// Options of [`OtlpReceiver::start_with`].
#[derive(Default)]
pub struct Options<'a> {
    /// Serve TLS with this certificate and key (PEM files).
    pub tls: Option<(&'a Path, &'a Path)>,
    /// Refuse (401) requests without this header value.
    pub require: Option<(&'a str, &'a str)>,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        OtlpReceiver::start_with(Options::default())
    }

    pub fn start_with(options: Options<'_>) -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let tls = options
            .tls
            .map(|(cert, key)| Arc::new(server_config(cert, key)));
        let require = options
            .require
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()));
        let s = Arc::clone(&state);
        let with_tls = tls.is_some();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (s, tls, require) = (Arc::clone(&s), tls.clone(), require.clone());
                std::thread::spawn(move || match tls {
                    Some(config) => {
                        let Ok(conn) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        serve(rustls::StreamOwned::new(conn, stream), &s, require.as_ref());
                    }
                    None => serve(stream, &s, require.as_ref()),
                });
            }
        });
        OtlpReceiver {
            port,
            tls: with_tls,
            state,
        }
    }

    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}/v1/traces", self.port)
    }

    pub fn fail(&self, failing: bool) {
        self.state.failing.store(failing, Ordering::SeqCst);
    }

    /// Every request received, decoded.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// Requests refused for lacking the required header.
    pub fn refused(&self) -> u64 {
        *self.state.refused.lock().unwrap()
    }

    /// Every span received so far, flattened out of the resource / scope structure.
    pub fn spans(&self) -> Vec<serde_json::Value> {
        self.bodies()
            .iter()
            .flat_map(|body| {
                body["resourceSpans"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .flat_map(|rs| rs["scopeSpans"].as_array().cloned().unwrap_or_default())
            .flat_map(|ss| ss["spans"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// Every body received, as text.
    pub fn raw(&self) -> String {
        self.bodies()
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn bodies(&self) -> Vec<serde_json::Value> {
        self.received().into_iter().map(|r| r.body).collect()
    }
}

fn server_config(cert: &Path, key: &Path) -> rustls::ServerConfig {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap()
}

use tokio_rustls::rustls;

fn decode(content_type: &str, encoding: Option<&str>, body: &[u8]) -> Option<serde_json::Value> {
    let mut plain = Vec::new();
    let body = match encoding {
        Some("gzip") => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut plain)
                .ok()?;
            &plain[..]
        }
        _ => body,
    };
    if content_type.starts_with("application/x-protobuf") {
        let request = ExportTraceServiceRequest::decode(body).ok()?;
        serde_json::to_value(&request).ok()
    } else {
        serde_json::from_slice(body).ok()
    }
}

fn serve<S: Read + Write>(stream: S, state: &State, require: Option<&(String, String)>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        let (mut content_type, mut encoding) = (String::new(), None);
        let mut authorized = require.is_none();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                match k.as_str() {
                    "content-length" => length = v.parse().unwrap_or(0),
                    "content-type" => content_type = v.to_owned(),
                    "content-encoding" => encoding = Some(v.to_owned()),
                    _ => {}
                }
                if require.is_some_and(|(name, value)| *name == k && value == v) {
                    authorized = true;
                }
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let answer: &[u8] = if !authorized {
            *state.refused.lock().unwrap() += 1;
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n"
        } else if state.failing.load(Ordering::SeqCst) {
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
        } else {
            if request_line.starts_with("POST /v1/traces") {
                if let Some(v) = decode(&content_type, encoding.as_deref(), &body) {
                    state.received.lock().unwrap().push(Received {
                        content_type: content_type.clone(),
                        content_encoding: encoding.clone(),
                        body: v,
                    });
                }
            }
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        };
        if reader.get_mut().write_all(answer).is_err() {
            return;
        }
        let _ = reader.get_mut().flush();
    }
}
