//! The proxy service, started with its store warming: the moment the runtime that serves
//! requests runs — before its listeners accept — the store's request connection is made in
//! it (its reader's task lives there, beside the requests that use it), and a reload that
//! makes a new store warms that one there too (`control/reload.rs`,
//! `limit/store/redis/warmth.rs`). Listening does not wait for it: a route without limits in
//! the store answers at once, and `/readyz` says `store warming` until it is done.

use crate::control::reload::Reloader;
use async_trait::async_trait;
use pingora::server::{ListenFds, RuntimeOpts, ShutdownWatch};
use pingora::services::Service;
use std::sync::Arc;
use std::time::Duration;

pub struct WarmingService<S> {
    inner: S,
    reloader: Arc<Reloader>,
}

impl<S> WarmingService<S> {
    pub fn new(inner: S, reloader: Arc<Reloader>) -> WarmingService<S> {
        WarmingService { inner, reloader }
    }
}

#[async_trait]
impl<S: Service> Service for WarmingService<S> {
    async fn start_service(
        &mut self,
        #[cfg(unix)] fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        self.reloader
            .serving_from(tokio::runtime::Handle::current());
        self.inner
            .start_service(
                #[cfg(unix)]
                fds,
                shutdown,
                listeners_per_fd,
            )
            .await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn runtime_opts_override(&self, global: &RuntimeOpts) -> Option<RuntimeOpts> {
        self.inner.runtime_opts_override(global)
    }

    fn on_startup_delay(&self, time_waited: Duration) {
        self.inner.on_startup_delay(time_waited)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}
