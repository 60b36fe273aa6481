//! One key's lease as this instance holds it: what is left, until when, the windows it
//! came from, a remembered refusal, a renewal in flight, the key's recent rate.

use crate::limit::{Decision, Policy, Verdict};
use std::sync::Arc;
use tokio::sync::Notify;

/// One limit's window as the store last reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Window {
    /// Start of the window in the store's clock (what give-backs name).
    pub(super) start: u64,
    /// When it ends, in this process's clock (early by the call's round trip).
    pub(super) ends_at: u64,
    /// Units the store had left after the last grant (other instances may take them since).
    pub(super) remaining: u64,
}

pub(super) struct Held {
    /// What the lease was taken against: a reload that changes the limits starts afresh.
    pub(super) policies: Vec<Policy>,
    /// Units granted and not yet spent.
    pub(super) left: u64,
    /// `left` may be spent until this local time.
    pub(super) expires_at: u64,
    pub(super) windows: Vec<Window>,
    /// The store refused: (index of the refusing limit, local time until which to refuse).
    pub(super) refused: Option<(usize, u64)>,
    /// Unspent units of a lease whose window ended, to give back with the next renewal.
    pub(super) lapsed: u64,
    pub(super) lapsed_starts: Vec<u64>,
    /// Set while a renewal is in flight.
    pub(super) renewing: Option<InFlight>,
    /// Moving average of units spent per millisecond, and what was spent since `last_ask`.
    pub(super) rate: f64,
    pub(super) spent: u64,
    pub(super) last_ask: u64,
}

impl Held {
    pub(super) fn new(policies: &[Policy]) -> Held {
        Held {
            policies: policies.to_vec(),
            left: 0,
            expires_at: 0,
            windows: Vec::new(),
            refused: None,
            lapsed: 0,
            lapsed_starts: Vec::new(),
            renewing: None,
            rate: 0.0,
            spent: 0,
            last_ask: 0,
        }
    }

    /// Whether `grant` is for the windows this lease is of.
    pub(super) fn same_windows(&self, grant: &super::types::Grant) -> bool {
        self.windows.len() == grant.windows.len()
            && self
                .windows
                .iter()
                .zip(&grant.windows)
                .all(|(w, g)| w.start == g.start)
    }

    /// Takes `grant`'s windows, measured from `sent_at` (before the call: early by its
    /// round trip); returns whether they are the windows the lease was of.
    pub(super) fn take_windows(&mut self, grant: &super::types::Grant, sent_at: u64) -> bool {
        let same = self.same_windows(grant);
        self.windows = grant
            .windows
            .iter()
            .map(|g| Window {
                start: g.start,
                ends_at: sent_at.saturating_add(g.reset_ms),
                remaining: g.remaining,
            })
            .collect();
        self.expires_at = self.windows.iter().map(|w| w.ends_at).min().unwrap_or(0);
        same
    }

    /// Moves an expired lease's units to `lapsed` (to be given back).
    pub(super) fn lapse(&mut self) {
        if self.left > 0 {
            self.lapsed = self.left;
            self.lapsed_starts = self.windows.iter().map(|w| w.start).collect();
            self.left = 0;
        }
    }

    pub(super) fn verdict(&self, now: u64, refused: Option<(usize, u64)>) -> Verdict {
        let decisions = self
            .policies
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let w = self.windows.get(i).copied().unwrap_or_default();
                let blocked = refused.filter(|(by, _)| *by == i);
                Decision {
                    allowed: blocked.is_none(),
                    limit: p.capacity(),
                    remaining: match blocked {
                        Some(_) => 0,
                        None => w.remaining.saturating_add(self.left),
                    },
                    reset_ms: w.ends_at.saturating_sub(now),
                    retry_after_ms: blocked
                        .map_or(0, |(_, until)| until.saturating_sub(now).max(1)),
                }
            })
            .collect();
        Verdict {
            admitted: refused.is_none(),
            decisions,
            at_ms: now,
            from_lease: true,
        }
    }
}

/// A renewal in flight.
pub(super) struct InFlight {
    /// Notified when it settles (or is abandoned).
    pub(super) settled: Arc<Notify>,
    /// Local time after which it is overdue: sent more than the store timeout ago.
    pub(super) overdue_at: u64,
}
