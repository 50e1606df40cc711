//! # tiercache-loadgen: tiercache's own NBD load generator
//!
//! Runs fio-style jobs against an NBD export (`nbd+unix:///NAME?socket=PATH` or
//! `nbd://HOST[:PORT]/NAME`; fixed-newstyle handshake with `NBD_OPT_GO`, simple replies):
//! a read/write mix, random (uniform or fio's Zipf) or sequential offsets, a block size, a
//! queue depth per connection and several connections, over a region, for a duration and/or
//! an IO count, with a ramp, optional FUA writes and periodic flushes.
//!
//! Every connection is one thread driving a non-blocking socket with `poll`: it keeps
//! `queue_depth` requests in flight (batched into one `sendmsg`), reads replies as they come
//! and matches them by handle, so a 2-core machine spends few cycles and context switches per
//! IO. Latency is submit → reply, recorded in a log-linear [`Histogram`] (tiercache-stats':
//! nearest-rank percentiles, never below the exact value and at most 1/128 above it);
//! the [`RunResult`] carries IOPS, MB/s, latency percentiles, a CDF, a per-interval time
//! series (to find the worst 1-second bucket), error counts and verification results, and
//! serializes to JSON.
//!
//! **Verification** ([`JobSpec::verify`]): every write carries a pattern (magic, write
//! sequence number, offset, run tag, checksum, generated body); the generator remembers the
//! last completed write of every block and checks every read of a written block against it.
//! Reads that race a write to the same block are not checked (they are counted as skipped),
//! and a block whose last write is ambiguous (two writes in flight at once) is only checked
//! to hold *some* complete write of this run for that offset. The bookkeeping is per
//! connection, so it is only meaningful when connections do not share blocks: with
//! `verify` and several connections, [`JobSpec::split_region`] must be set (each connection
//! gets its own slice of the region), and nothing else may write the region during the run
//! (that is exactly what it detects).
//!
//! **Compared with fio** (`tests/fio_crosscheck.rs` runs both against the same server-bound
//! nbdkit export and requires their IOPS within 10%): random offsets are drawn with
//! replacement (fio's default random map visits every block once per pass); Zipf uses fio's
//! formula and scattering but our own uniform source, and all connections share one hot set
//! (fio jobs each get their own); `io_count` is a total over the connections (fio's
//! `number_ios` is per job); MB/s are 10^6 bytes per second. Flushes (`flush_every`, like
//! fio's `fsync=N`) are not counted as IOs.
//!
//! [`Connection`] is a plain blocking client (read, write, flush, trim, write-zeroes, cache;
//! an optional time limit per call) for setup, warm-up and checks.
//!
//! ```no_run
//! use tiercache_loadgen::{run, JobSpec, Target};
//! let target = Target::parse("nbd+unix:///?socket=/tmp/nbd.sock").unwrap();
//! let spec = JobSpec { read_pct: 70, ..JobSpec::default() };
//! let r = run(&target, &spec).unwrap();
//! println!("{:.0} IOPS, p99 {:.1} µs", r.iops, r.lat.p99_us);
//! ```

#![deny(missing_docs)]

mod conn;
mod hist;
mod job;
mod pattern;
mod uri;
mod worker;

pub use conn::{Connection, flags};
pub use hist::{CdfPoint, Histogram, LatencyStats};
pub use job::{
    Access, Distribution, JobSpec, Progress, RunResult, Sample, VerifyStats, run, run_with,
};
pub use uri::Target;

use std::fmt;

/// Errors of this crate.
#[derive(Debug)]
pub enum Error {
    /// A socket error.
    Io(std::io::Error),
    /// The server broke the protocol or refused the export.
    Protocol(String),
    /// A malformed NBD URI.
    Uri(String),
    /// A job that cannot run (bad parameters, or the server lacks a needed feature).
    Spec(String),
    /// The server answered a request with this NBD error (an errno value).
    Nbd(u32),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Protocol(m) => write!(f, "NBD protocol: {m}"),
            Error::Uri(m) => write!(f, "bad NBD URI: {m}"),
            Error::Spec(m) => write!(f, "bad job: {m}"),
            Error::Nbd(e) => write!(f, "NBD error {e} ({})", errno_name(*e)),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}

/// The name of an NBD error value (the protocol's errno subset).
pub fn errno_name(e: u32) -> &'static str {
    match e {
        1 => "EPERM",
        5 => "EIO",
        12 => "ENOMEM",
        22 => "EINVAL",
        28 => "ENOSPC",
        75 => "EOVERFLOW",
        95 => "ENOTSUP",
        108 => "ESHUTDOWN",
        _ => "unknown",
    }
}
