//! Per-export request statistics: a latency histogram per operation and the client's payload
//! bytes, counted where a request is received and where its reply is queued.
//!
//! The hot path is one `Instant::now()` at each end and three relaxed atomic adds: no lock, no
//! allocation. Buckets are fixed and log-spaced (powers of two from 16 µs to about 1 s, plus
//! one for everything slower), so recording is a division and a `leading_zeros`.
//!
//! A request's time runs from the moment the server has all of it (the header, and for a
//! WRITE its payload) to the moment its reply is queued for the socket: it includes waiting
//! for a worker or the engine, the device IOs and the cache's work, not the client's network.
//! Requests refused before they reach the export (bad range, misaligned, zero length) are not
//! counted.

use crate::proto::cmd;
use crate::transmission::Conn;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Number of finite bucket bounds: 16 µs · 2^i for i in 0..17 (16 µs to 1.048576 s).
pub const BUCKETS: usize = 17;
/// The first bound, in nanoseconds.
const FIRST_NS: u64 = 16_000;

/// The operations counted, as (name, NBD command).
pub const OPS: [(&str, u16); 7] = [
    ("read", cmd::READ),
    ("write", cmd::WRITE),
    ("flush", cmd::FLUSH),
    ("trim", cmd::TRIM),
    ("write_zeroes", cmd::WRITE_ZEROES),
    ("cache", cmd::CACHE),
    ("block_status", cmd::BLOCK_STATUS),
];

/// The bucket bounds in seconds (`le` of each finite bucket).
pub fn bucket_bounds() -> [f64; BUCKETS] {
    std::array::from_fn(|i| (FIRST_NS << i) as f64 / 1e9)
}

/// The bucket of a duration: the first whose bound is ≥ `ns`, or `BUCKETS` (+Inf).
fn bucket(ns: u64) -> usize {
    let q = ns.div_ceil(FIRST_NS);
    if q <= 1 {
        0
    } else {
        ((64 - (q - 1).leading_zeros()) as usize).min(BUCKETS)
    }
}

fn op_index(typ: u16) -> Option<usize> {
    OPS.iter().position(|(_, t)| *t == typ)
}

#[derive(Default)]
struct OpHist {
    /// Requests per bucket (not cumulative); the last is +Inf.
    buckets: [AtomicU64; BUCKETS + 1],
    sum_ns: AtomicU64,
    errors: AtomicU64,
}

/// The request statistics of one export, shared by all its connections.
#[derive(Default)]
pub struct RequestStats {
    ops: [OpHist; OPS.len()],
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

/// One operation's histogram, read at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSnapshot {
    /// The operation (`read`, `write`, `flush`, ...).
    pub op: &'static str,
    /// Cumulative counts for each bound of [`bucket_bounds`] (`count` is the +Inf bucket).
    pub cumulative: [u64; BUCKETS],
    /// Requests answered.
    pub count: u64,
    /// Their total time in seconds.
    pub sum_seconds: f64,
    /// Requests answered with an error.
    pub errors: u64,
}

impl RequestStats {
    /// Counts a request of NBD command `typ` with `len` bytes, received at `start`, whose reply
    /// is being queued now (`ok`: not an error). Commands not in [`OPS`] are ignored.
    pub fn record(&self, typ: u16, len: u64, start: Instant, ok: bool) {
        let Some(i) = op_index(typ) else { return };
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let h = &self.ops[i];
        h.buckets[bucket(ns)].fetch_add(1, Relaxed);
        h.sum_ns.fetch_add(ns, Relaxed);
        if !ok {
            h.errors.fetch_add(1, Relaxed);
        } else if typ == cmd::READ {
            self.read_bytes.fetch_add(len, Relaxed);
        } else if typ == cmd::WRITE {
            self.written_bytes.fetch_add(len, Relaxed);
        }
    }

    /// Every operation's histogram.
    pub fn snapshot(&self) -> Vec<OpSnapshot> {
        OPS.iter()
            .zip(&self.ops)
            .map(|((op, _), h)| {
                let mut cumulative = [0; BUCKETS];
                let mut n = 0;
                for (i, c) in cumulative.iter_mut().enumerate() {
                    n += h.buckets[i].load(Relaxed);
                    *c = n;
                }
                OpSnapshot {
                    op,
                    cumulative,
                    count: n + h.buckets[BUCKETS].load(Relaxed),
                    sum_seconds: h.sum_ns.load(Relaxed) as f64 / 1e9,
                    errors: h.errors.load(Relaxed),
                }
            })
            .collect()
    }

    /// Payload bytes of successful READs sent to clients.
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes.load(Relaxed)
    }

    /// Payload bytes of successful WRITEs received from clients.
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes.load(Relaxed)
    }
}

/// Records a request of `conn` whose reply is being queued, if its export keeps statistics.
pub(crate) fn record(conn: &Conn, typ: u16, len: u64, start: Instant, ok: bool) {
    if let Some(s) = conn.export.request_stats() {
        s.record(typ, len, start, ok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn buckets_are_the_first_bound_at_or_above() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(16_000), 0);
        assert_eq!(bucket(16_001), 1);
        assert_eq!(bucket(32_000), 1);
        assert_eq!(bucket(32_001), 2);
        assert_eq!(bucket(1_048_576_000), 16);
        assert_eq!(bucket(1_048_576_001), BUCKETS);
        assert_eq!(bucket(u64::MAX), BUCKETS);
        let b = bucket_bounds();
        assert_eq!(b[0], 16e-6);
        assert_eq!(b[BUCKETS - 1], 1.048576);
        // Every duration lands in the first bucket whose bound holds it.
        for ns in [1, 15_999, 100_000, 999_999, 5_000_000, 300_000_000] {
            let i = bucket(ns);
            assert!(ns as f64 / 1e9 <= b[i]);
            assert!(i == 0 || ns as f64 / 1e9 > b[i - 1]);
        }
    }

    #[test]
    fn record_counts_time_bytes_and_errors() {
        let s = RequestStats::default();
        let long_ago = Instant::now() - Duration::from_millis(3);
        s.record(cmd::READ, 4096, long_ago, true);
        s.record(cmd::READ, 4096, Instant::now(), false);
        s.record(cmd::WRITE, 8192, Instant::now(), true);
        s.record(cmd::DISC, 0, Instant::now(), true); // not counted
        let snap = s.snapshot();
        let read = &snap[0];
        assert_eq!((read.op, read.count, read.errors), ("read", 2, 1));
        assert!(read.sum_seconds >= 0.003);
        // 3 ms: not in the buckets up to 2.048 ms, in the 4.096 ms one.
        assert_eq!(read.cumulative[7], 1);
        assert_eq!(read.cumulative[8], 2);
        assert_eq!(read.cumulative[BUCKETS - 1], 2);
        assert_eq!(snap[1].count, 1);
        assert_eq!(s.read_bytes(), 4096);
        assert_eq!(s.written_bytes(), 8192);
        assert!(snap[2..].iter().all(|o| o.count == 0));
    }
}
