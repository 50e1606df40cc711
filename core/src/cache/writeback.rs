//! Writeback: the cleaner's jobs.
//!
//! A job takes the dirty lines the cleaning policy picked, sorts them by core address, cuts
//! their dirty blocks into runs (a line's whole dirty span when it is all valid, otherwise each
//! dirty run) and merges runs that touch on the core into *extents* of at most one staging slot.
//! Per extent: read the runs from the cache into the slot, then write the extent to the core in
//! one IO. When every extent of the job is written: flush each core it touched. Only then are
//! the blocks marked clean — and only those still in the line's `wb_mask`, i.e. not rewritten by
//! a client since the job started (see `lock.rs`).
//!
//! Failures (`health.rs`): a line is marked clean only if every extent holding it was read from
//! the cache, written to the core, and its core's flush succeeded; every other line stays dirty
//! and goes back to the policy. A core whose write or flush failed is backed off (exponential,
//! per core: other cores keep being written back); a cache read that failed backs off all
//! writeback and counts against the cache device.
//!
//! When the cleaner runs: whenever its policy's wake-up time has come, and on every event while
//! it is *forced* — by a `writeback` command, a switch away from a lazy mode, an allocation that
//! found no clean line (on-demand cleaning), or the rate controller.

use super::health::IoClass;
use super::lock::lock_key;
use super::{Cache, IoOwner, View, WbIo};
use crate::event::{Action, BufRef, Dev, IoError};
use crate::policy::{LineView, position_key};
use crate::units::{CoreId, Lba, LineId, Nanos, mask_runs};

/// An extent whose slot went back to the pool.
const NO_SLOT: u32 = u32::MAX;

/// One core write of a job, staged in one pool slot.
#[derive(Debug)]
pub(crate) struct Extent {
    core: CoreId,
    lba: u64,
    blocks: u32,
    slot: u32,
    /// Cache reads not yet done.
    reads_pending: u32,
    /// Runs read from the cache: (line, first block in line, blocks).
    runs: Vec<(LineId, u32, u32)>,
    /// What went wrong with it, if anything.
    fail: ExtFail,
}

/// Why an extent did not reach the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ExtFail {
    None,
    /// A cache read of one of its runs failed (no core write was issued).
    CacheRead,
    /// Its core write failed.
    CoreWrite,
}

/// A writeback job.
#[derive(Debug)]
pub(crate) struct Job {
    /// Lines in the job: (line, core, core line).
    lines: Vec<(LineId, CoreId, u64)>,
    extents: Vec<Extent>,
    /// IOs in flight.
    pending: u32,
    /// Flushes issued (the job is in its last phase).
    flushing: bool,
    /// Cores whose flush failed.
    flush_failed: Vec<CoreId>,
    /// When the job started.
    started: Nanos,
}

impl Cache {
    /// Staging slots one job may use: half the pool, so the next job can start while this one
    /// waits for its slowest write and its core flush (the core's queue stays full).
    fn slots_per_job(&self) -> usize {
        (self.cfg.pool_slots as usize / 2).max(1)
    }

    /// Whether a new job could start now as far as slots go. With a job running, wait for a
    /// whole job's worth of free slots: many tiny jobs would each pay a core flush.
    pub(crate) fn cleaner_can_start(&self) -> bool {
        !self.free_slots.is_empty()
            && (self.jobs.is_empty() || self.free_slots.len() >= self.slots_per_job())
    }

    /// Starts writeback if the policy, a command, the rate controller or an allocation wants it.
    /// Whether cleaning ignores the policy's gating now: a `writeback` command, a switch out of
    /// a lazy mode, an allocation that found no clean line, the rate controller, or a failing
    /// cache device (dirty data should leave it while it can).
    pub(crate) fn cleaning_forced(&self) -> bool {
        self.force_clean
            || self.target_mode.is_some()
            || self.ondemand_clean > 0
            || self.rate.wants_writeback()
            || (self.bypass() && self.dirty_lines > 0)
    }

    /// Until when no writeback job can start because of failures: the cache-read backoff, or
    /// the earliest retry among the cores with dirty data when every one of them is backed
    /// off. `Nanos(0)`: nothing holds writeback back.
    pub(crate) fn cleaner_blocked_until(&self) -> Nanos {
        let read = self.faults.counters.writeback_reads.retry_at;
        if !self.faults.wb_alarm {
            return read;
        }
        let mut earliest: Option<Nanos> = None;
        for cs in self.cores.iter().flatten() {
            if cs.dirty_lines == 0 {
                continue;
            }
            let t = cs.faults.writeback.retry_at;
            if t <= self.now {
                return read;
            }
            earliest = Some(earliest.map_or(t, |e| e.min(t)));
        }
        read.max(earliest.unwrap_or(Nanos(0)))
    }

    pub(crate) fn run_cleaner(&mut self, actions: &mut Vec<Action>) {
        if self.dirty_lines == 0 || self.free_slots.is_empty() {
            return;
        }
        // Stopping (the final checkpoint must see a quiet cache) or not ready yet.
        if self.refusing() {
            return;
        }
        if self.now < self.cleaner_blocked_until() {
            return;
        }
        let forced = self.cleaning_forced();
        if !forced && self.now < self.cleaner_next {
            return;
        }
        if !self.cleaner_can_start() {
            return;
        }
        // Lines of cores whose writeback is backed off look busy to the policy (it leaves them
        // where they are).
        let mut blocked = [0u64; 4];
        if self.faults.wb_alarm {
            for (i, cs) in self.cores.iter().enumerate() {
                if cs
                    .as_ref()
                    .is_some_and(|c| c.faults.writeback.retry_at > self.now)
                {
                    blocked[i / 64] |= 1 << (i % 64);
                }
            }
        }
        let per_job = self.slots_per_job();
        let max = self
            .cleaning
            .batch_max()
            .min(self.free_slots.len())
            .min(per_job)
            .max(1);
        let mut picked = std::mem::take(&mut self.pick_buf);
        picked.clear();
        let view = CleanView {
            view: View {
                map: &self.map,
                locks: &self.locks,
            },
            blocked,
        };
        let next = self
            .cleaning
            .pick(self.now, &mut self.lists, &view, max, forced, &mut picked);
        self.cleaner_next = if !forced {
            next.unwrap_or(Nanos(u64::MAX))
        } else if picked.is_empty() {
            // Forced but every dirty line is busy: look again a little later (the events that
            // free the lines will also run the cleaner).
            self.now.plus(Nanos::from_ms(1))
        } else {
            self.now
        };
        if !picked.is_empty() {
            self.ondemand_clean = self.ondemand_clean.saturating_sub(picked.len() as u32);
            self.start_job(&picked, actions);
        } else if forced && self.ondemand_clean > 0 && self.jobs.is_empty() {
            // Nothing could be picked (every dirty line is busy): stop insisting.
            self.ondemand_clean = 0;
        }
        self.pick_buf = picked;
    }

    fn start_job(&mut self, picked: &[LineId], actions: &mut Vec<Action>) {
        let mut lines: Vec<(LineId, CoreId, u64)> = picked
            .iter()
            .map(|&l| {
                let (c, cl) = self.map.position(l);
                (l, c, cl)
            })
            .collect();
        lines.sort_by_key(|&(_, c, cl)| (c, cl));
        let slot_blocks = self.cfg.pool_slot_blocks;
        let mut extents: Vec<Extent> = Vec::new();
        let mut in_job: Vec<(LineId, CoreId, u64)> = Vec::new();
        for &(l, c, cl) in &lines {
            let d = self.state.dirty(l);
            let v = self.state.valid(l);
            debug_assert_ne!(d, 0, "picked a clean line");
            let lo = d.trailing_zeros();
            let hi = 127 - d.leading_zeros();
            let span = crate::units::block_range_mask(lo, hi - lo + 1);
            let runs: Vec<(u32, u32)> = if v & span == span {
                vec![(lo, hi - lo + 1)]
            } else {
                mask_runs(d).collect()
            };
            let mut placed = 0u128;
            for (b, n) in runs {
                let lba = (cl << self.shift) + b as u64;
                let merge = extents.last().is_some_and(|e| {
                    e.core == c && e.lba + e.blocks as u64 == lba && e.blocks + n <= slot_blocks
                });
                if !merge {
                    let Some(slot) = self.free_slots.pop() else {
                        break;
                    };
                    extents.push(Extent {
                        core: c,
                        lba,
                        blocks: 0,
                        slot,
                        reads_pending: 0,
                        runs: Vec::new(),
                        fail: ExtFail::None,
                    });
                }
                let e = extents.last_mut().expect("an extent");
                e.blocks += n;
                e.runs.push((l, b, n));
                placed |= crate::units::block_range_mask(b, n);
            }
            if placed == 0 {
                // No slot left: give the line back to the policy.
                let view = View {
                    map: &self.map,
                    locks: &self.locks,
                };
                self.cleaning.on_dirty(&mut self.lists, l, self.now, &view);
                continue;
            }
            let e = self.locks.entry(lock_key(c, cl));
            debug_assert!(!e.wb && !e.writer);
            e.wb = true;
            e.wb_mask = placed & d;
            in_job.push((l, c, cl));
        }
        if in_job.is_empty() {
            return;
        }
        let id = self.next_job;
        self.next_job = self.next_job.wrapping_add(1);
        let mut cores: Vec<CoreId> = extents.iter().map(|e| e.core).collect();
        cores.dedup();
        for c in cores {
            self.note_wb_start(c);
        }
        if self.faults.counters.writeback_reads.since.is_some() {
            self.faults.counters.writeback_reads.retries += 1;
        }
        let mut job = Job {
            lines: in_job,
            extents,
            pending: 0,
            flushing: false,
            flush_failed: Vec::new(),
            started: self.now,
        };
        for (x, e) in job.extents.iter_mut().enumerate() {
            for &(l, b, n) in &e.runs {
                let io = self.new_io(IoOwner::Wb {
                    job: id,
                    kind: WbIo::CacheRead { extent: x as u32 },
                });
                let offset = (((self.map.position(l).1 << self.shift) + b as u64) - e.lba) as u32;
                actions.push(Action::Read {
                    io,
                    dev: Dev::Cache,
                    lba: self.cache_lba(l, b),
                    blocks: n,
                    buf: BufRef::Pool {
                        slot: e.slot,
                        offset,
                    },
                });
                self.counters.cache_blocks_read += n as u64;
                e.reads_pending += 1;
                job.pending += 1;
            }
        }
        self.jobs.insert(id, job);
    }

    /// A writeback IO finished.
    pub(crate) fn wb_io_done(
        &mut self,
        id: u32,
        kind: WbIo,
        result: Result<(), IoError>,
        actions: &mut Vec<Action>,
    ) {
        let mut job = self.jobs.remove(&id).expect("IO for a job in flight");
        job.pending -= 1;
        match (kind, result) {
            (WbIo::CacheRead { .. }, Err(e)) => {
                self.counters.cache_errors += 1;
                self.note_wb_read_error(e);
            }
            (WbIo::CoreWrite { extent }, Err(e)) => {
                self.counters.core_errors += 1;
                let core = job.extents[extent as usize].core;
                self.note_core_error(core, IoClass::Write, e, true);
            }
            (WbIo::CoreFlush { core, .. }, Err(e)) => {
                self.counters.core_errors += 1;
                self.note_core_error(core, IoClass::Flush, e, true);
            }
            (WbIo::CacheRead { .. }, Ok(())) => {}
            (WbIo::CoreWrite { extent }, Ok(())) => {
                let core = job.extents[extent as usize].core;
                self.note_core_ok(core);
            }
            (WbIo::CoreFlush { core, .. }, Ok(())) => self.note_core_ok(core),
        }
        match kind {
            WbIo::CacheRead { extent } => {
                let e = &mut job.extents[extent as usize];
                e.reads_pending -= 1;
                if result.is_err() {
                    e.fail = ExtFail::CacheRead;
                }
                if e.reads_pending == 0 && e.fail != ExtFail::None && e.slot != NO_SLOT {
                    // No core write will use this slot: give it back now.
                    self.free_slots.push(e.slot);
                    e.slot = NO_SLOT;
                }
                if e.reads_pending == 0 && e.fail == ExtFail::None {
                    let io = self.new_io(IoOwner::Wb {
                        job: id,
                        kind: WbIo::CoreWrite { extent },
                    });
                    actions.push(Action::Write {
                        io,
                        dev: Dev::Core(e.core),
                        lba: Lba(e.lba),
                        blocks: e.blocks,
                        buf: BufRef::Pool {
                            slot: e.slot,
                            offset: 0,
                        },
                        fua: false,
                    });
                    self.counters.core_blocks_written += e.blocks as u64;
                    self.counters.writeback_ios += 1;
                    job.pending += 1;
                }
            }
            WbIo::CoreWrite { extent } => {
                // The data left the slot: another job may use it while this one waits for its
                // other writes and its flush (so the core's queue stays full).
                let e = &mut job.extents[extent as usize];
                self.free_slots.push(e.slot);
                e.slot = NO_SLOT;
                if result.is_err() {
                    e.fail = ExtFail::CoreWrite;
                }
            }
            WbIo::CoreFlush { core, covers } => {
                if result.is_ok() {
                    let fs = &mut self.cores[core.0 as usize].as_mut().expect("core").flush;
                    fs.durable_upto = fs.durable_upto.max(covers);
                } else {
                    job.flush_failed.push(core);
                }
            }
        }
        if job.pending > 0 {
            self.jobs.insert(id, job);
            return;
        }
        // Every extent that reached the core must be durable there before its lines are marked
        // clean: flush each core that got one. (The canary marks lines clean before any core
        // flush: a planted bug.)
        let mut cores: Vec<CoreId> = job
            .extents
            .iter()
            .filter(|e| e.fail == ExtFail::None)
            .map(|e| e.core)
            .collect();
        if job.flushing || cores.is_empty() || cfg!(feature = "canary-clean-before-durable") {
            return self.finish_job(job);
        }
        cores.sort();
        cores.dedup();
        job.flushing = true;
        for core in cores {
            let covers = self.cores[core.0 as usize]
                .as_ref()
                .expect("core")
                .flush
                .writes_done;
            let io = self.new_io(IoOwner::Wb {
                job: id,
                kind: WbIo::CoreFlush { core, covers },
            });
            actions.push(Action::Flush {
                io,
                dev: Dev::Core(core),
            });
            job.pending += 1;
        }
        self.jobs.insert(id, job);
    }

    fn finish_job(&mut self, job: Job) {
        // Lines that did not reach the core durably: in an extent that failed, or of a core
        // whose flush failed (or was never issued: the canary).
        let mut bad: Vec<LineId> = Vec::new();
        for e in &job.extents {
            if e.fail != ExtFail::None || job.flush_failed.contains(&e.core) {
                bad.extend(e.runs.iter().map(|r| r.0));
            }
        }
        bad.sort_unstable();
        bad.dedup();
        let mut cleaned = 0u32;
        // Per core: (lines cleaned, a core write or flush failed).
        let mut per_core: Vec<(CoreId, bool, bool)> = Vec::new();
        for &(l, c, cl) in &job.lines {
            let mask = self.locks.end_wb(lock_key(c, cl));
            self.unpark(c, cl, cl);
            if !self.map.is_mapped(l) || self.map.position(l) != (c, cl) {
                continue; // only under the broken-eviction canary
            }
            let ok = bad.binary_search(&l).is_err();
            let d = self.state.dirty(l);
            if ok {
                let nd = d & !mask;
                self.counters.writeback_blocks += (d & mask).count_ones() as u64;
                let v = self.state.valid(l);
                self.state.set(&mut self.lists, l, v, nd);
                self.meta_note(l);
                if d != 0 && nd == 0 {
                    self.note_clean(l);
                    let class = self.lists.class(l);
                    self.eviction
                        .insert(&mut self.lists, l, class, position_key(c, cl));
                    self.counters.writeback_lines += 1;
                    cleaned += 1;
                }
            }
            if self.state.dirty(l) != 0 {
                let view = View {
                    map: &self.map,
                    locks: &self.locks,
                };
                self.cleaning.on_dirty(&mut self.lists, l, self.now, &view);
            }
            match per_core.iter_mut().find(|x| x.0 == c) {
                Some(x) => x.1 |= ok,
                None => per_core.push((c, ok, false)),
            }
        }
        let mut read_failed = false;
        let mut read_ok = false;
        for e in &job.extents {
            if e.slot != NO_SLOT {
                self.free_slots.push(e.slot);
            }
            match e.fail {
                ExtFail::CacheRead => read_failed = true,
                ExtFail::CoreWrite | ExtFail::None => read_ok = true,
            }
            let core_failed = e.fail == ExtFail::CoreWrite || job.flush_failed.contains(&e.core);
            if let Some(x) = per_core.iter_mut().find(|x| x.0 == e.core) {
                x.2 |= core_failed;
            }
        }
        // Cores that got nothing written (every extent's cache read failed) learn nothing.
        for &(c, progress, core_failed) in &per_core {
            if core_failed {
                self.note_wb_attempt(c, job.started, true, progress);
            } else if progress {
                self.note_wb_attempt(c, job.started, false, true);
            }
        }
        self.note_wb_read_attempt(job.started, read_failed, read_ok);
        if cleaned > 0 {
            self.rate.on_cleaned(self.now, cleaned);
        }
        if read_failed || per_core.iter().any(|x| x.2) {
            self.counters.writeback_errors += 1;
        }
        self.wake_waiters = true;
    }
}

/// What the cleaning policy sees when it picks: lines of cores whose writeback is backed off
/// after a failure look busy (the policy leaves them on its lists).
struct CleanView<'a> {
    view: View<'a>,
    blocked: [u64; 4],
}

impl LineView for CleanView<'_> {
    #[inline]
    fn busy(&self, line: LineId) -> bool {
        if self.view.busy(line) {
            return true;
        }
        if self.blocked == [0; 4] {
            return false;
        }
        let c = self.view.position(line).0.0 as usize;
        self.blocked[c / 64] >> (c % 64) & 1 == 1
    }
    #[inline]
    fn evictable(&self, lists: &crate::lists::ListArena, line: LineId) -> bool {
        self.view.evictable(lists, line)
    }
    #[inline]
    fn position(&self, line: LineId) -> (CoreId, u64) {
        self.view.position(line)
    }
    #[inline]
    fn key(&self, line: LineId) -> u64 {
        self.view.key(line)
    }
}

impl Job {
    /// Staging slots the job holds.
    pub(crate) fn slots(&self) -> usize {
        self.extents.iter().filter(|e| e.slot != NO_SLOT).count()
    }
}
