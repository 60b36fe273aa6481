//! Real Redis for tests: `redis-server` processes started on free ports in temporary
//! directories (no persistence), and a real three-master Redis Cluster joined with
//! `redis-cli --cluster create`. Only servers started here are ever touched (and flushed).

use super::{free_port, wait_until, Proc};
use std::process::Command;

pub struct RedisServer {
    pub port: u16,
    pub proc: Proc,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--maxmemory", "1mb"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let proc = spawn(port, dir.path(), &extra);
        let server = RedisServer {
            port,
            proc,
            dir,
            extra,
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

    /// Kills the server (SIGKILL) — a crash.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts a new, empty server on the same port after [`kill`](Self::kill).
    pub fn restart(&mut self) {
        self.proc.kill();
        self.proc = spawn(self.port, self.dir.path(), &self.extra);
        self.wait_ready();
    }

    /// SIGSTOP: the server hangs without refusing connections.
    pub fn freeze(&self) {
        self.proc.signal("STOP");
    }

    pub fn thaw(&self) {
        self.proc.signal("CONT");
    }
}

fn spawn(port: u16, dir: &std::path::Path, extra: &[String]) -> Proc {
    let mut cmd = Command::new("redis-server");
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

/// A three-master Redis Cluster.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
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
