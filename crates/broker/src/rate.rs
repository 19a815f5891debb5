//! Kafka's windowed `Rate` (a `SampledStat` of `quota.window.num` samples of
//! `quota.window.size.seconds`), which client quotas (`server::quotas`), connection
//! creation rates (`network`'s accept loop) and replication throttles (`replication`)
//! are measured with, and the throttle that brings
//! a rate over its bound back to it (KIP-219's `(rate - bound) / bound * span`).

use std::time::Duration;

/// `quota.window.num` and `quota.window.size.seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaWindows {
    pub samples: u32,
    pub window: Duration,
}

impl Default for QuotaWindows {
    fn default() -> Self {
        Self {
            samples: 11,
            window: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    start_ms: u64,
    value: f64,
}

/// Kafka's `Rate` over a `SampledStat` of [`QuotaWindows`].
#[derive(Debug, Default)]
pub(crate) struct Rate {
    samples: Vec<Sample>,
    pub(crate) last_ms: u64,
}

impl Rate {
    fn purge(&mut self, now_ms: u64, w: QuotaWindows) {
        let expire = w.window.as_millis() as u64 * u64::from(w.samples);
        self.samples
            .retain(|s| now_ms.saturating_sub(s.start_ms) < expire);
    }

    pub(crate) fn record(&mut self, value: f64, now_ms: u64, w: QuotaWindows) {
        self.purge(now_ms, w);
        self.last_ms = now_ms;
        let window_ms = w.window.as_millis() as u64;
        match self.samples.last_mut() {
            Some(s) if now_ms < s.start_ms + window_ms => s.value += value,
            _ => {
                if self.samples.len() >= w.samples as usize {
                    self.samples.remove(0);
                }
                self.samples.push(Sample {
                    start_ms: now_ms,
                    value,
                });
            }
        }
    }

    /// The rate per second and the span in milliseconds it is taken over.
    pub(crate) fn measure(&mut self, now_ms: u64, w: QuotaWindows) -> (f64, f64) {
        self.purge(now_ms, w);
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        let window_ms = w.window.as_millis() as u64;
        let oldest = self.samples.first().map_or(now_ms, |s| s.start_ms);
        let mut span = now_ms.saturating_sub(oldest);
        let full = span / window_ms.max(1);
        let min_full = u64::from(w.samples.saturating_sub(1));
        if full < min_full {
            span += (min_full - full) * window_ms;
        }
        let span = span.max(1) as f64;
        (total / (span / 1000.0), span)
    }
}

impl Rate {
    /// Records `value` at `now_ms` and answers the throttle it earns against `limit`
    /// (zero when the rate stays within it).
    pub(crate) fn record_and_throttle(
        &mut self,
        value: f64,
        limit: f64,
        now_ms: u64,
        w: QuotaWindows,
    ) -> Duration {
        self.record(value, now_ms, w);
        let (observed, span) = self.measure(now_ms, w);
        if observed <= limit || limit <= 0.0 {
            return Duration::ZERO;
        }
        let ms = ((observed - limit) / limit * span).round();
        Duration::from_millis(ms.clamp(0.0, i32::MAX as f64) as u64)
    }
}
