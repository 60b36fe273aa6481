//! Names the commit the binary was built from (`turnstile --version`, `turnstile_build_info`):
//! `git rev-parse --short=12 HEAD` when built from a git checkout, with `-dirty` when the tree
//! had changes; `TURNSTILE_COMMIT` from the environment when set (a build without `.git`,
//! such as the container's); `unknown` otherwise.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TURNSTILE_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=.git/{reference}");
        }
    }
    let commit = std::env::var("TURNSTILE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=TURNSTILE_COMMIT={commit}");
}

fn git_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| o.status.success() && !o.stdout.is_empty());
    Some(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}
