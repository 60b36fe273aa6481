//! When Sentinel's connection is given up on because its calls time out.
//!
//! A primary that froze while the sentinels promoted a replica answers nothing: the gateway
//! must leave it quickly, and asks the sentinels again after a second timeout in a row. But on
//! a machine whose CPUs are taken (an autoscaler starting an instance when load is high) calls
//! time out because this process was not running, with Redis healthy; dropping the connection
//! then made every request behind it wait for a new one made through the sentinels, and a
//! `fail_closed` route refused them. So a timeout counts toward leaving the primary only when
//! this process was running ([`patient::starved_within`]): a timeout while starved is
//! excused — unless nothing at all has been answered for [`SILENT_AT_MOST`], which a healthy
//! Redis on a starved machine does not do, and a frozen one does.

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

impl TimeoutRun {
    /// A call timed out: whether to give the connection up now (the run starts again).
    pub fn timed_out(&self) -> bool {
        self.timed_out_at(patient::now_ms(), patient::starved_within(STARVED_WINDOW))
    }

    /// [`Self::timed_out`] at `now` (ms), the process `starved` lately or not.
    fn timed_out_at(&self, now: u64, starved: bool) -> bool {
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
        let leave = counted >= IN_A_ROW || silent;
        if leave {
            self.answered();
        }
        leave
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

    const SILENCE: u64 = SILENT_AT_MOST.as_millis() as u64;

    #[test]
    fn two_timeouts_in_a_row_leave_and_an_answer_between_them_does_not() {
        let run = TimeoutRun::default();
        assert!(!run.timed_out_at(1_000, false));
        run.answered();
        assert!(!run.timed_out_at(1_010, false));
        assert!(run.timed_out_at(1_020, false), "the second in a row");
        assert!(!run.timed_out_at(1_030, false), "counted again from none");
    }

    #[test]
    fn a_starved_process_leaves_only_after_a_silence() {
        let run = TimeoutRun::default();
        for t in 0..10 {
            assert!(
                !run.timed_out_at(1_000 + t * 20, true),
                "excused: the process was starved"
            );
        }
        run.answered();
        assert!(!run.timed_out_at(2_000, true));
        assert!(!run.timed_out_at(2_000 + SILENCE - 1, true));
        assert!(
            run.timed_out_at(2_000 + SILENCE, true),
            "nothing answered for a second"
        );
    }

    #[test]
    fn one_timeout_while_running_and_one_while_starved_do_not_leave() {
        let run = TimeoutRun::default();
        assert!(!run.timed_out_at(1_000, false));
        assert!(!run.timed_out_at(1_020, true));
        assert!(run.timed_out_at(1_040, false), "two of a running process");
    }
}
