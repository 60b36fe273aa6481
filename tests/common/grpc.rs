//! gRPC on the wire, for tests: an echo server over TLS + HTTP/2 (ALPN h2; optionally asking
//! for a client certificate), and a unary call from a client over h2c. A call is a POST with
//! `content-type: application/grpc` and `te: trailers`, a length-prefixed message, and an
//! answer whose status travels in the trailers (`grpc-status`) — what a gRPC library sends.

use bytes::Bytes;
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls;

/// A gRPC message frame: uncompressed flag, 4-byte length, the message.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

pub struct GrpcServer {
    pub port: u16,
    _runtime: tokio::runtime::Runtime,
}

impl GrpcServer {
    /// An echo service on TLS (`cert`/`key`), asking clients for a certificate signed by
    /// `client_ca` when given.
    pub fn start(cert: &Path, key: &Path, client_ca: Option<&Path>) -> GrpcServer {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(key).unwrap();
        let builder = rustls::ServerConfig::builder();
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca).unwrap() {
                    roots.add(c.unwrap()).unwrap();
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (runtime, listener, port) = loopback_server();
        runtime.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut conn) = h2::server::handshake(tls).await else {
                        return;
                    };
                    while let Some(Ok((req, respond))) = conn.accept().await {
                        tokio::spawn(echo(req, respond));
                    }
                });
            }
        });
        GrpcServer {
            port,
            _runtime: runtime,
        }
    }
}

/// A one-worker runtime for a test server and its listener on a free loopback port.
fn loopback_server() -> (tokio::runtime::Runtime, tokio::net::TcpListener, u16) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    (runtime, listener, port)
}

async fn echo(req: http::Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>) {
    let path = req.uri().path().to_owned();
    let te = req
        .headers()
        .get("te")
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let mut body = req.into_body();
    let mut received = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
    }
    // Echo the message back (it arrived framed).
    let message = received.get(5..).unwrap_or_default().to_vec();
    let response = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let Ok(mut send) = respond.send_response(response, false) else {
        return;
    };
    let _ = send.send_data(frame(&message), false);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    trailers.insert("grpc-message", format!("echoed {path}").parse().unwrap());
    trailers.insert(
        "x-te-received",
        te.unwrap_or_else(|| "none".into()).parse().unwrap(),
    );
    let _ = send.send_trailers(trailers);
}

/// The answer to a unary call: status, headers, the message, the trailers.
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub message: Vec<u8>,
    pub trailers: Option<http::HeaderMap>,
}

/// A unary call to `path` over h2c (HTTP/2 with prior knowledge) on `port`.
pub fn call(port: u16, path: &str, message: &[u8], headers: &[(&str, &str)]) -> Answer {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut client = client.ready().await.unwrap();
        let mut req = http::Request::builder()
            .method("POST")
            .uri(format!("http://127.0.0.1:{port}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (response, mut send) = client.send_request(req.body(()).unwrap(), false).unwrap();
        send.send_data(frame(message), true).unwrap();
        let response = response.await.unwrap();
        let (parts, mut body) = response.into_parts();
        let mut received = Vec::new();
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
            received.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.unwrap();
        Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            message: received.get(5..).unwrap_or_default().to_vec(),
            trailers,
        }
    })
}

/// A gRPC server over h2c (prior knowledge) that takes every call and never answers: it
/// keeps each call's request headers, so a test sees what the gateway forwarded.
pub struct SilentServer {
    pub port: u16,
    pub received: Arc<std::sync::Mutex<Vec<http::HeaderMap>>>,
    _runtime: tokio::runtime::Runtime,
}

impl SilentServer {
    pub fn start() -> SilentServer {
        let (runtime, listener, port) = loopback_server();
        let received = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&received);
        runtime.spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    let mut held = Vec::new();
                    while let Some(Ok((req, respond))) = conn.accept().await {
                        seen.lock().unwrap().push(req.headers().clone());
                        held.push(respond);
                    }
                });
            }
        });
        SilentServer {
            port,
            received,
            _runtime: runtime,
        }
    }
}

/// [`call`], given up after `bound` (a liveness bound, so a gateway that never answers
/// fails the test instead of hanging it): `None` then.
pub fn call_within(
    bound: std::time::Duration,
    port: u16,
    path: &str,
    message: &[u8],
    headers: &[(&str, &str)],
) -> Option<Answer> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (path, message) = (path.to_owned(), message.to_vec());
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    std::thread::spawn(move || {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let _ = tx.send(call(port, &path, &message, &headers));
    });
    rx.recv_timeout(bound).ok()
}

impl Answer {
    /// The call's `grpc-status`: from the trailers, or from the headers of a trailers-only
    /// answer (the gateway's own).
    pub fn grpc_status(&self) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
    }
}
