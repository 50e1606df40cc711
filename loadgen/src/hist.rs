//! Latency summaries of the load generator over tiercache's one latency histogram
//! ([`tiercache_stats::Histogram`]: nearest-rank quantiles, a bucket reports its largest value,
//! so a reported value is within 1/128 above the exact one; values below 256 ns are exact).

use serde::Serialize;

pub use tiercache_stats::Histogram;

/// Summary of a histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencyStats {
    /// Number of recorded values.
    pub count: u64,
    /// Mean (exact).
    pub mean_us: f64,
    /// Smallest value (exact).
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// 99.99th percentile.
    pub p9999_us: f64,
    /// Largest value (exact).
    pub max_us: f64,
}

/// One point of a latency CDF: the fraction of IOs at or below `lat_us`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CdfPoint {
    /// Latency in microseconds.
    pub lat_us: f64,
    /// Fraction of IOs with latency ≤ `lat_us` (0–1).
    pub fraction: f64,
}

/// Summary of `h` in microseconds.
pub fn summary(h: &Histogram) -> LatencyStats {
    let us = |ns: u64| ns as f64 / 1000.0;
    LatencyStats {
        count: h.count(),
        mean_us: h.mean_ns() / 1000.0,
        min_us: us(h.min_ns()),
        p50_us: us(h.quantile_ns(0.5)),
        p90_us: us(h.quantile_ns(0.9)),
        p99_us: us(h.quantile_ns(0.99)),
        p999_us: us(h.quantile_ns(0.999)),
        p9999_us: us(h.quantile_ns(0.9999)),
        max_us: us(h.max_ns()),
    }
}

/// The CDF of `h` at every non-empty bucket (the value it reports), thinned to at most
/// `max_points` points (the last point, fraction 1.0, is always kept).
pub fn cdf(h: &Histogram, max_points: usize) -> Vec<CdfPoint> {
    let mut pts = Vec::new();
    if h.count() == 0 {
        return pts;
    }
    let mut seen = 0;
    for (top, c) in h.buckets() {
        seen += c;
        pts.push(CdfPoint {
            lat_us: top as f64 / 1000.0,
            fraction: seen as f64 / h.count() as f64,
        });
    }
    if pts.len() > max_points.max(2) {
        let step = pts.len() as f64 / (max_points.max(2) - 1) as f64;
        let last = *pts.last().unwrap();
        let mut thin: Vec<CdfPoint> = (0..max_points.max(2) - 1)
            .map(|k| pts[(k as f64 * step) as usize])
            .collect();
        thin.push(last);
        pts = thin;
    }
    pts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_cdf() {
        let mut h = Histogram::new();
        let mut vals: Vec<u64> = (0..100_000u64).map(|i| 1000 + i * i % 9_999_991).collect();
        for &v in &vals {
            h.record(v);
        }
        vals.sort();
        let s = summary(&h);
        for (q, got) in [
            (0.5, s.p50_us),
            (0.9, s.p90_us),
            (0.99, s.p99_us),
            (0.999, s.p999_us),
        ] {
            let exact = tiercache_stats::nearest_rank(&vals, q).unwrap() as f64 / 1000.0;
            assert!(
                (got - exact).abs() / exact < 0.01,
                "q={q} exact={exact} got={got}"
            );
        }
        assert_eq!(s.max_us, *vals.last().unwrap() as f64 / 1000.0);
        assert_eq!(s.min_us, vals[0] as f64 / 1000.0);
        assert_eq!(s.count, 100_000);
        let cdf = cdf(&h, 50);
        assert!(cdf.len() <= 50);
        assert_eq!(cdf.last().unwrap().fraction, 1.0);
        assert_eq!(cdf.last().unwrap().lat_us, s.max_us);
    }
}
