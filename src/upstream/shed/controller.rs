//! The adaptive concurrency limit of one upstream pool: a gradient controller over a minimum
//! latency baseline (after Envoy's adaptive concurrency filter and Netflix's Gradient2).
//! Pure: latencies and times are arguments.
//!
//! Latencies of completed requests are averaged over a window (`window`, at least
//! `MIN_SAMPLES` of them). The baseline is the latency the pool shows when it is not queueing
//! requests: measured by a **probe** — at start and then every `baseline_interval`, the limit
//! is held at `min_limit` for one window and the average of the requests sent during it
//! becomes the baseline (a pool that got slower for good is the new normal after one
//! interval) — and lowered whenever a window is faster. At the end of each other window:
//!
//! ```text
//! gradient = clamp(tolerance × baseline / latency, 0.5, 1)
//! target   = limit × gradient + √limit            (headroom: the limit probes upwards)
//! limit    = limit + smoothing × (target − limit), within [min_limit, max_limit]
//! ```
//!
//! At the baseline the limit grows (by about `smoothing × √limit` per window); when latency
//! passes `tolerance × baseline` — requests queue in the backend — it shrinks, by up to half
//! of `smoothing` per window, until the excess waits or is shed here instead. (The headroom
//! keeps it at 4 or more while the latency stays high, or `min_limit` if that is higher.)
//! Without the probe, a pool that is overloaded from the start would never show its real
//! baseline, and the limit would settle where the backend already queues.

use std::time::Duration;

/// A window's average needs at least this many samples.
pub const MIN_SAMPLES: u32 = 5;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControllerSettings {
    pub min_limit: u32,
    pub max_limit: u32,
    pub initial_limit: u32,
    /// Latency up to `tolerance × baseline` counts as healthy.
    pub tolerance: f64,
    /// How often the limit is recomputed (when enough samples came in).
    pub window: Duration,
    /// How often the baseline is measured afresh (a probe at `min_limit`).
    pub baseline_interval: Duration,
    /// How far the limit moves toward its target per window (0 < smoothing ≤ 1).
    pub smoothing: f64,
}

#[derive(Debug, Clone)]
pub struct Controller {
    settings: ControllerSettings,
    limit: f64,
    window_start_ms: u64,
    samples: u32,
    sum_us: u64,
    /// The latency of the pool when it does not queue (µs), once measured.
    baseline_us: Option<u64>,
    /// A probe runs since this time: the limit is `min_limit`, and only requests sent since
    /// count.
    probe_since: Option<u64>,
    next_probe_ms: u64,
    /// The last window's average (µs), for metrics.
    last_latency_us: Option<u64>,
}

impl Controller {
    /// A controller that starts with a probe (the baseline is measured first).
    pub fn new(settings: ControllerSettings, now_ms: u64) -> Controller {
        Controller {
            limit: f64::from(
                settings
                    .initial_limit
                    .clamp(settings.min_limit, settings.max_limit),
            ),
            settings,
            window_start_ms: now_ms,
            samples: 0,
            sum_us: 0,
            baseline_us: None,
            probe_since: Some(now_ms),
            next_probe_ms: now_ms,
            last_latency_us: None,
        }
    }

    /// The current limit on requests in flight (`min_limit` during a probe).
    pub fn limit(&self) -> u32 {
        match self.probe_since {
            Some(_) => self.settings.min_limit,
            None => self.limit as u32,
        }
    }

    /// The latency baseline (µs), once measured.
    pub fn baseline_us(&self) -> Option<u64> {
        self.baseline_us
    }

    pub fn last_latency_us(&self) -> Option<u64> {
        self.last_latency_us
    }

    /// A request completed with `latency`; returns the new limit when a window closed.
    pub fn sample(&mut self, latency: Duration, now_ms: u64) -> Option<u32> {
        let latency_us = latency.as_micros().min(u128::from(u64::MAX)) as u64;
        if let Some(since) = self.probe_since {
            if now_ms.saturating_sub(latency_us / 1000) < since {
                // Sent before the probe, when more were in flight: not the baseline.
                return None;
            }
        }
        self.samples += 1;
        self.sum_us = self.sum_us.saturating_add(latency_us);
        let window_ms = self.settings.window.as_millis() as u64;
        if now_ms < self.window_start_ms + window_ms || self.samples < MIN_SAMPLES {
            return None;
        }
        let average = (self.sum_us / u64::from(self.samples)).max(1);
        self.samples = 0;
        self.sum_us = 0;
        self.window_start_ms = now_ms;
        self.last_latency_us = Some(average);
        if self.probe_since.take().is_some() {
            // The probe's answer replaces the baseline; the limit resumes where it was.
            self.baseline_us = Some(average);
            self.next_probe_ms = now_ms + self.settings.baseline_interval.as_millis() as u64;
            return Some(self.limit());
        }
        let baseline = self.baseline_us.map_or(average, |b| b.min(average));
        self.baseline_us = Some(baseline);
        let gradient = (self.settings.tolerance * baseline as f64 / average as f64).clamp(0.5, 1.0);
        let target = self.limit * gradient + self.limit.sqrt();
        let limit = self.limit + self.settings.smoothing * (target - self.limit);
        self.limit = limit.clamp(
            f64::from(self.settings.min_limit),
            f64::from(self.settings.max_limit),
        );
        if now_ms >= self.next_probe_ms {
            self.probe_since = Some(now_ms);
        }
        Some(self.limit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ControllerSettings {
        ControllerSettings {
            min_limit: 2,
            max_limit: 200,
            initial_limit: 20,
            tolerance: 1.5,
            window: Duration::from_millis(100),
            baseline_interval: Duration::from_secs(10),
            smoothing: 0.2,
        }
    }

    /// Feeds `windows` windows of 10 samples of `latency_ms`, 100 ms apart, from `start`.
    fn run(c: &mut Controller, start: u64, windows: u64, latency_ms: u64) -> u64 {
        let mut now = start;
        for _ in 0..windows {
            now += 100;
            for _ in 0..10 {
                c.sample(Duration::from_millis(latency_ms), now);
            }
        }
        now
    }

    #[test]
    fn at_the_baseline_the_limit_grows_to_its_maximum() {
        let mut c = Controller::new(settings(), 0);
        run(&mut c, 0, 600, 5);
        assert_eq!(c.limit(), 200);
        assert_eq!(c.baseline_us(), Some(5_000));
    }

    #[test]
    fn rising_latency_brings_the_limit_down_and_its_return_brings_it_back() {
        let mut c = Controller::new(settings(), 0);
        let now = run(&mut c, 0, 250, 5);
        let high = c.limit();
        assert!(high > 100, "{high}");
        // The backend slows down: 20× the baseline (between two probes: the next one, at
        // 30 s, would take 100 ms for the pool's new normal).
        let now = run(&mut c, now, 30, 100);
        let low = c.limit();
        assert!(low < high / 4, "{high} → {low}");
        assert!(low >= 2);
        // Back to normal: the limit climbs again.
        run(&mut c, now, 300, 5);
        assert!(c.limit() > low * 4, "{low} → {}", c.limit());
    }

    #[test]
    fn a_backend_slower_for_good_becomes_the_new_baseline() {
        let mut c = Controller::new(settings(), 0);
        let now = run(&mut c, 0, 50, 5);
        // 30 s at 40 ms: after the next probe (at most one interval), 40 ms is the baseline.
        run(&mut c, now, 300, 40);
        assert_eq!(c.baseline_us(), Some(40_000));
        assert!(c.limit() > 50, "{}", c.limit());
    }

    #[test]
    fn a_probe_holds_the_limit_at_its_minimum_and_ignores_requests_sent_before_it() {
        let mut c = Controller::new(settings(), 0);
        // Probing from the start: the minimum until one window of samples came in.
        assert_eq!(c.limit(), 2);
        let now = run(&mut c, 0, 1, 5);
        assert_eq!((c.limit(), c.baseline_us()), (20, Some(5_000)));
        // Overloaded windows until the next probe (10 s): the limit comes down.
        let now = run(&mut c, now, 99, 30);
        assert!(c.limit() < 20, "{}", c.limit());
        let now = run(&mut c, now, 1, 30);
        assert_eq!(c.limit(), 2, "probing at 10.1 s");
        // Requests sent before the probe (their 30 ms started before it) do not count...
        for _ in 0..10 {
            assert_eq!(c.sample(Duration::from_millis(300), now + 100), None);
        }
        // ...the probe's own ones do, and become the baseline.
        run(&mut c, now, 1, 12);
        assert_eq!(c.baseline_us(), Some(12_000));
        assert!(c.limit() > 2);
    }

    #[test]
    fn the_limit_stays_within_its_bounds() {
        let mut c = Controller::new(settings(), 0);
        let now = run(&mut c, 0, 20, 5);
        // Until the next probe, the limit bottoms out where halving and the √limit headroom
        // balance (4), never below min_limit.
        run(&mut c, now, 60, 5_000);
        assert!((2..=4).contains(&c.limit()), "{}", c.limit());
        // Fewer than MIN_SAMPLES in a window: no change.
        let mut quiet = Controller::new(settings(), 0);
        for t in 1..=4 {
            assert_eq!(quiet.sample(Duration::from_millis(1), t * 1000), None);
        }
    }
}
