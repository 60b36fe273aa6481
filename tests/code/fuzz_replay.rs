//! The fuzz targets (src/fuzzing.rs) in `make test`: every file of the committed corpus
//! (`fuzz/corpus/<target>/`, including crashers found by `make fuzz`, kept as regression
//! inputs) and a few thousand random inputs per target through the same functions libFuzzer
//! drives. A panic is a failure.

use proptest::prelude::*;
use std::path::Path;
use turnstile::fuzzing;

fn replay(target: &str, run: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_file() {
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target}: {} crashes", path.display());
            n += 1;
        }
    }
    n
}

#[test]
fn the_committed_corpus_replays_cleanly() {
    assert!(replay("config", fuzzing::config) >= 10);
    assert!(replay("client_ip", fuzzing::client_ip_extraction) >= 4);
    assert!(replay("api_key", fuzzing::api_key) >= 3);
    assert!(replay("headers", fuzzing::header_rendering) >= 1);
    assert!(replay("request_path", fuzzing::request_path) >= 5);
    assert!(replay("body_fields", fuzzing::body_fields) >= 3);
    assert!(replay("one_reading", fuzzing::one_reading) >= 6);
}

/// Bytes that look like the inputs: mostly printable, with the separators that matter.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            4 => 0x20u8..0x7f,
            1 => Just(b'\n'),
            1 => Just(b','),
            1 => Just(0u8),
            1 => any::<u8>(),
        ],
        0..200,
    )
}

/// Path-like bytes: slashes, dots, escapes (of the characters that matter) and letters.
fn path_bytes() -> impl Strategy<Value = Vec<u8>> {
    let pieces: Vec<&[u8]> = vec![
        b"/", b"/", b"//", b".", b"..", b"%", b"%2e", b"%2E", b"%2f", b"%5c", b"%3b", b"%25",
        b"%6f", b"%4", b"%zz", b"%c3%a9", b";", b"\\", b"a", b"B", b"~", b"-", b"\x00",
    ];
    prop::collection::vec(prop::sample::select(pieces), 0..20).prop_map(|v| v.concat())
}

/// Login requests for `fuzzing::one_reading`: a content-type selector, a query, `\n`, a
/// body; made of spellings of the field's name, values that fold alike or not, separators,
/// escapes and JSON syntax.
fn login_request() -> impl Strategy<Value = Vec<u8>> {
    let names: Vec<&[u8]> = vec![
        b"username",
        b"USERNAME",
        b"UserName",
        b"u\xc5\xbfername",
        b"user%6Eame",
        b"user_name",
        b"user.name",
        b"user name",
        b" user_name",
        b"user[name",
        b"\xef\xbd\x95sername",
        b"password",
        b"usernam",
    ];
    let values: Vec<&[u8]> = vec![
        b"victim",
        b"VICTIM",
        b"decoy",
        b"\xef\xbd\x96ictim",
        b"%1Cvictim",
        b"vic%20tim",
        b"",
        b"a;username=victim",
        b"x%26username%3Dv",
    ];
    let joints: Vec<&[u8]> = vec![b"=", b"&", b";", b"\":\"", b"\",\"", b"{\"", b"\"}", b"\n"];
    let piece = prop_oneof![
        prop::sample::select(names),
        prop::sample::select(values),
        prop::sample::select(joints),
    ];
    let structured =
        (0u8..4, prop::collection::vec(piece, 0..16)).prop_map(|(selector, pieces)| {
            let mut data = vec![selector];
            data.extend(pieces.concat());
            data
        });
    // JSON and form bodies of name/value pairs, and a query of pairs.
    let name = prop::sample::select(vec![
        "username",
        "USERNAME",
        "uſername",
        "user_name",
        "user.name",
        "ｕsername",
        "password",
    ]);
    let value = prop::sample::select(vec![
        "victim",
        "VICTIM",
        "decoy",
        "ｖictim",
        " victim\u{1c}",
    ]);
    let pairs = prop::collection::vec((name, value), 0..4);
    let bodies =
        (0u8..4, pairs.clone(), pairs, any::<bool>()).prop_map(|(selector, query, body, json)| {
            let mut data = vec![if json { 0 } else { 1 + selector % 3 }];
            let q: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            data.extend(q.join("&").bytes());
            data.push(b'\n');
            let b: Vec<String> = if json {
                body.iter().map(|(k, v)| format!("{k:?}:{v:?}")).collect()
            } else {
                body.iter().map(|(k, v)| format!("{k}={v}")).collect()
            };
            let text = if json {
                format!("{{{}}}", b.join(","))
            } else {
                b.join("&")
            };
            data.extend(text.bytes());
            data
        });
    prop_oneof![structured, bodies]
}

/// TOML-ish text: fragments of valid configs shuffled and cut.
fn config_text() -> impl Strategy<Value = String> {
    let pieces = [
        "[server]\n",
        "listen = \"127.0.0.1:8080\"\n",
        "threads = 2\n",
        "[upstreams.u]\n",
        "servers = [\"127.0.0.1:1\"]\n",
        "[[routes]]\n",
        "name = \"r\"\n",
        "path_prefix = \"/\"\n",
        "upstream = \"u\"\n",
        "auth = \"api_key\"\n",
        "cost = 3\n",
        "[plans.p]\n",
        "limits = [{ name = \"l\", algorithm = \"token_bucket\", limit = 5, window = \"1s\" }]\n",
        "[[clients]]\n",
        "id = \"c\"\n",
        "plan = \"p\"\n",
        "api_keys = [\"0123456789abcdef0\"]\n",
        "[store]\n",
        "kind = \"redis\"\n",
        "url = \"redis://127.0.0.1:6379\"\n",
        "ip_limit = \"off\"\n",
        "ip_limit = { rate = \"5/s\" }\n",
        "[access_log]\n",
        "mode = \"sampled\"\n",
        "sample = 0.5\n",
        "= \n",
        "[[",
        "\"",
        "{",
        "window = \"0s\"\n",
        "limit = 0\n",
    ];
    prop::collection::vec(prop::sample::select(pieces.to_vec()), 0..30).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn config_never_panics(text in config_text()) {
        fuzzing::config(text.as_bytes());
    }

    #[test]
    fn client_ip_never_panics(data in bytes()) {
        fuzzing::client_ip_extraction(&data);
    }

    #[test]
    fn request_paths_normalise_to_normal_paths(data in path_bytes()) {
        fuzzing::request_path(&data);
    }

    #[test]
    fn body_fields_never_panic(data in bytes()) {
        fuzzing::body_fields(&data);
    }

    #[test]
    fn what_two_framework_readings_could_disagree_on_is_refused(data in login_request()) {
        fuzzing::one_reading(&data);
    }

    #[test]
    fn api_key_never_panics(data in bytes()) {
        fuzzing::api_key(&data);
    }

    #[test]
    fn header_rendering_keeps_its_numbers(data in prop::collection::vec(any::<u8>(), 0..80)) {
        fuzzing::header_rendering(&data);
    }
}
