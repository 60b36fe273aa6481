//! An identity provider for the token tests: signing keys made by `openssl` (RSA, EC P-256,
//! Ed25519) or an HMAC secret, tokens signed with them by the `jsonwebtoken` crate, and a
//! JWKS endpoint over HTTP or TLS whose key set can be swapped, made to fail (503) or to
//! answer garbage, and that counts the fetches it served.

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A signing key with its key id.
pub struct Signer {
    pub kid: String,
    pub alg: Algorithm,
    key: EncodingKey,
    /// The private key as PEM (`openssl` keys), for tests that need the public half.
    pub pem: Option<Vec<u8>>,
}

fn openssl_key(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .arg("genpkey")
        .args(args)
        .output()
        .expect("run openssl genpkey");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

impl Signer {
    pub fn rsa(kid: &str) -> Signer {
        let pem = openssl_key(&["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]);
        Signer {
            kid: kid.into(),
            alg: Algorithm::RS256,
            key: EncodingKey::from_rsa_pem(&pem).unwrap(),
            pem: Some(pem),
        }
    }

    pub fn ec(kid: &str) -> Signer {
        let pem = openssl_key(&["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]);
        Signer {
            kid: kid.into(),
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_pem(&pem).unwrap(),
            pem: Some(pem),
        }
    }

    pub fn ed(kid: &str) -> Signer {
        let pem = openssl_key(&["-algorithm", "ed25519"]);
        Signer {
            kid: kid.into(),
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_pem(&pem).unwrap(),
            pem: Some(pem),
        }
    }

    pub fn hmac(secret: &[u8]) -> Signer {
        Signer {
            kid: String::new(),
            alg: Algorithm::HS256,
            key: EncodingKey::from_secret(secret).unwrap(),
            pem: None,
        }
    }

    /// The public key as a JWK with this signer's `kid`.
    pub fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg).unwrap();
        jwk.common.key_id = Some(self.kid.clone());
        jwk
    }

    /// The public key as PEM (`BEGIN PUBLIC KEY`), by `openssl pkey -pubout`.
    pub fn public_pem(&self) -> Vec<u8> {
        use std::process::Stdio;
        let mut child = Command::new("openssl")
            .args(["pkey", "-pubout"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run openssl pkey");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(self.pem.as_ref().expect("an openssl key"))
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        out.stdout
    }

    /// A token with `claims`, its header naming this signer's `alg` and `kid`.
    pub fn sign(&self, claims: &serde_json::Value) -> String {
        let mut header = Header::new(self.alg);
        if !self.kid.is_empty() {
            header.kid = Some(self.kid.clone());
        }
        self.sign_with(header, claims)
    }

    pub fn sign_with(&self, header: Header, claims: &serde_json::Value) -> String {
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

/// Now, in Unix seconds.
pub fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// A JWKS document of `signers`' public keys.
pub fn key_set(signers: &[&Signer]) -> String {
    serde_json::to_string(&JwkSet {
        keys: signers.iter().map(|s| s.jwk()).collect(),
    })
    .unwrap()
}

/// What the endpoint answers.
#[derive(Clone)]
enum Answer {
    Keys(String),
    Fail,
    Garbage,
    /// Reads the request and never answers (the connection held open).
    Hang,
}

struct State {
    answer: Mutex<Answer>,
    fetches: AtomicU64,
}

pub struct JwksServer {
    pub port: u16,
    tls: bool,
    state: Arc<State>,
}

impl JwksServer {
    pub fn start(signers: &[&Signer]) -> JwksServer {
        JwksServer::start_on(signers, None)
    }

    /// Over TLS with this certificate and key (PEM files).
    pub fn start_tls(signers: &[&Signer], cert: &Path, key: &Path) -> JwksServer {
        JwksServer::start_on(signers, Some((cert, key)))
    }

    fn start_on(signers: &[&Signer], tls: Option<(&Path, &Path)>) -> JwksServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the JWKS server");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            answer: Mutex::new(Answer::Keys(key_set(signers))),
            fetches: AtomicU64::new(0),
        });
        let config = tls.map(|(cert, key)| Arc::new(server_config(cert, key)));
        let with_tls = config.is_some();
        let s = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (s, config) = (Arc::clone(&s), config.clone());
                std::thread::spawn(move || match config {
                    Some(config) => {
                        let Ok(conn) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        serve(rustls::StreamOwned::new(conn, stream), &s);
                    }
                    None => serve(stream, &s),
                });
            }
        });
        JwksServer {
            port,
            tls: with_tls,
            state,
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}/jwks.json", self.port)
    }

    pub fn set_keys(&self, signers: &[&Signer]) {
        *self.state.answer.lock().unwrap() = Answer::Keys(key_set(signers));
    }

    /// Answers 503 from now on (until `set_keys`).
    pub fn fail(&self) {
        *self.state.answer.lock().unwrap() = Answer::Fail;
    }

    /// Answers 200 with a body that is no key set (until `set_keys`).
    pub fn garbage(&self) {
        *self.state.answer.lock().unwrap() = Answer::Garbage;
    }

    /// Accepts requests and never answers them, from now on (until `set_keys`).
    pub fn hang(&self) {
        *self.state.answer.lock().unwrap() = Answer::Hang;
    }

    /// Requests for the key set served so far (whatever the answer).
    pub fn fetches(&self) -> u64 {
        self.state.fetches.load(Ordering::SeqCst)
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

/// One request per connection: the head is read, the answer written, the connection closed.
fn serve<S: std::io::Read + Write>(stream: S, state: &State) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line == "\r\n" || line == "\n" => break,
            Ok(_) => {}
        }
    }
    state.fetches.fetch_add(1, Ordering::SeqCst);
    let answer = state.answer.lock().unwrap().clone();
    let (status, body) = match answer {
        Answer::Keys(body) => ("200 OK", body),
        Answer::Fail => ("503 Service Unavailable", "down".to_owned()),
        Answer::Garbage => ("200 OK", "<html>not a key set</html>".to_owned()),
        Answer::Hang => {
            // Held until the client gives up (it closes the connection).
            let mut rest = Vec::new();
            let _ = std::io::Read::read_to_end(&mut reader, &mut rest);
            return;
        }
    };
    let stream = reader.get_mut();
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.flush();
}
