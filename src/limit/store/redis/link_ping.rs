//! The repair task's ping through a single node's or Sentinel primary's request connection
//! (`repair.rs`), made anew if the old one is gone — with every script loaded again on a
//! single node's (whose manager reconnects by itself, to a Redis that may have restarted).

use crate::limit::store::redis::connection::{Link, Nodes};
use crate::limit::store::redis::making::connect_bound;
use crate::limit::store::redis::repair::{LaneWatch, Ping};
use crate::limit::store::redis::wire::{load, lost_connection, Lane};
use redis::RedisError;
use std::time::Duration;

impl Ping for Link {
    fn watch(&self) -> &LaneWatch {
        &self.watch
    }

    /// One PING through the request lane's connection (made anew if the old one is gone;
    /// on Sentinel, to the primary the sentinels name now), bounded by the time making a
    /// connection may take plus a call's.
    async fn ping(&self) -> bool {
        let ping = async {
            match &self.nodes {
                Nodes::Single { lanes, .. } => {
                    let conn = self.single(lanes, Lane::Requests).await?;
                    let pong = redis::cmd("PING")
                        .query_async::<()>(&mut conn.clone())
                        .await;
                    match pong {
                        // The manager's last reconnection failed (Redis was down then): this
                        // error started a new one, which the second ping waits for.
                        Err(e) if lost_connection(&e) => {
                            redis::cmd("PING")
                                .query_async::<()>(&mut conn.clone())
                                .await?
                        }
                        pong => pong?,
                    }
                    // The manager connected again by itself: a Redis that restarted knows
                    // none of the scripts. Loaded before requests use the connection again,
                    // so a release queued meanwhile still runs in the order it was sent.
                    load(&self.scripts, &mut conn.clone(), Some(&self.native)).await
                }
                Nodes::Cluster(cluster) => match cluster.ping().await {
                    true => Ok(()),
                    false => Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "no node of the cluster answered",
                    ))),
                },
                Nodes::Sentinel { lanes, .. } => {
                    let slot = &lanes.requests;
                    let conn = self.sentinel(lanes, Lane::Requests).await?;
                    let pong = redis::cmd("PING")
                        .query_async::<()>(&mut (*conn).clone())
                        .await;
                    if pong.is_err() {
                        slot.compare_and_swap(&conn, None);
                    }
                    pong
                }
            }
        };
        matches!(
            tokio::time::timeout(
                connect_bound(self.store_timeout)
                    + self.store_timeout.max(Duration::from_millis(100)),
                ping
            )
            .await,
            Ok(Ok(()))
        )
    }
}
