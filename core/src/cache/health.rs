//! Faults: what the cache does when a device fails, and the health it reports (SPEC R3, R4,
//! C19; docs/SAFETY.md, "Faults").
//!
//! Every device error reaches the core as an [`IoError`] (`Io`, `NoSpace`, `TimedOut`; the
//! three are handled alike and counted apart). What the core does about it:
//!
//! - **Core device, client IO** (reads, write-through and pass-through writes, flushes): the
//!   error is the request's result. The core is *failing* from that error until an IO on it
//!   succeeds ([`Problem::CoreDevice`]).
//! - **Core device, writeback** (a core write or the core flush of a writeback job): the lines
//!   stay dirty — never marked clean — and are retried with exponential backoff per core
//!   ([`FaultParams::writeback_retry_first`], doubling up to
//!   [`FaultParams::writeback_retry_max`]; a job that cleaned some lines of the core resets the
//!   backoff to the first step). An *episode* opens at the first failure and closes when a job
//!   writes every line it took for that core, or when the core has no dirty line left
//!   ([`Problem::Writeback`]: first failure, failures, retries, next retry, dirty blocks).
//! - **Cache device** (any IO: client data, backfill, writeback reads, metadata): the request
//!   that met the error is finished from the core where the data allows it (a read of clean
//!   blocks is re-read from the core; a write-through write already went to the core; a lazy
//!   write is written to the core instead, see `request.rs`), and the cache enters *bypass*:
//!   it acts as in mode `pt` — nothing new is mapped or promoted, writes go to the core with the
//!   cache's copy dropped (no new dirty data), clean blocks are read from the core, dirty blocks
//!   (which exist nowhere else) are still read from the cache, and writeback is forced so that
//!   dirty data leaves the device while it can. At [`FaultParams::cache_retry_first`] (doubling
//!   up to [`FaultParams::cache_retry_max`]) the core *probes* the device with a flush; a
//!   successful probe ends bypass ([`Problem::CacheDevice`], with every dirty block at risk).

use super::{Cache, IoOwner};
use crate::event::{Action, Dev, IoError};
use crate::units::{CoreId, LineId, Nanos};

/// Retry timing for faults (not persisted: the defaults apply after a load).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultParams {
    /// First wait before retrying writeback to a core that failed (default 50 ms).
    pub writeback_retry_first: Nanos,
    /// Longest wait between writeback retries (default 5 s).
    pub writeback_retry_max: Nanos,
    /// How long the cache stays in bypass after a cache device error before its first probe
    /// (default 1 s).
    pub cache_retry_first: Nanos,
    /// Longest wait between probes of a failing cache device (default 30 s).
    pub cache_retry_max: Nanos,
}

impl Default for FaultParams {
    fn default() -> Self {
        FaultParams {
            writeback_retry_first: Nanos::from_ms(50),
            writeback_retry_max: Nanos::from_secs(5),
            cache_retry_first: Nanos::SECOND,
            cache_retry_max: Nanos::from_secs(30),
        }
    }
}

/// What kind of IO failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoClass {
    Read,
    Write,
    Flush,
}

/// Errors one device returned (counters), by kind of IO and by kind of error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceErrors {
    /// Failed reads.
    pub reads: u64,
    /// Failed writes (data, write-zeroes, trims, metadata).
    pub writes: u64,
    /// Failed flushes (probes included).
    pub flushes: u64,
    /// Of all failures: plain IO errors.
    pub io: u64,
    /// Of all failures: the device was full (ENOSPC).
    pub no_space: u64,
    /// Of all failures: the device did not answer in time.
    pub timed_out: u64,
    /// The last error and when it happened.
    pub last: Option<(IoError, Nanos)>,
}

impl DeviceErrors {
    /// Every failure counted.
    pub fn total(&self) -> u64 {
        self.reads + self.writes + self.flushes
    }

    pub(crate) fn count(&mut self, class: IoClass, e: IoError, now: Nanos) {
        match class {
            IoClass::Read => self.reads += 1,
            IoClass::Write => self.writes += 1,
            IoClass::Flush => self.flushes += 1,
        }
        match e {
            IoError::Io => self.io += 1,
            IoError::NoSpace => self.no_space += 1,
            IoError::TimedOut => self.timed_out += 1,
        }
        self.last = Some((e, now));
    }
}

/// Writeback failures of one core (or, for [`FaultCounters::writeback_reads`], of reading
/// dirty data from the cache device).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WritebackFaults {
    /// Writeback attempts (one per job and core) that failed, ever.
    pub failures: u64,
    /// Writeback attempts started while an episode was open (retries), ever.
    pub retries: u64,
    /// Episodes so far (each one an alarm).
    pub episodes: u64,
    /// The current episode: the time of its first failure (`None`: writeback works).
    pub since: Option<Nanos>,
    /// The last error of the current or last episode.
    pub last_error: Option<IoError>,
    /// No writeback before this time.
    pub retry_at: Nanos,
    /// The current backoff step.
    pub backoff: Nanos,
    /// When the last failed attempt of the episode ended.
    pub last_failure: Option<Nanos>,
}

impl WritebackFaults {
    /// An IO of a writeback attempt failed: the episode opens now if it is not open.
    fn failed_io(&mut self, e: IoError, now: Nanos) {
        if self.since.is_none() {
            self.since = Some(now);
            self.episodes += 1;
        }
        self.last_error = Some(e);
    }

    /// An attempt that started at `started` ended with failures; `progress`: it still cleaned
    /// something. An attempt already running when the previous failure was counted is the
    /// same try, not a retry: it does not grow the backoff.
    fn attempt_failed(&mut self, started: Nanos, progress: bool, now: Nanos, p: &FaultParams) {
        self.failures += 1;
        if self.last_failure.is_some_and(|t| started <= t) && !progress {
            return;
        }
        self.backoff = if progress || self.backoff.0 == 0 {
            p.writeback_retry_first
        } else {
            Nanos(self.backoff.0.saturating_mul(2)).min(p.writeback_retry_max)
        };
        self.retry_at = now.plus(self.backoff);
        self.last_failure = Some(now);
    }

    /// The episode is over (writeback succeeded, or nothing is left to write back).
    fn close(&mut self) {
        self.since = None;
        self.backoff = Nanos(0);
        self.retry_at = Nanos(0);
        self.last_failure = None;
    }
}

/// A core's fault state and counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreFaults {
    /// Errors the core device returned (client IO and writeback).
    pub device: DeviceErrors,
    /// The last IO on the core device failed at this time, and none succeeded since.
    pub failing_since: Option<Nanos>,
    /// Writeback to this core.
    pub writeback: WritebackFaults,
}

/// Cache-wide fault counters and the cache device's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Errors the cache device returned.
    pub cache_device: DeviceErrors,
    /// Times the cache entered bypass (cache device episodes).
    pub cache_episodes: u64,
    /// Probes of a failing cache device (flushes), and how many succeeded.
    pub probes: u64,
    /// Probes that succeeded (each one ended an episode).
    pub probes_ok: u64,
    /// Requests served as pass-through because the cache device was failing (bypass).
    pub bypassed_requests: u64,
    /// Write-through writes whose cache write failed: the core has the data, the cache's copy
    /// was dropped (the request succeeded as pass-through).
    pub write_through_cache_failed: u64,
    /// Lazy writes whose cache write failed and that were written to the core instead.
    pub lazy_write_fallbacks: u64,
    /// Reads whose cache read failed on clean blocks, read again from the core.
    pub read_retries_from_core: u64,
    /// Reads that failed because dirty blocks (which exist only on the cache device) could
    /// not be read.
    pub dirty_read_errors: u64,
    /// Backfills (read-miss insertions) whose cache write failed (the read succeeded).
    pub backfill_failures: u64,
    /// Writeback failures reading dirty data from the cache device.
    pub writeback_reads: WritebackFaults,
}

/// The cache device's episode (bypass) state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CacheDevState {
    /// First error of the current episode (`None`: the device works).
    pub(crate) since: Option<Nanos>,
    /// When the current backoff step ends (a probe is issued then).
    pub(crate) retry_at: Nanos,
    pub(crate) backoff: Nanos,
    pub(crate) probe_in_flight: bool,
    /// When the last episode ended (a new one soon after keeps growing the backoff).
    pub(crate) ended_at: Option<Nanos>,
    /// Errors in the current episode.
    pub(crate) errors: u64,
}

/// All the fault state of a cache.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    pub(crate) params: FaultParams,
    pub(crate) counters: FaultCounters,
    pub(crate) cache: CacheDevState,
    /// Some core's writeback episode may be open (keeps the per-core walks off the hot path).
    pub(crate) wb_alarm: bool,
}

impl DeviceErrors {
    /// Zeroes the counts; the last error stays (it is state, not a count).
    fn reset(&mut self) {
        *self = DeviceErrors {
            last: self.last,
            ..DeviceErrors::default()
        };
    }
}

impl WritebackFaults {
    /// Zeroes the counts; the episode stays.
    fn reset(&mut self) {
        self.failures = 0;
        self.retries = 0;
        self.episodes = 0;
    }
}

impl Faults {
    /// `reset-counters`: counts go to zero, the state (episodes, backoffs) stays.
    pub(crate) fn reset_counters(&mut self) {
        let c = &mut self.counters;
        c.cache_device.reset();
        c.writeback_reads.reset();
        *c = FaultCounters {
            cache_device: c.cache_device,
            writeback_reads: c.writeback_reads,
            ..FaultCounters::default()
        };
    }
}

impl CoreFaults {
    /// `reset-counters`: counts go to zero, the state stays.
    pub(crate) fn reset_counters(&mut self) {
        self.device.reset();
        self.writeback.reset();
    }
}

/// Whether the cache serves requests normally or has a problem to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthState {
    /// No device problem.
    Running,
    /// At least one [`Problem`]: requests are still served (or fail with the device's error),
    /// but something needs attention.
    Degraded,
}

impl HealthState {
    /// `running` or `degraded`, as `list` and the metrics show it.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Running => "running",
            HealthState::Degraded => "degraded",
        }
    }
}

/// One thing wrong, as [`Cache::health`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The cache device failed an IO and has not passed a probe since: the cache is in bypass
    /// (acts as `pt`: no new dirty data, clean data read from the cores), writeback is forced,
    /// and every dirty block is at risk (its only copy is on this device).
    CacheDevice {
        /// First error of the episode.
        since: Nanos,
        /// The last error.
        last_error: IoError,
        /// Errors in this episode.
        errors: u64,
        /// When the next probe is due (or in flight).
        next_probe: Nanos,
    },
    /// The last IO on a core device failed (client IO or writeback) and none succeeded since.
    /// Requests that need the core fail with its error.
    CoreDevice {
        /// The core.
        core: CoreId,
        /// When that IO failed.
        since: Nanos,
        /// Its error.
        last_error: IoError,
    },
    /// Writeback of dirty data to a core keeps failing. The data stays dirty on the cache
    /// device (never marked clean) and is retried; a stop that writes back cannot finish.
    Writeback {
        /// The core.
        core: CoreId,
        /// First failure of the episode.
        since: Nanos,
        /// The last error.
        last_error: IoError,
        /// Failed attempts, ever (counter).
        failures: u64,
        /// Retries, ever.
        retries: u64,
        /// When the next attempt may start.
        next_retry: Nanos,
        /// Dirty blocks of the core (their only copy is on the cache device).
        dirty_blocks: u64,
    },
    /// Mode `wl`: an IO of the write log on the cache device failed (a log write, a read of
    /// logged data, a flush or a log superblock) and none of the kinds that failed has
    /// succeeded since. Writes that cannot be logged fail with the device's error; logged data
    /// not yet written back (its only copy is in the log) is at risk.
    LogDevice {
        /// First error of the episode.
        since: Nanos,
        /// The last error.
        last_error: IoError,
        /// Errors in this episode.
        errors: u64,
    },
    /// Dirty data could not be read from the cache device for writeback (it is retried).
    WritebackRead {
        /// First failure of the episode.
        since: Nanos,
        /// The last error.
        last_error: IoError,
        /// Failed attempts, ever.
        failures: u64,
        /// When the next attempt may start.
        next_retry: Nanos,
    },
}

fn err_name(e: IoError) -> &'static str {
    match e {
        IoError::Io => "IO error",
        IoError::NoSpace => "no space (ENOSPC)",
        IoError::TimedOut => "timed out",
    }
}

fn secs(t: Nanos) -> String {
    format!("{:.3}s", t.0 as f64 / 1e9)
}

impl Problem {
    /// One line saying what is wrong and what the cache does about it, with times in seconds
    /// of the core's clock (`now` for "ago"/"in").
    pub fn describe(&self, now: Nanos) -> String {
        match *self {
            Problem::CacheDevice {
                since,
                last_error,
                errors,
                next_probe,
            } => format!(
                "cache device failing for {} ({errors} errors, last: {}): bypass, no new dirty data, dirty data at risk; next probe in {}",
                secs(now.since(since)),
                err_name(last_error),
                secs(next_probe.since(now))
            ),
            Problem::CoreDevice {
                core,
                since,
                last_error,
            } => format!(
                "core {} failed an IO {} ago ({}); requests that need it fail",
                core.0,
                secs(now.since(since)),
                err_name(last_error)
            ),
            Problem::Writeback {
                core,
                since,
                last_error,
                failures,
                retries,
                next_retry,
                dirty_blocks,
            } => format!(
                "writeback to core {} failing for {} ({}; {failures} failures, {retries} retries): {dirty_blocks} dirty blocks stay on the cache device; next retry in {}",
                core.0,
                secs(now.since(since)),
                err_name(last_error),
                secs(next_retry.since(now))
            ),
            Problem::WritebackRead {
                since,
                last_error,
                failures,
                next_retry,
            } => format!(
                "reading dirty data from the cache device for writeback failing for {} ({}; {failures} failures); next retry in {}",
                secs(now.since(since)),
                err_name(last_error),
                secs(next_retry.since(now))
            ),
            Problem::LogDevice {
                since,
                last_error,
                errors,
            } => format!(
                "write log on the cache device failing for {} ({errors} errors, last: {}): writes that cannot be logged fail, logged data not yet written back at risk",
                secs(now.since(since)),
                err_name(last_error)
            ),
        }
    }

    /// The core the problem is about, if it is about one core.
    pub fn core(&self) -> Option<CoreId> {
        match *self {
            Problem::CoreDevice { core, .. } | Problem::Writeback { core, .. } => Some(core),
            Problem::CacheDevice { .. }
            | Problem::WritebackRead { .. }
            | Problem::LogDevice { .. } => None,
        }
    }
}

/// The health of a cache (or of one core: [`Cache::core_health`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// Running or degraded.
    pub state: HealthState,
    /// What is wrong (empty when running).
    pub problems: Vec<Problem>,
    /// Dirty blocks whose only copy is on the cache device while something keeps them from the
    /// core or threatens them: every dirty block while the cache device fails, else the dirty
    /// blocks of cores whose writeback fails.
    pub dirty_at_risk_blocks: u64,
}

/// Why writeback cannot finish now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritebackFailure {
    /// The core writeback fails on (`None`: reading dirty data from the cache device fails).
    pub core: Option<CoreId>,
    /// First failure of the episode.
    pub since: Nanos,
    /// The last error.
    pub last_error: IoError,
    /// Failed attempts, ever.
    pub failures: u64,
    /// When the next attempt may start.
    pub next_retry: Nanos,
    /// Dirty lines it holds back (of that core; of every core for the cache device).
    pub dirty_lines: u32,
}

/// Where writeback stands: what a `stop-cache` / `writeback` command waits on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritebackStatus {
    /// Lines with dirty data.
    pub dirty_lines: u32,
    /// A `writeback` command, a switch out of a lazy mode, or bypass forces writeback.
    pub forced: bool,
    /// Writeback jobs in flight.
    pub jobs: usize,
    /// Writeback is failing: these dirty lines will not go away until the device recovers.
    /// A caller waiting for `dirty_lines == 0` should say so and may give up (a persistent
    /// cache stopped without writeback keeps its dirty data on the cache device), or
    /// [`Cache::retry_writeback_now`] after the device is repaired.
    pub failing: Vec<WritebackFailure>,
}

impl Cache {
    // ----- recording -----

    /// A cache device IO failed.
    pub(crate) fn note_cache_error(&mut self, class: IoClass, e: IoError) {
        let now = self.now;
        self.faults.counters.cache_device.count(class, e, now);
        let p = self.faults.params;
        let c = &mut self.faults.cache;
        c.errors += 1;
        if c.since.is_none() {
            c.since = Some(now);
            c.errors = 1;
            self.faults.counters.cache_episodes += 1;
            // A new episode soon after the last one (a device that fails only writes passes a
            // flush probe) keeps growing the backoff instead of starting over.
            c.backoff = match c.ended_at {
                Some(t) if now.since(t) < p.cache_retry_max && c.backoff.0 > 0 => {
                    Nanos(c.backoff.0.saturating_mul(2)).min(p.cache_retry_max)
                }
                _ => p.cache_retry_first,
            };
            c.retry_at = now.plus(c.backoff);
        }
    }

    /// A core device IO failed (`wb`: a writeback IO).
    pub(crate) fn note_core_error(&mut self, core: CoreId, class: IoClass, e: IoError, wb: bool) {
        let now = self.now;
        let Some(cs) = self.cores.get_mut(core.0 as usize).and_then(|c| c.as_mut()) else {
            return;
        };
        let f = &mut cs.faults;
        f.device.count(class, e, now);
        f.failing_since = Some(now);
        if wb {
            f.writeback.failed_io(e, now);
            self.faults.wb_alarm = true;
        }
    }

    /// A core device IO succeeded.
    #[inline]
    pub(crate) fn note_core_ok(&mut self, core: CoreId) {
        if let Some(cs) = self.cores.get_mut(core.0 as usize).and_then(|c| c.as_mut())
            && cs.faults.failing_since.is_some()
        {
            cs.faults.failing_since = None;
        }
    }

    /// A writeback job started at `started` ended for `core`: `failed` (some core write or the
    /// flush failed), `cleaned` (some of its lines were marked clean).
    pub(crate) fn note_wb_attempt(
        &mut self,
        core: CoreId,
        started: Nanos,
        failed: bool,
        cleaned: bool,
    ) {
        let now = self.now;
        let p = self.faults.params;
        let Some(cs) = self.cores.get_mut(core.0 as usize).and_then(|c| c.as_mut()) else {
            return;
        };
        let w = &mut cs.faults.writeback;
        if failed {
            w.attempt_failed(started, cleaned, now, &p);
        } else if w.since.is_some() {
            w.close();
        }
    }

    /// A writeback job could not read some dirty data from the cache device (`failed`), or
    /// read all it needed (`!failed`).
    pub(crate) fn note_wb_read_attempt(&mut self, started: Nanos, failed: bool, progress: bool) {
        let now = self.now;
        let p = self.faults.params;
        let w = &mut self.faults.counters.writeback_reads;
        if failed {
            w.attempt_failed(started, progress, now, &p);
        } else if w.since.is_some() {
            w.close();
        }
    }

    /// A cache read of a writeback job failed.
    pub(crate) fn note_wb_read_error(&mut self, e: IoError) {
        let now = self.now;
        self.faults.counters.writeback_reads.failed_io(e, now);
        self.note_cache_error(IoClass::Read, e);
    }

    /// A writeback job starts with lines of `core`: a retry if its episode is open.
    pub(crate) fn note_wb_start(&mut self, core: CoreId) {
        if let Some(cs) = self.cores.get_mut(core.0 as usize).and_then(|c| c.as_mut())
            && cs.faults.writeback.since.is_some()
        {
            cs.faults.writeback.retries += 1;
        }
    }

    /// Whether the cache is in bypass (the cache device failed and has not passed a probe).
    #[inline]
    pub(crate) fn bypass(&self) -> bool {
        self.faults.cache.since.is_some()
    }

    /// Upkeep after each event: issue a due probe, close writeback episodes of cores with no
    /// dirty line left.
    pub(crate) fn faults_maintain(&mut self, actions: &mut Vec<Action>) {
        let c = &self.faults.cache;
        if c.since.is_some() && !c.probe_in_flight && self.now >= c.retry_at && !self.refusing() {
            self.faults.cache.probe_in_flight = true;
            self.faults.counters.probes += 1;
            let io = self.new_io(IoOwner::Probe);
            actions.push(Action::Flush {
                io,
                dev: Dev::Cache,
            });
        }
        if self.faults.wb_alarm {
            let mut open = false;
            for cs in self.cores.iter_mut().flatten() {
                if cs.faults.writeback.since.is_some() && cs.dirty_lines == 0 {
                    cs.faults.writeback.close();
                }
                // A backoff may outlive its episode's end by a little: keep the flag until
                // every retry time has passed too.
                open |=
                    cs.faults.writeback.since.is_some() || cs.faults.writeback.retry_at > self.now;
            }
            self.faults.wb_alarm = open;
        }
        let w = &mut self.faults.counters.writeback_reads;
        if w.since.is_some() && self.dirty_lines == 0 {
            w.close();
        }
    }

    /// The probe of a failing cache device completed.
    pub(crate) fn probe_done(&mut self, result: Result<(), IoError>) {
        let now = self.now;
        let p = self.faults.params;
        self.faults.cache.probe_in_flight = false;
        match result {
            Ok(()) => {
                self.faults.counters.probes_ok += 1;
                let c = &mut self.faults.cache;
                c.since = None;
                c.ended_at = Some(now);
                c.errors = 0;
                // Writes held back while the device failed may go to the cache again.
                self.wake_waiters = true;
            }
            Err(e) => {
                self.faults
                    .counters
                    .cache_device
                    .count(IoClass::Flush, e, now);
                let c = &mut self.faults.cache;
                c.errors += 1;
                c.backoff = Nanos(c.backoff.0.saturating_mul(2))
                    .max(p.cache_retry_first)
                    .min(p.cache_retry_max);
                c.retry_at = now.plus(c.backoff);
            }
        }
    }

    /// The earliest fault-related deadline (a probe), if any.
    pub(crate) fn faults_deadline(&self) -> Option<Nanos> {
        let c = &self.faults.cache;
        (c.since.is_some() && !c.probe_in_flight).then_some(c.retry_at)
    }

    // ----- public API -----

    /// The cache's health: `Running`, or `Degraded` with every [`Problem`] and the dirty
    /// blocks at risk. Walks the lines when writeback fails (for `list`, `stats`, metrics; not
    /// for hot paths — [`Cache::is_degraded`] is cheap).
    pub fn health(&self) -> Health {
        let mut problems = Vec::new();
        let c = &self.faults.cache;
        if let Some(since) = c.since {
            problems.push(Problem::CacheDevice {
                since,
                last_error: self
                    .faults
                    .counters
                    .cache_device
                    .last
                    .map_or(IoError::Io, |x| x.0),
                errors: c.errors,
                next_probe: c.retry_at,
            });
        }
        let w = &self.faults.counters.writeback_reads;
        if let Some(since) = w.since {
            problems.push(Problem::WritebackRead {
                since,
                last_error: w.last_error.unwrap_or(IoError::Io),
                failures: w.failures,
                next_retry: w.retry_at,
            });
        }
        let wb_failing: Vec<CoreId> = self
            .cores
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.as_ref()
                    .filter(|c| c.faults.writeback.since.is_some())
                    .map(|_| CoreId(i as u16))
            })
            .collect();
        let per_core = if wb_failing.is_empty() {
            Vec::new()
        } else {
            self.dirty_blocks_per_core()
        };
        for (i, cs) in self.cores.iter().enumerate() {
            let Some(cs) = cs else { continue };
            let core = CoreId(i as u16);
            if let Some(since) = cs.faults.failing_since {
                problems.push(Problem::CoreDevice {
                    core,
                    since,
                    last_error: cs.faults.device.last.map_or(IoError::Io, |x| x.0),
                });
            }
            let w = &cs.faults.writeback;
            if let Some(since) = w.since {
                problems.push(Problem::Writeback {
                    core,
                    since,
                    last_error: w.last_error.unwrap_or(IoError::Io),
                    failures: w.failures,
                    retries: w.retries,
                    next_retry: w.retry_at,
                    dirty_blocks: per_core.get(i).copied().unwrap_or(0),
                });
            }
        }
        let dirty_at_risk_blocks = if self.bypass() || w.since.is_some() {
            self.dirty_blocks()
        } else {
            wb_failing
                .iter()
                .map(|c| per_core.get(c.0 as usize).copied().unwrap_or(0))
                .sum()
        };
        Health {
            state: if problems.is_empty() {
                HealthState::Running
            } else {
                HealthState::Degraded
            },
            problems,
            dirty_at_risk_blocks,
        }
    }

    /// The health of one core: the cache-wide problems (the cache device) and the core's own
    /// (its device, writeback to it), with its dirty blocks at risk. `None`: no such core.
    pub fn core_health(&self, core: CoreId) -> Option<Health> {
        self.core(core)?;
        let h = self.health();
        let problems: Vec<Problem> = h
            .problems
            .into_iter()
            .filter(|p| p.core().is_none_or(|c| c == core))
            .collect();
        let at_risk = problems.iter().any(|p| {
            matches!(
                p,
                Problem::CacheDevice { .. }
                    | Problem::WritebackRead { .. }
                    | Problem::Writeback { .. }
            )
        });
        let dirty_at_risk_blocks = if at_risk {
            self.dirty_blocks_per_core()
                .get(core.0 as usize)
                .copied()
                .unwrap_or(0)
        } else {
            0
        };
        Some(Health {
            state: if problems.is_empty() {
                HealthState::Running
            } else {
                HealthState::Degraded
            },
            problems,
            dirty_at_risk_blocks,
        })
    }

    /// Whether any problem is open (O(cores); [`Cache::health`] says which).
    pub fn is_degraded(&self) -> bool {
        self.bypass()
            || self.faults.counters.writeback_reads.since.is_some()
            || self
                .cores
                .iter()
                .flatten()
                .any(|c| c.faults.failing_since.is_some() || c.faults.writeback.since.is_some())
    }

    /// Where writeback stands, for a caller waiting until nothing is dirty (`stop-cache`,
    /// `writeback`, `remove-core`): whether it progresses or fails, and on which device.
    pub fn writeback_status(&self) -> WritebackStatus {
        let mut failing = Vec::new();
        let w = &self.faults.counters.writeback_reads;
        if let Some(since) = w.since {
            failing.push(WritebackFailure {
                core: None,
                since,
                last_error: w.last_error.unwrap_or(IoError::Io),
                failures: w.failures,
                next_retry: w.retry_at,
                dirty_lines: self.dirty_lines,
            });
        }
        for (i, cs) in self.cores.iter().enumerate() {
            let Some(cs) = cs else { continue };
            let w = &cs.faults.writeback;
            if let Some(since) = w.since {
                failing.push(WritebackFailure {
                    core: Some(CoreId(i as u16)),
                    since,
                    last_error: w.last_error.unwrap_or(IoError::Io),
                    failures: w.failures,
                    next_retry: w.retry_at,
                    dirty_lines: cs.dirty_lines,
                });
            }
        }
        WritebackStatus {
            dirty_lines: self.dirty_lines,
            forced: self.cleaning_forced(),
            jobs: self.jobs.len(),
            failing,
        }
    }

    /// Ends every backoff now: writeback to every core and the next cache device probe are due
    /// at once (an operator repaired a device and says so, e.g. with a `writeback` command).
    pub fn retry_writeback_now(&mut self) {
        for cs in self.cores.iter_mut().flatten() {
            cs.faults.writeback.retry_at = Nanos(0);
        }
        self.faults.counters.writeback_reads.retry_at = Nanos(0);
        if self.faults.cache.since.is_some() {
            self.faults.cache.retry_at = self.now;
        }
        self.cleaner_next = self.now;
    }

    /// Fault counters and cache device state (cache-wide).
    pub fn faults(&self) -> &FaultCounters {
        &self.faults.counters
    }

    /// Fault counters and state of a core.
    pub fn core_faults(&self, core: CoreId) -> Option<&CoreFaults> {
        self.core(core).map(|c| &c.faults)
    }

    /// Lines of `core` with dirty data (O(1)).
    pub fn core_dirty_lines(&self, core: CoreId) -> u32 {
        self.core(core).map_or(0, |c| c.dirty_lines)
    }

    /// Retry timing in force.
    pub fn fault_params(&self) -> FaultParams {
        self.faults.params
    }

    /// Sets the retry timing (takes effect at the next backoff step).
    pub fn set_fault_params(&mut self, p: FaultParams) {
        let first = |a: Nanos| Nanos(a.0.max(1));
        self.faults.params = FaultParams {
            writeback_retry_first: first(p.writeback_retry_first),
            writeback_retry_max: p.writeback_retry_max.max(first(p.writeback_retry_first)),
            cache_retry_first: first(p.cache_retry_first),
            cache_retry_max: p.cache_retry_max.max(first(p.cache_retry_first)),
        };
    }

    /// Dirty blocks per core id (index = core id). Walks every line.
    fn dirty_blocks_per_core(&self) -> Vec<u64> {
        let mut v = vec![0u64; self.cores.len()];
        for l in 0..self.cfg.lines {
            let l = LineId(l);
            let d = self.state.dirty(l);
            if d != 0 && self.map.is_mapped(l) {
                let (c, _) = self.map.position(l);
                if let Some(x) = v.get_mut(c.0 as usize) {
                    *x += d.count_ones() as u64;
                }
            }
        }
        v
    }
}
