//! Upstream host names to addresses: the system's resolver (`getaddrinfo`: `/etc/hosts`,
//! `resolv.conf`, NSS), or DNS servers named in the configuration (`server.dns_servers`,
//! queried directly with `hickory-resolver`, no cache: every resolution asks).

use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// How long one resolution may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameResolver {
    System,
    /// These DNS servers, asked directly (a client made per resolution, inside the runtime
    /// that runs it).
    Dns(Vec<SocketAddr>),
}

impl NameResolver {
    /// The system resolver (`servers` empty) or one asking `servers` (`ip:port`).
    pub fn new(servers: &[SocketAddr]) -> NameResolver {
        if servers.is_empty() {
            NameResolver::System
        } else {
            NameResolver::Dns(servers.to_vec())
        }
    }

    fn dns_client(servers: &[SocketAddr]) -> TokioResolver {
        let mut group = NameServerConfigGroup::new();
        for server in servers {
            group.merge(NameServerConfigGroup::from_ips_clear(
                &[server.ip()],
                server.port(),
                true,
            ));
        }
        let mut options = ResolverOpts::default();
        options.cache_size = 0;
        options.timeout = LOOKUP_TIMEOUT;
        options.attempts = 1;
        let config = ResolverConfig::from_parts(None, vec![], group);
        TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
            .with_options(options)
            .build()
    }

    /// The addresses of `host` (an IP address resolves to itself).
    pub async fn lookup(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let found: Vec<SocketAddr> = match self {
            NameResolver::System => {
                tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)))
                    .await
                    .map_err(|_| format!("resolving {host:?} timed out"))?
                    .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
                    .collect()
            }
            NameResolver::Dns(servers) => NameResolver::dns_client(servers)
                .lookup_ip(host)
                .await
                .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
                .iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect(),
        };
        if found.is_empty() {
            return Err(format!("{host:?} resolves to no address"));
        }
        Ok(found)
    }

    /// [`lookup`](Self::lookup), from blocking code (building a snapshot).
    pub fn lookup_blocking(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        match self {
            NameResolver::System => {
                if let Ok(ip) = host.parse::<IpAddr>() {
                    return Ok(vec![SocketAddr::new(ip, port)]);
                }
                let found: Vec<SocketAddr> = (host, port)
                    .to_socket_addrs()
                    .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
                    .collect();
                if found.is_empty() {
                    return Err(format!("{host:?} resolves to no address"));
                }
                Ok(found)
            }
            // Its own thread and runtime: the caller may be inside a runtime's blocking pool.
            NameResolver::Dns(_) => std::thread::scope(|s| {
                s.spawn(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| format!("no runtime to resolve {host:?}: {e}"))?
                        .block_on(self.lookup(host, port))
                })
                .join()
                .unwrap_or_else(|_| Err(format!("resolving {host:?} failed")))
            }),
        }
    }
}
