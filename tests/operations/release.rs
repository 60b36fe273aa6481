//! `make release` (`scripts/release.sh`), packaging the binary this test run built: the
//! archive holds the binary and the docs, `SHA256SUMS` verifies with `sha256sum -c`, and the
//! packaged binary names this version and a commit.

use std::path::Path;
use std::process::Command;

#[test]
fn release_packages_the_binary_with_checksums() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(root.join("scripts/release.sh"))
        .env("TURNSTILE_BIN", env!("CARGO_BIN_EXE_turnstile"))
        .env("OUT", out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        stdout.starts_with(&format!("turnstile {version} (")),
        "{stdout}"
    );

    let check = Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(out.path())
        .output()
        .unwrap();
    let sums = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(check.status.success(), "{sums}");
    assert_eq!(sums.matches(": OK").count(), 2, "{sums}");

    let archive = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .expect("an archive");
    let name = archive.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(&format!("turnstile-{version}-")), "{name}");
    let listing = Command::new("tar")
        .arg("-tzf")
        .arg(&archive)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let dir = name.trim_end_matches(".tar.gz");
    for entry in [
        "turnstile",
        "README.md",
        "CHANGELOG.md",
        "docs/configuration.md",
        "conf/gateway.toml",
    ] {
        assert!(
            listing.lines().any(|l| l == format!("{dir}/{entry}")),
            "{entry} missing from {name}:\n{listing}"
        );
    }

    // A binary of another version is refused rather than packaged under this one.
    let fake = out.path().join("fake");
    std::fs::write(&fake, "#!/bin/sh\necho 'turnstile 9.9.9 (abc)'\n").unwrap();
    let mut perms = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).unwrap();
    let refused = Command::new(root.join("scripts/release.sh"))
        .env("TURNSTILE_BIN", &fake)
        .env("OUT", out.path().join("other"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not version"));
}
