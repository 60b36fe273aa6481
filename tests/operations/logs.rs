//! Application logs: `server.log_format = "json"` makes every line (ours and Pingora's) one
//! JSON object with a timestamp, level, target and message; "text" (the default) is for
//! people. A reload reports a changed format as pending a restart.

use crate::common;

use common::{wait_until, Gateway, Upstream};

fn config(up: &Upstream) -> String {
    format!(
        "[upstreams.u]\nservers = [\"{}\"]\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n",
        up.addr()
    )
}

#[test]
fn json_logs_are_one_object_per_line_from_every_source() {
    let up = Upstream::start("u");
    let gw = Gateway::start_with("log_format = \"json\"\nwatch_config = false", &config(&up));
    // The format is fixed at start: a reload that changes it says so (and logs it).
    let header = gw
        .header()
        .replace("log_format = \"json\"", "log_format = \"text\"");
    gw.rewrite_raw(&format!("{header}{}", config(&up)));
    let resp = gw.reload().json();
    assert_eq!(resp["result"], "applied", "{resp}");
    assert!(resp.to_string().contains("server.log_format"), "{resp}");
    assert_eq!(
        gw.admin("/config").json()["config"]["server"]["log_format"],
        "json"
    );
    wait_until("the reload to be logged", || {
        gw.proc.log_text().contains("after a restart")
    });
    let text = gw.proc.log_text();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for line in &lines {
        let ts = line["timestamp"].as_str().unwrap();
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
        assert!(
            line["level"].is_string() && line["target"].is_string(),
            "{line}"
        );
        assert!(line["message"].is_string(), "{line}");
    }
    // Pingora's own records (through the `log` bridge) and ours.
    let from = |prefix: &str| {
        lines
            .iter()
            .any(|l| l["target"].as_str().unwrap().starts_with(prefix))
    };
    assert!(from("pingora") && from("turnstile"), "{text}");
    assert!(lines.iter().any(|l| l["level"] == "WARN"));
}

#[test]
fn text_logs_are_the_default() {
    let up = Upstream::start("u");
    let gw = Gateway::start(&config(&up));
    wait_until("the start to be logged", || {
        gw.proc.log_text().contains("Server starting")
    });
    let text = gw.proc.log_text();
    let line = text
        .lines()
        .find(|l| l.contains("Server starting"))
        .unwrap();
    assert!(
        serde_json::from_str::<serde_json::Value>(line).is_err(),
        "{line}"
    );
    assert!(line.contains(" INFO ") && line.contains('Z'), "{line}");
}
