//! Everything a request needs, built from one validated [`Config`]. The live snapshot sits in
//! an `ArcSwap`; each request loads it once, at the start, and uses that one value until it
//! ends, so a reload in the middle of a request never mixes two configurations.

use crate::config::{Config, ConfigError, RouteConfig};
use crate::router::Router;
use crate::upstream::Pool;
use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::sync::Arc;

pub type SnapshotHandle = Arc<ArcSwap<Snapshot>>;

pub struct Snapshot {
    pub config: Arc<Config>,
    pub router: Router,
    /// Same order as `config.routes` (the router returns indexes into this).
    pub routes: Vec<Route>,
    pub pools: BTreeMap<String, Arc<Pool>>,
}

pub struct Route {
    pub config: RouteConfig,
    pub pool: Arc<Pool>,
}

impl Snapshot {
    /// Builds a snapshot. Pools whose definition is unchanged since `previous` are reused, so
    /// their health state and round-robin position survive a reload. Fails when a server
    /// name does not resolve.
    pub fn build(config: Config, previous: Option<&Snapshot>) -> Result<Snapshot, ConfigError> {
        let mut pools = BTreeMap::new();
        let mut problems = Vec::new();
        for (name, up) in &config.upstreams {
            let reused = previous
                .and_then(|p| p.pools.get(name))
                .filter(|pool| pool.config == *up);
            match reused {
                Some(pool) => {
                    pools.insert(name.clone(), Arc::clone(pool));
                }
                None => match Pool::new(up) {
                    Ok(pool) => {
                        pools.insert(name.clone(), Arc::new(pool));
                    }
                    Err(problem) => problems.push(problem),
                },
            }
        }
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(problems));
        }
        let routes = config
            .routes
            .iter()
            .map(|r| Route {
                config: r.clone(),
                pool: Arc::clone(&pools[&r.upstream]),
            })
            .collect();
        Ok(Snapshot {
            router: Router::new(&config.routes),
            routes,
            pools,
            config: Arc::new(config),
        })
    }
}
