//! A real browser for tests, headless, driven over WebDriver on a free port: Debian's
//! Chromium by `chromedriver`, or Debian's Firefox ESR by `geckodriver` (all from
//! `scripts/install-deps.sh`). Only what the console test needs: open a page, find elements,
//! type, click, press keys, read text, run a line of script, emulate a media feature (dark
//! mode) over the DevTools protocol (Chromium), take a screenshot, read the page's errors.

use super::{free_port, wait_until, Proc};
use serde_json::{json, Value};
use std::process::Command;

pub struct Browser {
    port: u16,
    session: String,
    /// Firefox: geckodriver's log, where Firefox writes the page's script errors.
    firefox_log: Option<std::path::PathBuf>,
    _driver: Proc,
    _dir: tempfile::TempDir,
}

/// The W3C WebDriver name of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// A headless Chromium window of `width` × `height`.
    pub fn start(width: u32, height: u32) -> Browser {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let driver = Proc::spawn(
            "chromedriver",
            Command::new("chromedriver").arg(format!("--port={port}")),
            dir.path().join("chromedriver.log"),
        );
        wait_until("chromedriver", || super::port_open(port));
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromium (scripts/install-deps.sh installs it)");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": binary,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         format!("--window-size={width},{height}"),
                         format!("--user-data-dir={}", dir.path().join("profile").display())],
            },
        }}});
        Browser::session(port, driver, dir, caps, None)
    }

    /// A headless Firefox window of `width` × `height`.
    pub fn firefox(width: u32, height: u32) -> Browser {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = dir.path().join("geckodriver.log");
        let driver = Proc::spawn(
            "geckodriver",
            Command::new("geckodriver")
                .arg(format!("--port={port}"))
                .arg(format!("--websocket-port={}", free_port())),
            log.clone(),
        );
        wait_until("geckodriver", || super::port_open(port));
        let binary = ["/usr/bin/firefox-esr", "/usr/bin/firefox"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("firefox (scripts/install-deps.sh installs it)");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "firefox",
            "moz:firefoxOptions": {
                "binary": binary,
                "args": ["-headless"],
                // A closed network: nothing of Mozilla's is asked for.
                "prefs": {
                    "app.update.enabled": false,
                    "browser.shell.checkDefaultBrowser": false,
                    "datareporting.policy.dataSubmissionEnabled": false,
                    "network.captive-portal-service.enabled": false,
                    "network.connectivity-service.enabled": false,
                    "browser.safebrowsing.update.enabled": false,
                    "extensions.update.enabled": false,
                },
            },
        }}});
        let browser = Browser::session(port, driver, dir, caps, Some(log));
        browser.session_call(
            "POST",
            "/window/rect",
            json!({"width": width, "height": height}),
        );
        browser
    }

    fn session(
        port: u16,
        driver: Proc,
        dir: tempfile::TempDir,
        caps: Value,
        firefox_log: Option<std::path::PathBuf>,
    ) -> Browser {
        let mut browser = Browser {
            port,
            session: String::new(),
            firefox_log,
            _driver: driver,
            _dir: dir,
        };
        let created = browser.call("POST", "/session", caps);
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {created}"))
            .to_owned();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let (status, value) = exchange(self.port, method, path, &body);
        assert!(status == 200, "WebDriver {method} {path}: {status} {value}");
        value["value"].clone()
    }

    fn session_call(&self, method: &str, path: &str, body: Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn open(&self, url: &str) {
        self.session_call("POST", "/url", json!({ "url": url }));
    }

    /// The element `css` selects, waiting for it to exist and be displayed.
    pub fn find(&self, css: &str) -> String {
        let mut id = String::new();
        wait_until(&format!("the element {css}"), || {
            let (_, value) = exchange(
                self.port,
                "POST",
                &format!("/session/{}/element", self.session),
                &json!({"using": "css selector", "value": css}),
            );
            match value["value"][ELEMENT].as_str() {
                Some(found) => {
                    id = found.to_owned();
                    // A live page may replace the element between the two calls: a stale
                    // reference is looked up again.
                    let path = format!("/session/{}/element/{id}/displayed", self.session);
                    let (status, shown) = exchange(self.port, "GET", &path, &Value::Null);
                    assert!(
                        status == 200 || shown["value"]["error"] == "stale element reference",
                        "WebDriver GET {path}: {status} {shown}"
                    );
                    shown["value"] == json!(true)
                }
                None => false,
            }
        });
        id
    }

    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css);
        self.session_call("POST", &format!("/element/{id}/clear"), json!({}));
        self.session_call(
            "POST",
            &format!("/element/{id}/value"),
            json!({ "text": text }),
        );
    }

    /// Clicks the element `css` selects (found again if the page replaced it meanwhile).
    pub fn click(&self, css: &str) {
        wait_until(&format!("a click on {css}"), || {
            let id = self.find(css);
            let path = format!("/session/{}/element/{id}/click", self.session);
            let (status, value) = exchange(self.port, "POST", &path, &json!({}));
            assert!(
                status == 200 || value["value"]["error"] == "stale element reference",
                "WebDriver click on {css}: {status} {value}"
            );
            status == 200
        });
    }

    /// The text of the element `css` selects (found again if the page replaced it meanwhile).
    pub fn text(&self, css: &str) -> String {
        let mut text = String::new();
        wait_until(&format!("the text of {css}"), || {
            let id = self.find(css);
            let path = format!("/session/{}/element/{id}/text", self.session);
            let (status, value) = exchange(self.port, "GET", &path, &Value::Null);
            assert!(
                status == 200 || value["value"]["error"] == "stale element reference",
                "WebDriver GET {path}: {status} {value}"
            );
            text = value["value"].as_str().unwrap_or_default().to_owned();
            status == 200
        });
        text
    }

    /// Waits until the text of `css` satisfies `ok`; returns it.
    pub fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let mut seen = String::new();
        wait_until(what, || {
            seen = self.text(css);
            ok(&seen)
        });
        seen
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub fn eval(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
    }

    /// Runs `script` (a function body whose last argument is the callback it calls with its
    /// result) in the page, waiting for the callback; its value.
    pub fn eval_async(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/async",
            json!({ "script": script, "args": [] }),
        )
    }

    /// Presses keys on whatever has the focus, as a keyboard does (WebDriver key codes:
    /// `TAB`, `ENTER`, or text).
    pub fn press(&self, keys: &str) {
        let actions: Vec<Value> = keys
            .chars()
            .flat_map(|c| {
                let key = c.to_string();
                [
                    json!({"type": "keyDown", "value": key}),
                    json!({"type": "keyUp", "value": key}),
                ]
            })
            .collect();
        self.session_call(
            "POST",
            "/actions",
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]}),
        );
    }

    /// One Chrome DevTools Protocol command (chromedriver's `goog/cdp/execute`).
    pub fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.session_call(
            "POST",
            "/goog/cdp/execute",
            json!({"cmd": cmd, "params": params}),
        )
    }

    /// A PNG of the window, written to `path`.
    pub fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine;
        let png = self.session_call("GET", "/screenshot", Value::Null);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("a base64 PNG");
        std::fs::write(path, bytes).expect("write the screenshot");
    }

    /// Keeps the page's Content-Security-Policy violations from now on, for
    /// [`Browser::errors`] in Firefox (which writes script errors to its log, but not these).
    pub fn watch_violations(&self) {
        self.eval(
            "window.__violations = []; \
             document.addEventListener('securitypolicyviolation', (e) => __violations.push(`CSP ${e.violatedDirective}: ${e.blockedURI}`));",
        );
    }

    /// The page's errors: in Chromium its console messages at level SEVERE (script errors,
    /// refused loads); in Firefox the script errors of pages served over HTTP that it wrote
    /// to its log since it started, and the violations [`Browser::watch_violations`] kept.
    pub fn errors(&self) -> Vec<String> {
        if let Some(log) = &self.firefox_log {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let mut errors: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("JavaScript error: http"))
                .map(str::to_owned)
                .collect();
            let kept = self.eval("return window.__violations || []");
            errors.extend(
                kept.as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| v.as_str().unwrap_or_default().to_owned()),
            );
            return errors;
        }
        let logs = self.session_call("POST", "/se/log", json!({"type": "browser"}));
        logs.as_array()
            .map(|entries| {
                entries
                    .iter()
                    .filter(|e| e["level"] == "SEVERE")
                    .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            exchange(self.port, "DELETE", &path, &Value::Null);
        }
    }
}

/// One WebDriver request and its JSON answer, read by its `Content-Length` (chromedriver
/// keeps the connection open whatever the request says). `(0, Null)` when it does not answer.
fn exchange(port: u16, method: &str, path: &str, body: &Value) -> (u16, Value) {
    use std::io::{Read, Write};
    let body = match method {
        "GET" | "DELETE" => String::new(),
        _ => body.to_string(),
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, Value::Null);
    };
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(60)));
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, Value::Null);
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let status = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let value = serde_json::from_slice(&buf[end + 4..end + 4 + length]);
                return (status, value.unwrap_or(Value::Null));
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return (0, Value::Null),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// WebDriver's code for the Tab key.
pub const TAB: &str = "\u{E004}";
/// WebDriver's code for the Enter key.
pub const ENTER: &str = "\u{E007}";
