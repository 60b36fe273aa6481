//! The door to one upstream pool when load shedding is on: at most the controller's limit of
//! requests in flight, with part of it kept for more important traffic, and a short bounded
//! queue for the rest.
//!
//! Priority classes share the limit unevenly: critical requests may use all of it, default
//! ones `1 − reserve_critical` of it, sheddable ones `1 − reserve_critical − reserve_default`
//! — so as the pool fills up, sheddable traffic waits (and is shed) first, then default, and
//! the last share is critical traffic's alone. A request that finds no room waits in the queue
//! (more important classes are woken first) for at most `queue_timeout`; when the queue is
//! full, a newcomer takes the place of the newest waiter of a less important class, if any.
//! A request that gets no place is shed: it never reaches the upstream.

use crate::upstream::shed::controller::{Controller, ControllerSettings};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How important a request is when its upstream is at its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Critical = 0,
    Default = 1,
    Sheddable = 2,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Default, Priority::Sheddable];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Default => "default",
            Priority::Sheddable => "sheddable",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateSettings {
    pub controller: ControllerSettings,
    /// Most requests waiting for a place.
    pub queue: usize,
    /// Longest wait for a place.
    pub queue_timeout: Duration,
    /// Share of the limit only critical requests may use.
    pub reserve_critical: f64,
    /// Further share default (and critical) requests may use, sheddable ones not.
    pub reserve_default: f64,
}

/// Why a request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shed {
    /// No place, and the queue was full of requests at least as important.
    QueueFull,
    /// Waited `queue_timeout` without a place.
    Timeout,
    /// Waiting, it gave its place to a more important request.
    Displaced,
}

/// What the gate looks like now (for metrics and `/readyz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateView {
    pub limit: u32,
    pub in_flight: u32,
    pub queued: usize,
    pub baseline_us: Option<u64>,
    pub latency_us: Option<u64>,
}

struct Waiter {
    id: u64,
    wake: oneshot::Sender<()>,
}

struct Inner {
    controller: Controller,
    in_flight: u32,
    /// Waiters by priority, oldest first.
    queues: [VecDeque<Waiter>; 3],
    next_id: u64,
}

impl Inner {
    fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
}

pub struct Gate {
    settings: GateSettings,
    inner: Mutex<Inner>,
    epoch: Instant,
    shed: [AtomicU64; 3],
}

impl Gate {
    pub fn new(settings: GateSettings) -> Gate {
        Gate {
            inner: Mutex::new(Inner {
                controller: Controller::new(settings.controller, 0),
                in_flight: 0,
                queues: Default::default(),
                next_id: 0,
            }),
            settings,
            epoch: Instant::now(),
            shed: Default::default(),
        }
    }

    pub fn settings(&self) -> &GateSettings {
        &self.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Slots a class may fill, of the current limit (at least one for critical requests).
    fn room(&self, limit: u32, priority: Priority) -> u32 {
        let share = match priority {
            Priority::Critical => 1.0,
            Priority::Default => 1.0 - self.settings.reserve_critical,
            Priority::Sheddable => {
                1.0 - self.settings.reserve_critical - self.settings.reserve_default
            }
        };
        let room = (f64::from(limit) * share).floor() as u32;
        if priority == Priority::Critical {
            room.max(1)
        } else {
            room
        }
    }

    /// A place for a request of `priority`, now, after a wait in the queue, or not at all.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Result<Permit, Shed> {
        let (id, wait) = {
            let mut inner = self.lock();
            let limit = inner.controller.limit();
            // Waiters of this class or a more important one go first.
            let ahead = inner.queues[..=priority as usize]
                .iter()
                .any(|q| !q.is_empty());
            if !ahead && inner.in_flight < self.room(limit, priority) {
                inner.in_flight += 1;
                return Ok(self.permit(priority));
            }
            if inner.queued() >= self.settings.queue {
                // Displace the newest waiter of a less important class, if there is one.
                let lower = (priority as usize + 1..3)
                    .rev()
                    .find(|&p| !inner.queues[p].is_empty());
                match lower {
                    Some(p) => {
                        // Dropping its sender tells it: shed.
                        inner.queues[p].pop_back();
                    }
                    None => return Err(self.shed(priority, Shed::QueueFull)),
                }
            }
            let (wake, wait) = oneshot::channel();
            let id = inner.next_id;
            inner.next_id += 1;
            inner.queues[priority as usize].push_back(Waiter { id, wake });
            (id, wait)
        };
        match tokio::time::timeout(self.settings.queue_timeout, wait).await {
            Ok(Ok(())) => Ok(self.permit(priority)),
            Ok(Err(_)) => Err(self.shed(priority, Shed::Displaced)),
            Err(_) => {
                let mut inner = self.lock();
                let queue = &mut inner.queues[priority as usize];
                match queue.iter().position(|w| w.id == id) {
                    Some(at) => {
                        queue.remove(at);
                        drop(inner);
                        Err(self.shed(priority, Shed::Timeout))
                    }
                    // Woken just as the wait ended: the place is ours.
                    None => Ok(self.permit(priority)),
                }
            }
        }
    }

    fn permit(self: &Arc<Self>, priority: Priority) -> Permit {
        Permit {
            gate: Arc::clone(self),
            priority,
            recorded: false,
        }
    }

    fn shed(&self, priority: Priority, why: Shed) -> Shed {
        self.shed[priority as usize].fetch_add(1, Ordering::Relaxed);
        why
    }

    /// Requests shed so far, by priority (in `Priority::ALL` order).
    pub fn shed_counts(&self) -> [u64; 3] {
        [0, 1, 2].map(|i| self.shed[i].load(Ordering::Relaxed))
    }

    pub fn view(&self) -> GateView {
        let inner = self.lock();
        GateView {
            limit: inner.controller.limit(),
            in_flight: inner.in_flight,
            queued: inner.queued(),
            baseline_us: inner.controller.baseline_us(),
            latency_us: inner.controller.last_latency_us(),
        }
    }

    /// A place came free (or the limit grew): wake waiters, most important first, while there
    /// is room for their class.
    fn wake(&self, inner: &mut Inner) {
        let limit = inner.controller.limit();
        for priority in Priority::ALL {
            while inner.in_flight < self.room(limit, priority) {
                let Some(waiter) = inner.queues[priority as usize].pop_front() else {
                    break;
                };
                inner.in_flight += 1;
                if waiter.wake.send(()).is_err() {
                    // It stopped waiting (its client left): the place goes to the next one.
                    inner.in_flight -= 1;
                }
            }
        }
    }
}

/// A place in an upstream pool; dropping it frees the place.
pub struct Permit {
    gate: Arc<Gate>,
    priority: Priority,
    recorded: bool,
}

impl Permit {
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// How long the upstream took to answer (once per request): the controller's sample.
    pub fn record(&mut self, latency: Duration) {
        if self.recorded {
            return;
        }
        self.recorded = true;
        let now = self.gate.now_ms();
        let mut inner = self.gate.lock();
        if inner.controller.sample(latency, now).is_some() {
            self.gate.wake(&mut inner);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut inner = self.gate.lock();
        inner.in_flight = inner.in_flight.saturating_sub(1);
        self.gate.wake(&mut inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(limit: u32, queue: usize) -> Arc<Gate> {
        Arc::new(Gate::new(GateSettings {
            controller: ControllerSettings {
                min_limit: limit,
                max_limit: limit,
                initial_limit: limit,
                tolerance: 1.5,
                window: Duration::from_millis(100),
                baseline_interval: Duration::from_secs(10),
                smoothing: 0.2,
            },
            queue,
            queue_timeout: Duration::from_secs(30),
            reserve_critical: 0.2,
            reserve_default: 0.3,
        }))
    }

    #[tokio::test]
    async fn classes_fill_the_limit_unevenly() {
        let g = gate(10, 0);
        let mut held = Vec::new();
        // Sheddable: half of 10.
        for _ in 0..5 {
            held.push(g.acquire(Priority::Sheddable).await.unwrap());
        }
        assert_eq!(
            g.acquire(Priority::Sheddable).await.err(),
            Some(Shed::QueueFull)
        );
        // Default: up to 8.
        for _ in 0..3 {
            held.push(g.acquire(Priority::Default).await.unwrap());
        }
        assert_eq!(
            g.acquire(Priority::Default).await.err(),
            Some(Shed::QueueFull)
        );
        // Critical: the rest.
        for _ in 0..2 {
            held.push(g.acquire(Priority::Critical).await.unwrap());
        }
        assert_eq!(
            g.acquire(Priority::Critical).await.err(),
            Some(Shed::QueueFull)
        );
        assert_eq!(g.view().in_flight, 10);
        assert_eq!(g.shed_counts(), [1, 1, 1]);
        drop(held);
        assert_eq!(g.view().in_flight, 0);
    }

    #[tokio::test]
    async fn waiters_get_freed_places_most_important_first_and_displace_less_important_ones() {
        let g = gate(2, 2);
        let a = g.acquire(Priority::Critical).await.unwrap();
        let b = g.acquire(Priority::Critical).await.unwrap();
        let sheddable = tokio::spawn({
            let g = Arc::clone(&g);
            async move { g.acquire(Priority::Sheddable).await.map(|_| ()) }
        });
        let default = tokio::spawn({
            let g = Arc::clone(&g);
            async move { g.acquire(Priority::Default).await.map(|_| ()) }
        });
        while g.view().queued < 2 {
            tokio::task::yield_now().await;
        }
        // The queue is full: a critical newcomer takes the sheddable waiter's place.
        let critical = tokio::spawn({
            let g = Arc::clone(&g);
            async move { g.acquire(Priority::Critical).await.map(|p| p.priority()) }
        });
        assert_eq!(sheddable.await.unwrap(), Err(Shed::Displaced));
        drop(a);
        // The freed place goes to the critical waiter, not to the older default one.
        assert_eq!(critical.await.unwrap(), Ok(Priority::Critical));
        drop(b);
        assert_eq!(default.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn a_waiter_is_shed_after_the_queue_timeout() {
        let g = Arc::new(Gate::new(GateSettings {
            queue_timeout: Duration::from_millis(20),
            ..*gate(1, 4).settings()
        }));
        let _held = g.acquire(Priority::Critical).await.unwrap();
        assert_eq!(
            g.acquire(Priority::Critical).await.err(),
            Some(Shed::Timeout)
        );
        assert_eq!(g.view().queued, 0);
    }
}
