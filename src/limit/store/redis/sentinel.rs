//! The Sentinel primary's connections: made to the node the sentinels name, and left when
//! they name another.
//!
//! A call that fails as if the primary were gone (`READONLY`, a broken connection) drops the
//! connection at once, and the next call asks the sentinels (`connection.rs`). Timeouts are
//! weaker evidence: a frozen primary gives them, but so does this process's own connection
//! task not being run on a machine whose CPUs are taken. So after a second timeout in a row
//! (`timeouts.rs`) the sentinels are asked in a task of its own, one question at a time,
//! bounded like making a connection, while requests go on using the connection: it is left
//! only when they name another node. A question that fails or finds no answer in time leaves
//! things as they are; a connection that stays silent for a second is left anyway
//! (`timeouts.rs`).

use crate::limit::store::redis::native::Native;
use crate::limit::store::redis::scripts::Scripts;
use crate::limit::store::redis::wire::{load, Lane};
use redis::aio::MultiplexedConnection;
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, RedisError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
pub(super) struct SentinelLanes {
    pub(super) requests: arc_swap::ArcSwapOption<MultiplexedConnection>,
    background: arc_swap::ArcSwapOption<MultiplexedConnection>,
    /// The address of the node the request connection was made to (`host:port`).
    requests_at: Mutex<Option<String>>,
    /// Whether the sentinels are being asked where the primary is.
    asking: AtomicBool,
    /// Questions asked after timeouts, and how many of them found the primary moved.
    asked: AtomicU64,
    moved: AtomicU64,
}

impl SentinelLanes {
    pub(super) fn pick(&self, lane: Lane) -> &arc_swap::ArcSwapOption<MultiplexedConnection> {
        match lane {
            Lane::Requests => &self.requests,
            Lane::Background => &self.background,
        }
    }

    /// Asks the sentinels for the primary and connects `lane` to it with `config` (one
    /// caller at a time; the others find the new connection), every script loaded.
    pub(super) async fn connect(
        &self,
        client: &tokio::sync::Mutex<SentinelClient>,
        (lane, config): (Lane, AsyncConnectionConfig),
        (scripts, native): (&Scripts, &Native),
    ) -> Result<Arc<MultiplexedConnection>, RedisError> {
        let slot = self.pick(lane);
        let mut client = client.lock().await;
        if let Some(conn) = slot.load_full() {
            return Ok(conn);
        }
        let primary = client.async_get_client().await?;
        let at = primary.get_connection_info().addr().to_string();
        let mut conn = primary
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        load(scripts, &mut conn, Some(native)).await?;
        let conn = Arc::new(conn);
        if matches!(lane, Lane::Requests) {
            *self.requests_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
        }
        slot.store(Some(Arc::clone(&conn)));
        Ok(conn)
    }

    /// The questions asked after timeouts, and how many found the primary moved.
    pub(super) fn questions(&self) -> (u64, u64) {
        (
            self.asked.load(Ordering::Relaxed),
            self.moved.load(Ordering::Relaxed),
        )
    }

    fn requests_at(&self) -> Option<String> {
        self.requests_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// What asking the sentinels needs of the store's connections.
pub(super) trait Sentinels: Send + Sync + 'static {
    /// The sentinels' client and the primary's lanes (`None`: not a Sentinel store).
    fn sentinels(&self) -> Option<(&tokio::sync::Mutex<SentinelClient>, &SentinelLanes)>;
    /// How long a question may take.
    fn question_bound(&self) -> Duration;
    /// The primary moved: leave the request connection (and have it made again).
    fn leave(&self);
}

/// Has the sentinels asked where the primary is, unless they are being asked already; the
/// request connection is left if they name another node than the one it was made to.
pub(super) fn ask<S: Sentinels>(me: Arc<S>) {
    let Some((_, lanes)) = me.sentinels() else {
        return;
    };
    if lanes.asking.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(async move {
        let moved = tokio::time::timeout(me.question_bound(), primary_moved(&*me)).await;
        let Some((_, lanes)) = me.sentinels() else {
            return;
        };
        lanes.asked.fetch_add(1, Ordering::Relaxed);
        if moved == Ok(true) {
            lanes.moved.fetch_add(1, Ordering::Relaxed);
            me.leave();
        }
        lanes.asking.store(false, Ordering::Release);
    });
}

/// Whether the sentinels name a primary other than the node the request connection was made
/// to (false when they cannot say).
async fn primary_moved<S: Sentinels>(me: &S) -> bool {
    let Some((client, lanes)) = me.sentinels() else {
        return false;
    };
    let named = client.lock().await.async_get_client().await;
    match (named, lanes.requests_at()) {
        (Ok(primary), Some(at)) => primary.get_connection_info().addr().to_string() != at,
        _ => false,
    }
}
