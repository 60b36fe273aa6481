//! What goes in and out of the lease table: keys, what `take` decided, the renewal to send and
//! the store's answer, what a shutdown gives back.

use crate::limit::{Policy, Verdict};
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::futures::OwnedNotified;

/// Leases are per client and route (a client-scoped limit leased from two routes is simply
/// leased twice: both grants are counted in Redis).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseKey {
    pub client: Arc<str>,
    pub route: Arc<str>,
}

/// What [`LeaseTable::take`] decided.
pub enum FromLease {
    /// Decided from the local lease (or a remembered refusal): no store call.
    Local(Verdict),
    /// Ask the store ([`Ask`]), then [`settle`](LeaseTable::settle) or
    /// [`renewal_failed`](LeaseTable::renewal_failed).
    Ask(Ask),
    /// Another request of this key is renewing: await this, then take again.
    Wait(Pin<Box<OwnedNotified>>),
    /// The table is full: decide this request with a per-request store call.
    Untracked,
    /// A renewal of this key has been in flight for longer than the store timeout: the
    /// store is stalling. Decide by the route's failure mode, without another store call
    /// (which would only queue behind it, and spend units when the store wakes up).
    Stalled,
}

/// A renewal to send to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// Units the request must get (its cost less what it took from the current lease).
    pub need: u64,
    /// Units to reserve (at least `need`).
    pub want: u64,
    /// Units of the current lease the request holds (given back locally if refused).
    pub held: u64,
    /// A lapsed lease to give back first: its units, and each limit's window start.
    pub give_back: u64,
    pub give_back_starts: Vec<u64>,
    /// Local time the call was sent.
    pub sent_at: u64,
}

/// One limit in the store's answer to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantWindow {
    pub remaining: u64,
    pub reset_ms: u64,
    pub retry_after_ms: u64,
    pub start: u64,
}

/// The store's answer to a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Units reserved (0: refused).
    pub granted: u64,
    /// The first limit that could not spare `need`.
    pub rejected: Option<usize>,
    pub windows: Vec<GrantWindow>,
}

/// Unspent units of one live lease, for a graceful shutdown to give back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unspent {
    pub key: LeaseKey,
    pub policies: Vec<Policy>,
    pub starts: Vec<u64>,
    pub units: u64,
}
