//! The container image's build, without a Docker engine: the Dockerfile's dependency layer
//! built as the image would build it. A binary of its own, so that its release build of
//! every dependency (minutes on two cores) runs alone rather than beside the tests that
//! talk to real servers.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Dockerfile's instructions → arguments, in order (continuation lines joined).
fn instructions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (op, rest) = l.split_once(' ').unwrap_or((l, ""));
            (op.to_uppercase(), rest.trim().to_owned())
        })
        .collect()
}

/// The Dockerfile's dependency layer, built as the image would build it: its COPYs into a
/// temporary directory, then its RUN with the same command (stubbing and `cargo build`), so
/// that a stub the manifest needs and the layer lacks fails here, not silently in the image
/// (a `|| true` once hid exactly that: the layer built nothing). The release build of the
/// dependencies goes to `target/dockerfile-deps`, kept between local runs.
#[test]
fn the_dockerfiles_dependency_layer_builds() {
    let lines = instructions();
    let build = lines
        .iter()
        .position(|(op, args)| op == "RUN" && args.contains("cargo build"))
        .expect("a RUN building the dependencies");
    assert!(
        !lines[build].1.contains("|| true"),
        "the dependency layer must not hide its failure"
    );
    let first = lines[..build]
        .iter()
        .rposition(|(op, _)| op == "WORKDIR")
        .expect("the builder's WORKDIR");
    let dir = tempfile::tempdir().unwrap();
    for (op, args) in &lines[first + 1..build] {
        match op.as_str() {
            "COPY" => {
                let parts: Vec<&str> = args.split_whitespace().collect();
                let (dest, sources) = parts.split_last().unwrap();
                for source in sources {
                    let to = if dest.ends_with('/') {
                        dir.path().join(dest).join(source)
                    } else {
                        dir.path().join(dest)
                    };
                    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                    std::fs::copy(root().join(source), &to)
                        .unwrap_or_else(|e| panic!("COPY {source}: {e}"));
                }
            }
            "ARG" | "ENV" => {}
            other => panic!("unexpected {other} before the dependency build"),
        }
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg(&lines[build].1)
        .current_dir(dir.path())
        .env("CARGO_TARGET_DIR", root().join("target/dockerfile-deps"))
        .output()
        .expect("run the layer's command");
    assert!(
        out.status.success(),
        "the Dockerfile's dependency layer fails:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every target the manifest names was stubbed.
    for stub in [
        "src/lib.rs",
        "src/main.rs",
        "src/bin/orders-api.rs",
        "benches/floor.rs",
    ] {
        assert!(dir.path().join(stub).exists(), "{stub} not stubbed");
    }
}

/// The instructions of the Dockerfile's stage `name` (after its FROM, up to the next one).
fn stage(lines: &[(String, String)], name: &str) -> Vec<(String, String)> {
    let from = lines
        .iter()
        .position(|(op, args)| op == "FROM" && args.ends_with(&format!(" AS {name}")))
        .unwrap_or_else(|| panic!("a stage named {name}"));
    let end = lines[from + 1..]
        .iter()
        .position(|(op, _)| op == "FROM")
        .map_or(lines.len(), |i| from + 1 + i);
    lines[from + 1..end].to_vec()
}

/// `COPY <source> <dest>` of a file or a directory, as Docker copies it.
fn copy(source: &Path, to: &Path) {
    if source.is_dir() {
        for entry in std::fs::read_dir(source).unwrap() {
            let entry = entry.unwrap();
            copy(&entry.path(), &to.join(entry.file_name()));
        }
        return;
    }
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(source, to).unwrap_or_else(|e| panic!("COPY {}: {e}", source.display()));
}

/// A redis-server started with `args` on a free loopback port, stopped on drop.
struct Redis(std::process::Child, u16);

impl Redis {
    fn start(args: &[String]) -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(args)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("redis-server (make test installs it)");
        Redis(child, port)
    }

    /// What `TURNSTILE.VERSION` answers once the server listens (bounded: 20 s).
    fn module_version(&mut self) -> String {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.1)).unwrap();
        for _ in 0..200 {
            if let Some(status) = self.0.try_wait().unwrap() {
                let mut log = String::new();
                use std::io::Read;
                self.0
                    .stdout
                    .take()
                    .unwrap()
                    .read_to_string(&mut log)
                    .unwrap();
                panic!("redis-server exited ({status}):\n{log}");
            }
            if let Ok(mut conn) = client.get_connection() {
                return redis::cmd("TURNSTILE.VERSION")
                    .query(&mut conn)
                    .unwrap_or_else(|e| format!("{e}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("redis-server never listened on {}", self.1);
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Redis image that decides natively, built as the image would build it: the module
/// stage's COPYs into a temporary directory and its commands run there (its `apt-get` line
/// is this machine's: `scripts/install-deps.sh module` installs the same package), then the
/// Redis image's command — and docker-compose.yml's Redis command, and the Kubernetes Redis's
/// arguments — run with redis-server on what the stage built: each loads the module.
#[test]
fn the_dockerfiles_module_stage_builds_what_the_redis_images_load() {
    let lines = instructions();
    let dir = tempfile::tempdir().unwrap();
    let target = root().join("target/dockerfile-module");
    for (op, args) in stage(&lines, "module") {
        match op.as_str() {
            "RUN" if args.starts_with("apt-get") => {
                assert!(args.contains("libclang-dev"), "{args}");
            }
            "RUN" => {
                assert!(
                    !args.contains("|| true"),
                    "a stage must not hide its failure"
                );
                let out = Command::new("sh")
                    .arg("-c")
                    .arg(&args)
                    .current_dir(dir.path())
                    .env("CARGO_TARGET_DIR", &target)
                    .output()
                    .expect("run the stage's command");
                assert!(
                    out.status.success(),
                    "the module stage's `{args}` fails:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            "COPY" => {
                let parts: Vec<&str> = args.split_whitespace().collect();
                let (dest, sources) = parts.split_last().unwrap();
                for source in sources {
                    let to = match dest.ends_with('/') {
                        true => dir.path().join(dest).join(source),
                        false => dir.path().join(dest),
                    };
                    copy(&root().join(source), &to);
                }
            }
            "WORKDIR" => {}
            other => panic!("unexpected {other} in the module stage"),
        }
    }
    // The Redis image: the library copied from the module stage's build to where its command
    // loads it from.
    let image = stage(&lines, "redis-module");
    let copied = image
        .iter()
        .find_map(|(op, args)| (op == "COPY").then_some(args))
        .expect("a COPY of the module");
    let parts: Vec<&str> = copied.split_whitespace().collect();
    let [from, built, loaded] = parts[..] else {
        panic!("COPY --from=module <built> <path>: {copied}")
    };
    assert_eq!(from, "--from=module");
    let built = target.join(
        built
            .strip_prefix("/src/target/")
            .expect("the stage's target"),
    );
    assert!(built.exists(), "{} was not built", built.display());
    // Each command, with the image's path standing for the library the stage built.
    let here = |args: Vec<String>| -> Vec<String> {
        args.into_iter()
            .map(|a| match a == loaded {
                true => built.to_str().unwrap().to_owned(),
                false => a,
            })
            .collect()
    };
    let cmd = image
        .iter()
        .rev()
        .find_map(|(op, args)| (op == "CMD").then_some(args))
        .expect("a CMD");
    let cmd: Vec<String> = serde_json::from_str(cmd).expect("CMD in exec form");
    assert_eq!(cmd[0], "redis-server");
    let compose: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root().join("docker-compose.yml")).unwrap())
            .unwrap();
    let redis = &compose["services"]["redis"];
    assert_eq!(redis["build"]["target"].as_str(), Some("redis-module"));
    let strings = |v: &serde_yaml::Value| -> Vec<String> {
        v.as_sequence()
            .expect("a list")
            .iter()
            .map(|a| a.as_str().expect("a string").to_owned())
            .collect()
    };
    let compose_cmd = strings(&redis["command"]);
    assert_eq!(compose_cmd[0], "redis-server");
    let manifest = std::fs::read_to_string(root().join("deploy/kubernetes/redis.yaml")).unwrap();
    let statefulset: serde_yaml::Value =
        serde_yaml::from_str(manifest.split("\n---\n").next().unwrap()).unwrap();
    let container = &statefulset["spec"]["template"]["spec"]["containers"][0];
    let k8s_args = strings(&container["args"]);
    for (what, args) in [
        ("the image's CMD", cmd[1..].to_vec()),
        ("docker-compose.yml's Redis", compose_cmd[1..].to_vec()),
        ("deploy/kubernetes/redis.yaml", k8s_args),
    ] {
        assert!(args.iter().any(|a| a == loaded), "{what}: {args:?}");
        let dir = tempfile::tempdir().unwrap();
        let mut args = here(args);
        args.extend(["--dir".to_owned(), dir.path().to_str().unwrap().to_owned()]);
        let version = Redis::start(&args).module_version();
        assert!(
            version.starts_with("turnstile-module 1 "),
            "{what}: {version}"
        );
    }
}
