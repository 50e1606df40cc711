//! tiercache's one latency histogram and its one percentile convention.
//!
//! `bench core`, the simulator (`tiercache-sim`) and the load generator (`tiercache-loadgen`)
//! all report percentiles; they used to define them three ways, so their p99s were not
//! strictly comparable. They now all record into [`Histogram`] and ask [`Histogram::quantile_ns`].
//!
//! **Why a crate of its own, with no dependencies**: its users sit at different layers (the
//! simulator next to the core, the load generator next to the NBD client, the CLI on top), and
//! none of `format` (the on-disk format) or `devmodel` (device models) is about measurement.
//! A leaf crate that depends on nothing can be used by every one of them without making one
//! layer depend on another. Serialisable summaries (`LatencyStats`, CDF points) stay with the
//! tools that print them.
//!
//! **The convention, written once.**
//! - The `q` quantile of `n` values is the **nearest rank**: the `r`-th smallest value with
//!   `r = max(1, ceil(q·n))` (`q` clamped to 0..=1). So `q = 0` is the smallest value and
//!   `q = 1` the largest.
//! - Values are kept in log-linear buckets: below 256 every value is its own bucket; above,
//!   every power of two is split into 128 buckets, so a bucket is at most 1/128 of its values
//!   wide.
//! - **A bucket reports its largest value**, clamped to the smallest and largest value
//!   recorded. So a quantile is never under-reported, and is over-reported by less than one
//!   bucket width (under 0.8%): `exact <= quantile_ns(q) <= exact + exact/128`. A histogram of
//!   one value, and `q = 1`, report the exact value.

const SUB_BITS: u32 = 7;
/// Buckets per power of two.
const SUB: usize = 1 << SUB_BITS;
/// Values below this are their own bucket.
const EXACT: u64 = 2 * SUB as u64;
const BUCKETS: usize = EXACT as usize + (64 - 8) * SUB;

/// A log-linear latency histogram in nanoseconds (see the crate doc for the convention).
#[derive(Clone, PartialEq, Eq)]
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
        write!(
            f,
            "Histogram {{ count: {}, mean_ns: {:.0}, min_ns: {}, p50_ns: {}, p99_ns: {}, max_ns: {} }}",
            self.count,
            self.mean_ns(),
            self.min_ns(),
            self.quantile_ns(0.5),
            self.quantile_ns(0.99),
            self.max_ns()
        )
    }
}

/// The bucket holding `v`.
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

/// (smallest value, width) of bucket `i`.
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

    /// A histogram of `values` (ns).
    pub fn of(values: impl IntoIterator<Item = u64>) -> Histogram {
        let mut h = Histogram::new();
        for v in values {
            h.record(v);
        }
        h
    }

    /// Records one value (ns).
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

    /// Exact mean, ns (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// Largest value, ns (exact; 0 when empty).
    pub fn max_ns(&self) -> u64 {
        self.max
    }

    /// Smallest value, ns (exact; 0 when empty).
    pub fn min_ns(&self) -> u64 {
        if self.count == 0 { 0 } else { self.min }
    }

    /// The `q` quantile (0..=1), ns: the nearest rank `max(1, ceil(q·count))`, reported as the
    /// largest value of the bucket holding it, clamped to [min, max] (the crate doc); 0 when
    /// empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::reported(i).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// What bucket `i` reports before clamping: its largest value.
    fn reported(i: usize) -> u64 {
        let (lo, w) = bucket_range(i);
        lo + (w - 1)
    }

    /// The non-empty buckets in increasing order, each as (the value it reports, clamped to
    /// [min, max]; how many values it holds) — the points of a CDF.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c > 0)
            .map(|(i, &c)| (Self::reported(i).clamp(self.min, self.max), c))
    }
}

/// The exact nearest-rank `q` quantile of `sorted` (ascending): the `max(1, ceil(q·n))`-th
/// smallest value; `None` when empty. The definition [`Histogram::quantile_ns`] approximates
/// within one bucket; for tests and for a handful of values.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n);
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded xorshift, so the data is the same every run.
    fn values(seed: u64, n: usize) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Latencies from ns to tens of ms, log-spread.
                let mag = x % 25;
                (x >> 8) % (1u64 << mag).max(1) + (x >> 40) % 200
            })
            .collect()
    }

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
    fn quantiles_are_the_nearest_rank_within_one_bucket() {
        for seed in [1u64, 7, 0x9e37_79b9_7f4a_7c15] {
            for n in [1usize, 2, 3, 10, 99, 100, 101, 1000, 54_321] {
                let mut vals = values(seed, n);
                let h = Histogram::of(vals.iter().copied());
                vals.sort_unstable();
                for q in [0.0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0] {
                    let exact = nearest_rank(&vals, q).unwrap();
                    let got = h.quantile_ns(q);
                    assert!(
                        exact <= got && got <= exact + exact / 128,
                        "seed {seed} n {n} q {q}: {got} vs exact {exact}"
                    );
                }
                assert_eq!(h.quantile_ns(1.0), vals[n - 1], "q=1 is the max");
                assert_eq!(h.min_ns(), vals[0]);
                assert_eq!(h.max_ns(), vals[n - 1]);
                let sum: u64 = vals.iter().sum();
                assert!((h.mean_ns() - sum as f64 / n as f64).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn edge_cases() {
        let empty = Histogram::new();
        assert_eq!(empty.count(), 0);
        for q in [0.0, 0.5, 1.0] {
            assert_eq!(empty.quantile_ns(q), 0);
        }
        assert_eq!(
            (empty.min_ns(), empty.max_ns(), empty.mean_ns()),
            (0, 0, 0.0)
        );
        assert_eq!(empty.buckets().count(), 0);
        assert_eq!(nearest_rank::<u64>(&[], 0.5), None);

        let one = Histogram::of([123_457]);
        for q in [0.0, 0.5, 0.99, 1.0] {
            assert_eq!(one.quantile_ns(q), 123_457, "one sample is every quantile");
        }
        assert_eq!(one.buckets().collect::<Vec<_>>(), vec![(123_457, 1)]);

        let mut v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let h = Histogram::of(v.iter().copied());
        // q=0 is the smallest value, reported as its bucket's largest value: within a bucket.
        assert_eq!(
            h.quantile_ns(0.0),
            1003,
            "the top of the bucket [1000, 1004)"
        );
        assert_eq!(h.quantile_ns(-1.0), h.quantile_ns(0.0), "q is clamped");
        assert_eq!(h.quantile_ns(1.0), 100_000);
        assert_eq!(h.quantile_ns(2.0), 100_000, "q is clamped");
        v.sort_unstable();
        assert_eq!(nearest_rank(&v, 0.0), Some(1000));
        assert_eq!(nearest_rank(&v, 0.5), Some(50_000));
        assert_eq!(nearest_rank(&v, 0.99), Some(99_000));
        assert_eq!(nearest_rank(&v, 1.0), Some(100_000));

        let constant = Histogram::of(std::iter::repeat_n(77_000, 100));
        assert_eq!(
            constant.quantile_ns(0.99),
            77_000,
            "a constant is its own p99"
        );
    }

    #[test]
    fn merge_is_recording_both() {
        let a = values(3, 1000);
        let b = values(4, 500);
        let mut h = Histogram::of(a.iter().copied());
        h.merge(&Histogram::of(b.iter().copied()));
        assert_eq!(h, Histogram::of(a.iter().chain(&b).copied()));
        let total: u64 = h.buckets().map(|(_, c)| c).sum();
        assert_eq!(total, 1500);
    }
}
