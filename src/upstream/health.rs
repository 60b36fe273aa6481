//! The active health checks and name resolutions that are due, over every pool of a
//! snapshot: each pool on its own interval (`health_check.interval`, `resolve_interval`).

use crate::upstream::pool::Pool;
use std::sync::Arc;
use std::time::Instant;

/// Runs what is due in `pools` at `now` (concurrently); returns when the next one is due.
pub async fn run_due<'a>(
    pools: impl Iterator<Item = &'a Arc<Pool>>,
    now: Instant,
) -> Option<Instant> {
    let checks = pools.map(|pool| async move {
        let resolve = pool.resolve_if_due(now).await;
        let check = pool.check_if_due(now).await;
        resolve.into_iter().chain(check).min()
    });
    futures::future::join_all(checks)
        .await
        .into_iter()
        .flatten()
        .min()
}
