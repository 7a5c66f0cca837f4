//! Throughput and latency percentiles.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of latencies, in milliseconds (all zero when there
/// are no samples).
///
/// ```
/// use std::time::Duration;
/// use outbox_bench::stats::LatencySummary;
///
/// let mut samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
/// let summary = LatencySummary::of(&mut samples);
/// assert_eq!(summary.p50_ms, 50.0);
/// assert_eq!(summary.p99_ms, 99.0);
/// assert_eq!(summary.max_ms, 100.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    /// How many latencies were measured.
    pub samples: usize,
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

impl LatencySummary {
    /// Summarizes `samples`, sorting them in place.
    pub fn of(samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        let total: Duration = samples.iter().sum();
        let mean = if samples.is_empty() {
            Duration::ZERO
        } else {
            total / samples.len() as u32
        };
        Self {
            samples: samples.len(),
            mean_ms: millis(mean),
            p50_ms: millis(percentile(samples, 50.0)),
            p90_ms: millis(percentile(samples, 90.0)),
            p99_ms: millis(percentile(samples, 99.0)),
            max_ms: millis(samples.last().copied().unwrap_or_default()),
        }
    }
}

/// The nearest-rank `p`th percentile of `sorted` (ascending); zero when empty.
///
/// ```
/// use std::time::Duration;
/// use outbox_bench::stats::percentile;
///
/// let sorted = [1, 2, 3, 4].map(Duration::from_millis);
/// assert_eq!(percentile(&sorted, 50.0), Duration::from_millis(2));
/// assert_eq!(percentile(&sorted, 99.0), Duration::from_millis(4));
/// ```
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `count` per second of `elapsed`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(outbox_bench::stats::per_second(500, Duration::from_millis(250)), 2000.0);
/// ```
pub fn per_second(count: usize, elapsed: Duration) -> f64 {
    if elapsed.is_zero() {
        return 0.0;
    }
    count as f64 / elapsed.as_secs_f64()
}

/// The first quartile, median and third quartile of `values` (nearest
/// rank), sorting them in place; `None` when empty.
///
/// ```
/// let mut ratios = [1.4, 1.1, 1.3, 1.2, 9.0];
/// assert_eq!(outbox_bench::stats::quartiles(&mut ratios), Some([1.2, 1.3, 1.4]));
/// ```
pub fn quartiles(values: &mut [f64]) -> Option<[f64; 3]> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable_by(f64::total_cmp);
    let rank = |p: f64| {
        let rank = (p * values.len() as f64).ceil() as usize;
        values[rank.clamp(1, values.len()) - 1]
    };
    Some([rank(0.25), rank(0.5), rank(0.75)])
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_samples_summarize_to_zero() {
        let summary = LatencySummary::of(&mut []);
        assert_eq!(summary.samples, 0);
        assert_eq!(summary.p99_ms, 0.0);
    }

    #[test]
    fn a_single_sample_is_every_percentile() {
        let summary = LatencySummary::of(&mut [Duration::from_millis(7)]);
        assert_eq!(
            [
                summary.p50_ms,
                summary.p90_ms,
                summary.p99_ms,
                summary.max_ms
            ],
            [7.0; 4]
        );
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sorted: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        assert_eq!(percentile(&sorted, 99.0), Duration::from_micros(990));
        assert_eq!(percentile(&sorted, 0.0), Duration::from_micros(1));
        assert_eq!(percentile(&sorted, 100.0), Duration::from_micros(1000));
    }
}
