//! The operator console (`/ui/`): a page, its script and its style, embedded in the binary.
//! The script calls the admin API with the token the operator types (kept in the tab's
//! sessionStorage, sent as `Authorization: Bearer`, never in a URL or a cookie), so the
//! console shows nothing the API would not, and everything it shows is scriptable. The three
//! files are served without the token: they hold no data. A strict Content-Security-Policy
//! (no inline script, nothing from elsewhere) and the script setting client-chosen text only
//! as text keep a client id or metadata holding markup from running.

use http::{Response, StatusCode};

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");
const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\"><rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#0b62d6\"/><path d=\"M4 4h8v2H9v6H7V6H4z\" fill=\"#fff\"/></svg>";

/// Only this origin's script and style; no frames, forms to elsewhere or plugins.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's answer for `path`, or `None` when it is not one of its files.
pub fn asset(path: &str) -> Option<Response<Vec<u8>>> {
    let (body, content_type) = match path {
        "/ui" => {
            return Some(
                Response::builder()
                    .status(StatusCode::PERMANENT_REDIRECT)
                    .header("location", "/ui/")
                    .header("content-length", 0)
                    .body(Vec::new())
                    .expect("valid response"),
            )
        }
        "/ui/" | "/ui/index.html" => (INDEX, "text/html; charset=utf-8"),
        "/ui/console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "/ui/console.css" => (STYLE, "text/css; charset=utf-8"),
        "/ui/favicon.svg" => (ICON, "image/svg+xml"),
        _ => return None,
    };
    Some(
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", content_type)
            .header("content-length", body.len())
            .header("content-security-policy", CSP)
            .header("x-content-type-options", "nosniff")
            .header("x-frame-options", "DENY")
            .header("referrer-policy", "no-referrer")
            .header("cache-control", "no-store")
            .body(body.as_bytes().to_vec())
            .expect("valid response"),
    )
}
