//! Real Redis for tests: `redis-server` processes started on free ports in temporary
//! directories (no persistence), and a real three-master Redis Cluster joined with
//! `redis-cli --cluster create`. Only servers started here are ever touched (and flushed).

use super::{free_port, wait_until, Proc};
use std::path::Path;
use std::process::Command;

pub struct RedisServer {
    pub port: u16,
    pub proc: Proc,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// Never given the module by `TURNSTILE_TEST_MODULE` (a test's own choice of modules).
    plain: bool,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--maxmemory", "1mb"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::started(extra, false)
    }

    /// A server that never has the module, whatever the suite's run.
    pub fn start_plain() -> RedisServer {
        RedisServer::started(&[], true)
    }

    fn started(extra: &[&str], plain: bool) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let args = match plain {
            true => extra.clone(),
            false => with_suite_module(&extra),
        };
        let proc = spawn(port, dir.path(), &args);
        let server = RedisServer {
            port,
            proc,
            dir,
            extra,
            plain,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        wait_until(&format!("redis-server on port {}", self.port), || {
            redis::Client::open(self.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        });
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("connect to test redis on {}: {e}", self.port))
    }

    /// Runs a command on this server.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?} on test redis: {e}"))
    }

    /// Calls of a command since start, from `INFO commandstats` (e.g. "evalsha").
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Calls that decided requests, whichever decided them: `check.lua` and `batch.lua`
    /// (`EVALSHA`), or the module's commands (the suite's run with `TURNSTILE_TEST_MODULE`).
    pub fn decision_calls(&self) -> u64 {
        ["evalsha", "eval", "turnstile.decide", "turnstile.batch"]
            .iter()
            .map(|c| self.command_calls(c))
            .sum()
    }

    /// Kills the server (SIGKILL) — a crash.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts a new, empty server on the same port after [`kill`](Self::kill).
    pub fn restart(&mut self) {
        self.proc.kill();
        let extra = match self.plain {
            true => self.extra.clone(),
            false => with_suite_module(&self.extra),
        };
        self.proc = spawn(self.port, self.dir.path(), &extra);
        self.wait_ready();
    }

    /// Kills the server and starts it again on the same port with other extra arguments
    /// (e.g. without the module it had loaded).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.plain = true;
        self.restart();
    }

    /// SIGSTOP: the server hangs without refusing connections.
    pub fn freeze(&self) {
        self.proc.signal("STOP");
    }

    pub fn thaw(&self) {
        self.proc.signal("CONT");
    }
}

/// The limits suite's second run (`make test`) decides with the module: with
/// `TURNSTILE_TEST_MODULE` set, every Redis a test starts loads it (unless the test chose
/// its modules itself).
fn with_suite_module(extra: &[String]) -> Vec<String> {
    let mut extra = extra.to_vec();
    let chosen = extra.iter().any(|a| a == "--loadmodule");
    if !chosen && std::env::var_os("TURNSTILE_TEST_MODULE").is_some_and(|v| !v.is_empty()) {
        extra.extend(["--loadmodule".to_string(), module_path()]);
    }
    extra
}

/// The server binary: `redis-server`, or `TURNSTILE_TEST_REDIS_SERVER` (e.g. a
/// `valkey-server`, to run the suite against Valkey).
pub fn server_binary() -> String {
    std::env::var("TURNSTILE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

fn spawn(port: u16, dir: &std::path::Path, extra: &[String]) -> Proc {
    let mut cmd = Command::new(server_binary());
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .arg("--dir")
    .arg(dir)
    .args(extra);
    Proc::spawn(
        &format!("redis-server:{port}"),
        &mut cmd,
        dir.join(format!("redis-{port}.log")),
    )
}

/// A three-master Redis Cluster (with a replica each, from [`RedisCluster::with_replicas`]).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        RedisCluster::start_nodes(3, 0, "5000", &[])
    }

    /// Three masters, each with turnstile's Redis module loaded.
    pub fn with_module() -> RedisCluster {
        RedisCluster::start_nodes(3, 0, "5000", &["--loadmodule", &module_path()])
    }

    /// Three masters and a replica of each (`cluster-node-timeout` 1 s: a frozen master's
    /// replica is promoted a few seconds later), every replica in sync before it returns.
    /// `cluster-require-full-coverage no`: while a failed master's slots wait for their
    /// replica, the other masters keep answering for theirs (with the default, every node
    /// refuses every command with `CLUSTERDOWN` until the promotion).
    pub fn with_replicas() -> RedisCluster {
        let cluster = RedisCluster::start_nodes(6, 1, "1000", &[]);
        for node in &cluster.nodes {
            let _: () = node.cmd(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
        }
        for node in &cluster.nodes {
            wait_until(&format!("replication up on {}", node.port), || {
                let info: String = node.cmd(&["INFO", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            });
        }
        cluster
    }

    fn start_nodes(
        count: usize,
        replicas: usize,
        node_timeout: &str,
        extra: &[&str],
    ) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..count)
            .map(|_| {
                // The bus port named, so that it too is a port handed out by `free_port`
                // (by default it is the port + 10 000, which nothing reserved).
                let bus = free_port().to_string();
                let mut args = vec![
                    "--cluster-port",
                    &bus,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    node_timeout,
                ];
                args.extend_from_slice(extra);
                RedisServer::start_with(&args)
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for node in &nodes {
            wait_until(&format!("cluster state ok on {}", node.port), || {
                let info: String = node.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
            });
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node (index in `nodes`) that is the primary of `slot` now, asked of `asker`.
    pub fn primary_of(&self, slot: u16, asker: usize) -> usize {
        let slots: redis::Value = self.nodes[asker].cmd(&["CLUSTER", "SLOTS"]);
        let redis::Value::Array(entries) = slots else {
            panic!("CLUSTER SLOTS: {slots:?}")
        };
        for entry in entries {
            let redis::Value::Array(f) = entry else {
                continue;
            };
            let (redis::Value::Int(a), redis::Value::Int(b), redis::Value::Array(p)) =
                (&f[0], &f[1], &f[2])
            else {
                continue;
            };
            if (*a..=*b).contains(&i64::from(slot)) {
                let redis::Value::Int(port) = p[1] else {
                    panic!("{p:?}")
                };
                return self.index_of(port as u16);
            }
        }
        panic!("slot {slot} is served by no node")
    }

    /// The replica of the node at `primary` (index in `nodes`).
    pub fn replica_of(&self, primary: usize) -> usize {
        let id: String = self.nodes[primary].cmd(&["CLUSTER", "MYID"]);
        (0..self.nodes.len())
            .find(|&i| {
                let info: String = self.nodes[i].cmd(&["INFO", "replication"]);
                i != primary
                    && info.contains("role:slave")
                    && info.contains(&format!("master_port:{}", self.nodes[primary].port))
            })
            .unwrap_or_else(|| panic!("no replica of {id}"))
    }

    /// The index in `nodes` of the node on `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// The hash slot of `key`, as Redis computes it.
    pub fn slot_of(&self, key: &str) -> u16 {
        let slot: i64 = self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]);
        slot as u16
    }

    /// Every key on every node, with the node's port.
    pub fn all_keys(&self) -> Vec<(u16, String)> {
        self.nodes
            .iter()
            .flat_map(|n| {
                let keys: Vec<String> = n.cmd(&["KEYS", "*"]);
                keys.into_iter().map(move |k| (n.port, k))
            })
            .collect()
    }
}

/// A `redis-server` on loopback, logging to `dir`/`name`.log, without persistence.
pub fn redis(dir: &Path, name: &str, args: &[&str]) -> Proc {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    Proc::spawn(
        &format!("redis-server {name}"),
        Command::new(server_binary())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .args(with_suite_module(&args)),
        dir.join(format!("{name}.log")),
    )
}

/// `redis-cli` with `args`: its output when it succeeded.
pub fn cli(args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// One primary, one replica and three sentinels watching them (quorum 2, a primary is down
/// after 1 s), all in `dir`, ready: the replica in sync and known to every sentinel.
pub struct SentinelSetup {
    pub procs: Vec<Proc>,
    pub primary: u16,
    pub replica: u16,
    pub sentinels: Vec<u16>,
}

impl SentinelSetup {
    pub fn start(dir: &Path) -> SentinelSetup {
        let (primary, replica) = (free_port(), free_port());
        let mut procs = vec![
            redis(dir, "primary", &["--port", &primary.to_string()]),
            redis(
                dir,
                "replica",
                &[
                    "--port",
                    &replica.to_string(),
                    "--replicaof",
                    "127.0.0.1",
                    &primary.to_string(),
                ],
            ),
        ];
        let sentinels: Vec<u16> = (0..3).map(|_| free_port()).collect();
        for (i, port) in sentinels.iter().enumerate() {
            let conf = dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nsentinel monitor main 127.0.0.1 {primary} 2\nsentinel down-after-milliseconds main 1000\nsentinel failover-timeout main 5000\n"
                ),
            )
            .unwrap();
            procs.push(Proc::spawn(
                &format!("redis-sentinel {i}"),
                Command::new("redis-server").arg(&conf).arg("--sentinel"),
                dir.join(format!("sentinel-{i}.log")),
            ));
        }
        wait_until("the replica and the sentinels to be ready", || {
            let synced = cli(&["-p", &replica.to_string(), "INFO", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"));
            let known = sentinels.iter().all(|s| {
                cli(&["-p", &s.to_string(), "SENTINEL", "replicas", "main"])
                    .is_some_and(|r| r.contains(&replica.to_string()))
            });
            synced && known
        });
        SentinelSetup {
            procs,
            primary,
            replica,
            sentinels,
        }
    }

    /// The `[store]` table of a gateway using these sentinels.
    pub fn store(&self, extra: &str) -> String {
        let list: Vec<String> = self
            .sentinels
            .iter()
            .map(|p| format!("\"redis://127.0.0.1:{p}\""))
            .collect();
        format!(
            "[store]\nkind = \"redis_sentinel\"\nmaster_name = \"main\"\nsentinels = [{}]\n{extra}",
            list.join(", ")
        )
    }
}

/// The turnstile Redis module (`module/`, built by `make module`, which `make test` runs
/// first): `TURNSTILE_MODULE`, or the release build in this workspace's target directory.
pub fn module_path() -> String {
    let path = std::env::var("TURNSTILE_MODULE").unwrap_or_else(|_| {
        let target = std::env::var("CARGO_TARGET_DIR")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target").into());
        format!("{target}/release/libturnstile_module.so")
    });
    assert!(
        Path::new(&path).exists(),
        "the Redis module is not built at {path}: run `make module` (make test does)"
    );
    path
}
