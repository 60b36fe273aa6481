//! Opportunistic batching of decisions, per connection (per Cluster node): while
//! `store.batch_in_flight` calls are in flight, the decisions that arrive wait here; when one
//! returns, all of them (up to `store.batch_max`) go as one `batch.lua` call that decides
//! each in arrival order, on one `TIME`. A connection with fewer calls in flight sends a
//! decision at once, as its own `check.lua` call, so batching adds no wait: batches only
//! form under load, and grow with it. The charges of responses that reported their cost,
//! the refunds of shed requests, the releases of concurrency slots and quota questions
//! ([`Kind`]) take the same way, so a batch carries them too.
//!
//! A queued check taking concurrency slots holds a [`Landing`] (`landing.rs`) until no call
//! can carry it any more: the release of its slots, should its request give up before the
//! answer, waits for that, so it never reaches Redis before the check.
//!
//! The request whose call finds a free place sends it itself ([`Batcher::enter`] →
//! [`Enter::Idle`]), keeping its place until its reply; decisions arriving while every place
//! is taken queue. When a place is given back (replied, or dropped at the request's timeout)
//! and some wait, a task takes it and drives the queue until it is empty, one batch at a
//! time. A decision whose request gave up while it waited is not sent. Each member keeps
//! its own route's failure mode; a batch call is bounded by `store.timeout`, so a frozen
//! Redis never holds a queue longer than that. `store.timeout` measures Redis: the wait for
//! a turn on the connection is the gateway's own backlog (under load, on a machine whose
//! CPUs are taken, it was most of a decision's time, and counted against Redis it sent
//! `fail_closed` routes to 503 while Redis was fine), bounded apart by [`turn_bound`]. The
//! sender reports each call it makes to the circuit breaker once (`SendBatch`), and members
//! that queued are not counted again by the store.
//!
//! A batch Redis refused as a whole (nothing in it was decided: a `MOVED`/`ASK`/`TRYAGAIN`
//! while a Cluster slot moves, a Redis too old for the script's flags) sends its members
//! back to be sent one by one ([`Answer::Alone`]) by the ordinary path, which follows
//! redirects; a member `batch.lua` could not decide fails alone.

use super::batch_call::{batch_cmd, member_reply, Part, Reply};
use super::landing::Landing;
use super::making::connect_bound;
use super::patient::{longest, patient};
use crate::limit::store::error::StoreError;
use redis::{Cmd, Value};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// What became of a batch call, as the connection's sender tells.
pub enum Sent {
    /// Redis answered (the batch's array, or the lone call's reply).
    Replied(Value),
    /// Nothing in the call was decided; its members are sent one by one. `true`: batching
    /// cannot work on this store at all (the script is refused), so stop trying.
    NotDecided(bool),
    /// The call failed (or may have run unseen: a timeout, a broken connection).
    Failed(StoreError),
}

/// A queued call's outcome.
pub enum Answer {
    /// This member's reply, as its own script's call would have answered.
    Decided(Value),
    /// Send this call on its own (the ordinary path).
    Alone(Cmd),
    Failed(StoreError),
}

/// Batches sent, what rode in them, members sent back to go alone (every batcher of a store
/// shares one).
#[derive(Default)]
pub struct BatchCounts {
    batches: AtomicU64,
    decisions: AtomicU64,
    settlements: AtomicU64,
    alone: AtomicU64,
}

/// What a store's batches carried so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchTotals {
    /// `batch.lua` calls sent.
    pub batches: u64,
    /// Decisions in them.
    pub decisions: u64,
    /// The other members in them: charges, refunds, releases and quota questions.
    pub settlements: u64,
    /// Members sent one call each after their batch was refused whole.
    pub alone: u64,
}

impl BatchCounts {
    pub fn totals(&self) -> BatchTotals {
        BatchTotals {
            batches: self.batches.load(Ordering::Relaxed),
            decisions: self.decisions.load(Ordering::Relaxed),
            settlements: self.settlements.load(Ordering::Relaxed),
            alone: self.alone.load(Ordering::Relaxed),
        }
    }
}

/// What a queued call is: the script its own call runs, and the member kind `batch.lua`
/// runs it as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `check.lua`: a request's decision.
    Decide,
    /// `charge.lua`: what a request turned out to cost.
    Charge,
    /// `refund.lua`: what a request counted, given back.
    Refund,
    /// `release.lua`: a finished request's concurrency slots, freed.
    Release,
    /// `usage.lua`: what a client has left (the quota endpoint), read without writing.
    Usage,
}

impl Kind {
    /// The member's kind as `batch.lua` reads it: none for a decision (the commonest member,
    /// kept one argument shorter), a letter for the others.
    fn code(self) -> Option<&'static str> {
        match self {
            Kind::Decide => None,
            Kind::Charge => Some("c"),
            Kind::Refund => Some("r"),
            Kind::Release => Some("l"),
            Kind::Usage => Some("u"),
        }
    }
}

struct Member {
    cmd: Cmd,
    keys: usize,
    kind: Kind,
    reply: oneshot::Sender<Answer>,
    /// Dropped with the member: once the call carrying it has ended, or unsent.
    _landing: Option<Landing>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Member>,
    /// Calls in flight (requests' own, or drivers').
    in_flight: usize,
}

pub struct Batcher {
    queue: Mutex<Queue>,
    /// `batch.lua`'s SHA.
    sha: String,
    max: usize,
    /// Calls in flight before decisions queue.
    places: usize,
    off: AtomicBool,
    counts: Arc<BatchCounts>,
    /// A Cluster node: the keys go after the arguments (`batch.lua`'s "keys as
    /// arguments"), none declared, so that Redis does not refuse a batch whose keys span
    /// slots (`CROSSSLOT`).
    keys_in_args: bool,
}

/// A call's way to Redis (a decision, a charge or a refund).
pub enum Enter<S: SendBatch> {
    /// The connection is idle: send `cmd` now, holding the turn until the reply.
    Idle(Cmd, Turn<S>),
    /// Queued: the answer comes here.
    Queued(oneshot::Receiver<Answer>),
}

impl<S: SendBatch> Enter<S> {
    /// This decision's reply. `send` makes a call of its own: on a free place, or after its
    /// batch was refused as a whole; that call is bounded by `bound` (Redis's time). A
    /// queued decision waits for its turn at most [`turn_bound`] — the gateway's own
    /// backlog, not Redis's time — then for the call carrying it, bounded by its sender.
    /// `queued` is set while the decision waits for, or rides in, a call made for the queue
    /// — a call the sender reports to the breaker itself.
    pub async fn answer<F>(
        self,
        queued: &AtomicBool,
        bound: Duration,
        send: impl Fn(Cmd) -> F,
    ) -> Result<Value, StoreError>
    where
        F: Future<Output = Result<Value, StoreError>>,
    {
        let timed_out = |_| Err(StoreError::Timeout(bound));
        let answer = match self {
            Enter::Idle(cmd, turn) => {
                let result = patient(bound, send(cmd)).await;
                drop(turn);
                return result.unwrap_or_else(timed_out);
            }
            Enter::Queued(answer) => answer,
        };
        queued.store(true, Ordering::Relaxed);
        // Dropped at its bound, the answer's channel closes: a member not yet sent is not.
        // The call ahead of it may be given its bound again (a starved machine): the turn
        // outlasts that, or the member would give up just as its batch is sent.
        match patient(turn_bound(bound) + longest(bound), answer).await {
            Ok(Ok(Answer::Decided(value))) => Ok(value),
            Ok(Ok(Answer::Alone(cmd))) => {
                queued.store(false, Ordering::Relaxed);
                patient(bound, send(cmd)).await.unwrap_or_else(timed_out)
            }
            Ok(Ok(Answer::Failed(e))) => Err(e),
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the batch carrying this decision was dropped".into(),
            )),
            Err(elapsed) => timed_out(elapsed),
        }
    }
}

/// How long a queued call may wait for a turn on its connection: the calls in flight end
/// within their own bounds, so this is only reached by a queue far longer than a batch —
/// as long as making a connection may take (`making.rs`), at least 500 ms.
pub fn turn_bound(bound: Duration) -> Duration {
    connect_bound(bound)
}

/// What a call made for the queue carries: a batch (`batch.lua`), or one member alone — run
/// as its own kind's script, so that a `NOSCRIPT` reply (Redis restarted, its scripts
/// flushed) loads that script, not the decisions'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sending {
    /// `native`: only decisions and quota questions, which the Redis module may run
    /// (`native.rs`); a batch with charges, refunds or releases is `batch.lua`'s, so that
    /// its members run in arrival order.
    Batch {
        native: bool,
    },
    Alone(Kind),
}

impl Sending {
    pub fn is_batch(self) -> bool {
        matches!(self, Sending::Batch { .. })
    }
}

/// How a batch is sent: `(cmd, what it is)` → what Redis said. Cloned into the driver.
pub trait SendBatch: Clone + Send + Sync + 'static {
    fn send(&self, cmd: &Cmd, what: Sending) -> impl Future<Output = Sent> + Send;
}

/// Whether Redis refused a batch because it cannot run the script at all (older than 7:
/// no `#!lua` line), not for something in it.
pub fn unsupported(message: &str) -> bool {
    message.contains("compiling script") || message.contains("shebang")
}

impl Batcher {
    /// `(max, places)`: the most decisions in one batch; the calls in flight before
    /// decisions queue.
    pub fn new(sha: &str, (max, places): (usize, usize), counts: Arc<BatchCounts>) -> Batcher {
        Batcher {
            queue: Mutex::new(Queue::default()),
            sha: sha.to_owned(),
            max,
            places: places.max(1),
            off: AtomicBool::new(max <= 1),
            counts,
            keys_in_args: false,
        }
    }

    /// For a Cluster node: batches pass their keys as arguments.
    pub fn keys_in_args(mut self) -> Batcher {
        self.keys_in_args = true;
        self
    }

    /// Takes `cmd`'s way to Redis: at once when a place is free, else the queue.
    /// `keys`: how many keys `cmd` (a call of `kind`'s script) names. `landing`: kept while
    /// a call may carry a queued `cmd` (a call sent at once drops it: whatever is sent after
    /// it on the connection reaches Redis after it).
    pub fn enter<S: SendBatch>(
        self: &Arc<Self>,
        cmd: Cmd,
        (keys, kind): (usize, Kind),
        landing: Option<Landing>,
        sender: &S,
    ) -> Enter<S> {
        if self.off.load(Ordering::Relaxed) {
            let turn = Turn {
                batcher: Arc::clone(self),
                sender: None,
            };
            return Enter::Idle(cmd, turn);
        }
        let mut queue = lock(&self.queue);
        if queue.in_flight < self.places {
            queue.in_flight += 1;
            drop(queue);
            return Enter::Idle(
                cmd,
                Turn {
                    batcher: Arc::clone(self),
                    sender: Some(sender.clone()),
                },
            );
        }
        let (reply, answer) = oneshot::channel();
        queue.waiting.push(Member {
            cmd,
            keys,
            kind,
            reply,
            _landing: landing,
        });
        Enter::Queued(answer)
    }

    /// A place is free again: the queue goes on in it (in a task), or it is given back.
    fn hand_over<S: SendBatch>(self: &Arc<Self>, sender: S) {
        let mut queue = lock(&self.queue);
        if queue.waiting.is_empty() {
            queue.in_flight -= 1;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                drop(queue);
                runtime.spawn(Arc::clone(self).drive(sender));
            }
            // No runtime left (shutting down): the waiting see their call dropped.
            Err(_) => {
                queue.waiting.clear();
                queue.in_flight -= 1;
            }
        }
    }

    /// Sends batches until the queue is empty, one at a time in its place.
    async fn drive<S: SendBatch>(self: Arc<Self>, sender: S) {
        loop {
            let members = {
                let mut queue = lock(&self.queue);
                // Those whose requests gave up are not sent.
                queue.waiting.retain(|m| !m.reply.is_closed());
                if queue.waiting.is_empty() {
                    queue.in_flight -= 1;
                    return;
                }
                let n = queue.waiting.len().min(self.max.max(1));
                queue.waiting.drain(..n).collect::<Vec<_>>()
            };
            self.send(&sender, members).await;
        }
    }

    async fn send<S: SendBatch>(&self, sender: &S, mut members: Vec<Member>) {
        if members.len() == 1 || self.off.load(Ordering::Relaxed) {
            // One waiting (or batching off): its own call, as an idle connection sends it.
            for m in members {
                let answer = match sender.send(&m.cmd, Sending::Alone(m.kind)).await {
                    Sent::Replied(value) => Answer::Decided(value),
                    // A redirect: the ordinary path follows it.
                    Sent::NotDecided(_) => Answer::Alone(m.cmd),
                    Sent::Failed(e) => Answer::Failed(e),
                };
                let _ = m.reply.send(answer);
            }
            return;
        }
        let parts = members.iter().map(|m| Part {
            cmd: &m.cmd,
            keys: m.keys,
            kind: m.kind.code(),
        });
        let cmd = batch_cmd(&self.sha, parts, self.keys_in_args);
        let decisions = members.iter().filter(|m| m.kind == Kind::Decide).count();
        let questions = members.iter().filter(|m| m.kind == Kind::Usage).count();
        let counts = &self.counts;
        counts.batches.fetch_add(1, Ordering::Relaxed);
        counts
            .decisions
            .fetch_add(decisions as u64, Ordering::Relaxed);
        counts
            .settlements
            .fetch_add((members.len() - decisions) as u64, Ordering::Relaxed);
        let native = decisions + questions == members.len();
        match sender.send(&cmd, Sending::Batch { native }).await {
            Sent::Replied(Value::Array(replies)) if replies.len() == members.len() => {
                for (m, value) in members.into_iter().zip(replies) {
                    let answer = match member_reply(value) {
                        Reply::Ran(value) => Answer::Decided(value),
                        Reply::Failed(e) => Answer::Failed(e),
                        // A slot the node does not serve (now): alone, following the redirect.
                        Reply::Elsewhere => {
                            self.counts.alone.fetch_add(1, Ordering::Relaxed);
                            Answer::Alone(m.cmd)
                        }
                    };
                    let _ = m.reply.send(answer);
                }
            }
            Sent::Replied(other) => {
                let e = StoreError::Protocol(format!(
                    "expected {} replies from batch.lua, got {other:?}",
                    members.len()
                ));
                for m in members {
                    let _ = m.reply.send(Answer::Failed(e.clone()));
                }
            }
            Sent::NotDecided(unsupported) => {
                if unsupported && !self.off.swap(true, Ordering::Relaxed) {
                    log::warn!("Redis refused the batch script: decisions are sent one call each from now on (Redis 7 or later batches)");
                }
                self.counts
                    .alone
                    .fetch_add(members.len() as u64, Ordering::Relaxed);
                for m in members.drain(..) {
                    let _ = m.reply.send(Answer::Alone(m.cmd));
                }
            }
            Sent::Failed(e) => {
                for m in members {
                    let _ = m.reply.send(Answer::Failed(e.clone()));
                }
            }
        }
    }
}

/// The turn of the request sending its call on an idle connection; ending it (dropped:
/// replied, or given up) hands the connection to the queue.
pub struct Turn<S: SendBatch> {
    batcher: Arc<Batcher>,
    sender: Option<S>,
}

impl<S: SendBatch> Drop for Turn<S> {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take() {
            self.batcher.hand_over(sender);
        }
    }
}

fn lock(m: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::super::batch_call::tests::check;
    use super::*;

    /// Answers every call with its own arguments' count, after being let go.
    #[derive(Clone, Default)]
    struct Echo {
        calls: Arc<Mutex<Vec<Sending>>>,
    }

    impl SendBatch for Echo {
        async fn send(&self, cmd: &Cmd, what: Sending) -> Sent {
            self.calls.lock().unwrap().push(what);
            Sent::Replied(Value::Int(cmd.args_iter().count() as i64))
        }
    }

    /// With `places` calls in flight allowed, that many decisions go at once and the next
    /// queue; giving a place back sends the queue (one waiting: its own call).
    #[tokio::test]
    async fn decisions_queue_only_once_every_place_is_taken() {
        for places in [1, 2, 3] {
            let batcher = Arc::new(Batcher::new("bsha", (64, places), Arc::default()));
            let echo = Echo::default();
            let mut turns = Vec::new();
            for _ in 0..places {
                match batcher.enter(check(&["k"], &["1"]), (1, Kind::Decide), None, &echo) {
                    Enter::Idle(_, turn) => turns.push(turn),
                    Enter::Queued(_) => panic!("{places} places: queued before they were taken"),
                }
            }
            let Enter::Queued(answer) =
                batcher.enter(check(&["k"], &["1"]), (1, Kind::Decide), None, &echo)
            else {
                panic!("{places} places: not queued once they were taken");
            };
            drop(turns.pop());
            assert!(matches!(answer.await, Ok(Answer::Decided(Value::Int(5)))));
            assert_eq!(*echo.calls.lock().unwrap(), [Sending::Alone(Kind::Decide)]);
            drop(turns);
            // Every place given back: the next decision goes at once again, and holds one.
            assert_eq!(lock(&batcher.queue).in_flight, 0);
            let again = batcher.enter(check(&["k"], &["1"]), (1, Kind::Decide), None, &echo);
            assert!(matches!(again, Enter::Idle(..)));
            assert_eq!(lock(&batcher.queue).in_flight, 1);
        }
    }
}
