//! What a pool's TLS connections are made with — its CA, client certificate and the key that
//! keeps Pingora's connection pool from sharing a connection across different trust — read
//! when the pool is built.

use crate::upstream::config::UpstreamTls;
use crate::upstream::Invalid;
use pingora::protocols::tls::CaType;
use pingora::utils::tls::{CertKey, WrappedX509};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// What a pool's TLS connections use.
pub struct PeerTls {
    /// SNI and verified name, over each server's host.
    pub sni: Option<String>,
    pub verify: bool,
    pub ca: Option<Arc<CaType>>,
    pub client_cert: Option<Arc<CertKey>>,
    /// Names the trust this pool's connections were made with (a digest of the CA file's
    /// certificates, the client certificate and key, SNI, verification and HTTP version):
    /// Pingora's connection pool shares a connection only between peers with the same key,
    /// and its own key leaves the CA and the HTTP version out. A pool trusting other roots
    /// never reuses a connection another pool's trust accepted, nor one made before a
    /// reload changed its own.
    pub group_key: u64,
}

/// The CA and client certificate of a pool's TLS connections, read now.
pub fn peer_tls(pool: &str, tls: &UpstreamTls, http2: bool) -> Result<PeerTls, Invalid> {
    use sha2::{Digest, Sha256};
    let mut trust = Sha256::new();
    trust.update([u8::from(tls.verify), u8::from(http2)]);
    let mut field = |tag: &[u8], bytes: &[u8]| {
        trust.update(tag);
        trust.update((bytes.len() as u64).to_be_bytes());
        trust.update(bytes);
    };
    let problem = |field: &str, message: String| Invalid {
        path: format!("upstreams.{pool}.{field}"),
        message,
    };
    let ca = match &tls.ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                problem(
                    "tls_ca_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            field(b"ca", &pem);
            let certs: Vec<WrappedX509> = CertificateDer::pem_slice_iter(&pem)
                .map(|c| c.map(|c| WrappedX509::new(c.to_vec(), pingora::utils::tls::parse_x509)))
                .collect::<Result<_, _>>()
                .map_err(|e| {
                    problem(
                        "tls_ca_file",
                        format!("{}: not PEM certificates ({e})", path.display()),
                    )
                })?;
            if certs.is_empty() {
                return Err(problem(
                    "tls_ca_file",
                    format!("{}: no certificate in it", path.display()),
                ));
            }
            Some(Arc::<CaType>::from(certs.into_boxed_slice()))
        }
        None => None,
    };
    let client_cert = match &tls.client_cert {
        Some((cert, key)) => {
            let pem = std::fs::read(cert).map_err(|e| {
                problem(
                    "tls_client_cert",
                    format!("cannot read {}: {e}", cert.display()),
                )
            })?;
            let chain: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&pem)
                .map(|c| c.map(|c| c.to_vec()))
                .collect::<Result<_, _>>()
                .map_err(|_| problem("tls_client_cert", "not a PEM certificate chain".into()))?;
            let key_pem = std::fs::read(key.expose()).map_err(|e| {
                problem(
                    "tls_client_key",
                    format!("cannot read the key file: {}", e.kind()),
                )
            })?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem)
                .map_err(|_| problem("tls_client_key", "not a PEM private key".into()))?;
            if chain.is_empty() {
                return Err(problem("tls_client_cert", "no certificate in it".into()));
            }
            field(b"client cert", &pem);
            field(b"client key", key.secret_der());
            Some(Arc::new(CertKey::new(chain, key.secret_der().to_vec())))
        }
        None => None,
    };
    field(b"sni", tls.sni.as_deref().unwrap_or("").as_bytes());
    let digest = trust.finalize();
    Ok(PeerTls {
        sni: tls.sni.clone(),
        verify: tls.verify,
        ca,
        client_cert,
        group_key: u64::from_be_bytes(digest[..8].try_into().expect("8 bytes")),
    })
}
