//! Config loading: every example in `conf/` is valid, and every fixture in
//! `tests/fixtures/invalid/` fails with the message its first line announces
//! (`# expect: <toml path>: <message fragment>`), both through the library and through
//! `turnstile check`.

use crate::common;

use std::path::{Path, PathBuf};
use turnstile::config::Config;

/// Every `.toml` file under `dir` (recursively).
fn files_in(dir: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "toml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut files);
    files.sort();
    files
}

#[test]
fn every_example_config_loads() {
    let files = files_in("conf");
    assert!(
        files.len() >= 2,
        "expected conf/gateway.toml and conf/demo.toml"
    );
    for file in files {
        if let Err(e) = Config::load(&file) {
            panic!("{} does not load:\n{e}", file.display());
        }
        let (code, out, err) = common::turnstile(&["check", file.to_str().unwrap()]);
        assert_eq!(code, 0, "turnstile check {}: {out}{err}", file.display());
    }
}

/// Every TOML block of the guides (`docs/guides/`) is a whole file `turnstile check`
/// accepts, with the variables its secrets name set.
#[test]
fn every_configuration_in_the_guides_passes_check() {
    let dir = tempfile::tempdir().unwrap();
    let mut guides: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guides"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
    guides.sort();
    let mut blocks = 0;
    for guide in &guides {
        let text = std::fs::read_to_string(guide).unwrap();
        for (i, block) in text.split("```toml\n").skip(1).enumerate() {
            let toml = block.split("```").next().unwrap();
            let file = dir.path().join(format!("guide-{blocks}.toml"));
            std::fs::write(&file, toml).unwrap();
            let (code, out, err) = common::turnstile_env(
                &["check", file.to_str().unwrap()],
                &[
                    ("TURNSTILE_KEY_HASH_SECRET", "a-long-enough-hash-secret"),
                    ("ACME_API_KEY", "acme-key-0123456789abcdef"),
                ],
            );
            assert_eq!(code, 0, "{} block {}: {out}{err}", guide.display(), i + 1);
            blocks += 1;
        }
    }
    assert!(guides.len() >= 4 && blocks >= 5, "{guides:?}: {blocks}");
}

#[test]
fn every_invalid_fixture_fails_naming_its_path() {
    let files = files_in("tests/fixtures/invalid");
    assert!(files.len() >= 20);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expected = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} lacks a `# expect:` line", file.display()))
            .trim_end();
        match Config::parse(&text) {
            Ok(_) => panic!("{} was accepted", file.display()),
            Err(e) => {
                let message = e.to_string();
                assert!(
                    message.lines().any(|l| l.starts_with(expected)),
                    "{}: expected a problem starting with {expected:?}, got:\n{message}",
                    file.display()
                );
            }
        }
        let (code, _, stderr) = common::turnstile(&["check", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{}", file.display());
        assert!(
            stderr.contains(expected),
            "{}: stderr was {stderr}",
            file.display()
        );
    }
}

#[test]
fn a_deprecated_key_is_read_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("old.toml");
    std::fs::write(
        &file,
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nconcurrency_lease = \"45s\"\n\n[upstreams.u]\nservers = [\"127.0.0.1:9001\"]\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n",
    )
    .unwrap();
    let config = Config::load(&file).unwrap();
    let turnstile::config::StoreConfig::Redis(redis, _) = &config.store else {
        panic!("a redis store")
    };
    assert_eq!(redis.slot_ttl, std::time::Duration::from_secs(45));
    assert_eq!(config.warnings.len(), 1);
    assert_eq!(config.warnings[0].path, "store.concurrency_lease");
    let (code, _, stderr) = common::turnstile(&["check", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("warning") && stderr.contains("renamed store.concurrency_slot_ttl"),
        "{stderr}"
    );
}

#[test]
fn several_problems_are_reported_at_once() {
    let err = Config::parse(
        "[server]\nthreads = 0\n[upstreams.u]\nservers = []\n[[routes]]\nname = \"r\"\npath_prefix = \"x\"\nupstream = \"nope\"\n",
    )
    .unwrap_err();
    let paths: Vec<&str> = err.problems().iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "server.threads",
            "upstreams.u.servers",
            "routes[0].path_prefix",
            "routes[0].upstream"
        ]
    );
}

#[test]
fn defaults_are_applied() {
    let config = Config::parse(
        "[upstreams.u]\nservers = [\"127.0.0.1:1\"]\nhealth_check = { path = \"/h\" }\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\nmethods = [\"get\"]\n",
    )
    .unwrap();
    use turnstile::config::defaults;
    assert_eq!(config.server.listen.to_string(), defaults::LISTEN);
    let route = &config.routes[0];
    assert_eq!(route.connect_timeout, defaults::CONNECT_TIMEOUT);
    assert_eq!(route.read_timeout, defaults::READ_TIMEOUT);
    assert_eq!(route.methods.as_deref(), Some(&[http::Method::GET][..]));
    let hc = config.upstreams["u"].health_check.as_ref().unwrap();
    assert_eq!(hc.interval, defaults::HEALTH_INTERVAL);
    assert_eq!(hc.host, defaults::HEALTH_HOST);
}

#[test]
fn check_without_a_readable_file_fails_clearly() {
    let (code, _, stderr) = common::turnstile(&["check", "/nonexistent/turnstile.toml"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("cannot read config file /nonexistent/turnstile.toml"),
        "{stderr}"
    );
}

#[test]
fn running_with_an_invalid_config_exits_with_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[server]\nthreads = 0\n").unwrap();
    let (code, _, stderr) = common::turnstile(&["--config", path.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(stderr.contains("server.threads"), "{stderr}");
}

#[test]
fn an_unresolvable_server_passes_check_but_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dns.toml");
    let port = common::free_port();
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[upstreams.u]\nservers = [\"no-such-host.invalid:80\"]\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n"
        ),
    )
    .unwrap();
    // Names are resolved where the gateway runs (compose service names, say), not by `check`.
    let (code, _, stderr) = common::turnstile(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = common::turnstile(&["--config", path.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("upstreams.u.servers[0]: cannot resolve \"no-such-host.invalid\""),
        "{stderr}"
    );
}
