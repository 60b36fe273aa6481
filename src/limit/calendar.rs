//! Calendar windows: a fixed window that starts at local midnight, on Monday, or on the
//! first of the month, in a time zone (IANA names; UTC by default). Boundaries come from
//! the time zone database, so a window across a daylight-saving change is 23 or 25 hours
//! long, and a month is as long as that month.
//!
//! Times are Unix milliseconds. The Redis store decides on Redis's clock: the gateway sends
//! the boundaries around its own now (`around`), and the script picks the window its clock
//! falls in — the two clocks may disagree at a boundary without a request counting in a
//! window neither of them is in.

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use std::fmt;
use std::hash::{Hash, Hasher};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Day,
    Week,
    Month,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
        }
    }

    /// A typical length, for `RateLimit-Policy`'s `w` (a month: 30 days).
    pub fn nominal_ms(self) -> u64 {
        match self {
            Unit::Day => 86_400_000,
            Unit::Week => 7 * 86_400_000,
            Unit::Month => 30 * 86_400_000,
        }
    }
}

/// A calendar unit in a time zone.
#[derive(Clone)]
pub struct Calendar {
    pub unit: Unit,
    /// The IANA name (`"UTC"`, `"Europe/Berlin"`).
    pub zone: String,
    tz: TimeZone,
}

impl Calendar {
    pub fn new(unit: Unit, zone: &str) -> Result<Calendar, String> {
        let tz = TimeZone::get(zone).map_err(|_| {
            format!("{zone:?} is not a time zone (an IANA name like \"Europe/Berlin\")")
        })?;
        Ok(Calendar {
            unit,
            zone: zone.to_owned(),
            tz,
        })
    }

    /// `"1 day"`, `"1 week"`, `"1 month"` (also `"day"`, `"month"`): the unit, if `text` is
    /// a calendar window.
    pub fn parse_unit(text: &str) -> Option<Unit> {
        let text = text.trim();
        let word = text.strip_prefix('1').map_or(text, str::trim_start);
        match word {
            "day" => Some(Unit::Day),
            "week" => Some(Unit::Week),
            "month" => Some(Unit::Month),
            _ => None,
        }
    }

    /// The window containing `unix_ms`: `[start, end)`.
    pub fn window(&self, unix_ms: u64) -> (u64, u64) {
        let start = self.start_of(unix_ms);
        (start, self.next(start))
    }

    /// The boundaries around `unix_ms`: the previous window's start, this window's start
    /// and end, the next window's end.
    pub fn around(&self, unix_ms: u64) -> [u64; 4] {
        let (start, end) = self.window(unix_ms);
        let previous = self.start_of(start.saturating_sub(1));
        [previous, start, end, self.next(end)]
    }

    fn start_of(&self, unix_ms: u64) -> u64 {
        let ts = Timestamp::from_millisecond(unix_ms.min(i64::MAX as u64) as i64)
            .unwrap_or(Timestamp::MAX);
        let zoned = ts.to_zoned_datetime(self.tz.clone());
        let day = zoned.start_of_day().unwrap_or(zoned);
        let start = match self.unit {
            Unit::Day => Ok(day),
            Unit::Week => {
                let back = i64::from(day.weekday().to_monday_zero_offset());
                day.checked_sub(back.days()).and_then(|d| d.start_of_day())
            }
            Unit::Month => day.first_of_month().and_then(|d| d.start_of_day()),
        };
        start.map_or(unix_ms, |z| z.timestamp().as_millisecond().max(0) as u64)
    }

    fn next(&self, start: u64) -> u64 {
        let ts = Timestamp::from_millisecond(start.min(i64::MAX as u64) as i64)
            .unwrap_or(Timestamp::MAX);
        let zoned = ts.to_zoned_datetime(self.tz.clone());
        let next = match self.unit {
            Unit::Day => zoned.checked_add(1.day()),
            Unit::Week => zoned.checked_add(1.week()),
            Unit::Month => zoned.checked_add(1.month()),
        };
        next.and_then(|z| z.start_of_day())
            .map_or(u64::MAX, |z| z.timestamp().as_millisecond().max(0) as u64)
    }
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1 {} ({})", self.unit.as_str(), self.zone)
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.unit == other.unit && self.zone == other.zone
    }
}

impl Eq for Calendar {}

impl Hash for Calendar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.unit.hash(state);
        self.zone.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> u64 {
        text.parse::<Timestamp>().unwrap().as_millisecond() as u64
    }

    #[test]
    fn months_are_as_long_as_they_are_and_start_at_local_midnight() {
        let berlin = Calendar::new(Unit::Month, "Europe/Berlin").unwrap();
        let (start, end) = berlin.window(ms("2026-02-14T12:00:00Z"));
        assert_eq!(
            start,
            ms("2026-01-31T23:00:00Z"),
            "1 Feb, 00:00 in Berlin (CET)"
        );
        assert_eq!(end, ms("2026-02-28T23:00:00Z"), "1 Mar, 00:00 in Berlin");
        // March 2026 holds the change to summer time: 31 days minus an hour.
        let (start, end) = berlin.window(ms("2026-03-15T00:00:00Z"));
        assert_eq!(end - start, 31 * 86_400_000 - 3_600_000);
        let utc = Calendar::new(Unit::Month, "UTC").unwrap();
        assert_eq!(
            utc.window(ms("2026-12-31T23:59:59.999Z")).1,
            ms("2027-01-01T00:00:00Z")
        );
    }

    #[test]
    fn days_across_a_daylight_saving_change_are_23_or_25_hours() {
        let ny = Calendar::new(Unit::Day, "America/New_York").unwrap();
        let (start, end) = ny.window(ms("2026-03-08T12:00:00Z"));
        assert_eq!(end - start, 23 * 3_600_000);
        let (start, end) = ny.window(ms("2026-11-01T12:00:00Z"));
        assert_eq!(end - start, 25 * 3_600_000);
        let [previous, s, e, next] = ny.around(ms("2026-11-01T12:00:00Z"));
        assert_eq!((s, e), (start, end));
        assert_eq!(s - previous, 24 * 3_600_000);
        assert_eq!(next - e, 24 * 3_600_000);
    }

    #[test]
    fn weeks_start_on_monday() {
        let utc = Calendar::new(Unit::Week, "UTC").unwrap();
        // 2026-12-02 is a Wednesday.
        let (start, end) = utc.window(ms("2026-12-02T10:00:00Z"));
        assert_eq!(start, ms("2026-11-30T00:00:00Z"));
        assert_eq!(end, ms("2026-12-07T00:00:00Z"));
        assert_eq!(Calendar::parse_unit("1 month"), Some(Unit::Month));
        assert_eq!(Calendar::parse_unit("week"), Some(Unit::Week));
        assert_eq!(Calendar::parse_unit("1d"), None);
        assert!(Calendar::new(Unit::Day, "Mars/Olympus").is_err());
    }
}
