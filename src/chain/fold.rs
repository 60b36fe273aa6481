//! The strictest common reading of text that names limiter state or picks a request field.
//!
//! Frameworks behind the gateway read the same bytes differently: Django's login form applies
//! NFKC (`ｖｉｃｔｉｍ` is `victim`), Python's `str.strip()` and Java's `trim()` drop
//! U+001C–U+001F around a name, ASP.NET Identity compares user names upper-cased, Go's
//! `encoding/json` and ASP.NET match JSON keys ignoring case (Go even folds `ſ` to `s`), PHP
//! reads `user.name` as `user_name`. A limit keyed on such text must count every spelling the
//! upstream would take for one account as that account, so values are folded to what all of
//! those readings agree on: default-ignorable code points removed, NFKC, full Unicode case
//! folding, NFKC again (folding can un-normalise), and white space and control characters
//! trimmed from both ends. Folding can only merge spellings, never split them — a limit only
//! gets stricter.
//!
//! Bytes that are not UTF-8 (HTTP's obs-text) are read as Latin-1, as WSGI servers do.

use icu_casemap::CaseMapper;
use icu_normalizer::ComposingNormalizerBorrowed;
use icu_properties::props::DefaultIgnorableCodePoint;
use icu_properties::CodePointSetData;
use std::borrow::Cow;

/// The folded form of a value (a header's, a body field's); `None` when nothing is left.
pub fn value(raw: &[u8]) -> Option<String> {
    let text = match std::str::from_utf8(raw) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => Cow::Owned(raw.iter().map(|&b| char::from(b)).collect()),
    };
    let folded = fold(&text);
    (!folded.is_empty()).then_some(folded)
}

/// The folded form of a field name, for finding names that some framework reads as another:
/// [`value`]'s folding, then PHP's renaming of ` `, `.` and `[` to `_`.
pub fn name(raw: &str) -> String {
    fold(raw)
        .chars()
        .map(|c| match c {
            ' ' | '.' | '[' => '_',
            c => c,
        })
        .collect()
}

/// Ends trimmed by some common reading: Unicode white space (Python's `strip()`, .NET's
/// `Trim()`) and control characters (Java's `trim()` drops everything up to U+0020).
fn trimmed(c: char) -> bool {
    c.is_whitespace() || c.is_control()
}

fn fold(text: &str) -> String {
    if text.is_ascii() {
        // Nothing to normalise; ASCII folds to its lower case.
        return text.trim_matches(trimmed).to_ascii_lowercase();
    }
    let ignorable = CodePointSetData::new::<DefaultIgnorableCodePoint>();
    let kept: String = text
        .chars()
        .filter(|&c| !ignorable.contains(c))
        .map(|c| match c {
            '\u{130}' | '\u{131}' => 'i',
            c => c,
        })
        .collect();
    let nfkc = ComposingNormalizerBorrowed::new_nfkc();
    let composed = nfkc.normalize(&kept);
    let folded = CaseMapper::new().fold_string(&composed);
    let normal = nfkc.normalize(&folded);
    normal.trim_matches(trimmed).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Option<String> {
        value(text.as_bytes())
    }

    #[test]
    fn spellings_one_framework_takes_for_one_account_fold_alike() {
        for spelling in [
            "victim",
            "Victim",
            "VICTIM",
            "ｖｉｃｔｉｍ",
            "  victim\t",
            "\u{1c}victim\u{1f}",
            "\u{feff}victim\u{200b}",
            "vic\u{ad}tim",
            "\u{3000}victim\u{a0}",
        ] {
            assert_eq!(v(spelling).as_deref(), Some("victim"), "{spelling:?}");
        }
        assert_eq!(v("Jose\u{301}"), v("José"), "NFD and NFC");
        assert_eq!(v("Straße"), v("STRASSE"), "full case folding");
        assert_eq!(v("\u{212a}elvin"), v("kelvin"), "the Kelvin sign");
        // ASP.NET Identity upper-cases `ı` to `I`; Go's simple lower case of `İ` is `i`.
        assert_eq!(v("v\u{131}ctim"), v("victim"), "dotless i");
        assert_eq!(v("V\u{130}CT\u{130}M"), v("victim"), "dotted capital I");
    }

    #[test]
    fn distinct_names_stay_distinct_and_empty_is_missing() {
        assert_ne!(v("victim"), v("victim2"));
        assert_ne!(v("vic tim"), v("victim"), "inner space is kept");
        for empty in ["", "  ", "\u{1c}\u{200b}", "\u{feff}"] {
            assert_eq!(v(empty), None, "{empty:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_read_as_latin1() {
        assert_eq!(value(b"Acm\xe9"), v("acmé"));
        assert_eq!(value(b"\xc9"), v("é"));
    }

    #[test]
    fn field_names_fold_with_php_renaming() {
        assert_eq!(name("USERNAME"), "username");
        assert_eq!(name("u\u{17f}ername"), "username", "Go folds the long s");
        assert_eq!(name("user.name"), "user_name");
        assert_eq!(name("user name"), "user_name");
        assert_eq!(name("user[name"), "user_name");
        assert_eq!(name("ｕｓｅｒｎａｍｅ"), "username");
        assert_eq!(
            name("ema\u{131}l"),
            "email",
            ".NET's OrdinalIgnoreCase matches it"
        );
        assert_ne!(name("username2"), "username");
    }
}
