//! The documentation as a whole: every relative link (and `#anchor`) in every Markdown file
//! of the repository leads somewhere, nothing points outside the repository's own docs, and
//! the README stays a front door (a couple of hundred lines at most).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(
                    name.as_str(),
                    "target" | ".git" | "corpus" | "work" | "artifacts"
                ) {
                    walk(&path, out);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(root(), &mut files);
    files.sort();
    files
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `[text](target)` links outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Drop code spans: a `](x)` inside backticks is not a link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = markdown_files();
    assert!(files.len() >= 15, "{files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for link in links(&text) {
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let shown = format!("{}: {link}", file.strip_prefix(root()).unwrap().display());
            if !target.exists() {
                broken.push(format!("{shown} (no such file)"));
                continue;
            }
            if !anchor.is_empty() {
                let Ok(content) = std::fs::read_to_string(&target) else {
                    broken.push(format!("{shown} (an anchor into a directory)"));
                    continue;
                };
                if !anchors(&content).contains(anchor) {
                    broken.push(format!("{shown} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_docs_stay_inside_the_repository() {
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains("../shared")
                && !text.contains("STYLE.md")
                && !text.contains("DESIGN.md"),
            "{} points at notes outside the repository",
            file.display()
        );
    }
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: move the details into docs/"
    );
    // It opens with the two commands.
    let first = readme.split("```sh\n").nth(1).unwrap_or_default();
    assert!(
        first.starts_with("make demo") && first.contains("\nmake test"),
        "{first}"
    );
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug(" `[upstreams.NAME.health_check]`"),
        "upstreamsnamehealth_check"
    );
    assert_eq!(
        slug(" What the gateway rejects, and why"),
        "what-the-gateway-rejects-and-why"
    );
    assert_eq!(
        slug(" Paths: what is routed is what is forwarded"),
        "paths-what-is-routed-is-what-is-forwarded"
    );
}
