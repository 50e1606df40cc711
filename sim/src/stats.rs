//! Latency histograms and time-series samples.

/// A log-linear latency histogram: 16 sub-buckets per power of two (about 4% resolution), from
/// 1 ns to hours, in a fixed 1 KiB table — cheap enough to keep one per second.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
    sum: u128,
    max: u64,
}

const SUB: u32 = 16;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; 64 * SUB as usize],
            n: 0,
            sum: 0,
            max: 0,
        }
    }
}

impl Histogram {
    fn bucket(v: u64) -> usize {
        if v < SUB as u64 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= 4
        let m = (v >> (e - 4)) as u32 & (SUB - 1);
        ((e - 3) * SUB + m) as usize
    }

    fn lower(b: usize) -> u64 {
        let b = b as u32;
        if b < SUB {
            return b as u64;
        }
        let e = b / SUB + 3;
        let m = (b % SUB) as u64;
        (SUB as u64 + m) << (e - 4)
    }

    /// Adds a value (nanoseconds).
    pub fn record(&mut self, v: u64) {
        self.counts[Self::bucket(v)] += 1;
        self.n += 1;
        self.sum += v as u128;
        self.max = self.max.max(v);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// Mean, ns (0 if empty).
    pub fn mean_ns(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// The `q` quantile (0..=1), ns: the top of the bucket holding it (so a tail is never
    /// under-reported by more than the bucket width, 1/16), but never more than the largest
    /// value recorded (0 if empty).
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut acc = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= rank {
                return (Self::lower(b + 1) - 1).min(self.max);
            }
        }
        self.max
    }
}

/// One time-series sample.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
pub struct Sample {
    /// End of the interval, simulated seconds since the start of the run.
    pub t_s: f64,
    /// Client requests completed per second in the interval.
    pub iops: f64,
    /// Mean client latency in the interval, µs.
    pub lat_mean_us: f64,
    /// 99th percentile client latency in the interval, µs.
    pub lat_p99_us: f64,
    /// Dirty share of all cache lines at the end of the interval, percent.
    pub dirty_pct: f64,
    /// Lines written back per second in the interval (all caches).
    pub writeback_lines_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_within_resolution() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        for q in [0.5, 0.9, 0.99] {
            let exact = q * 100_000_000.0;
            let got = h.quantile_ns(q) as f64;
            assert!((got - exact).abs() / exact < 0.07, "q{q}: {got} vs {exact}");
        }
        assert!((h.mean_ns() - 50_000_500.0).abs() < 1.0);
        let mut c = Histogram::default();
        for _ in 0..100 {
            c.record(77_000);
        }
        assert_eq!(
            c.quantile_ns(0.99),
            77_000,
            "a constant latency is its own p99"
        );
        for v in [0u64, 1, 15, 16, 17, 1 << 40] {
            let b = Histogram::bucket(v);
            assert!(
                Histogram::lower(b) <= v
                    && (b + 1 >= h.counts.len() || Histogram::lower(b + 1) > v),
                "{v}"
            );
        }
    }
}
