//! Latency histograms and time-series samples.

/// The latency histogram: tiercache's one percentile convention (nearest rank, a bucket
/// reports its largest value, 1/128 resolution), shared with `bench` and `loadgen`.
pub use tiercache_stats::Histogram;

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
