//! The listener's certificates: loaded from PEM files when a snapshot is built (at start and
//! on every reload — a bad file rejects the reload and the running certificates stay), and
//! chosen per handshake by SNI from the live snapshot, so a reload swaps them without
//! touching open connections.
//!
//! A certificate serves the names given in the file, or else the DNS names of its subject
//! alternative names. `*.example.com` matches one label (`api.example.com`, not
//! `example.com` or `a.b.example.com`). A client that sends no SNI, or a name no certificate
//! serves, gets the first certificate.

use crate::control::config::{CertificateConfig, Problem};
use pingora::tls::sign::CertifiedKey;
use pingora::tls::{CertificateDer, CryptoProvider, PrivateKeyDer};
use rustls_pki_types::pem::PemObject;
use std::collections::HashMap;
use std::sync::Arc;

/// The certificates of the TLS listener, by name.
#[derive(Debug)]
pub struct CertStore {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` stored as `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
    /// The names each certificate serves, in configuration order (for `/config`).
    pub names: Vec<Vec<String>>,
}

impl CertStore {
    /// Loads every certificate; problems name the TOML path of the file at fault.
    pub fn load(certificates: &[CertificateConfig]) -> Result<CertStore, Vec<Problem>> {
        let mut problems = Vec::new();
        let mut loaded = Vec::new();
        for (i, c) in certificates.iter().enumerate() {
            let at = format!("server.tls.certificates[{i}]");
            match load_one(c) {
                Ok(pair) => loaded.push(pair),
                Err((field, message)) => problems.push(Problem {
                    path: format!("{at}.{field}"),
                    message,
                    location: None,
                }),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let Some((default, _)) = loaded.first().cloned() else {
            return Err(vec![Problem {
                path: "server.tls.certificates".into(),
                message: "at least one certificate is required".into(),
                location: None,
            }]);
        };
        let mut store = CertStore {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            default,
            names: Vec::new(),
        };
        for (key, names) in loaded {
            for name in &names {
                let table = match name.strip_prefix("*.") {
                    Some(suffix) => store.wildcard.entry(suffix.to_owned()),
                    None => store.exact.entry(name.clone()),
                };
                // The first certificate to claim a name keeps it.
                table.or_insert_with(|| Arc::clone(&key));
            }
            store.names.push(names);
        }
        Ok(store)
    }

    /// The certificate for a handshake that asked for `server_name`.
    pub fn pick(&self, server_name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = server_name.map(|n| n.trim_end_matches('.').to_ascii_lowercase()) else {
            return Arc::clone(&self.default);
        };
        if let Some(key) = self.exact.get(&name) {
            return Arc::clone(key);
        }
        let parent = name.split_once('.').map(|(_, rest)| rest);
        parent
            .and_then(|p| self.wildcard.get(p))
            .map_or_else(|| Arc::clone(&self.default), Arc::clone)
    }
}

/// A loaded certificate and the names it serves.
type Loaded = (Arc<CertifiedKey>, Vec<String>);

/// One certificate chain and its key; `Err((field, message))`.
fn load_one(c: &CertificateConfig) -> Result<Loaded, (&'static str, String)> {
    let cert_pem = std::fs::read(&c.cert)
        .map_err(|e| ("cert", format!("cannot read {}: {e}", c.cert.display())))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| {
            (
                "cert",
                format!("{}: not a PEM certificate chain ({e})", c.cert.display()),
            )
        })?;
    if chain.is_empty() {
        return Err((
            "cert",
            format!("{}: no certificate in it", c.cert.display()),
        ));
    }
    // The key path may be a secret; its content always is: never quoted.
    let key_pem = std::fs::read(c.key.expose())
        .map_err(|e| ("key", format!("cannot read the key file: {}", e.kind())))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
        (
            "key",
            "not a PEM private key (PKCS#8, PKCS#1 or SEC1)".to_owned(),
        )
    })?;
    pingora::tls::install_default_crypto_provider();
    let provider =
        CryptoProvider::get_default().ok_or(("key", "no TLS crypto provider".to_owned()))?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| ("key", format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| ("key", format!("does not match the certificate: {e}")))?;
    let names = if c.names.is_empty() {
        dns_names(&certified.cert[0]).map_err(|e| ("cert", format!("{}: {e}", c.cert.display())))?
    } else {
        c.names.clone()
    };
    Ok((Arc::new(certified), names))
}

/// The DNS names of a certificate's subject alternative names (lower case).
fn dns_names(cert: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("not a readable X.509 certificate ({e})"))?;
    let names: Vec<String> = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        return Err("no DNS names in its subject alternative names: list them in `names`".into());
    }
    Ok(names)
}
