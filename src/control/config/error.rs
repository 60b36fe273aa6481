//! Configuration errors: each problem located by its TOML path.

use std::fmt;
use std::path::PathBuf;

/// One problem found in a configuration, located by its TOML path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted TOML path, e.g. `routes[1].upstream`; `.` for the document itself.
    pub path: String,
    pub message: String,
    /// 1-based line and column when the problem could be located in the text.
    pub location: Option<(usize, usize)>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)?;
        if let Some((line, column)) = self.location {
            write!(f, " (line {line}, column {column})")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", display_problems(.0))]
    Invalid(Vec<Problem>),
}

fn display_problems(problems: &[Problem]) -> String {
    let lines: Vec<String> = problems.iter().map(Problem::to_string).collect();
    lines.join("\n")
}

impl ConfigError {
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(p) => p,
            ConfigError::Read { .. } => &[],
        }
    }
}
