//! `log.cleaner.io.max.bytes.per.second`: bounds the cleaner's disk I/O so that a clean
//! of gigabytes does not take the disk and page cache from produce and fetch.
//!
//! Kafka's `Throttler` way: the bytes the cleaner reads and writes are counted, and
//! every `CHECK_INTERVAL` (or sooner, once the period has used up an interval's worth
//! of the bound) the rate over that period is compared with the bound; when it is
//! above, the cleaner's thread sleeps until the period's average comes down to the
//! bound, and a new period starts. The cleaner runs on a blocking thread of its own, so
//! sleeping there delays nobody else.

use std::time::{Duration, Instant};

/// How often the observed rate is checked (Kafka's cleaner uses 300 ms).
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_millis(300);

pub(crate) struct Throttler {
    max_bytes_per_sec: f64,
    period_start: Instant,
    observed: u64,
    /// Time spent asleep, for the cleaner's log line.
    pub(crate) slept: Duration,
}

impl Throttler {
    pub(crate) fn new(max_bytes_per_sec: f64) -> Self {
        Self {
            max_bytes_per_sec,
            period_start: Instant::now(),
            observed: 0,
            slept: Duration::ZERO,
        }
    }

    fn unbounded(&self) -> bool {
        // Kafka's default is Double.MaxValue; anything not a positive finite rate is no
        // bound (the config validation refuses it before it gets here).
        !(self.max_bytes_per_sec.is_finite() && self.max_bytes_per_sec > 0.0)
    }

    /// Counts `bytes` of I/O and sleeps if the period's rate is over the bound.
    pub(crate) fn maybe_throttle(&mut self, bytes: u64) {
        if self.unbounded() {
            return;
        }
        self.observed += bytes;
        let elapsed = self.period_start.elapsed();
        // Checked at the end of each interval, as Kafka does, and also as soon as the
        // period has used a whole interval's allowance, so that a burst shorter than the
        // interval (a clean of a few hundred MB from the page cache) is bounded too.
        let allowance = self.max_bytes_per_sec * CHECK_INTERVAL.as_secs_f64();
        if elapsed < CHECK_INTERVAL && (self.observed as f64) < allowance {
            return;
        }
        if let Some(pause) = pause_for(self.observed, elapsed, self.max_bytes_per_sec) {
            std::thread::sleep(pause);
            self.slept += pause;
        }
        self.period_start = Instant::now();
        self.observed = 0;
    }
}

/// How long to pause after `observed` bytes in `elapsed` so that the period's rate is at
/// most `max_bytes_per_sec`; `None` when it is already.
pub(crate) fn pause_for(
    observed: u64,
    elapsed: Duration,
    max_bytes_per_sec: f64,
) -> Option<Duration> {
    let needed = observed as f64 / max_bytes_per_sec;
    let pause = needed - elapsed.as_secs_f64();
    (pause > 0.0).then(|| Duration::from_secs_f64(pause))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_pause_at_or_under_the_bound() {
        assert_eq!(pause_for(1_000, Duration::from_secs(1), 1_000.0), None);
        assert_eq!(pause_for(0, Duration::from_millis(300), 1.0), None);
        assert_eq!(pause_for(299, Duration::from_millis(300), 1_000.0), None);
    }

    #[test]
    fn pause_brings_the_period_down_to_the_bound() {
        // 3 MB in 0.3 s against 1 MB/s: the period must last 3 s, so 2.7 s more.
        let pause = pause_for(3_000_000, Duration::from_millis(300), 1e6).unwrap();
        assert!((pause.as_secs_f64() - 2.7).abs() < 1e-9, "{pause:?}");
    }

    #[test]
    fn the_default_bound_never_sleeps() {
        let mut t = Throttler::new(f64::MAX);
        t.period_start -= CHECK_INTERVAL;
        t.maybe_throttle(u64::MAX / 2);
        assert_eq!(t.slept, Duration::ZERO);
        assert_eq!(t.observed, 0, "an unbounded throttler counts nothing");
    }

    #[test]
    fn a_burst_over_an_intervals_allowance_is_checked_at_once() {
        let mut t = Throttler::new(1e6);
        // Fresh period: 300 KB is the allowance of 300 ms at 1 MB/s.
        t.maybe_throttle(200_000);
        assert_eq!(t.slept, Duration::ZERO);
        t.maybe_throttle(200_000);
        // 400 KB must take at least 400 ms.
        assert!(t.slept >= Duration::from_millis(300), "{:?}", t.slept);
        assert_eq!(t.observed, 0);
    }

    #[test]
    fn an_over_rate_period_sleeps_and_starts_over() {
        let mut t = Throttler::new(1e6);
        t.period_start -= CHECK_INTERVAL;
        // 330 KB over at least 300 ms is at most 1.1 MB/s: about 30 ms of pause.
        t.maybe_throttle(330_000);
        assert!(
            t.slept > Duration::ZERO && t.slept <= Duration::from_millis(30),
            "{:?}",
            t.slept
        );
        assert_eq!(t.observed, 0);
    }
}
