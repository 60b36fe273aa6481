//! The TLS listener's choices, per handshake, from the live snapshot (so a reload applies to
//! new handshakes while open connections keep theirs): its certificate by SNI
//! (`control::tls`), and whether and against which CA it asks for a client certificate
//! (`control::client_auth`). After a handshake the verified client certificate's names are
//! read once (`chain::cert`) and kept with the connection for its requests.

use crate::chain::cert::PeerCert;
use crate::control::client_auth::ClientAuth;
use crate::control::snapshot::SnapshotHandle;
use async_trait::async_trait;
use pingora::listeners::TlsAccept;
use pingora::protocols::tls::TlsRef;
use pingora::tls::sign::CertifiedKey;
use pingora::tls::{
    CertificateDer, ClientCertVerified, ClientCertVerifier, ClientHello, DigitallySignedStruct,
    ResolvesServerCert, RusTlsError, SignatureScheme, UnixTime,
};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::DistinguishedName;
use std::any::Any;
use std::sync::Arc;

/// Chooses the listener's certificate per handshake from the live snapshot.
pub struct CertResolver {
    snapshots: SnapshotHandle,
}

impl std::fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CertResolver")
    }
}

impl CertResolver {
    pub fn new(snapshots: SnapshotHandle) -> CertResolver {
        CertResolver { snapshots }
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let snapshot = self.snapshots.load();
        let store = snapshot.tls.as_ref()?;
        Some(store.pick(hello.server_name()))
    }
}

/// The listener's verifier: the live snapshot's, per handshake.
pub struct LiveClientVerifier {
    snapshots: SnapshotHandle,
    /// Signature checks when no CA is configured (no certificate is asked for then).
    schemes: Vec<SignatureScheme>,
}

impl std::fmt::Debug for LiveClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveClientVerifier")
    }
}

impl LiveClientVerifier {
    pub fn new(snapshots: SnapshotHandle) -> LiveClientVerifier {
        let schemes = rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes();
        LiveClientVerifier { snapshots, schemes }
    }

    fn current(&self) -> Option<Arc<ClientAuth>> {
        self.snapshots.load().client_auth.clone()
    }
}

impl ClientCertVerifier for LiveClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.current().is_some()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.current().is_some_and(|c| c.required)
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, RusTlsError> {
        match self.current() {
            Some(c) => c
                .verifier
                .verify_client_cert(end_entity, intermediates, now),
            None => Err(RusTlsError::General(
                "no client certificate is accepted".into(),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RusTlsError> {
        match self.current() {
            Some(c) => c.verifier.verify_tls12_signature(message, cert, dss),
            None => Err(RusTlsError::General(
                "no client certificate is accepted".into(),
            )),
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, RusTlsError> {
        match self.current() {
            Some(c) => c.verifier.verify_tls13_signature(message, cert, dss),
            None => Err(RusTlsError::General(
                "no client certificate is accepted".into(),
            )),
        }
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().map_or_else(
            || self.schemes.clone(),
            |c| c.verifier.supported_verify_schemes(),
        )
    }
}

/// After each handshake: the verified client certificate's names, kept with the connection.
pub struct PeerCertReader;

#[async_trait]
impl TlsAccept for PeerCertReader {
    async fn handshake_complete_callback(
        &self,
        tls: &TlsRef,
    ) -> Option<Arc<dyn Any + Send + Sync>> {
        let der = tls.peer_certificate_der()?;
        PeerCert::read(der).map(|c| Arc::new(c) as Arc<dyn Any + Send + Sync>)
    }
}
