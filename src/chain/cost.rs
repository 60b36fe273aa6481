//! What a request costs when the route or the response says so.
//!
//! - `cost_from_request = "header:NAME"`: a caller trusted to declare its cost sends it, a
//!   whole number from 1 to `max_cost`; anything else (absent, twice, not a number, out of
//!   range) is a 400 — the declared cost is what the limits count.
//! - `cost_from_response = "header:NAME"` on a plan limit: the request reserved units of it
//!   when admitted — the bound it states (the route's `reserve_from`), else the limit's
//!   `reserve`, else the route's cost ([`ResponseCost::reservation`]); the response's header
//!   says what it really cost, and the difference is charged (`limit/store`'s `charge`). The rule for headers
//!   that say nothing usable: absent, given twice, or not a whole number → the estimate
//!   stands (counted as `missing` / `invalid`); above `max_response_cost` → that maximum is
//!   charged (`capped`).

use http::{HeaderMap, HeaderName};
use std::sync::Arc;

/// A plan limit charged from the response (`cost_from_response`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseCost {
    /// The limit's name.
    pub limit: Arc<str>,
    /// The response header that says what the request cost.
    pub header: HeaderName,
    /// The most one response charges (`max_response_cost`).
    pub max: u64,
    /// What a request reserves of the limit when admitted (`reserve`), unless it states its
    /// own bound (the route's `reserve_from`); `None`: the route's cost.
    pub reserve: Option<u64>,
}

impl ResponseCost {
    /// The units a request reserves of this limit: the bound it states (`declared`, at least
    /// 1, at most what one response may charge), else the limit's `reserve`, else `cost`.
    pub fn reservation(&self, declared: Option<u64>, cost: u64) -> u64 {
        match declared {
            Some(n) => n.clamp(1, self.max),
            None => self.reserve.unwrap_or(cost),
        }
    }
}

/// The cost a request declares in `name`, 1 to `max`.
pub fn declared(headers: &HeaderMap, name: &HeaderName, max: u64) -> Result<u64, String> {
    let mut values = headers.get_all(name).iter();
    let value = match (values.next(), values.next()) {
        (Some(v), None) => v,
        (None, _) => return Err(format!("this route needs the request's cost in {name}")),
        (Some(_), Some(_)) => return Err(format!("{name} is given more than once")),
    };
    std::str::from_utf8(value.as_bytes())
        .ok()
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| format!("{name} must be a whole number from 1 to {max}"))
}

/// What a response's header made of a charged limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// The header's value, charged as it is.
    Charged(u64),
    /// Above the limit's `max_response_cost`: that maximum is charged.
    Capped(u64),
    /// No header: the estimate stands.
    Missing,
    /// Twice, or not a whole number: the estimate stands.
    Invalid,
}

impl Reported {
    pub fn read(headers: &HeaderMap, name: &HeaderName, max: u64) -> Reported {
        let mut values = headers.get_all(name).iter();
        let value = match (values.next(), values.next()) {
            (None, _) => return Reported::Missing,
            (Some(v), None) => v,
            (Some(_), Some(_)) => return Reported::Invalid,
        };
        let number = std::str::from_utf8(value.as_bytes())
            .ok()
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
        match number.map(|v| v.parse::<u64>()) {
            Some(Ok(n)) if n <= max => Reported::Charged(n),
            // A number too large for u64 is above any maximum too.
            Some(_) => Reported::Capped(max),
            None => Reported::Invalid,
        }
    }

    /// The units to count in place of `estimate` (what the request was counted at).
    pub fn actual(self, estimate: u64) -> u64 {
        match self {
            Reported::Charged(n) | Reported::Capped(n) => n,
            Reported::Missing | Reported::Invalid => estimate,
        }
    }

    /// The label this outcome is counted under.
    pub fn as_str(self) -> &'static str {
        match self {
            Reported::Charged(_) => "charged",
            Reported::Capped(_) => "capped",
            Reported::Missing => "missing",
            Reported::Invalid => "invalid",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-tokens-used", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn every_header_has_one_stated_reading() {
        let name = HeaderName::from_static("x-tokens-used");
        let read = |v: &[&str]| Reported::read(&headers(v), &name, 1000);
        assert_eq!(read(&["120"]), Reported::Charged(120));
        assert_eq!(read(&[" 7 "]), Reported::Charged(7));
        assert_eq!(read(&["0"]), Reported::Charged(0));
        assert_eq!(read(&["5000"]), Reported::Capped(1000));
        assert_eq!(read(&["99999999999999999999999"]), Reported::Capped(1000));
        assert_eq!(read(&[]), Reported::Missing);
        for bad in [&["-3"][..], &["1.5"], &["abc"], &[""], &["1", "2"]] {
            assert_eq!(read(bad), Reported::Invalid, "{bad:?}");
        }
        assert_eq!(Reported::Missing.actual(4), 4);
        assert_eq!(Reported::Capped(1000).actual(4), 1000);
    }

    #[test]
    fn a_reservation_is_the_stated_bound_within_what_a_response_may_charge() {
        let limit = ResponseCost {
            limit: Arc::from("tokens"),
            header: HeaderName::from_static("x-tokens-used"),
            max: 4000,
            reserve: Some(500),
        };
        assert_eq!(limit.reservation(Some(256), 1), 256);
        assert_eq!(limit.reservation(Some(0), 1), 1);
        assert_eq!(limit.reservation(Some(u64::MAX), 1), 4000);
        assert_eq!(limit.reservation(None, 1), 500);
        let unreserved = ResponseCost {
            reserve: None,
            ..limit
        };
        assert_eq!(unreserved.reservation(None, 3), 3);
    }

    #[test]
    fn a_declared_cost_is_one_whole_number_in_range() {
        let name = HeaderName::from_static("x-tokens-used");
        assert_eq!(declared(&headers(&["3"]), &name, 10), Ok(3));
        for bad in [&[][..], &["0"], &["11"], &["x"], &["1", "1"], &["-1"]] {
            assert!(declared(&headers(bad), &name, 10).is_err(), "{bad:?}");
        }
    }
}
