//! Latency histograms: fixed log-scale buckets, so recording is one
//! increment and merging the statistics of several loop threads is a sum.

use std::time::Duration;

/// Buckets: `[0, 1 µs)`, then doubling up to 2^39 µs (about 6 days).
const BUCKETS: usize = 40;

/// A histogram of durations with power-of-two buckets of microseconds.
/// Quantiles are exact to a factor of two — enough for p50/p99 reports and
/// for seeing a tail, without storing samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: [u64; BUCKETS],
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: [0; BUCKETS], total: 0 }
    }
}

impl Histogram {
    /// Counts one duration.
    pub fn record(&mut self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let bucket = if us == 0 { 0 } else { (64 - us.leading_zeros() as usize).min(BUCKETS - 1) };
        self.counts[bucket] += 1;
        self.total += 1;
    }

    /// Durations counted.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The upper bound of the bucket holding the `q` quantile (0 ≤ q ≤ 1);
    /// `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Duration::from_micros(if i == 0 { 1 } else { 1u64 << i }));
            }
        }
        unreachable!("rank ≤ total")
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_land_in_the_right_power_of_two() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
        for _ in 0..98 {
            h.record(Duration::from_micros(300)); // bucket (256, 512]
        }
        h.record(Duration::from_millis(40)); // (32768, 65536]
        h.record(Duration::from_secs(3));
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile(0.5), Some(Duration::from_micros(512)));
        assert_eq!(h.quantile(0.98), Some(Duration::from_micros(512)));
        assert_eq!(h.quantile(0.99), Some(Duration::from_micros(65_536)));
        assert_eq!(h.quantile(1.0), Some(Duration::from_micros(1 << 22)));
        let mut m = Histogram::default();
        m.merge(&h);
        m.merge(&h);
        assert_eq!(m.count(), 200);
        assert_eq!(m.quantile(0.5), h.quantile(0.5));
    }
}
