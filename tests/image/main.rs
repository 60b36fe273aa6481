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
