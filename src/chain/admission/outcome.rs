//! How a limiter step ended, per policy and per request.

use crate::limit::store::FailureMode;

/// How a limiter step ended: per policy (counted in `turnstile_limiter_decisions_total`), and
/// for the request as a whole (the access log's `decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    /// No limit applies to the request (or none was reached: it was refused before).
    #[default]
    NotLimited,
    /// Refused by authentication, before any limit.
    Unauthorized,
    Allowed,
    Rejected,
    /// Store failed, route fails open: admitted without a decision.
    DegradedOpen,
    /// Store failed, route fails closed: 503.
    DegradedClosed,
    /// Store failed, decided by the in-process fallback.
    LocalFallback,
    /// A dry-run (shadow) limit that would have rejected the request.
    ShadowRejected,
    /// Admitted by the limits, then shed: its upstream pool was at its concurrency limit.
    Shed,
    /// An exemption (by address or client) skipped the limit: no decision was asked for.
    Exempt,
    /// Admitted, and held by a leaky bucket until its turn.
    Delayed,
}

impl Outcome {
    /// The outcomes of a limit's decision (what metrics count per policy).
    pub const DECISIONS: [Outcome; 7] = [
        Outcome::Allowed,
        Outcome::Rejected,
        Outcome::DegradedOpen,
        Outcome::DegradedClosed,
        Outcome::LocalFallback,
        Outcome::ShadowRejected,
        Outcome::Exempt,
    ];

    /// This outcome's place in [`DECISIONS`](Self::DECISIONS), if it is a decision's.
    pub fn decision_index(self) -> Option<usize> {
        Outcome::DECISIONS.iter().position(|o| *o == self)
    }

    /// The outcome of one limit's decision.
    pub fn of(allowed: bool, shadow: bool) -> Outcome {
        match (allowed, shadow) {
            (true, _) => Outcome::Allowed,
            (false, false) => Outcome::Rejected,
            (false, true) => Outcome::ShadowRejected,
        }
    }

    /// What the route's failure mode made of a decision the store could not take.
    pub fn degraded(mode: FailureMode) -> Outcome {
        match mode {
            FailureMode::FailOpen => Outcome::DegradedOpen,
            FailureMode::FailClosed => Outcome::DegradedClosed,
            FailureMode::Local => Outcome::LocalFallback,
        }
    }

    /// Every outcome (the test `all_lists_every_outcome` fails to compile when one is added
    /// without it).
    pub const ALL: [Outcome; 11] = [
        Outcome::NotLimited,
        Outcome::Unauthorized,
        Outcome::Allowed,
        Outcome::Rejected,
        Outcome::DegradedOpen,
        Outcome::DegradedClosed,
        Outcome::LocalFallback,
        Outcome::ShadowRejected,
        Outcome::Shed,
        Outcome::Exempt,
        Outcome::Delayed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::NotLimited => "not_limited",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Allowed => "allowed",
            Outcome::Rejected => "rejected",
            Outcome::DegradedOpen => "degraded_open",
            Outcome::DegradedClosed => "degraded_closed",
            Outcome::LocalFallback => "local_fallback",
            Outcome::ShadowRejected => "shadow_rejected",
            Outcome::Shed => "shed",
            Outcome::Exempt => "exempt",
            Outcome::Delayed => "delayed",
        }
    }
}

#[cfg(test)]
mod all_tests {
    use super::Outcome;

    #[test]
    fn all_lists_every_outcome() {
        // Exhaustive: a new variant is a compile error here until it has a place.
        let place = |o: Outcome| match o {
            Outcome::NotLimited => 0,
            Outcome::Unauthorized => 1,
            Outcome::Allowed => 2,
            Outcome::Rejected => 3,
            Outcome::DegradedOpen => 4,
            Outcome::DegradedClosed => 5,
            Outcome::LocalFallback => 6,
            Outcome::ShadowRejected => 7,
            Outcome::Shed => 8,
            Outcome::Exempt => 9,
            Outcome::Delayed => 10,
        };
        let places: Vec<usize> = Outcome::ALL.iter().map(|o| place(*o)).collect();
        assert_eq!(places, (0..Outcome::ALL.len()).collect::<Vec<_>>());
    }
}
