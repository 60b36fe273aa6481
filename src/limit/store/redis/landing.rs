//! A check taking concurrency slots that queued for a batch (`batch.rs`) holds a [`Landing`]
//! for as long as a call may carry it; the release of its slots, should its request give up
//! before the answer (`store/settle.rs`), waits for the matching [`Landed`]. Sent without it,
//! the release could reach Redis while the check's batch was still being written — before
//! the check — and the slot the check then takes would stay until its TTL. A check sent at
//! once holds none: what is sent after it on the connection reaches Redis after it.

use std::sync::Arc;
use tokio::sync::oneshot;

/// Held by a queued check taking concurrency slots, for as long as a call may carry it (a
/// check split across Cluster slots: one clone per call).
#[derive(Clone)]
pub struct Landing {
    _ends_when_dropped: Arc<oneshot::Sender<()>>,
}

/// Ends once the check holding its [`Landing`] can no longer reach Redis after a call sent
/// now on the same connection: every call carrying it ended, or it was dropped unsent.
pub struct Landed(oneshot::Receiver<()>);

/// A check's landing, and what waits for it.
pub fn landing() -> (Landing, Landed) {
    let (tx, rx) = oneshot::channel();
    let landing = Landing {
        _ends_when_dropped: Arc::new(tx),
    };
    (landing, Landed(rx))
}

impl Landed {
    /// Waits for the landing's end (its sender is never used: it ends by being dropped).
    pub async fn wait(self) {
        let _ = self.0.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::store::redis::batch::{
        Answer, Batcher, Enter, Kind, SendBatch, Sending, Sent,
    };
    use redis::{Cmd, Value};
    use std::sync::Mutex;

    /// Holds every call until let go, then answers each member with "1".
    #[derive(Clone)]
    struct Gate {
        open: Arc<tokio::sync::Semaphore>,
        calls: Arc<Mutex<usize>>,
    }

    impl Default for Gate {
        fn default() -> Gate {
            Gate {
                open: Arc::new(tokio::sync::Semaphore::new(0)),
                calls: Arc::default(),
            }
        }
    }

    impl SendBatch for Gate {
        async fn send(&self, cmd: &Cmd, what: Sending) -> Sent {
            *self.calls.lock().unwrap() += 1;
            let _ = self.open.acquire().await.map(|p| p.forget());
            if !what.is_batch() {
                return Sent::Replied(Value::BulkString(b"1".to_vec()));
            }
            let members = number(cmd, 3 + number(cmd, 2));
            Sent::Replied(Value::Array(vec![
                Value::BulkString(b"1".to_vec());
                members
            ]))
        }
    }

    /// The `at`th argument of `cmd`, a number.
    fn number(cmd: &Cmd, at: usize) -> usize {
        match cmd.args_iter().nth(at) {
            Some(redis::Arg::Simple(bytes)) => String::from_utf8_lossy(bytes).parse().unwrap(),
            _ => panic!("no argument {at}"),
        }
    }

    /// A one-key decision's call, as the batcher receives it.
    fn check() -> Cmd {
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA").arg("sha").arg(1).arg("k").arg("1");
        cmd
    }

    /// A queued check's landing ends only when no call can carry it any more: not while its
    /// batch is in flight (even after its request gave up), but once that call ended; and at
    /// once for a check whose request gave up before any call took it (dropped unsent).
    #[tokio::test]
    async fn a_queued_checks_landing_ends_with_the_call_that_carried_it() {
        let batcher = Arc::new(Batcher::new("bsha", (64, 1), Arc::default()));
        let gate = Gate::default();
        let enter = |held| batcher.enter(check(), (1, Kind::Decide), held, &gate);
        let Enter::Idle(_, first) = enter(None) else {
            panic!("the first call finds the place free");
        };
        // Two checks queue behind it, each with its landing.
        let (held, carried) = landing();
        let Enter::Queued(answer) = enter(Some(held)) else {
            panic!("queued while the place is taken");
        };
        let (held2, _) = landing();
        let Enter::Queued(answer2) = enter(Some(held2)) else {
            panic!("queued while the place is taken");
        };
        let mut carried = Box::pin(carried.wait());
        // The place comes back: a task takes the queue and sends it as one batch, which the
        // gate holds in flight.
        drop(first);
        while *gate.calls.lock().unwrap() == 0 {
            tokio::task::yield_now().await;
        }
        // The request gives up; its batch is still in flight, so its landing has not ended.
        drop(answer);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(futures::poll!(carried.as_mut()).is_pending());
        gate.open.add_permits(1);
        carried.await;
        assert!(matches!(answer2.await, Ok(Answer::Decided(_))));

        // A check whose request gave up while it waited is dropped unsent: its landing ends
        // when the queue moves on, without a call for it.
        let Enter::Idle(_, first) = enter(None) else {
            panic!("the place is free again");
        };
        let (held, unsent) = landing();
        let Enter::Queued(answer) = enter(Some(held)) else {
            panic!("queued while the place is taken");
        };
        drop(answer);
        let mut unsent = Box::pin(unsent.wait());
        assert!(futures::poll!(unsent.as_mut()).is_pending());
        drop(first);
        unsent.await;
        assert_eq!(
            *gate.calls.lock().unwrap(),
            1,
            "the dropped check was not sent"
        );
    }
}
