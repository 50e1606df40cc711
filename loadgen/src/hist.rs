//! A log-linear latency histogram (HDR-like): values below 256 ns are exact, above that
//! every power of two is split into 128 buckets, so a reported value (the bucket's
//! midpoint) is within 0.4% of every value in its bucket.

use serde::Serialize;

const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS; // 128 buckets per power of two
const EXACT: u64 = 2 * SUB as u64; // 256: values below are their own bucket
const BUCKETS: usize = EXACT as usize + (64 - 8) * SUB;

/// Latency histogram in nanoseconds.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Histogram({:?})", self.stats())
    }
}

fn index(v: u64) -> usize {
    if v < EXACT {
        v as usize
    } else {
        let e = 63 - v.leading_zeros(); // >= 8
        let shift = e - SUB_BITS;
        let mantissa = (v >> shift) as usize; // in [128, 256)
        EXACT as usize + (e as usize - 8) * SUB + (mantissa - SUB)
    }
}

/// (lowest value, width) of bucket `i`.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < EXACT as usize {
        (i as u64, 1)
    } else {
        let j = i - EXACT as usize;
        let e = (j / SUB) as u32 + 8;
        let mantissa = (j % SUB + SUB) as u64;
        let shift = e - SUB_BITS;
        (mantissa << shift, 1u64 << shift)
    }
}

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

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Records one value in nanoseconds.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[index(ns)] += 1;
        self.count += 1;
        self.sum += ns as u128;
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Exact mean in nanoseconds (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// Largest value in nanoseconds (0 when empty).
    pub fn max_ns(&self) -> u64 {
        self.max
    }

    /// Smallest value in nanoseconds (0 when empty).
    pub fn min_ns(&self) -> u64 {
        if self.count == 0 { 0 } else { self.min }
    }

    /// The value at quantile `q` (0–1) in nanoseconds: the midpoint of the bucket holding the
    /// `ceil(q·count)`-th smallest value, clamped to [min, max]; 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, w) = bucket_range(i);
                return (lo + w / 2).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// Summary in microseconds.
    pub fn stats(&self) -> LatencyStats {
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencyStats {
            count: self.count,
            mean_us: self.mean_ns() / 1000.0,
            min_us: us(self.min_ns()),
            p50_us: us(self.quantile_ns(0.5)),
            p90_us: us(self.quantile_ns(0.9)),
            p99_us: us(self.quantile_ns(0.99)),
            p999_us: us(self.quantile_ns(0.999)),
            p9999_us: us(self.quantile_ns(0.9999)),
            max_us: us(self.max),
        }
    }

    /// The CDF at the upper edge of every non-empty bucket, thinned to at most `max_points`
    /// points (the last point, fraction 1.0, is always kept).
    pub fn cdf(&self, max_points: usize) -> Vec<CdfPoint> {
        let mut pts = Vec::new();
        if self.count == 0 {
            return pts;
        }
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            seen += c;
            let (lo, w) = bucket_range(i);
            let top = (lo + (w - 1)).min(self.max);
            pts.push(CdfPoint {
                lat_us: top as f64 / 1000.0,
                fraction: seen as f64 / self.count as f64,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        let mut prev_end = 0;
        for i in 0..BUCKETS {
            let (lo, w) = bucket_range(i);
            assert_eq!(lo, prev_end, "bucket {i}");
            assert!(w == 1 || (w as f64) / (lo as f64) <= 1.0 / 128.0 + 1e-12);
            assert_eq!(index(lo), i);
            assert_eq!(index(lo + (w - 1)), i);
            prev_end = lo.wrapping_add(w);
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_within_one_percent() {
        let mut h = Histogram::new();
        let mut vals: Vec<u64> = (0..100_000u64).map(|i| 1000 + i * i % 9_999_991).collect();
        for &v in &vals {
            h.record(v);
        }
        vals.sort();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = vals[(q * vals.len() as f64).ceil() as usize - 1] as f64;
            let got = h.quantile_ns(q) as f64;
            assert!(
                (got - exact).abs() / exact < 0.01,
                "q={q} exact={exact} got={got}"
            );
        }
        assert_eq!(h.max_ns(), *vals.last().unwrap());
        assert_eq!(h.min_ns(), vals[0]);
        let cdf = h.cdf(50);
        assert!(cdf.len() <= 50);
        assert_eq!(cdf.last().unwrap().fraction, 1.0);
    }
}
