//! When Sentinel's connection is given up on because its calls time out.
//!
//! A primary that froze while the sentinels promoted a replica answers nothing: the gateway
//! must leave it quickly, so after a second timeout in a row it asks the sentinels which node
//! is the primary now. But on a machine whose CPUs are taken (an autoscaler starting an
//! instance when load is high) calls time out because this process was not running, with
//! Redis healthy; dropping the connection then made every request behind it wait for a new
//! one made through the sentinels, and a `fail_closed` route refused them. So:
//!
//! - a timeout counts only when this process was running ([`patient::starved_within`]): a
//!   timeout while starved is excused;
//! - two counted in a row do not drop the connection: they have the sentinels asked
//!   ([`Verdict::Ask`], `sentinel_ask.rs`), and the connection is left only if they name
//!   another node — a healthy primary behind a starved connection task keeps its connection;
//! - nothing at all answered for [`SILENT_AT_MOST`] leaves it whatever the sentinels say
//!   ([`Verdict::Leave`]): a healthy Redis on a starved machine does not stay silent that
//!   long, a frozen one or a connection the network lost does.

use crate::limit::store::redis::patient;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Timeouts in a row (of a running process) that leave the primary.
const IN_A_ROW: u32 = 2;
/// A starved process's timeouts that went on this long with no answer leave it too.
pub const SILENT_AT_MOST: Duration = Duration::from_secs(1);
/// A timer that fired late within this long before a timeout excuses it.
const STARVED_WINDOW: Duration = Duration::from_millis(500);

/// The calls that timed out since the last one answered.
#[derive(Default)]
pub struct TimeoutRun {
    /// Timeouts while the process was running.
    running: AtomicU32,
    /// When the first timeout of the run happened (ms on `patient`'s clock; 0 = no run).
    since_ms: AtomicU64,
}

/// What a timeout calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing: the next call may well be answered.
    Stay,
    /// Ask the sentinels which node is the primary; leave the connection if it moved.
    Ask,
    /// Leave the connection: nothing was answered for [`SILENT_AT_MOST`].
    Leave,
}

impl TimeoutRun {
    /// A call timed out: what to do about the connection (after `Ask` or `Leave`, the run
    /// starts again).
    pub fn timed_out(&self) -> Verdict {
        self.timed_out_at(patient::now_ms(), patient::starved_within(STARVED_WINDOW))
    }

    /// [`Self::timed_out`] at `now` (ms), the process `starved` lately or not.
    fn timed_out_at(&self, now: u64, starved: bool) -> Verdict {
        let since =
            match self
                .since_ms
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => now,
                Err(since) => since,
            };
        let counted = if starved {
            self.running.load(Ordering::Relaxed)
        } else {
            self.running.fetch_add(1, Ordering::Relaxed) + 1
        };
        let silent = now.saturating_sub(since) >= SILENT_AT_MOST.as_millis() as u64;
        let verdict = match (silent, counted >= IN_A_ROW) {
            (true, _) => Verdict::Leave,
            (false, true) => Verdict::Ask,
            (false, false) => return Verdict::Stay,
        };
        // The run starts again, but for its first timeout's time: a silence goes on counting.
        self.running.store(0, Ordering::Relaxed);
        if silent {
            self.since_ms.store(0, Ordering::Relaxed);
        }
        verdict
    }

    /// A call was answered: the run is over (two loads when there was none).
    pub fn answered(&self) {
        if self.since_ms.load(Ordering::Relaxed) != 0 {
            self.since_ms.store(0, Ordering::Relaxed);
        }
        if self.running.load(Ordering::Relaxed) != 0 {
            self.running.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Verdict::{Ask, Leave, Stay};

    const SILENCE: u64 = SILENT_AT_MOST.as_millis() as u64;

    #[test]
    fn two_timeouts_in_a_row_ask_and_an_answer_between_them_does_not() {
        let run = TimeoutRun::default();
        assert_eq!(run.timed_out_at(1_000, false), Stay);
        run.answered();
        assert_eq!(run.timed_out_at(1_010, false), Stay);
        assert_eq!(run.timed_out_at(1_020, false), Ask, "the second in a row");
        assert_eq!(
            run.timed_out_at(1_030, false),
            Stay,
            "counted again from none"
        );
    }

    #[test]
    fn a_starved_process_leaves_only_after_a_silence() {
        let run = TimeoutRun::default();
        for t in 0..10 {
            assert_eq!(
                run.timed_out_at(1_000 + t * 20, true),
                Stay,
                "excused: the process was starved"
            );
        }
        run.answered();
        assert_eq!(run.timed_out_at(2_000, true), Stay);
        assert_eq!(run.timed_out_at(2_000 + SILENCE - 1, true), Stay);
        assert_eq!(
            run.timed_out_at(2_000 + SILENCE, true),
            Leave,
            "nothing answered for a second"
        );
        assert_eq!(run.timed_out_at(2_000 + SILENCE + 1, true), Stay, "again");
    }

    #[test]
    fn asking_does_not_restart_the_silence() {
        let run = TimeoutRun::default();
        let mut asked = 0;
        for t in 0..SILENCE / 20 {
            match run.timed_out_at(1_000 + t * 20, false) {
                Ask => asked += 1,
                Stay => {}
                Leave => panic!("left before the silence"),
            }
        }
        assert_eq!(
            asked,
            SILENCE / 40,
            "every second timeout of a running process asks"
        );
        assert_eq!(run.timed_out_at(1_000 + SILENCE, false), Leave);
    }

    #[test]
    fn one_timeout_while_running_and_one_while_starved_do_not_ask() {
        let run = TimeoutRun::default();
        assert_eq!(run.timed_out_at(1_000, false), Stay);
        assert_eq!(run.timed_out_at(1_020, true), Stay);
        assert_eq!(
            run.timed_out_at(1_040, false),
            Ask,
            "two of a running process"
        );
    }
}
