//! Job specification, running a job over its connections, and results (the per-connection
//! worker is `worker.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Serialize, Serializer};

use crate::conn::{Connection, flags};
use crate::hist::{CdfPoint, Histogram, LatencyStats};
use crate::pattern::{self, Zipf};
use crate::worker::{ConnShared, Worker, WorkerResult, WorkerSetup, merge};
use crate::{Error, Target};

/// Random or sequential offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Offsets drawn from [`JobSpec::distribution`] (with replacement: unlike fio's default
    /// random map, a block can be hit twice before every block was hit once).
    Random,
    /// Each connection walks its region block by block, wrapping at the end.
    Sequential,
}

/// How random offsets are distributed over the region's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Distribution {
    /// Every block equally likely.
    Uniform,
    /// fio's `random_distribution=zipf:THETA` (θ > 0, θ ≠ 1), computed as fio's
    /// `lib/zipf.c` does. All connections share the same hot blocks (fio gives every job its
    /// own); each connection draws its own sequence.
    Zipf {
        /// The skew θ (fio's default example: 0.9; larger is more skewed).
        theta: f64,
    },
}

pub(crate) fn ser_dur<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}
pub(crate) fn ser_opt_dur<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// One workload. `Default` is 4 KiB random reads, QD 16, one connection, the whole export,
/// 10 s, uniform, no ramp.
#[derive(Debug, Clone, Serialize)]
pub struct JobSpec {
    /// Share of reads in percent (0–100); the rest are writes (fio's `rwmixread`).
    pub read_pct: u8,
    /// Random or sequential offsets.
    pub access: Access,
    /// Bytes per IO; a multiple of 512. Offsets are multiples of it from [`JobSpec::offset`].
    pub block_size: u32,
    /// Requests in flight per connection (fio's `iodepth`).
    pub queue_depth: u32,
    /// Number of NBD connections (fio's `numjobs`), each with its own queue depth.
    pub connections: u32,
    /// Start of the region in bytes (a multiple of 512).
    pub offset: u64,
    /// Size of the region; `None`: to the end of the export.
    pub size: Option<u64>,
    /// Give each connection its own 1/n slice of the region instead of all of it (needed
    /// by `verify` with several connections; natural for sequential streams).
    pub split_region: bool,
    /// How long to measure (after the ramp). With `io_count` too, whichever ends first.
    #[serde(rename = "duration_s", serialize_with = "ser_opt_dur")]
    pub duration: Option<Duration>,
    /// How many IOs to complete after the ramp, over all connections (flushes excluded).
    pub io_count: Option<u64>,
    /// Distribution of random offsets.
    pub distribution: Distribution,
    /// Warm-up time: IOs submitted during it are run but not counted (fio's `ramp_time`).
    #[serde(rename = "ramp_s", serialize_with = "ser_dur")]
    pub ramp: Duration,
    /// Seed of every random choice (offsets, read/write, FUA).
    pub seed: u64,
    /// Share of writes sent with `NBD_CMD_FLAG_FUA`, in percent.
    pub fua_pct: u8,
    /// Send `NBD_CMD_FLUSH` after every this many writes per connection (0: never; fio's
    /// `fsync=N`). Flushes get their own latency and are not counted as IOs.
    pub flush_every: u64,
    /// Width of the time-series buckets.
    #[serde(rename = "sample_interval_s", serialize_with = "ser_dur")]
    pub sample_interval: Duration,
    /// Write a checkable pattern and check reads against the last write (see the crate
    /// documentation for what is and is not checked).
    pub verify: bool,
    /// CPUs to pin the connection threads to (connection `i` on `cpus[i % len]`); empty:
    /// no pinning. SPEC's measurements pin the generator and the server apart.
    pub cpus: Vec<usize>,
}

impl Default for JobSpec {
    fn default() -> JobSpec {
        JobSpec {
            read_pct: 100,
            access: Access::Random,
            block_size: 4096,
            queue_depth: 16,
            connections: 1,
            offset: 0,
            size: None,
            split_region: false,
            duration: Some(Duration::from_secs(10)),
            io_count: None,
            distribution: Distribution::Uniform,
            ramp: Duration::ZERO,
            seed: 1,
            fua_pct: 0,
            flush_every: 0,
            sample_interval: Duration::from_secs(1),
            verify: false,
            cpus: Vec::new(),
        }
    }
}

impl JobSpec {
    /// Sets `read_pct` and `access` from a fio `rw=` name (`read`, `write`, `randread`,
    /// `randwrite`, `rw`/`readwrite`, `randrw`); the mixed ones take `rwmixread`.
    pub fn set_rw(&mut self, rw: &str, rwmixread: u8) -> Result<(), Error> {
        let (pct, access) = match rw {
            "read" => (100, Access::Sequential),
            "write" => (0, Access::Sequential),
            "randread" => (100, Access::Random),
            "randwrite" => (0, Access::Random),
            "rw" | "readwrite" => (rwmixread, Access::Sequential),
            "randrw" => (rwmixread, Access::Random),
            _ => return Err(Error::Spec(format!("unknown rw={rw}"))),
        };
        self.read_pct = pct.min(100);
        self.access = access;
        Ok(())
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Spec(m));
        if self.read_pct > 100 || self.fua_pct > 100 {
            return bad("read_pct and fua_pct are percentages".into());
        }
        if self.block_size == 0 || !self.block_size.is_multiple_of(512) {
            return bad(format!(
                "block_size {} is not a multiple of 512",
                self.block_size
            ));
        }
        if self.queue_depth == 0 || self.queue_depth > 65_536 {
            return bad(format!("queue_depth {} not in 1..=65536", self.queue_depth));
        }
        if self.connections == 0 || self.connections > 1024 {
            return bad(format!("connections {} not in 1..=1024", self.connections));
        }
        if !self.offset.is_multiple_of(512) {
            return bad(format!("offset {} is not a multiple of 512", self.offset));
        }
        if self.sample_interval < Duration::from_millis(1) {
            return bad("sample_interval below 1 ms".into());
        }
        if let Distribution::Zipf { theta } = self.distribution
            && !(theta > 0.0 && theta.is_finite() && (theta - 1.0).abs() > 1e-9)
        {
            return bad(format!(
                "zipf theta {theta} must be > 0 and ≠ 1 (as in fio)"
            ));
        }
        if self.cpus.iter().any(|&c| c >= libc::CPU_SETSIZE as usize) {
            return bad(format!("cpus {:?}: CPU number too large", self.cpus));
        }
        if self.verify && self.connections > 1 && !self.split_region {
            return bad("verify with several connections needs split_region".into());
        }
        Ok(())
    }
}

/// What a progress callback sees (about every 250 ms).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Progress {
    /// Time since the run started (ramp included).
    pub elapsed: Duration,
    /// Still in the ramp.
    pub ramping: bool,
    /// Completed IOs so far (ramp included, flushes excluded).
    pub ops: u64,
    /// Bytes transferred so far (ramp included).
    pub bytes: u64,
    /// Planned ramp + duration, when a duration was given.
    pub planned: Option<Duration>,
    /// Connections still running.
    pub connections_running: usize,
}

/// One bucket of the time series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Start of the bucket, seconds after the end of the ramp.
    pub t_s: f64,
    /// Length of the bucket (the last one may be shorter).
    pub duration_s: f64,
    /// Shorter than the sample interval (the tail of the run): left out of `worst_sample`.
    pub partial: bool,
    /// IOs completed in the bucket.
    pub ops: u64,
    /// Reads completed in the bucket.
    pub reads: u64,
    /// Writes completed in the bucket.
    pub writes: u64,
    /// Error replies in the bucket.
    pub errors: u64,
    /// IOs per second over the bucket.
    pub iops: f64,
    /// MB/s (10^6 bytes) over the bucket.
    pub mb_s: f64,
    /// Mean latency of the IOs completed in the bucket.
    pub lat_mean_us: f64,
    /// Largest latency of the IOs completed in the bucket.
    pub lat_max_us: f64,
}

/// Verification outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyStats {
    /// Reads compared with the exact last write of their block.
    pub checked: u64,
    /// Reads of blocks whose last write was ambiguous, checked to hold some complete write
    /// of this run for their offset.
    pub checked_any: u64,
    /// Reads not checked: block never written in this run, or a write to it in flight.
    pub skipped: u64,
    /// Reads whose data was wrong.
    pub failures: u64,
    /// The first few failures, described.
    pub first_failures: Vec<String>,
}

/// Everything a run measured. Rates are over the measured period (after the ramp, until
/// the last counted completion).
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// The job.
    pub spec: JobSpec,
    /// The target, as a URI.
    pub target: String,
    /// Size of the export.
    pub export_size: u64,
    /// Length of the measured period.
    pub elapsed_s: f64,
    /// Completed IOs (reads + writes without error).
    pub ops: u64,
    /// Completed reads.
    pub reads: u64,
    /// Completed writes.
    pub writes: u64,
    /// Completed flushes (not in `ops`).
    pub flushes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// IOs per second.
    pub iops: f64,
    /// Reads per second.
    pub read_iops: f64,
    /// Writes per second.
    pub write_iops: f64,
    /// MB/s (10^6 bytes), reads and writes.
    pub bw_mbps: f64,
    /// MiB/s, reads and writes.
    pub bw_mibps: f64,
    /// Latency of all IOs.
    pub lat: LatencyStats,
    /// Latency of reads.
    pub read_lat: LatencyStats,
    /// Latency of writes.
    pub write_lat: LatencyStats,
    /// Latency of flushes.
    pub flush_lat: LatencyStats,
    /// Latency CDF of all IOs (at most 200 points).
    pub lat_cdf: Vec<CdfPoint>,
    /// The time series, one bucket per `sample_interval`.
    pub samples: Vec<Sample>,
    /// Index in `samples` of the full bucket with the fewest IOPS.
    pub worst_sample: Option<usize>,
    /// Error replies (all kinds); these requests are not in `ops` or the latencies.
    pub errors: u64,
    /// Error replies to reads.
    pub read_errors: u64,
    /// Error replies to writes.
    pub write_errors: u64,
    /// Error replies to flushes.
    pub flush_errors: u64,
    /// The first few error replies, described.
    pub error_messages: Vec<String>,
    /// Verification results, when `verify` was on.
    pub verify: Option<VerifyStats>,
    /// Connections that failed during the run (socket error, protocol violation, no
    /// answer while draining); what they measured before is kept.
    pub connection_failures: Vec<String>,
    /// Stopped by the stop flag before the planned end.
    pub stopped: bool,
    /// CPU time of the generator's connection threads per completed IO (ramp included), in
    /// µs: the client's cost only; the server's is the caller's to measure.
    pub client_cpu_us_per_io: f64,
    /// Histogram of all IO latencies (not serialized).
    #[serde(skip)]
    pub histogram: Histogram,
}

/// Runs `spec` against `target` until its duration/IO count ends.
pub fn run(target: &Target, spec: &JobSpec) -> Result<RunResult, Error> {
    run_with(target, spec, &Arc::new(AtomicBool::new(false)), &mut |_| {})
}

/// Runs `spec` against `target`; setting `stop` ends the run early (in-flight requests are
/// drained and everything measured is kept, `stopped` is set); `progress` is called from
/// this thread about every 250 ms. Errors only when the job is invalid or the connections
/// cannot be set up; failures during the run are reported in the result.
pub fn run_with(
    target: &Target,
    spec: &JobSpec,
    stop: &Arc<AtomicBool>,
    progress: &mut dyn FnMut(&Progress),
) -> Result<RunResult, Error> {
    spec.validate()?;
    let mut conns = Vec::new();
    for _ in 0..spec.connections {
        conns.push(Connection::connect(target)?);
    }
    let size = conns[0].size();
    let fl = conns[0].flags();
    if spec.read_pct < 100 && fl & flags::READ_ONLY != 0 {
        return Err(Error::Spec("the export is read-only".into()));
    }
    if spec.fua_pct > 0 && fl & flags::SEND_FUA == 0 {
        return Err(Error::Spec("the server does not support FUA".into()));
    }
    if spec.flush_every > 0 && fl & flags::SEND_FLUSH == 0 {
        return Err(Error::Spec("the server does not support flush".into()));
    }
    let region_size = match spec.size {
        Some(s) => s,
        None => size.saturating_sub(spec.offset),
    };
    if spec
        .offset
        .checked_add(region_size)
        .is_none_or(|end| end > size)
    {
        return Err(Error::Spec(format!(
            "region {}+{} is beyond the export's {} bytes",
            spec.offset, region_size, size
        )));
    }
    let bs = spec.block_size as u64;
    let nblocks = region_size / bs;
    let n = spec.connections as u64;
    if nblocks == 0 || (spec.split_region && nblocks < n) {
        return Err(Error::Spec(format!(
            "region of {region_size} bytes has too few blocks"
        )));
    }
    let zipf_blocks = if spec.split_region {
        nblocks / n
    } else {
        nblocks
    };
    let zipf = match spec.distribution {
        Distribution::Zipf { theta } => Some(Zipf::new(zipf_blocks, theta, spec.seed)),
        Distribution::Uniform => None,
    };
    let tag = pattern::mix64(spec.seed ^ 0x7469_6572_6361_6368)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
        ^ std::process::id() as u64;

    let shared: Vec<ConnShared> = (0..n).map(|_| ConnShared::default()).collect();
    let running = AtomicUsize::new(conns.len());
    let t0 = Instant::now();
    let measure_start = t0 + spec.ramp;
    let deadline = spec.duration.map(|d| measure_start + d);
    let planned = spec.duration.map(|d| d + spec.ramp);
    let results: Vec<WorkerResult> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, conn) in conns.into_iter().enumerate() {
            let i = i as u64;
            let (start_block, blocks) = if spec.split_region {
                let per = nblocks / n;
                (i * per, per)
            } else {
                (0, nblocks)
            };
            let budget = spec.io_count.map(|c| c / n + u64::from(i < c % n));
            let w = Worker::new(WorkerSetup {
                conn,
                spec,
                index: i,
                region_start: spec.offset + start_block * bs,
                blocks,
                zipf: zipf.clone(),
                tag,
                t0,
                measure_start,
                deadline,
                budget,
                stop,
                shared: &shared[i as usize],
            });
            let running = &running;
            handles.push(s.spawn(move || {
                let r = w.run();
                running.fetch_sub(1, Ordering::Release);
                r
            }));
        }
        let tick = Duration::from_millis(250);
        let mut next = t0 + tick;
        loop {
            let alive = running.load(Ordering::Acquire);
            if alive == 0 {
                break;
            }
            let now = Instant::now();
            if now >= next {
                progress(&Progress {
                    elapsed: now - t0,
                    ramping: now < measure_start,
                    ops: shared.iter().map(|c| c.ops.load(Ordering::Relaxed)).sum(),
                    bytes: shared.iter().map(|c| c.bytes.load(Ordering::Relaxed)).sum(),
                    planned,
                    connections_running: alive,
                });
                next += tick;
                if next < now {
                    next = now + tick;
                }
            }
            std::thread::sleep(Duration::from_millis(10).min(next.saturating_duration_since(now)));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("loadgen worker panicked"))
            .collect()
    });
    let end = Instant::now();
    progress(&Progress {
        elapsed: end - t0,
        ramping: false,
        ops: shared.iter().map(|c| c.ops.load(Ordering::Relaxed)).sum(),
        bytes: shared.iter().map(|c| c.bytes.load(Ordering::Relaxed)).sum(),
        planned,
        connections_running: 0,
    });
    Ok(merge(
        target,
        spec,
        size,
        measure_start,
        end,
        shared.iter().map(|c| c.ops.load(Ordering::Relaxed)).sum(),
        results,
    ))
}
