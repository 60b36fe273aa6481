//! Where a problem's TOML path (`routes[0].deny_ips[1]`) is in the file: the line and column
//! of the value it names, or of the nearest table above it the file has (a missing key is
//! reported at the table that lacks it). Read from toml's spanned parse of the same text.

use toml::de::{DeTable, DeValue};

/// 1-based line and column of `path` in `text`; `None` when not even its first part is
/// in the file (a problem about the document, or about a key of the environment).
pub fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let root = DeTable::parse(text).ok()?;
    let mut found: Option<std::ops::Range<usize>> = None;
    let mut table = Some(root.get_ref());
    let mut array: Option<&toml::de::DeArray<'_>> = None;
    // Up to the first blank: "server.listen (environment TURNSTILE_LISTEN)".
    let path = path.split(' ').next().unwrap_or_default();
    for step in steps(path) {
        let next = match (step, table, array) {
            (Step::Key(name), Some(t), _) => t
                .iter()
                .find(|(k, _)| k.get_ref().as_ref() == name)
                .map(|(_, v)| v),
            (Step::Index(i), _, Some(a)) => a.get(i),
            _ => None,
        };
        let Some(value) = next else { break };
        found = Some(value.span());
        (table, array) = match value.get_ref() {
            DeValue::Table(t) => (Some(t), None),
            DeValue::Array(a) => (None, Some(a)),
            _ => (None, None),
        };
    }
    found.map(|span| line_column(text, span.start))
}

pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `a.b[2][0].c` → `a`, `b`, 2, 0, `c`; stops at anything it cannot read.
fn steps(path: &str) -> Vec<Step<'_>> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (name, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        if !name.is_empty() {
            out.push(Step::Key(name));
        }
        while let Some(inner) = rest.strip_prefix('[') {
            let Some((index, after)) = inner.split_once(']') else {
                return out;
            };
            let Ok(index) = index.parse() else {
                return out;
            };
            out.push(Step::Index(index));
            rest = after;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[server]\nlisten = \"127.0.0.1:1\"\ndeny_ips = [\n  \"10.0.0.0/8\",\n  \"x\",\n]\n\n[[routes]]\nname = \"a\"\n\n[[routes]]\nname = \"b\"\nallow_ips = [\"y\"]\n\n[upstreams.api]\nservers = [\"z\"]\n";

    #[test]
    fn paths_are_found_down_to_list_entries() {
        assert_eq!(locate(TEXT, "server.deny_ips[1]"), Some((5, 3)));
        assert_eq!(locate(TEXT, "routes[1].allow_ips[0]"), Some((13, 14)));
        assert_eq!(locate(TEXT, "upstreams.api.servers[0]"), Some((16, 12)));
        assert_eq!(
            locate(TEXT, "server.listen (environment TURNSTILE_LISTEN)"),
            Some((2, 10))
        );
    }

    #[test]
    fn a_missing_key_is_placed_at_what_lacks_it() {
        let (line, _) = locate(TEXT, "routes[1].upstream").unwrap();
        assert!((11..=13).contains(&line), "{line}");
        assert_eq!(locate(TEXT, "plans.free"), None);
        assert_eq!(locate("not toml [", "server"), None);
    }

    #[test]
    fn line_column_is_one_based() {
        assert_eq!(line_column("a\nbc\n", 0), (1, 1));
        assert_eq!(line_column("a\nbc\n", 3), (2, 2));
    }

    #[test]
    fn paths_split_into_keys_and_indices() {
        assert_eq!(
            steps("a.b[2][0].c"),
            [
                Step::Key("a"),
                Step::Key("b"),
                Step::Index(2),
                Step::Index(0),
                Step::Key("c")
            ]
        );
        assert_eq!(steps("a[x].b"), [Step::Key("a")]);
    }
}
