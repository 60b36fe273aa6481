//! Python tools from PyPI for tests (a real gRPC client, a real WebSocket client, schema
//! validators), each set installed once into its own virtual environment under `target/`: a
//! `ready` file names the packages of an environment whose install finished, so a changed
//! pin reinstalls. One install at a time per test binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

static INSTALLING: Mutex<()> = Mutex::new(());

/// The `bin/` directory of the environment `name` holding `packages` (pinned versions).
pub fn venv(name: &str, packages: &[&str]) -> PathBuf {
    let _one = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(name);
    let want = packages.join("\n");
    let ready = root.join("ready");
    if std::fs::read_to_string(&ready).is_ok_and(|got| got == want) {
        return root.join("bin");
    }
    let _ = std::fs::remove_dir_all(&root);
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&root)
        .status()
        .expect("python3 -m venv");
    assert!(
        status.success(),
        "python3 -m venv failed (Debian: apt install python3-venv)"
    );
    let status = Command::new(root.join("bin/pip"))
        .args(["install", "--quiet"])
        .args(packages)
        .status()
        .expect("pip install");
    assert!(status.success(), "pip install {packages:?} failed");
    std::fs::write(&ready, want).unwrap();
    root.join("bin")
}

/// The Python clients of the upstream tests (`tests/clients/`): grpcio, sonora (gRPC-Web) and
/// websockets.
pub fn clients() -> PathBuf {
    venv(
        "py-clients",
        &["grpcio==1.85.3", "sonora==0.2.3", "websockets==17.4"],
    )
    .join("python")
}

/// A client script of `tests/clients/`.
pub fn client_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(name)
}
