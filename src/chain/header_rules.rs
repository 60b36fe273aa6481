//! Header rules (`request_headers` / `response_headers` on a route): headers set, added and
//! removed, values from templates with `${client_id}`, `${plan}`, `${route}`,
//! `${request_id}` and `${client_ip}`. Parsed and checked at load (a rule may not touch a
//! header the gateway decides, nor a hop-by-hop or framing one); applied to any head through
//! [`RuleHead`]. Pure.

use http::{HeaderMap, HeaderName, HeaderValue};
use std::net::IpAddr;

/// Headers that frame the message or belong to one hop: no rule may set, add or remove
/// them, on either side.
const FRAMING: [&str; 8] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// Request headers the gateway decides (forwarding, identity, the request id), or that route
/// and frame the request (one reading of it): no rule may touch them.
const GATEWAY_REQUEST: [&str; 10] = [
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-prefix",
    "forwarded",
    "x-request-id",
    "x-client-id",
    "x-api-key",
    "host",
    "expect",
];

/// Response headers of a refusal's contract (`Retry-After`, `RateLimit*`, the request id).
const GATEWAY_RESPONSE: [&str; 7] = [
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-request-id",
];

/// Whether no request rule may name `name` (lower-case, as `http` keeps names).
pub fn protected_request(name: &str) -> bool {
    GATEWAY_REQUEST.contains(&name) || FRAMING.contains(&name)
}

/// Whether no response rule may name `name`.
pub fn protected_response(name: &str) -> bool {
    GATEWAY_RESPONSE.contains(&name) || FRAMING.contains(&name)
}

/// A header value with variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Var(Var),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    ClientId,
    Plan,
    Route,
    RequestId,
    ClientIp,
}

impl Template {
    /// `text` with `${name}` variables; the rest printable ASCII (a header value's safe
    /// part: no control characters, nothing a server could read two ways).
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("${") {
            let (literal, after) = rest.split_at(at);
            push_text(&mut parts, literal)?;
            let Some(end) = after.find('}') else {
                return Err(format!("{text:?}: \"${{\" without its \"}}\""));
            };
            let var = match &after[2..end] {
                "client_id" => Var::ClientId,
                "plan" => Var::Plan,
                "route" => Var::Route,
                "request_id" => Var::RequestId,
                "client_ip" => Var::ClientIp,
                other => {
                    return Err(format!(
                        "{text:?}: unknown variable ${{{other}}} (known: client_id, plan, route, request_id, client_ip)"
                    ))
                }
            };
            parts.push(Part::Var(var));
            rest = &after[end + 1..];
        }
        push_text(&mut parts, rest)?;
        Ok(Template(parts))
    }

    /// Whether the value needs who the client is (`${client_id}`, `${plan}`).
    pub fn needs_client(&self) -> bool {
        self.0
            .iter()
            .any(|p| matches!(p, Part::Var(Var::ClientId | Var::Plan)))
    }

    /// The value for one request; `None` when a variable it names has no value here (no
    /// client identified, no client address): the header is then left alone.
    pub fn render(&self, vars: &Vars<'_>) -> Option<HeaderValue> {
        if let [Part::Text(text)] = self.0.as_slice() {
            return HeaderValue::from_str(text).ok();
        }
        let mut out = String::with_capacity(64);
        for part in &self.0 {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Var(Var::ClientId) => out.push_str(vars.client_id?),
                Part::Var(Var::Plan) => out.push_str(vars.plan?),
                Part::Var(Var::Route) => out.push_str(vars.route),
                Part::Var(Var::RequestId) => out.push_str(vars.request_id.to_str().ok()?),
                Part::Var(Var::ClientIp) => {
                    use std::fmt::Write;
                    write!(out, "{}", vars.client_ip?).ok()?;
                }
            }
        }
        HeaderValue::try_from(out).ok()
    }
}

fn push_text(parts: &mut Vec<Part>, text: &str) -> Result<(), String> {
    if let Some(bad) = text.chars().find(|c| !(c.is_ascii_graphic() || *c == ' ')) {
        return Err(format!(
            "{text:?}: {bad:?} cannot be in a header value here (printable ASCII only)"
        ));
    }
    if !text.is_empty() {
        parts.push(Part::Text(text.to_owned()));
    }
    Ok(())
}

/// What a template's variables stand for, for one request.
pub struct Vars<'a> {
    pub client_id: Option<&'a str>,
    pub plan: Option<&'a str>,
    pub route: &'a str,
    pub request_id: &'a HeaderValue,
    pub client_ip: Option<IpAddr>,
}

/// One route's rules for one direction: removed first, then set (replacing), then added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderRules {
    pub set: Vec<(HeaderName, Template)>,
    pub add: Vec<(HeaderName, Template)>,
    pub remove: Vec<HeaderName>,
}

/// A head the rules edit (the upstream request's, the client's response's).
pub trait RuleHead {
    fn headers(&self) -> &HeaderMap;
    fn replace(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String>;
    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String>;
    fn remove(&mut self, name: &HeaderName);
}

impl HeaderRules {
    /// Applies the rules to `head`. A removed header goes with every spelling a server
    /// could read as it (`X_Debug` for `x-debug`, as CGI-style servers map `_` to `-`).
    pub fn apply(&self, vars: &Vars<'_>, head: &mut dyn RuleHead) -> Result<(), String> {
        if !self.remove.is_empty() {
            let names = self.remove.iter().map(HeaderName::as_str);
            let aliases: Vec<HeaderName> = super::forward::underscore_aliases(
                head.headers().keys().map(|k| k.as_str()),
                names,
            )
            .into_iter()
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .collect();
            for name in self.remove.iter().chain(&aliases) {
                head.remove(name);
            }
        }
        for (name, template) in &self.set {
            if let Some(value) = template.render(vars) {
                head.replace(name, value)?;
            }
        }
        for (name, template) in &self.add {
            if let Some(value) = template.render(vars) {
                head.append(name, value)?;
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Map(HeaderMap);

    impl RuleHead for Map {
        fn headers(&self) -> &HeaderMap {
            &self.0
        }
        fn replace(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
            self.0.insert(name.clone(), value);
            Ok(())
        }
        fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<(), String> {
            self.0.append(name.clone(), value);
            Ok(())
        }
        fn remove(&mut self, name: &HeaderName) {
            self.0.remove(name);
        }
    }

    fn vars(request_id: &HeaderValue) -> Vars<'_> {
        Vars {
            client_id: Some("ada"),
            plan: Some("gold"),
            route: "orders",
            request_id,
            client_ip: Some("192.0.2.7".parse().unwrap()),
        }
    }

    #[test]
    fn templates_render_their_variables() {
        let id = HeaderValue::from_static("req-1");
        let t =
            Template::parse("${client_id}/${plan} on ${route} (${request_id}) from ${client_ip}")
                .unwrap();
        assert_eq!(
            t.render(&vars(&id)).unwrap(),
            "ada/gold on orders (req-1) from 192.0.2.7"
        );
        assert!(t.needs_client());
        let anonymous = Vars {
            client_id: None,
            ..vars(&id)
        };
        assert_eq!(
            t.render(&anonymous),
            None,
            "no client: the header is left alone"
        );
        assert_eq!(
            Template::parse("static")
                .unwrap()
                .render(&anonymous)
                .unwrap(),
            "static"
        );
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in [
            "${nope}",
            "a ${client_id",
            "line\nbreak",
            "tab\there",
            "caf\u{e9}",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn remove_then_set_then_add_and_underscore_spellings_go_too() {
        let mut head = Map(HeaderMap::new());
        head.0.insert("x-debug", HeaderValue::from_static("1"));
        head.0.insert("x_debug", HeaderValue::from_static("2"));
        head.0.insert("x-env", HeaderValue::from_static("client"));
        head.0.insert("x-tag", HeaderValue::from_static("a"));
        let name = |n: &'static str| HeaderName::from_static(n);
        let rules = HeaderRules {
            remove: vec![name("x-debug")],
            set: vec![(name("x-env"), Template::parse("prod").unwrap())],
            add: vec![(name("x-tag"), Template::parse("${route}").unwrap())],
        };
        let id = HeaderValue::from_static("r");
        rules.apply(&vars(&id), &mut head).unwrap();
        assert!(!head.0.contains_key("x-debug") && !head.0.contains_key("x_debug"));
        assert_eq!(head.0["x-env"], "prod");
        let tags: Vec<_> = head.0.get_all("x-tag").iter().collect();
        assert_eq!(tags, ["a", "orders"]);
    }
}
