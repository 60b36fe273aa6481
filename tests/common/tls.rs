//! A throwaway certificate authority for the TLS tests: a CA, and certificates it signs for
//! given names, written as PEM files.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

pub struct Ca {
    cert: Certificate,
    key: KeyPair,
}

/// A certificate and key as PEM files.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    pub fn new() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "turnstile test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// Writes the CA certificate to `dir/ca.pem`.
    pub fn write_ca(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }

    /// A certificate for `names` (DNS names or IP addresses), signed by this CA, with
    /// `common_name` as its subject, written to `dir/<file>.pem` and `dir/<file>.key`.
    pub fn issue(&self, dir: &Path, file: &str, common_name: &str, names: &[&str]) -> Issued {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let issued = Issued {
            cert: dir.join(format!("{file}.pem")),
            key: dir.join(format!("{file}.key")),
        };
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        std::fs::write(&issued.key, key.serialize_pem()).unwrap();
        issued
    }
}
