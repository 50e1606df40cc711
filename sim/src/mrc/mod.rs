//! Miss-ratio curves from a trace: "how much cache do I need?".
//!
//! Two methods, one result type ([`Point`] per cache size):
//!
//! - [`stack`]: textbook LRU in one pass with stack distances (a Fenwick tree over last-access
//!   times, O(log n) per line access), every size at once; optionally on a spatially sampled
//!   trace (SHARDS, fixed rate) for traces too large to walk exactly.
//! - [`policy`]: the product's own cache core ([`tiercache_core::Cache`], unchanged) run once
//!   per size, the sizes in parallel threads, with any eviction, promotion, cutoff and mode —
//!   exact to what tiercache would do, slower.
//!
//! A request counts as a hit only when every line it touches is a hit (a full hit); a request
//! with some lines hit is a partial hit and counted as a miss, and separately. Reads and
//! writes count; trims and flushes are not requests of the curve (the core run applies them).

pub mod policy;
pub mod stack;

use crate::trace::{Op, Request};

/// One cache size's result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Point {
    /// Cache size, bytes (`lines` × line size).
    pub bytes: u64,
    /// Cache lines.
    pub lines: u64,
    /// Read requests counted.
    pub reads: u64,
    /// Write requests counted.
    pub writes: u64,
    /// Read requests that were full hits.
    pub read_hits: u64,
    /// Write requests that were full hits.
    pub write_hits: u64,
    /// Requests that were partial hits (some lines or blocks hit, not all).
    pub partial_hits: u64,
    /// Bytes read from the core device.
    pub core_read_bytes: u64,
    /// Bytes written to the core device (client writes in write-through, writeback in lazy
    /// modes).
    pub core_write_bytes: u64,
    /// Of those, bytes written back (lazy modes; 0 for write-through and the stack method).
    pub writeback_bytes: u64,
}

impl Point {
    /// Misses over requests (a partial hit is a miss).
    pub fn miss_ratio(&self) -> f64 {
        ratio(
            self.reads + self.writes - self.read_hits - self.write_hits,
            self.reads + self.writes,
        )
    }

    /// Read misses over reads.
    pub fn read_miss_ratio(&self) -> f64 {
        ratio(self.reads - self.read_hits, self.reads)
    }

    /// Write misses over writes.
    pub fn write_miss_ratio(&self) -> f64 {
        ratio(self.writes - self.write_hits, self.writes)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The lines a request touches, `line_bytes` each: first line and count.
pub fn lines_of(r: &Request, line_bytes: u64) -> (u64, u64) {
    let first = r.offset / line_bytes;
    let last = (r.end() - 1) / line_bytes;
    (first, last - first + 1)
}

/// Whether a request is one the curve counts.
pub fn counted(r: &Request) -> bool {
    matches!(r.op, Op::Read | Op::Write) && r.len > 0
}

/// Reads and writes of a trace, in requests and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mix {
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
}

impl Mix {
    /// Counts a read or write request (see [`counted`]).
    pub fn count(&mut self, r: &Request) {
        if r.op == Op::Read {
            self.reads += 1;
            self.read_bytes += r.len as u64;
        } else {
            self.writes += 1;
            self.write_bytes += r.len as u64;
        }
    }
}

/// What the trace looks like to a cache of `line_bytes` lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Distinct lines read or written.
    pub lines: u64,
    /// Reads and writes.
    pub mix: Mix,
    /// Trims.
    pub trims: u64,
    /// Flushes.
    pub flushes: u64,
    /// Line accesses (a request touching 3 lines is 3).
    pub line_accesses: u64,
}

/// Counts the trace's footprint and mix.
pub fn footprint(reqs: &[Request], line_bytes: u64) -> Footprint {
    let mut seen = stack::LineMap::default();
    let mut f = Footprint::default();
    for r in reqs {
        match r.op {
            Op::Trim => f.trims += 1,
            Op::Flush => f.flushes += 1,
            Op::Read | Op::Write if r.len > 0 => {
                f.mix.count(r);
                let (first, n) = lines_of(r, line_bytes);
                f.line_accesses += n;
                for l in first..first + n {
                    seen.insert(l, 0);
                }
            }
            _ => {}
        }
    }
    f.lines = seen.len() as u64;
    f
}

/// The knee of a curve: the point farthest below the straight line from the first to the
/// last point, with sizes on a log scale (where more cache stops paying off as fast).
/// `None` with fewer than 3 points.
pub fn knee(points: &[Point]) -> Option<usize> {
    if points.len() < 3 {
        return None;
    }
    let x = |p: &Point| (p.bytes.max(1) as f64).log10();
    let (a, b) = (&points[0], &points[points.len() - 1]);
    let (x0, y0, x1, y1) = (x(a), a.miss_ratio(), x(b), b.miss_ratio());
    if x1 <= x0 {
        return None;
    }
    let mut best = (0.0, None);
    for (i, p) in points.iter().enumerate() {
        let chord = y0 + (y1 - y0) * (x(p) - x0) / (x1 - x0);
        let below = chord - p.miss_ratio();
        if below > best.0 {
            best = (below, Some(i));
        }
    }
    best.1
}

/// Largest absolute difference in miss ratio between two curves at the same sizes.
pub fn max_error(a: &[Point], b: &[Point]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(p, q)| (p.miss_ratio() - q.miss_ratio()).abs())
        .fold(0.0, f64::max)
}
