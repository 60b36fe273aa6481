//! Assembles the Pingora server from a validated config: server options (threads, pid file,
//! upgrade socket, grace periods), the proxy service and the background services.

use crate::background::health::HealthChecker;
use crate::background::heartbeat::Heartbeat;
use crate::background::jwks::KeyRefresher;
use crate::background::registry::RegistrySync;
use crate::background::sweeper::Sweeper;
use crate::background::watch::{SighupListener, Watcher};
use crate::control::admin::Admin;
use crate::control::config::{Config, ConfigError};
use crate::control::reload::Reloader;
use crate::control::snapshot::{Snapshot, SnapshotHandle};
use crate::ops::access_log::AccessLog;
use crate::ops::metrics::Metrics;
use crate::ops::trace::Tracer;
use crate::proxy::conn::{Bounded, Guarded, HandshakeDeadline};
use crate::proxy::tls::{CertResolver, LiveClientVerifier, PeerCertReader};
use crate::proxy::warm::WarmingService;
use crate::proxy::Gateway;
use arc_swap::ArcSwap;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::background_service;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Pingora's own server configuration, with what the TOML file decides applied on top of the
/// optional Pingora YAML file (`--conf`).
pub fn server_conf(config: &Config, pingora_yaml: Option<&str>) -> anyhow::Result<ServerConf> {
    let mut conf = match pingora_yaml {
        Some(path) => ServerConf::load_from_yaml(path)
            .map_err(|e| anyhow::anyhow!("cannot load Pingora configuration {path}: {e}"))?,
        None => {
            ServerConf::new().ok_or_else(|| anyhow::anyhow!("cannot build Pingora defaults"))?
        }
    };
    let s = &config.server;
    conf.threads = s.threads;
    conf.pid_file = s.pid_file.clone();
    conf.upgrade_sock = s.upgrade_sock.clone();
    conf.upstream_keepalive_pool_size = s.upstream_keepalive_pool_size;
    // BENCHMARKS.md: without work stealing pass-through costs less CPU per request, but a
    // Redis decision per request loses throughput (its reply waits behind every ready task
    // of the thread): work stealing stays the default.
    conf.work_stealing = s.work_stealing;
    conf.grace_period_seconds = Some(s.grace_period.as_secs());
    conf.graceful_shutdown_timeout_seconds = Some(s.graceful_shutdown_timeout.as_secs());
    Ok(conf)
}

/// How often the config file is checked for changes.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Loads the configuration at `path` and builds the server with every service added; the
/// caller runs it. A `ConfigError` inside the error means the file is at fault.
pub fn build(path: &Path, mut opt: Opt) -> anyhow::Result<Server> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let config = Config::from_text(&text)?;
    for warning in &config.warnings {
        log::warn!("configuration {}: {warning}", path.display());
    }
    let conf = server_conf(&config, opt.conf.as_deref())?;
    let listen = config.server.listen.to_string();
    let admin_listen = config.admin.listen.to_string();
    let metrics = Arc::new(Metrics::new());
    let access_log = Arc::new(AccessLog::start(
        config.access_log.target.clone(),
        metrics.access_log_dropped.clone(),
    ));
    let tracer = config
        .tracing
        .clone()
        .map(|settings| Arc::new(Tracer::start(settings, metrics.trace_export())));
    let snapshot = Snapshot::build(config, None, &metrics)?;
    opt.conf = None;
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    let snapshots: SnapshotHandle = Arc::new(ArcSwap::from_pointee(snapshot));

    let mut proxy = pingora::proxy::http_proxy(
        &server.configuration,
        Gateway::new(Arc::clone(&snapshots), Arc::clone(&access_log), tracer),
    );
    let tls = snapshots.load().config.server.tls.clone();
    let h2c = snapshots.load().config.server.h2c;
    if h2c {
        let mut options = pingora::apps::HttpServerOptions::default();
        options.h2c = true;
        proxy.server_options = Some(options);
    }
    // Every connection is held to its deadlines (see proxy/conn/).
    let mut proxy = pingora::services::listening::Service::new(
        "turnstile proxy".to_owned(),
        Guarded::new(proxy, Arc::clone(&snapshots)),
    );
    proxy.add_tcp(&listen);
    proxy
        .endpoints()
        .set_pre_tls_callback(Arc::new(HandshakeDeadline::new(Arc::clone(&snapshots))));
    if let Some(tls) = tls {
        proxy.add_tls_with_settings(
            &tls.listen.to_string(),
            None,
            tls_settings(tls.h2, &snapshots),
        );
    }
    let reloader = Arc::new(Reloader::new(
        path.to_owned(),
        &text,
        Arc::clone(&snapshots),
        Arc::clone(&metrics),
        access_log,
    ));
    server.add_service(WarmingService::new(proxy, Arc::clone(&reloader)));
    server.add_service(background_service(
        "upstream health checks",
        HealthChecker::new(Arc::clone(&snapshots)),
    ));
    server.add_service(background_service(
        "limiter state sweeper",
        Sweeper::new(Arc::clone(&snapshots)),
    ));
    server.add_service(background_service(
        "issuer key refresh",
        KeyRefresher::new(Arc::clone(&snapshots)),
    ));
    server.add_service(background_service(
        "client registry sync",
        RegistrySync::new(Arc::clone(&snapshots)),
    ));
    server.add_service(background_service(
        "store heartbeat",
        Heartbeat::new(Arc::clone(&snapshots)),
    ));
    server.add_service(background_service(
        "config file watcher",
        Watcher::new(Arc::clone(&reloader), WATCH_INTERVAL),
    ));
    server.add_service(background_service(
        "SIGHUP reload",
        SighupListener::new(Arc::clone(&reloader)),
    ));
    let mut admin = pingora::services::listening::Service::new(
        "turnstile admin".to_owned(),
        Bounded::new(
            Admin::new(Arc::clone(&snapshots), metrics, reloader),
            snapshots,
        ),
    );
    admin.add_tcp(&admin_listen);
    server.add_service(admin);
    Ok(server)
}

/// The TLS listener: TLS 1.2 and 1.3, certificates chosen by SNI from the live snapshot
/// (so a reload replaces them for new handshakes), ALPN `h2` and `http/1.1` (or only the
/// latter).
fn tls_settings(h2: bool, snapshots: &SnapshotHandle) -> pingora::listeners::tls::TlsSettings {
    let mut settings =
        pingora::listeners::tls::TlsSettings::with_callbacks(Box::new(PeerCertReader))
            .expect("settings without files cannot fail");
    settings.set_cert_resolver(Arc::new(CertResolver::new(Arc::clone(snapshots))));
    settings.set_client_cert_verifier(Arc::new(LiveClientVerifier::new(Arc::clone(snapshots))));
    if h2 {
        settings.enable_h2();
    } else {
        settings.set_alpn(pingora::protocols::ALPN::H1);
    }
    settings
}
