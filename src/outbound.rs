//! The gateway's own outgoing HTTP calls (spans to an OTLP collector, key sets from a JWKS
//! endpoint): one blocking client shape, run off the request path (an export thread,
//! `spawn_blocking`). Every call has a bound: the whole call (connect, TLS, headers, body) is
//! limited by `timeout`; error statuses are errors; https verifies against the given CA
//! certificates (PEM) or Mozilla's roots.

use std::time::Duration;

/// A client for one destination.
pub fn agent(timeout: Duration, ca_pem: Option<&[u8]>) -> ureq::Agent {
    use ureq::tls::{Certificate, RootCerts, TlsConfig};
    let roots = match ca_pem {
        Some(pem) => {
            let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            RootCerts::new_with_certs(&certs)
        }
        None => RootCerts::WebPki,
    };
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(true)
        .tls_config(TlsConfig::builder().root_certs(roots).build())
        .build()
        .into()
}

/// GET `url`, reading at most `max` bytes of the body (more is an error).
pub fn get(agent: &ureq::Agent, url: &str, max: usize) -> Result<Vec<u8>, String> {
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    response
        .body_mut()
        .with_config()
        .limit(max as u64)
        .read_to_vec()
        .map_err(|e| e.to_string())
}
