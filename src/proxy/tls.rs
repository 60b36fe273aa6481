//! The TLS listener's certificate choice, per handshake: by SNI, from the live snapshot's
//! certificates (`control::tls`), so a reload swaps them for new handshakes while open
//! connections keep theirs.

use crate::control::snapshot::SnapshotHandle;
use pingora::tls::sign::CertifiedKey;
use pingora::tls::{ClientHello, ResolvesServerCert};
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
