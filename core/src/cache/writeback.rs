//! Writeback: the cleaner's jobs.
//!
//! A job takes the dirty lines the cleaning policy picked, sorts them by core address, cuts
//! their dirty blocks into runs (a line's whole dirty span when it is all valid, otherwise each
//! dirty run) and merges runs that touch on the core into *extents* of at most one staging slot.
//! Per extent: read the runs from the cache into the slot, then write the extent to the core in
//! one IO. When every extent of the job is written: flush each core it touched. Only then are
//! the blocks marked clean — and only those still in the line's `wb_mask`, i.e. not rewritten by
//! a client since the job started (see `lock.rs`). A failure anywhere leaves every line of the
//! job dirty, counts an error and backs the cleaner off for a second.
//!
//! When the cleaner runs: whenever its policy's wake-up time has come, and on every event while
//! it is *forced* — by a `writeback` command, a switch away from a lazy mode, an allocation that
//! found no clean line (on-demand cleaning), or the rate controller.

use super::lock::lock_key;
use super::{Cache, IoOwner, View, WbIo};
use crate::event::{Action, BufRef, Dev, IoError};
use crate::policy::position_key;
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
    failed: bool,
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
    pub(crate) fn run_cleaner(&mut self, actions: &mut Vec<Action>) {
        if self.dirty_lines == 0 || self.free_slots.is_empty() || self.now < self.wb_backoff_until {
            return;
        }
        // Stopping (the final checkpoint must see a quiet cache) or not ready yet.
        if self.refusing() {
            return;
        }
        let forced = self.force_clean
            || self.target_mode.is_some()
            || self.ondemand_clean > 0
            || self.rate.wants_writeback();
        if !forced && self.now < self.cleaner_next {
            return;
        }
        if !self.cleaner_can_start() {
            return;
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
        let view = View {
            map: &self.map,
            locks: &self.locks,
            state: &self.state,
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
                    state: &self.state,
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
        let mut job = Job {
            lines: in_job,
            extents,
            pending: 0,
            flushing: false,
            failed: false,
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
        if result.is_err() {
            job.failed = true;
            match kind {
                WbIo::CacheRead { .. } => self.counters.cache_errors += 1,
                WbIo::CoreWrite { .. } | WbIo::CoreFlush { .. } => self.counters.core_errors += 1,
            }
        }
        match kind {
            WbIo::CacheRead { extent } => {
                let e = &mut job.extents[extent as usize];
                e.reads_pending -= 1;
                if e.reads_pending == 0 && job.failed && e.slot != NO_SLOT {
                    // No core write will use this slot: give it back now.
                    self.free_slots.push(e.slot);
                    e.slot = NO_SLOT;
                }
                if e.reads_pending == 0 && !job.failed {
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
            }
            WbIo::CoreFlush { core, covers } => {
                if result.is_ok() {
                    let fs = &mut self.cores[core.0 as usize].as_mut().expect("core").flush;
                    fs.durable_upto = fs.durable_upto.max(covers);
                }
            }
        }
        if job.pending > 0 {
            self.jobs.insert(id, job);
            return;
        }
        if job.failed || job.flushing || cfg!(feature = "canary-clean-before-durable") {
            // (The canary marks lines clean before any core flush: a planted bug.)
            return self.finish_job(job);
        }
        // Every extent is on the core: make it durable before anything is marked clean.
        let mut cores: Vec<CoreId> = job.extents.iter().map(|e| e.core).collect();
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
        let ok = !job.failed;
        let mut cleaned = 0u32;
        for &(l, c, cl) in &job.lines {
            let key = lock_key(c, cl);
            let e = self.locks.entry(key);
            let mask = e.wb_mask;
            e.wb = false;
            e.wb_mask = 0;
            self.locks.tidy(key);
            if !self.map.is_mapped(l) || self.map.position(l) != (c, cl) {
                continue; // only under the broken-eviction canary
            }
            let d = self.state.dirty(l);
            if ok {
                let nd = d & !mask;
                self.counters.writeback_blocks += (d & mask).count_ones() as u64;
                let v = self.state.valid(l);
                self.state.set(l, v, nd);
                self.meta_note(l);
                if d != 0 && nd == 0 {
                    self.dirty_lines -= 1;
                    self.cleaning.on_clean(
                        &mut self.lists,
                        l,
                        &View {
                            map: &self.map,
                            locks: &self.locks,
                            state: &self.state,
                        },
                    );
                    let class = self.state.class(l);
                    self.eviction
                        .insert(&mut self.lists, l, class, position_key(c, cl));
                    self.counters.writeback_lines += 1;
                    cleaned += 1;
                    continue;
                }
            }
            if self.state.dirty(l) != 0 {
                let view = View {
                    map: &self.map,
                    locks: &self.locks,
                    state: &self.state,
                };
                self.cleaning.on_dirty(&mut self.lists, l, self.now, &view);
            }
        }
        for e in &job.extents {
            if e.slot != NO_SLOT {
                self.free_slots.push(e.slot);
            }
        }
        if ok {
            self.rate.on_cleaned(self.now, cleaned);
        } else {
            self.counters.writeback_errors += 1;
            self.wb_backoff_until = self.now.plus(Nanos::SECOND);
        }
        self.wake_waiters = true;
    }
}

impl Job {
    /// Staging slots the job holds.
    pub(crate) fn slots(&self) -> usize {
        self.extents.iter().filter(|e| e.slot != NO_SLOT).count()
    }
}
