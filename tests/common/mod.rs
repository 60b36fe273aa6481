//! Test harness: real processes on free loopback ports, each in its own temporary
//! directory, killed when the test ends (also when it panics). Nothing here touches a process
//! or server the harness did not start.
#![allow(dead_code)]

pub mod browser;
pub mod dns;
pub mod grpc;
pub mod http;
pub mod jwks;
pub mod otlp;
pub mod page;
pub mod python;
pub mod redis;
pub mod tls;

use std::collections::HashSet;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Upper bound for anything to become ready; only reached when something is broken.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A loopback port nobody listens on, not handed out before by this test process.
///
/// Taken below the kernel's ephemeral range when there is room there: a port from that range
/// can be the source port the kernel gives any outgoing connection, so a server restarted on
/// its port (Redis killed and started again) could find it taken, and a client retrying a
/// connection to it while it is down could connect to itself. Nothing picks a port below the
/// range unless asked for it.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let below = ephemeral_low().filter(|low| *low >= 12_000);
    let mut seed = u64::from(std::process::id()) ^ Instant::now().elapsed().as_nanos() as u64;
    loop {
        let wanted = match below {
            Some(low) => {
                // xorshift: spread over [10 000, low) without a crate.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed = seed.wrapping_add(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.subsec_nanos().into()),
                );
                10_000 + (seed % u64::from(low - 10_000)) as u16
            }
            None => 0,
        };
        let Ok(port) = TcpListener::bind(("127.0.0.1", wanted)).and_then(|l| l.local_addr()) else {
            continue;
        };
        let mut given = GIVEN.lock().unwrap();
        if given.get_or_insert_with(HashSet::new).insert(port.port()) {
            return port.port();
        }
    }
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`), where readable.
fn ephemeral_low() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Polls `cond` until it is true; panics with `what` after [`READY_TIMEOUT`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < READY_TIMEOUT,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process that is killed and reaped on drop. Its output goes to a log file that is
/// printed when the test panics.
pub struct Proc {
    pub name: String,
    child: Option<std::process::Child>,
    log: PathBuf,
    group: bool,
}

impl Proc {
    /// Spawns `cmd` as the leader of its own process group; dropping the [`Proc`] kills the
    /// whole group (a script and everything it started).
    pub fn spawn_group(name: &str, cmd: &mut Command, log: PathBuf) -> Proc {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let mut p = Proc::spawn(name, cmd, log);
        p.group = true;
        p
    }

    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Proc {
            name: name.to_owned(),
            child: Some(child),
            log,
            group: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Panics (with the log) if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            panic!(
                "{} exited with {status}; log:\n{}",
                self.name,
                self.log_text()
            );
        }
    }

    pub fn has_exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends a signal by name (`STOP`, `CONT`, `HUP`, `TERM`, ...).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args(["-s", sig, "--", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} {}", self.name);
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.group {
                // `--` matters: without it procps-ng 4.0's kill does not read `-PGID` as a
                // process group (and can end up signalling every process).
                let _ = Command::new("kill")
                    .args(["-s", "KILL", "--", &format!("-{}", child.id())])
                    .status();
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("----- log of {} -----\n{}", self.name, self.log_text());
        }
    }
}

/// Something listens on the loopback `port`. A connection to a free port can succeed by
/// connecting to itself (the kernel may pick that very port as its source): not counted.
pub fn port_open(port: u16) -> bool {
    listening("127.0.0.1", port)
}

fn listening(host: &str, port: u16) -> bool {
    TcpStream::connect((host, port)).is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
}

/// A running `orders-api` instance.
pub struct Upstream {
    pub name: String,
    /// The loopback address it listens on (`--host`, default 127.0.0.1).
    pub host: String,
    pub port: u16,
    pub proc: Proc,
    _dir: tempfile::TempDir,
}

impl Upstream {
    pub fn start(name: &str) -> Upstream {
        Upstream::start_on(name, free_port())
    }

    pub fn start_on(name: &str, port: u16) -> Upstream {
        Upstream::start_args(name, port, &[])
    }

    /// An instance started with extra arguments (`--capacity`, `--delay-ms`, `--threads`).
    pub fn start_args(name: &str, port: u16, extra: &[&str]) -> Upstream {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut proc = Proc::spawn(
            &format!("orders-api {name}"),
            Command::new(env!("CARGO_BIN_EXE_orders-api"))
                .args(["--port", &port.to_string(), "--name", name])
                .args(extra),
            dir.path().join("orders-api.log"),
        );
        let host = extra
            .windows(2)
            .find(|w| w[0] == "--host")
            .map_or("127.0.0.1", |w| w[1])
            .to_owned();
        wait_until(&format!("orders-api {name} on {host}:{port}"), || {
            proc.assert_running();
            listening(&host, port)
        });
        Upstream {
            name: name.to_owned(),
            host,
            port,
            proc,
            _dir: dir,
        }
    }

    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Requests this instance has served (its control endpoints excluded).
    pub fn served(&self) -> u64 {
        http::get(self.port, "/_control/stats").json()["requests"]
            .as_u64()
            .expect("request count")
    }

    /// When the requests it served arrived (Unix ms, the latest 10000, in order).
    pub fn arrivals(&self) -> Vec<u64> {
        http::get(self.port, "/_control/arrivals").json()["ms"]
            .as_array()
            .expect("arrival times")
            .iter()
            .map(|v| v.as_u64().expect("a time"))
            .collect()
    }

    /// Adds `ms` milliseconds to every answer from now on (0: none).
    pub fn set_delay(&self, ms: u64) {
        let path = format!("/_control/delay?ms={ms}");
        let resp = http::request(self.port, "POST", &path, &[], b"");
        assert_eq!(resp.status, 200, "{}", resp.text());
    }

    /// Answers every request with `status` from now on (0: answers normally again).
    pub fn set_failing(&self, status: u16) {
        let path = format!("/_control/fail?status={status}");
        let resp = http::request(self.port, "POST", &path, &[], b"");
        assert_eq!(resp.status, 200, "{}", resp.text());
    }

    pub fn set_healthy(&self, healthy: bool) {
        let path = if healthy {
            "/_control/healthy"
        } else {
            "/_control/unhealthy"
        };
        let resp = http::request(self.port, "POST", path, &[], b"");
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
}

/// A running `turnstile` gateway with a generated config file.
pub struct Gateway {
    pub port: u16,
    pub admin_port: u16,
    pub proc: Proc,
    pub config_path: PathBuf,
    /// The generated `[server]` and `[admin]` tables, reused by [`Gateway::rewrite`].
    header: String,
    dir: tempfile::TempDir,
}

impl Gateway {
    /// Starts a gateway. `config` is the TOML after the `[server]` table; `server_extra` adds
    /// lines to the generated `[server]` table (listen address, threads, pid file and upgrade
    /// socket are set by the harness).
    pub fn start_with(server_extra: &str, config: &str) -> Gateway {
        Gateway::start_full(server_extra, "", config)
    }

    /// Like [`start_with`](Self::start_with), with extra lines for the generated `[admin]`
    /// table (its listen address is set by the harness).
    pub fn start_full(server_extra: &str, admin_extra: &str, config: &str) -> Gateway {
        Gateway::start_env(server_extra, admin_extra, config, &[])
    }

    /// Like [`start_full`](Self::start_full), with environment variables for the gateway
    /// process (secrets read from `{ env = "NAME" }`): set on the child, never on the test
    /// process, whose other threads read its environment.
    pub fn start_env(
        server_extra: &str,
        admin_extra: &str,
        config: &str,
        env: &[(&str, &str)],
    ) -> Gateway {
        let ports = (free_port(), free_port());
        let binary = Path::new(env!("CARGO_BIN_EXE_turnstile"));
        Gateway::launch(
            binary,
            ports,
            (server_extra, admin_extra),
            (config, env),
            "127.0.0.1",
        )
    }

    /// The gateway `binary` listening on `port`, its admin listener on `admin_port` (chosen by
    /// the test with [`free_port`], e.g. for clients started before it that wait for it to
    /// accept).
    pub fn start_on(binary: &Path, (port, admin_port): (u16, u16), config: &str) -> Gateway {
        Gateway::launch(
            binary,
            (port, admin_port),
            ("", ""),
            (config, &[]),
            "127.0.0.1",
        )
    }

    /// Like [`start_with`](Self::start_with), listening on `[::]` (IPv6 and, as IPv4-mapped
    /// IPv6 peers, IPv4 clients) on `port`.
    pub fn start_dual_stack(server_extra: &str, config: &str) -> Gateway {
        let ports = (free_port(), free_port());
        let binary = Path::new(env!("CARGO_BIN_EXE_turnstile"));
        Gateway::launch(binary, ports, (server_extra, ""), (config, &[]), "[::]")
    }

    fn launch(
        binary: &Path,
        (port, admin_port): (u16, u16),
        (server_extra, admin_extra): (&str, &str),
        (config, env): (&str, &[(&str, &str)]),
        listen_host: &str,
    ) -> Gateway {
        let dir = tempfile::tempdir().expect("temp dir");
        let header = format!(
            "[server]\nlisten = \"{listen_host}:{port}\"\nthreads = 2\npid_file = \"{pid}\"\nupgrade_sock = \"{sock}\"\n{server_extra}\n\n[admin]\nlisten = \"127.0.0.1:{admin_port}\"\n{admin_extra}\n\n",
            pid = dir.path().join("turnstile.pid").display(),
            sock = dir.path().join("upgrade.sock").display(),
        );
        let text = format!("{header}{config}");
        let config_path = dir.path().join("turnstile.toml");
        std::fs::write(&config_path, text).expect("write config");
        let mut proc = Proc::spawn(
            "turnstile",
            Command::new(binary)
                .arg("--config")
                .arg(&config_path)
                .env("RUST_LOG", "info")
                .envs(env.iter().copied()),
            dir.path().join("turnstile.log"),
        );
        wait_until(&format!("turnstile on port {port}"), || {
            proc.assert_running();
            port_open(port) && port_open(admin_port)
        });
        Gateway {
            port,
            admin_port,
            proc,
            config_path,
            header,
            dir,
        }
    }

    pub fn start(config: &str) -> Gateway {
        Gateway::start_with("", config)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Replaces the config file the way editors and deploy tools do: write a temporary file
    /// next to it, then rename it over the original. `config` is the part after the
    /// generated `[server]` / `[admin]` tables.
    pub fn rewrite(&self, config: &str) {
        self.rewrite_raw(&format!("{}{config}", self.header));
    }

    /// Replaces the whole file (header included), atomically.
    pub fn rewrite_raw(&self, text: &str) {
        let tmp = self.dir.path().join(".turnstile.toml.tmp");
        std::fs::write(&tmp, text).expect("write temporary config");
        std::fs::rename(&tmp, &self.config_path).expect("rename config into place");
    }

    /// The generated header (for tests that rewrite the whole file).
    pub fn header(&self) -> &str {
        &self.header
    }

    /// `POST /reload` on the admin listener (a change: with the JSON content type an HTML
    /// form cannot send).
    pub fn reload(&self) -> http::Response {
        let json = [("Content-Type", "application/json")];
        http::request(self.admin_port, "POST", "/reload", &json, b"")
    }

    /// The running configuration's version (1 = as started).
    pub fn config_version(&self) -> u64 {
        self.admin("/config").json()["version"]
            .as_u64()
            .expect("version")
    }

    pub fn get(&self, path: &str) -> http::Response {
        http::get(self.port, path)
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> http::Response {
        http::get_with(self.port, path, headers)
    }

    /// `GET` on the admin listener.
    pub fn admin(&self, path: &str) -> http::Response {
        http::get(self.admin_port, path)
    }

    /// The value of one sample of `/metrics`, e.g.
    /// `metric("turnstile_requests_total", &[("route", "orders"), ("status", "200")])`;
    /// 0 when the sample is absent.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self.admin("/metrics").text();
        metric_value(&text, name, labels)
    }

    /// Waits until `metric(name, labels)` reaches `expected`, then asserts it is exactly
    /// that. A request is counted when it ends, just after its response is on the wire, so
    /// a test that has just read the response may look before the count moved.
    pub fn assert_counted(&self, name: &str, labels: &[(&str, &str)], expected: f64) {
        wait_until(&format!("{name} {labels:?} to reach {expected}"), || {
            self.metric(name, labels) >= expected
        });
        assert_eq!(self.metric(name, labels), expected, "{name} {labels:?}");
    }
}

/// Finds a sample in Prometheus text: the line for `name` whose labels include all of
/// `labels` (0 when there is none).
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, value)| value.parse::<f64>().expect("numeric sample"))
        .sum()
}

/// `turnstile check` on a file of `text`: it must refuse it, saying each of `expected`.
pub fn assert_check_refuses(text: &str, expected: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnstile.toml");
    std::fs::write(&path, text).unwrap();
    let (code, out, err) = turnstile(&["check", path.to_str().unwrap()]);
    let said = format!("{out}{err}");
    assert_ne!(code, 0, "{said}");
    for expected in expected {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
}

/// The values of header `name` an `orders-api` `/echo` reply says the upstream received.
pub fn echoed(echo: &serde_json::Value, name: &str) -> Vec<String> {
    echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pair| pair[0] == name)
        .map(|pair| pair[1].as_str().unwrap().to_owned())
        .collect()
}

/// Runs the `turnstile` binary with arguments; returns (exit code, stdout, stderr).
pub fn turnstile(args: &[&str]) -> (i32, String, String) {
    turnstile_env(args, &[])
}

/// [`turnstile`] with environment variables set for it (and `TURNSTILE_CONFIG` unset unless
/// given, so the test process's environment cannot choose the file).
pub fn turnstile_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(args)
        .env_remove("TURNSTILE_CONFIG")
        .envs(env.iter().copied())
        .output()
        .expect("run turnstile");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The upstream name a response came from.
pub fn upstream_of(resp: &http::Response) -> String {
    resp.header("x-upstream-name")
        .unwrap_or("<none>")
        .to_owned()
}
