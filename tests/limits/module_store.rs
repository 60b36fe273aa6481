//! The gateway's store with turnstile's Redis module (`store.decide_with`): `auto` sends its
//! decisions, batches and quota questions to the module where Redis has it — exactly, as Lua
//! decides — and to the scripts where it has not; `lua` never calls the module; `module`
//! refuses a Redis without it, naming why; a Redis restarted without the module is decided
//! by Lua again, and one restarted with it by the module.

use crate::common;

use common::redis::{module_path, RedisServer};
use futures::future::join_all;
use std::sync::Arc;
use turnstile::limit::store::redis::config::DecideWith;
use turnstile::limit::store::redis::{RedisConfig, RedisStore, Topology};
use turnstile::limit::store::request::CheckRequest;
use turnstile::limit::{Algorithm, Policy};

fn store(server: &RedisServer, decide_with: DecideWith) -> RedisStore {
    RedisStore::new(RedisConfig {
        topology: Topology::Single(server.url()),
        auth: Default::default(),
        tls: Default::default(),
        prefix: "native".into(),
        timeout: std::time::Duration::from_secs(5),
        slot_ttl: std::time::Duration::from_secs(60),
        batch_max: 64,
        batch_in_flight: 1,
        startup_grace: std::time::Duration::from_secs(5),
        decide_with,
    })
    .unwrap()
}

/// 300 requests of 10 clients at once (most ride in batches), a quota question among them:
/// each client admitted exactly its 12.
async fn burst(store: &RedisStore, round: usize) -> usize {
    let policies = [
        Policy::new("minute", Algorithm::SlidingWindow, 12, 60_000, 12),
        Policy::new("second", Algorithm::TokenBucket, 100, 1000, 100),
    ];
    let route: Arc<str> = "route".into();
    let clients: Vec<Arc<str>> = (0..10).map(|c| format!("r{round}-c{c}").into()).collect();
    let verdicts = join_all((0..300).map(|i| {
        let (client, route, policies) = (&clients[i % 10], &route, &policies);
        async move {
            store
                .check(&CheckRequest::new(client, route, policies, 1))
                .await
                .unwrap()
        }
    }))
    .await;
    let asks = [(route.clone(), policies[0].clone())];
    let left = store
        .usage(&clients[0], &asks, &Default::default())
        .await
        .unwrap();
    assert_eq!(left[0].remaining, 0, "{left:?}");
    let admitted = verdicts.iter().filter(|v| v.admitted).count();
    assert_eq!(admitted, 10 * 12);
    admitted
}

/// Waits until `store` decides again after its Redis restarted (the first calls may fail
/// while the connection is made again).
fn decides_again(store: &RedisStore, when: &str) {
    common::wait_until(&format!("decisions {when}"), || {
        futures::executor::block_on(async {
            let (route, client): (Arc<str>, Arc<str>) = ("route".into(), when.into());
            let policies = [Policy::new(
                "p",
                Algorithm::FixedWindow,
                1 << 20,
                60_000,
                1 << 20,
            )];
            store
                .check(&CheckRequest::new(&client, &route, &policies, 1))
                .await
                .is_ok()
        })
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_decides_with_the_module_where_redis_has_it_exactly() {
    let server = RedisServer::start_with(&["--loadmodule", &module_path()]);
    let store = store(&server, DecideWith::Auto);
    burst(&store, 0).await;
    assert_eq!(store.decides_with(), "module");
    let native = server.command_calls("turnstile.decide") + server.command_calls("turnstile.batch");
    assert!(
        native > 0
            && server.command_calls("turnstile.usage") + server.command_calls("turnstile.batch")
                > 0
    );
    assert_eq!(server.command_calls("evalsha"), 0, "a decision went to Lua");
    assert!(
        store.batches().batches > 0,
        "no batch was sent: {:?}",
        store.batches()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_never_calls_the_module_and_module_refuses_a_redis_without_it() {
    let with = RedisServer::start_with(&["--loadmodule", &module_path()]);
    let lua = store(&with, DecideWith::Lua);
    burst(&lua, 0).await;
    assert_eq!(lua.decides_with(), "lua");
    assert_eq!(
        with.command_calls("turnstile.decide") + with.command_calls("turnstile.batch"),
        0
    );
    assert!(with.command_calls("evalsha") > 0);

    let without = RedisServer::start_plain();
    let must = store(&without, DecideWith::Module);
    let route: Arc<str> = "route".into();
    let client: Arc<str> = "c".into();
    let policies = [Policy::new("minute", Algorithm::FixedWindow, 5, 60_000, 5)];
    let err = must
        .check(&CheckRequest::new(&client, &route, &policies, 1))
        .await
        .expect_err("a Redis without the module decided");
    assert!(err.to_string().contains("decide_with"), "{err}");
    let keys: Vec<String> = without.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_without_the_module_is_decided_by_lua_and_with_it_by_the_module() {
    let module = module_path();
    let mut server = RedisServer::start_with(&["--loadmodule", &module]);
    let store = store(&server, DecideWith::Auto);
    burst(&store, 0).await;
    assert_eq!(store.decides_with(), "module");

    server.restart_with(&[]);
    // Then every decision is Lua's, as exact.
    decides_again(&store, "after the restart");
    burst(&store, 1).await;
    assert_eq!(store.decides_with(), "lua");
    assert!(server.command_calls("evalsha") > 0);

    server.restart_with(&["--loadmodule", &module]);
    decides_again(&store, "after the second restart");
    burst(&store, 2).await;
    assert_eq!(store.decides_with(), "module");
    assert_eq!(
        server.command_calls("evalsha"),
        0,
        "Lua decided after the module came back"
    );
}
