//! Summaries of a handful of numbers (the rounds of one comparison). Latency percentiles are
//! [`tiercache_stats::Histogram`]'s, or fio's own.

pub(crate) fn pct(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The median of `xs` (the mean of the two middle values for an even count); NaN when empty.
pub(crate) fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// (median, min, max) of `xs` (empty: zeros).
pub(crate) fn median_min_max(xs: &[f64]) -> (f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    (median(&v), v[0], v[v.len() - 1])
}

/// The median of the values present (None when none is).
pub(crate) fn median_some(xs: &[Option<f64>]) -> Option<f64> {
    let v: Vec<f64> = xs.iter().flatten().copied().collect();
    (!v.is_empty()).then(|| median(&v))
}
