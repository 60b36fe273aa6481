//! Assembles the Pingora server from a validated config: server options (threads, pid file,
//! upgrade socket, grace periods), the proxy service and the background services.

use crate::admin::Admin;
use crate::config::Config;
use crate::heartbeat::Heartbeat;
use crate::metrics::Metrics;
use crate::proxy::Gateway;
use crate::snapshot::{Snapshot, SnapshotHandle};
use crate::sweeper::Sweeper;
use crate::upstream::HealthChecker;
use arc_swap::ArcSwap;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::background_service;
use std::sync::Arc;

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
    conf.grace_period_seconds = Some(s.grace_period.as_secs());
    conf.graceful_shutdown_timeout_seconds = Some(s.graceful_shutdown_timeout.as_secs());
    Ok(conf)
}

/// Builds the server with every service added; the caller runs it.
pub fn build(config: Config, mut opt: Opt) -> anyhow::Result<Server> {
    let conf = server_conf(&config, opt.conf.as_deref())?;
    let listen = config.server.listen.to_string();
    let admin_listen = config.admin.listen.to_string();
    let metrics = Arc::new(Metrics::new());
    let snapshot = Snapshot::build(config, None, &metrics)?;
    opt.conf = None;
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    let snapshots: SnapshotHandle = Arc::new(ArcSwap::from_pointee(snapshot));

    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(Arc::clone(&snapshots)),
        "turnstile proxy",
    );
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.add_service(background_service(
        "upstream health checks",
        HealthChecker::new(Arc::clone(&snapshots)),
    ));
    server.add_service(background_service(
        "limiter state sweeper",
        Sweeper::new(Arc::clone(&snapshots)),
    ));
    server.add_service(background_service(
        "store heartbeat",
        Heartbeat::new(Arc::clone(&snapshots)),
    ));
    let mut admin = pingora::services::listening::Service::new(
        "turnstile admin".to_owned(),
        Admin::new(snapshots, metrics),
    );
    admin.add_tcp(&admin_listen);
    server.add_service(admin);
    Ok(server)
}
