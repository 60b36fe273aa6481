//! [4] A client certificate (mTLS) as an identity: the names it carries, read once per
//! connection after the TLS listener verified it against `server.tls.client_ca_file`.
//!
//! Which name identifies the holder is configured (`client_identity`): the first URI subject
//! alternative name (a SPIFFE id) or else the first DNS one (`san`), or the subject's common
//! name (`subject`). Like a token's subject, the name becomes a namespaced, keyed-hashed
//! client id (`cert:<32 hex>`); the upstream gets the name itself in `X-Client-Id`.

use sha2::{Digest, Sha256};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Longest name taken from a certificate.
pub const MAX_NAME_LEN: usize = 256;

/// Which name of a client certificate identifies its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientIdentity {
    #[default]
    San,
    Subject,
}

/// What the gateway keeps of a connection's verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    /// The first URI SAN, else the first DNS SAN.
    pub san: Option<String>,
    /// The subject's common name.
    pub subject: Option<String>,
    /// SHA-256 of the certificate (DER), hex.
    pub fingerprint: String,
}

impl PeerCert {
    /// Reads a DER certificate; names that are empty, longer than [`MAX_NAME_LEN`] or not
    /// visible ASCII are left out.
    pub fn read(der: &[u8]) -> Option<PeerCert> {
        let (_, cert) = X509Certificate::from_der(der).ok()?;
        let usable = |s: &str| {
            (!s.is_empty()
                && s.len() <= MAX_NAME_LEN
                && s.bytes().all(|b| (0x21..=0x7e).contains(&b)))
            .then(|| s.to_owned())
        };
        let names: Vec<GeneralName<'_>> = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|ext| ext.value.general_names.clone())
            .unwrap_or_default();
        let uri = names.iter().find_map(|n| match n {
            GeneralName::URI(u) => usable(u),
            _ => None,
        });
        let dns = names.iter().find_map(|n| match n {
            GeneralName::DNSName(d) => usable(d),
            _ => None,
        });
        let subject = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .and_then(usable);
        let fingerprint = Sha256::digest(der)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Some(PeerCert {
            san: uri.or(dns),
            subject,
            fingerprint,
        })
    }

    /// The name that identifies the holder, per `identity`.
    pub fn name(&self, identity: ClientIdentity) -> Option<&str> {
        match identity {
            ClientIdentity::San => self.san.as_deref(),
            ClientIdentity::Subject => self.subject.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der(names: Vec<rcgen::SanType>, cn: &str) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = names;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_uri_san_then_the_dns_san_then_the_subject_name_the_holder() {
        use rcgen::SanType;
        let spiffe = "spiffe://example.org/ns/a/sa/b";
        let c = PeerCert::read(&der(
            vec![
                SanType::DnsName("a.example.org".try_into().unwrap()),
                SanType::URI(spiffe.try_into().unwrap()),
            ],
            "svc-a",
        ))
        .unwrap();
        assert_eq!(c.name(ClientIdentity::San), Some(spiffe));
        assert_eq!(c.name(ClientIdentity::Subject), Some("svc-a"));
        assert_eq!(c.fingerprint.len(), 64);
        let c = PeerCert::read(&der(
            vec![SanType::DnsName("b.example.org".try_into().unwrap())],
            "has space",
        ))
        .unwrap();
        assert_eq!(c.name(ClientIdentity::San), Some("b.example.org"));
        assert_eq!(c.name(ClientIdentity::Subject), None, "not visible ASCII");
        assert!(PeerCert::read(b"not a certificate").is_none());
    }
}
