//! Latency histograms (HdrHistogram, 3 significant digits, 1 µs to 1 hour) and the figures
//! reported from them.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies in microseconds.
#[derive(Clone, Debug)]
pub struct Latency {
    hist: Histogram<u64>,
}

impl Default for Latency {
    fn default() -> Latency {
        Latency::new()
    }
}

/// What a report shows of one histogram (microseconds).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl Latency {
    pub fn new() -> Latency {
        Latency {
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
        }
    }

    /// Records one latency; values outside the range are clamped into it, never dropped.
    pub fn record_us(&mut self, us: u64) {
        self.hist.saturating_record(us.max(1));
    }

    pub fn add(&mut self, other: &Latency) {
        self.hist.add(&other.hist).expect("same bounds");
    }

    pub fn reset(&mut self) {
        self.hist.reset();
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    pub fn quantile_us(&self, q: f64) -> u64 {
        self.hist.value_at_quantile(q)
    }

    pub fn summary(&self) -> Summary {
        if self.hist.is_empty() {
            return Summary::default();
        }
        Summary {
            count: self.hist.len(),
            mean_us: self.hist.mean(),
            p50_us: self.hist.value_at_quantile(0.50),
            p90_us: self.hist.value_at_quantile(0.90),
            p99_us: self.hist.value_at_quantile(0.99),
            p999_us: self.hist.value_at_quantile(0.999),
            max_us: self.hist.max(),
        }
    }

    /// Points of the cumulative distribution: (latency µs, fraction at or below it), one per
    /// distinct recorded bucket, for the SVG.
    pub fn cdf(&self) -> Vec<(f64, f64)> {
        let total = self.hist.len() as f64;
        if total == 0.0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut seen = 0u64;
        for v in self.hist.iter_recorded() {
            seen += v.count_at_value();
            out.push((
                self.hist.highest_equivalent(v.value_iterated_to()) as f64,
                seen as f64 / total,
            ));
        }
        out
    }
}

/// The median of `values` (the lower middle for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[(v.len() - 1) / 2]
}

/// Population standard deviation.
pub fn stddev(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / values.len() as f64).sqrt()
}

/// Exact percentile of a small sample (nearest rank), for the placement replay's latencies.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_inputs_give_known_percentiles() {
        let mut l = Latency::new();
        for us in 1..=1000 {
            l.record_us(us);
        }
        let s = l.summary();
        assert_eq!(s.count, 1000);
        assert_eq!(s.p50_us, 500);
        assert_eq!(s.p90_us, 900);
        assert_eq!(s.p99_us, 990);
        assert_eq!(s.p999_us, 999);
        assert_eq!(s.max_us, 1000);
        assert!((s.mean_us - 500.5).abs() < 0.5);
        // Three significant digits above 1000 µs.
        let mut big = Latency::new();
        big.record_us(123_456);
        assert!((123_000..=123_600).contains(&big.summary().p50_us));
    }

    #[test]
    fn merging_and_resetting() {
        let (mut a, mut b) = (Latency::new(), Latency::new());
        a.record_us(10);
        b.record_us(30);
        a.add(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.summary().max_us, 30);
        a.reset();
        assert_eq!(a.summary(), Summary::default());
        let cdf = b.cdf();
        assert_eq!(cdf.last().unwrap().1, 1.0);
    }

    #[test]
    fn small_sample_figures() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.0);
        assert_eq!(percentile(&[5.0, 1.0, 4.0, 2.0, 3.0], 0.5), 3.0);
        assert_eq!(percentile(&[5.0, 1.0, 4.0, 2.0, 3.0], 0.99), 5.0);
        assert_eq!(stddev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]), 2.0);
    }
}
