//! Human-friendly units used in the TOML file: durations (`"250ms"`, `"1m"`) and rates
//! (`"50/s"`, `"1000/h"`). They deserialize straight into typed values, so a bad value is
//! reported by serde with its TOML path and never survives loading as a string.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use std::time::Duration;

/// A duration: one or more `<number><unit>` terms with unit `ms`, `s`, `m`, `h` or `d`,
/// summed (`"250ms"`, `"1m30s"`, `"1.5s"`, `"2h45m"`), to the millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const EXPECTED: &'static str =
        "a duration like \"250ms\", \"2s\", \"1m30s\", \"1.5s\", \"1h\" or \"1d\"";

    pub fn parse(text: &str) -> Option<Duration> {
        let mut rest = text.trim();
        if rest.is_empty() {
            return None;
        }
        // Micro-milliseconds (1e-6 ms) so that decimals add up exactly before rounding.
        let mut total: u128 = 0;
        while !rest.is_empty() {
            let number_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let (number, after) = rest.split_at(number_len);
            let unit_len = after
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(after.len());
            let (unit, next) = after.split_at(unit_len);
            let per_ms: u128 = match unit {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return None,
            };
            total = total.checked_add(fraction_micro_ms(number, per_ms)?)?;
            rest = next;
        }
        if total % 1_000_000 != 0 {
            return None; // finer than a millisecond
        }
        u64::try_from(total / 1_000_000)
            .ok()
            .map(Duration::from_millis)
    }
}

/// `number` (`"12"`, `"1.5"`) × `per_ms`, in millionths of a millisecond.
fn fraction_micro_ms(number: &str, per_ms: u128) -> Option<u128> {
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() || frac.len() > 9 || frac.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.pow(frac.len() as u32);
    let micro = per_ms.checked_mul(1_000_000)?;
    let whole_part = whole.checked_mul(micro)?;
    let frac_part = frac_value.checked_mul(micro)?;
    if frac_part % scale != 0 {
        return None;
    }
    whole_part.checked_add(frac_part / scale)
}

/// A limit's `window`: a duration, or a calendar unit (`"1 day"`, `"1 week"`, `"1 month"`)
/// — a fixed window aligned to the calendar in the limit's `time_zone`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSetting {
    Duration(Duration),
    Calendar(crate::limit::calendar::Unit),
}

impl<'de> Deserialize<'de> for WindowSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = WindowSetting;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(
                    f,
                    "{}, or \"1 day\", \"1 week\", \"1 month\"",
                    HumanDuration::EXPECTED
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<WindowSetting, E> {
                if let Some(unit) = crate::limit::calendar::Calendar::parse_unit(v) {
                    return Ok(WindowSetting::Calendar(unit));
                }
                HumanDuration::parse(v)
                    .map(WindowSetting::Duration)
                    .ok_or_else(|| {
                        E::custom(format_args!(
                            "invalid window {v:?}: expected {}, or a calendar unit \"1 day\", \"1 week\", \"1 month\"",
                            HumanDuration::EXPECTED
                        ))
                    })
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// A number of bytes: an integer, or a string with a unit (`"512B"`, `"64KiB"`, `"10MiB"`,
/// `"1GiB"`, and the decimal `"10KB"`, `"5MB"`, `"1GB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub const EXPECTED: &'static str =
        "a number of bytes, or a size like \"64KiB\", \"10MiB\", \"1GB\"";

    pub fn parse(text: &str) -> Option<u64> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let n: u64 = digits.parse().ok()?;
        let per: u64 = match unit.trim() {
            "" | "B" => 1,
            "KB" | "kB" => 1_000,
            "KiB" => 1 << 10,
            "MB" => 1_000_000,
            "MiB" => 1 << 20,
            "GB" => 1_000_000_000,
            "GiB" => 1 << 30,
            _ => return None,
        };
        n.checked_mul(per)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(ByteSize::EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format_args!("{v}: a size is not negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map(ByteSize).ok_or_else(|| {
                    E::custom(format_args!(
                        "invalid size {v:?}: expected {}",
                        ByteSize::EXPECTED
                    ))
                })
            }
        }
        deserializer.deserialize_any(V)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", format_duration(self.0))
    }
}

/// Renders a duration in the largest unit that represents it exactly (`60000ms` → `"1m"`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= per && ms % per == 0 {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(HumanDuration::EXPECTED)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                HumanDuration::parse(v).map(HumanDuration).ok_or_else(|| {
                    E::custom(format_args!(
                        "invalid duration {v:?}: expected {}",
                        HumanDuration::EXPECTED
                    ))
                })
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// A rate written as `<amount>/<period>`: `"50/s"`, `"100/m"`, `"5000/h"`, `"10/d"`, or with
/// an explicit period duration such as `"30/10s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub amount: u64,
    pub period: Duration,
}

impl Rate {
    pub const EXPECTED: &'static str =
        "a rate like \"50/s\", \"100/m\", \"5000/h\" or \"30/10s\" (a positive amount per period)";

    pub fn parse(text: &str) -> Option<Rate> {
        let (amount, period) = text.trim().split_once('/')?;
        let amount: u64 = amount.trim().parse().ok()?;
        let period = period.trim();
        let period = match period {
            "ms" | "s" | "m" | "h" | "d" => HumanDuration::parse(&format!("1{period}"))?,
            _ => HumanDuration::parse(period)?,
        };
        if amount == 0 || period.is_zero() {
            return None;
        }
        Some(Rate { amount, period })
    }

    /// Units per millisecond, as a float (for token refill math).
    pub fn per_ms(&self) -> f64 {
        self.amount as f64 / self.period.as_millis() as f64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let period = format_duration(self.period);
        let period = period
            .strip_prefix('1')
            .filter(|p| !p.starts_with(|c: char| c.is_ascii_digit()));
        match period {
            Some(unit) => write!(f, "{}/{unit}", self.amount),
            None => write!(f, "{}/{}", self.amount, format_duration(self.period)),
        }
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Rate;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(Rate::EXPECTED)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Rate, E> {
                Rate::parse(v).ok_or_else(|| {
                    E::custom(format_args!(
                        "invalid rate {v:?}: expected {}",
                        Rate::EXPECTED
                    ))
                })
            }
        }
        deserializer.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            HumanDuration::parse("250ms"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(HumanDuration::parse("2s"), Some(Duration::from_secs(2)));
        assert_eq!(HumanDuration::parse("1m"), Some(Duration::from_secs(60)));
        assert_eq!(HumanDuration::parse("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(HumanDuration::parse("1d"), Some(Duration::from_secs(86400)));
        assert_eq!(HumanDuration::parse("0s"), Some(Duration::ZERO));
        assert_eq!(HumanDuration::parse("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(
            HumanDuration::parse("1.5s"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            HumanDuration::parse("2h45m10.25s"),
            Some(Duration::from_millis(9_910_250))
        );
        assert_eq!(
            HumanDuration::parse("0.5d"),
            Some(Duration::from_secs(43_200))
        );
        assert_eq!(
            HumanDuration::parse(".5s"),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn sizes_and_compound_durations_reach_the_configuration() {
        let config = crate::control::config::Config::parse(
            r#"
[server]
max_body_bytes = "1MiB"
max_header_bytes = "16KiB"
header_timeout = "1.5s"
[upstreams.u]
servers = ["127.0.0.1:1"]
[[routes]]
name = "r"
path_prefix = "/"
upstream = "u"
read_timeout = "1m30s"
max_body_bytes = 2048
body_key_bytes = "4KiB"
"#,
        )
        .unwrap();
        assert_eq!(config.server.limits.max_body_bytes, 1 << 20);
        assert_eq!(config.server.limits.max_header_bytes, 16 << 10);
        assert_eq!(
            config.server.limits.header_timeout,
            Duration::from_millis(1500)
        );
        assert_eq!(config.routes[0].read_timeout, Duration::from_secs(90));
        assert_eq!(config.routes[0].max_body_bytes, 2048);
        assert_eq!(config.routes[0].body_key_bytes, 4096);
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(ByteSize::parse("65536"), Some(65536));
        assert_eq!(ByteSize::parse("64KiB"), Some(65536));
        assert_eq!(ByteSize::parse("10MiB"), Some(10 << 20));
        assert_eq!(ByteSize::parse("10MB"), Some(10_000_000));
        assert_eq!(ByteSize::parse("1GiB"), Some(1 << 30));
        for bad in ["", "MiB", "1.5MiB", "10 mb", "-1", "99999999999GiB"] {
            assert_eq!(ByteSize::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bad_durations_are_rejected() {
        for bad in [
            "",
            "s",
            "10",
            "1.5ms",
            "0.0001s",
            "1..5s",
            ".s",
            "-1s",
            "1 sec",
            "1w",
            "1m30",
            "99999999999999999999d",
        ] {
            assert_eq!(HumanDuration::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn durations_format_in_the_largest_exact_unit() {
        assert_eq!(format_duration(Duration::from_millis(60_000)), "1m");
        assert_eq!(format_duration(Duration::from_millis(1_500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
    }

    #[test]
    fn rates_parse() {
        let r = Rate::parse("50/s").unwrap();
        assert_eq!((r.amount, r.period), (50, Duration::from_secs(1)));
        let r = Rate::parse("30/10s").unwrap();
        assert_eq!((r.amount, r.period), (30, Duration::from_secs(10)));
        assert_eq!(
            Rate::parse("100/m").unwrap().period,
            Duration::from_secs(60)
        );
        assert_eq!(Rate::parse("50/s").unwrap().to_string(), "50/s");
        assert_eq!(Rate::parse("30/10s").unwrap().to_string(), "30/10s");
    }

    #[test]
    fn bad_rates_are_rejected() {
        for bad in ["", "50", "0/s", "50/0s", "/s", "50/x", "-1/s", "a/s", "50/"] {
            assert_eq!(Rate::parse(bad), None, "{bad:?}");
        }
    }
}

pub use crate::secret::Secret;

/// A secret as written in the file: the value itself, `{ env = "NAME" }` (an environment
/// variable) or `{ file = "/path" }` (a file's content, without its trailing newline).
/// Resolved when the file is loaded; a missing variable or unreadable file is a problem at
/// the secret's TOML path. The value is never shown — also not when it is written in some
/// other shape (`["value"]`, a number): the error says what is expected, never what was
/// found.
#[derive(Debug, Clone)]
pub enum SecretSource {
    Literal(Secret),
    Env(EnvRef),
    File(FileRef),
}

#[derive(Debug, Clone)]
pub struct EnvRef {
    pub env: String,
}

#[derive(Debug, Clone)]
pub struct FileRef {
    pub file: std::path::PathBuf,
}

const SECRET_SHAPE: &str = "a string, { env = \"NAME\" } or { file = \"/path\" }";

impl<'de> Deserialize<'de> for SecretSource {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<SecretSource, D::Error> {
        de.deserialize_any(SecretVisitor)
    }
}

/// Reads only the three accepted shapes; anything else is refused without echoing it.
struct SecretVisitor;

impl<'de> serde::de::Visitor<'de> for SecretVisitor {
    type Value = SecretSource;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(SECRET_SHAPE)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SecretSource, E> {
        Ok(SecretSource::Literal(Secret::new(v)))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<SecretSource, A::Error> {
        use serde::de::Error;
        let refuse = || A::Error::custom(format!("expected {SECRET_SHAPE}"));
        let key: Option<String> = map.next_key()?;
        let source = match key.as_deref() {
            Some("env") => SecretSource::Env(EnvRef {
                env: map.next_value().map_err(|_| refuse())?,
            }),
            Some("file") => SecretSource::File(FileRef {
                file: map.next_value().map_err(|_| refuse())?,
            }),
            _ => return Err(refuse()),
        };
        if map.next_key::<serde::de::IgnoredAny>()?.is_some() {
            return Err(refuse());
        }
        Ok(source)
    }

    // Every other shape is refused without its value (serde's default error quotes numbers).
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<SecretSource, A::Error> {
        Err(serde::de::Error::custom(format!(
            "a list: expected {SECRET_SHAPE}"
        )))
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<SecretSource, E> {
        Err(E::custom(format!("a number: expected {SECRET_SHAPE}")))
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<SecretSource, E> {
        Err(E::custom(format!("a number: expected {SECRET_SHAPE}")))
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<SecretSource, E> {
        Err(E::custom(format!("a number: expected {SECRET_SHAPE}")))
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<SecretSource, E> {
        Err(E::custom(format!("a boolean: expected {SECRET_SHAPE}")))
    }
}

impl SecretSource {
    /// The secret's value, or why it cannot be had (naming the variable or file, never a
    /// value).
    pub fn resolve(&self) -> Result<Secret, String> {
        match self {
            SecretSource::Literal(s) => Ok(s.clone()),
            SecretSource::Env(EnvRef { env }) => match std::env::var(env) {
                Ok(v) if !v.is_empty() => Ok(Secret::new(v)),
                Ok(_) => Err(format!("environment variable {env} is empty")),
                Err(_) => Err(format!("environment variable {env} is not set")),
            },
            SecretSource::File(FileRef { file }) => match std::fs::read_to_string(file) {
                Ok(v) => {
                    let v = v.trim_end_matches(['\n', '\r']);
                    if v.is_empty() {
                        Err(format!("{} is empty", file.display()))
                    } else {
                        Ok(Secret::new(v))
                    }
                }
                Err(e) => Err(format!("cannot read {}: {}", file.display(), e.kind())),
            },
        }
    }

    /// The file a secret is read from, if any (watched for changes).
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            SecretSource::File(FileRef { file }) => Some(file),
            _ => None,
        }
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    #[derive(Deserialize)]
    struct T {
        s: SecretSource,
    }

    fn parse(text: &str) -> Result<SecretSource, String> {
        // The message alone, as the config loader reports it (with a line and column).
        toml::from_str::<T>(text)
            .map(|t| t.s)
            .map_err(|e| e.message().to_owned())
    }

    #[test]
    fn secrets_come_from_the_file_the_environment_or_a_file() {
        assert_eq!(
            parse("s = \"abc\"").unwrap().resolve().unwrap().expose(),
            "abc"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "from-a-file\n").unwrap();
        let src = parse(&format!(
            "s = {{ file = {:?} }}",
            path.display().to_string()
        ))
        .unwrap();
        assert_eq!(src.resolve().unwrap().expose(), "from-a-file");
        assert_eq!(src.file(), Some(path.as_path()));
        let missing = parse("s = { env = \"TURNSTILE_TEST_SURELY_UNSET\" }").unwrap();
        assert!(missing
            .resolve()
            .unwrap_err()
            .contains("TURNSTILE_TEST_SURELY_UNSET"));
        let gone = parse("s = { file = \"/nonexistent/secret\" }").unwrap();
        assert!(gone.resolve().unwrap_err().contains("/nonexistent/secret"));
        assert!(parse("s = { env = \"A\", extra = 1 }").is_err());
        // Any other shape is refused, and the error never shows what was written.
        for odd in [
            "s = [\"hunter2\"]",
            "s = { env = [\"hunter2\"] }",
            "s = { hunter2 = \"x\" }",
            "s = 12345678",
            "s = { file = 7, env = \"hunter2\" }",
        ] {
            let err = parse(odd).unwrap_err();
            assert!(
                !err.contains("hunter2") && !err.contains("12345678"),
                "{odd}: {err}"
            );
            assert!(err.contains("{ env = \"NAME\" }"), "{odd}: {err}");
        }
        // Debug never shows a value.
        assert!(!format!("{:?}", parse("s = \"hunter2\"").unwrap()).contains("hunter2"));
    }
}
