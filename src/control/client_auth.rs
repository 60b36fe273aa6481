//! Client certificates on the TLS listener (mTLS): one configuration's verifier, built with
//! the snapshot from `server.tls.client_ca_file` (the listener asks the live snapshot's for
//! each handshake: `proxy/tls.rs`).

use crate::control::config::{ClientAuthConfig, Problem};
use pingora::tls::{CertificateDer, ClientCertVerifier, RootCertStore, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject;
use std::sync::Arc;

/// The verifier of one configuration's client CA.
pub struct ClientAuth {
    pub required: bool,
    pub verifier: Arc<dyn ClientCertVerifier>,
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

impl ClientAuth {
    /// The CA file's certificates as trust anchors; a problem when there are none.
    pub fn load(config: &ClientAuthConfig) -> Result<ClientAuth, Problem> {
        let problem = |message: String| Problem {
            path: "server.tls.client_ca_file".into(),
            message,
            location: None,
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&config.ca_pem) {
            let cert = cert.map_err(|e| problem(format!("{}: {e}", config.ca_file.display())))?;
            roots
                .add(cert)
                .map_err(|e| problem(format!("{}: {e}", config.ca_file.display())))?;
        }
        if roots.is_empty() {
            return Err(problem(format!(
                "{} holds no certificate",
                config.ca_file.display()
            )));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        // Optional: a connection without a certificate is accepted and the routes decide.
        let builder = if config.required {
            builder
        } else {
            builder.allow_unauthenticated()
        };
        let verifier = builder
            .build()
            .map_err(|e| problem(format!("{}: {e}", config.ca_file.display())))?;
        Ok(ClientAuth {
            required: config.required,
            verifier,
        })
    }
}
