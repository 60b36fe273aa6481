//! Reading a configuration: TOML text → the serde mirror (`file`) → the validated
//! [`Config`] (`validate`), with the failing path and position on error.

use super::error::{ConfigError, Problem};
use super::file::FileConfig;
use super::model::Config;
use std::path::Path;

/// Environment variables that override a setting of the file, and the setting (for
/// containers: one image, the addresses chosen where it runs).
pub const ENV_OVERRIDES: [(&str, &str); 2] = [
    ("TURNSTILE_LISTEN", "server.listen"),
    ("TURNSTILE_ADMIN_LISTEN", "admin.listen"),
];

impl Config {
    /// Reads and validates a configuration file, with the environment's overrides
    /// ([`ENV_OVERRIDES`]): what the gateway would run.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::from_text(&text)
    }

    /// [`parse`](Self::parse), then the environment's overrides ([`ENV_OVERRIDES`]).
    pub fn from_text(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text)?.overridden(|name| std::env::var(name).ok())
    }

    /// The configuration with the overrides `lookup` finds applied; an unusable value is a
    /// problem naming the variable.
    pub fn overridden(
        mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        for (name, setting) in ENV_OVERRIDES {
            let Some(value) = lookup(name) else { continue };
            match value.trim().parse::<std::net::SocketAddr>() {
                Ok(addr) if setting == "server.listen" => self.server.listen = addr,
                Ok(addr) => self.admin.listen = addr,
                Err(_) => problems.push(Problem {
                    path: format!("{setting} (environment {name})"),
                    message: format!("{value:?}: expected ip:port like \"0.0.0.0:9090\""),
                    location: None,
                }),
            }
        }
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let file = parse_file(text).map_err(|p| ConfigError::Invalid(vec![p]))?;
        Config::try_from(file).map_err(|mut problems| {
            for problem in problems.iter_mut().filter(|p| p.location.is_none()) {
                problem.location = super::locate::locate(text, &problem.path);
            }
            ConfigError::Invalid(problems)
        })
    }
}

/// TOML text → serde mirror, with the failing path and position on error.
fn parse_file(text: &str) -> Result<FileConfig, Problem> {
    let de = toml::de::Deserializer::parse(text).map_err(|e| toml_problem(text, ".", &e))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        toml_problem(text, &path, e.inner())
    })
}

fn toml_problem(text: &str, path: &str, e: &toml::de::Error) -> Problem {
    Problem {
        path: path.to_owned(),
        message: suggest(e.message().trim()),
        location: e
            .span()
            .map(|span| super::locate::line_column(text, span.start)),
    }
}

/// serde's "unknown field `keepalive_timout`, expected one of `a`, `b`, …" (every field of
/// the table) becomes "unknown field `keepalive_timout`: did you mean `keepalive_timeout`?"
/// when one name is close (a typo), and keeps the list otherwise. Other messages pass as
/// they are.
fn suggest(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_owned();
    };
    let Some((field, expected)) = rest.split_once("`, expected ") else {
        return message.to_owned();
    };
    let names = expected
        .trim_start_matches("one of ")
        .split(", ")
        .map(|n| n.trim_matches('`'));
    let closest = names
        .map(|name| (strsim::damerau_levenshtein(field, name), name))
        .filter(|(distance, name)| *distance <= (name.len() / 4).clamp(1, 3))
        .min_by_key(|(distance, _)| *distance);
    match closest {
        Some((_, name)) => format!("unknown field `{field}`: did you mean `{name}`?"),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod suggestion_tests {
    use super::suggest;

    #[test]
    fn a_typo_is_answered_with_the_likely_name_and_anything_else_with_the_list() {
        let serde = "unknown field `keepalive_timout`, expected one of `listen`, `keepalive_timeout`, `body_timeout`";
        assert_eq!(
            suggest(serde),
            "unknown field `keepalive_timout`: did you mean `keepalive_timeout`?"
        );
        let far = "unknown field `database`, expected one of `url`, `prefix`";
        assert_eq!(suggest(far), far);
        let one = "unknown field `lmit`, expected `limit`";
        assert_eq!(suggest(one), "unknown field `lmit`: did you mean `limit`?");
        assert_eq!(suggest("invalid type: integer"), "invalid type: integer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_overrides_the_listen_addresses() {
        let text = "[admin]\nlisten = \"127.0.0.1:9090\"\n[upstreams.u]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";
        let env = |name: &str| (name == "TURNSTILE_ADMIN_LISTEN").then(|| "0.0.0.0:9191".into());
        let config = Config::parse(text).unwrap().overridden(env).unwrap();
        assert_eq!(config.admin.listen.to_string(), "0.0.0.0:9191");
        let bad = |name: &str| (name == "TURNSTILE_LISTEN").then(|| "port 80".into());
        let err = Config::parse(text).unwrap().overridden(bad).unwrap_err();
        assert!(err.to_string().contains("TURNSTILE_LISTEN"), "{err}");
    }

    #[test]
    fn syntax_errors_have_a_location() {
        let err = Config::parse("[server\nlisten = 1").unwrap_err();
        let p = &err.problems()[0];
        assert_eq!(p.path, ".");
        assert!(p.location.is_some(), "{p}");
    }

    #[test]
    fn work_stealing_is_on_unless_turned_off() {
        let routes = "[upstreams.u]\nservers = [\"127.0.0.1:1\"]\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";
        assert!(Config::parse(routes).unwrap().server.work_stealing);
        let off = format!("[server]\nwork_stealing = false\n{routes}");
        assert!(!Config::parse(&off).unwrap().server.work_stealing);
        let err = Config::parse("[server]\nwork_stealing = \"no\"\n").unwrap_err();
        assert_eq!(err.problems()[0].path, "server.work_stealing", "{err}");
    }

    #[test]
    fn type_errors_name_the_path() {
        let err = Config::parse("[server]\nthreads = \"two\"\n").unwrap_err();
        assert_eq!(err.problems()[0].path, "server.threads", "{err}");
    }
}
