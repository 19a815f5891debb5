//! Latencies of a `rill bench` run, kept in an HDR histogram of microseconds.
//!
//! A histogram rather than every sample: memory stays a few tens of KiB however many
//! records a run sends (a vector of samples is 4 bytes a record, 4 GB for a billion),
//! and merging the producers' histograms is an addition. Three significant digits: a
//! reported value is within 0.1% of the sample it stands for.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::json;

/// The percentiles the end-of-run table lists (in percent).
const TABLE: [f64; 10] = [
    50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 100.0,
];

/// The latencies of one run (or one producer's share of it).
#[derive(Debug, Clone)]
pub(super) struct Latencies(Histogram<u64>);

impl Latencies {
    pub(super) fn new() -> anyhow::Result<Self> {
        // Auto-resizing from 1 µs up: a stalled run's minutes-long maximum still counts.
        let histogram = Histogram::new(3)
            .map_err(|e| anyhow::anyhow!("creating the latency histogram: {e}"))?;
        Ok(Self(histogram))
    }

    pub(super) fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        // `record` grows the histogram; only a value beyond what it can ever grow to
        // fails, and is then counted as its highest value (`saturating_record` alone
        // would clamp to the current, not the largest possible, range).
        if self.0.record(us).is_err() {
            self.0.saturating_record(us);
        }
    }

    /// Adds another run's samples to this one.
    pub(super) fn add(&mut self, other: &Latencies) -> anyhow::Result<()> {
        self.0
            .add(&other.0)
            .map_err(|e| anyhow::anyhow!("merging latency histograms: {e}"))
    }

    /// Samples recorded.
    pub(super) fn len(&self) -> u64 {
        self.0.len()
    }

    /// Mean, percentiles and maximum, in ms (all zeros when empty).
    pub(super) fn summary(&self) -> LatencySummary {
        if self.0.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            avg: self.0.mean() / 1000.0,
            p50: self.at(50.0),
            p99: self.at(99.0),
            p999: self.at(99.9),
            max: self.0.max() as f64 / 1000.0,
        }
    }

    /// The value at `percentile` (0–100) in ms: the highest value a sample counted
    /// in that bucket can have, as HdrHistogram reports it.
    fn at(&self, percentile: f64) -> f64 {
        self.0.value_at_percentile(percentile) as f64 / 1000.0
    }

    /// The end-of-run distribution: each percentile of [`TABLE`] with its value and
    /// the number of samples at or below it.
    fn table(&self) -> Vec<(f64, f64, u64)> {
        if self.0.is_empty() {
            return Vec::new();
        }
        TABLE
            .iter()
            .map(|&p| {
                let us = self.0.value_at_percentile(p);
                (p, us as f64 / 1000.0, self.0.count_between(0, us))
            })
            .collect()
    }

    /// Prints the distribution, one percentile a line, after a title.
    pub(super) fn print_table(&self, title: &str) {
        println!("{title} (ms, HDR histogram, 3 significant digits):");
        println!("  {:>8}  {:>10}  {:>12}", "pct", "ms", "count");
        for (p, ms, count) in self.table() {
            println!("  {p:>8.2}  {ms:>10.3}  {count:>12}");
        }
    }

    /// The distribution for `--output json`.
    pub(super) fn table_json(&self) -> serde_json::Value {
        self.table()
            .into_iter()
            .map(|(p, ms, count)| json!({ "percentile": p, "ms": ms, "count": count }))
            .collect()
    }
}

/// Mean, percentiles and maximum of a run's latencies, in ms.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct LatencySummary {
    pub(super) avg: f64,
    pub(super) p50: f64,
    pub(super) p99: f64,
    pub(super) p999: f64,
    pub(super) max: f64,
}

impl LatencySummary {
    pub(super) fn to_json(self) -> serde_json::Value {
        json!({
            "avg": self.avg, "p50": self.p50, "p99": self.p99, "p999": self.p999, "max": self.max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64) -> bool {
        (actual - expected).abs() <= expected * 0.001 + 1e-9
    }

    #[test]
    fn percentiles_within_a_tenth_of_a_percent() {
        let mut l = Latencies::new().unwrap();
        for ms in 1..=1000u64 {
            l.record(Duration::from_millis(ms));
        }
        let s = l.summary();
        assert_eq!(l.len(), 1000);
        assert!(close(s.p50, 500.0), "{s:?}");
        assert!(close(s.p99, 990.0), "{s:?}");
        // HdrHistogram's rank rounding may land on the next sample at the tail.
        assert!(close(s.p999, 999.0) || close(s.p999, 1000.0), "{s:?}");
        assert!(close(s.max, 1000.0), "{s:?}");
        assert!(close(s.avg, 500.5), "{s:?}");
    }

    #[test]
    fn empty_is_zero_and_merging_adds() {
        let empty = Latencies::new().unwrap();
        assert_eq!(empty.summary(), LatencySummary::default());
        assert!(empty.table().is_empty());

        let mut a = Latencies::new().unwrap();
        let mut b = Latencies::new().unwrap();
        a.record(Duration::from_micros(100));
        b.record(Duration::from_secs(3600 * 24));
        a.add(&b).unwrap();
        assert_eq!(a.len(), 2);
        assert!(close(a.summary().max, 86_400_000.0));
        let table = a.table();
        assert_eq!(table.len(), TABLE.len());
        // Half the samples are at or below the median; all at or below the maximum.
        assert_eq!(table[0].2, 1);
        assert_eq!(table[TABLE.len() - 1].2, 2);
    }
}
