//! Client writes, write-zeroes and trims: the plan (write-back, write-through or
//! write-invalidate, by the mode's rules), the completion (state and metadata of the written
//! lines, the fallback of a lazy write whose cache write failed, the core flush before dirty
//! blocks are dropped), and dropping blocks from the cache. Part of the request path
//! (`request.rs`).

use super::issue::{Dir, Run, Runs};
use super::lock::{LockKind, lock_key};
use super::request::{Op, Phase, Plan, Request};
use super::{Cache, IoKind, IoOwner};
use crate::event::{Action, BufRef, Dev, ReqError};
use crate::mode::WriteRule;
use crate::policy::position_key;
use crate::stats::Outcome;
use crate::units::{BlockMask, CoreId, Lba, LineId};

impl Cache {
    pub(crate) fn plan_write(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
        if self.bypass() && matches!(r.op, Op::Write { .. }) && !r.fallback {
            self.faults.counters.bypassed_requests += 1;
        }
        let rule = if r.fallback
            || !matches!(r.op, Op::Write { .. })
            || r.cut
            || self.class_allocation(r.class) == 0
        {
            WriteRule::Invalidate
        } else {
            self.write_rules().write
        };
        let (valid, total) = self.count_valid(&r);
        let mut plan = match rule {
            WriteRule::Back | WriteRule::Through => {
                if self.map_all(&mut r) {
                    if rule == WriteRule::Back {
                        Plan::WriteBack
                    } else {
                        Plan::WriteThrough
                    }
                } else {
                    self.counters.alloc_failures += 1;
                    Plan::Invalidate
                }
            }
            WriteRule::AroundIfMapped => {
                if r.parts.iter().all(|p| p.line.is_some()) {
                    Plan::WriteThrough
                } else {
                    Plan::Invalidate
                }
            }
            WriteRule::Invalidate => Plan::Invalidate,
        };
        if plan != Plan::WriteBack
            && r.lock != LockKind::ExclusiveNoWb
            && self.locks.any_wb(r.core, r.first, r.last)
        {
            // This write must reach the core, and a writeback of its lines is in flight:
            // wait for it, so the older writeback cannot land after us.
            self.unmap_new(&mut r);
            self.unlock_lines(r.core, r.first, r.last, r.lock);
            r.locked = false;
            r.lock = LockKind::ExclusiveNoWb;
            let id = r.id;
            self.reqs.insert(id, r);
            self.requeue(id, false);
            return;
        }
        if matches!(r.op, Op::Trim) {
            plan = Plan::Invalidate;
        }
        r.outcome = if plan == Plan::Invalidate {
            Outcome::PassThrough
        } else {
            Self::outcome_of(valid, total)
        };
        r.plan = plan;
        r.phase = Phase::Io;
        let fua = r.op.fua();
        match plan {
            Plan::WriteBack if r.parts.len() == 1 => {
                // One line: one cache write (a part's mask is contiguous).
                let p = r.parts[0];
                let e = self.locks.entry(lock_key(r.core, r.first));
                if e.wb {
                    e.wb_mask &= !p.mask;
                    self.counters.writeback_races += 1;
                }
                let l = p.line.expect("write-back lines are mapped");
                let run = self.single_cache_run(&r, l, p.mask);
                self.issue(&mut r, run, Dir::Write { fua }, actions);
            }
            Plan::WriteBack => {
                let mut runs = Runs::new(std::mem::take(&mut self.runs_buf));
                for i in 0..r.parts.len() {
                    let mask = r.parts[i].mask;
                    let key = lock_key(r.core, r.first + i as u64);
                    let e = self.locks.entry(key);
                    if e.wb {
                        e.wb_mask &= !mask;
                        self.counters.writeback_races += 1;
                    }
                    self.add_runs(&r, i, mask, Dev::Cache, &mut runs);
                }
                let runs = runs.finish();
                self.issue_runs(&mut r, runs, Dir::Write { fua }, actions);
            }
            Plan::WriteThrough => {
                let mut runs = Runs::new(std::mem::take(&mut self.runs_buf));
                for i in 0..r.parts.len() {
                    let mask = r.parts[i].mask;
                    self.add_runs(&r, i, mask, Dev::Cache, &mut runs);
                }
                runs.add(Run {
                    dev: Dev::Core(r.core),
                    lba: r.lba,
                    buf_off: 0,
                    blocks: r.blocks,
                });
                let runs = runs.finish();
                // The cache copy needs no FUA: it is clean, the core's copy is the one that counts.
                let (core_runs, cache_runs): (Vec<Run>, Vec<Run>) =
                    runs.iter().partition(|x| x.dev != Dev::Cache);
                self.runs_buf = runs;
                self.issue_runs(&mut r, cache_runs, Dir::Write { fua: false }, actions);
                self.issue_runs(&mut r, core_runs, Dir::Write { fua }, actions);
            }
            Plan::Invalidate => {
                let core = Dev::Core(r.core);
                let io = self.new_io(IoOwner::Req {
                    req: r.id,
                    kind: IoKind::CoreWrite,
                });
                let (lba, blocks) = (Lba(r.lba), r.blocks);
                self.counters.core_blocks_written += blocks as u64;
                actions.push(match r.op {
                    Op::Write { fua } => Action::Write {
                        io,
                        dev: core,
                        lba,
                        blocks,
                        buf: BufRef::Req {
                            req: r.id,
                            offset: 0,
                        },
                        fua,
                    },
                    Op::WriteZeroes { fua } => Action::WriteZeroes {
                        io,
                        dev: core,
                        lba,
                        blocks,
                        fua,
                    },
                    Op::Trim => Action::Trim {
                        io,
                        dev: core,
                        lba,
                        blocks,
                    },
                    Op::Read | Op::Flush => unreachable!(),
                });
                r.pending += 1;
            }
            Plan::None | Plan::Read { .. } | Plan::Flush => unreachable!(),
        }
        self.reqs.insert(r.id, r);
    }

    pub(crate) fn write_io_done(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
        let fua = r.op.fua();
        if r.phase == Phase::FlushBeforeDrop {
            if let Some(e) = r.core_err {
                // The core's copy is not known durable: keep dirty blocks, drop clean copies.
                self.drop_clean_copies(&r);
                return self.finish(r, Err(ReqError::Io(e)), actions);
            }
            self.drop_all(&r);
            return self.finish(r, Ok(()), actions);
        }
        match r.plan {
            Plan::WriteBack => {
                if r.cache_err.is_some() {
                    // Some cache writes may have landed: a clean copy of a targeted block is
                    // now unknown and is dropped; a dirty one stays the truth (old or new data,
                    // whichever the device holds) for now, and the next flush must cover it.
                    self.drop_clean_copies(&r);
                    self.unmap_new(&mut r);
                    if !fua {
                        self.cache_flush.writes_done += 1;
                    }
                    // The data is still in the request's buffer: write it to the core instead.
                    return self.fallback_to_core(r);
                }
                for i in 0..r.parts.len() {
                    let p = r.parts[i];
                    let l = p.line.expect("write-back lines are mapped");
                    let old_d = self.state.dirty(l);
                    let old_v = self.state.valid(l);
                    let hit = !p.new && old_v & p.mask != 0;
                    #[allow(unused_mut)]
                    let mut v = old_v | p.mask;
                    #[cfg(feature = "canary-stale-partial")]
                    {
                        v = crate::units::full_mask(self.bpl);
                    }
                    self.state.set(&mut self.lists, l, v, old_d | p.mask);
                    // A rewrite of blocks already dirty in a recorded line changes no record:
                    // nothing to commit, and the write need not wait for a commit.
                    let same = !p.new && v == old_v && old_d | p.mask == old_d;
                    if !(same && !fua && self.meta_recorded(l)) {
                        self.meta_note(l);
                    }
                    if old_d == 0 {
                        let class = self.lists.class(l);
                        self.eviction.dirtied(&mut self.lists, l, class, hit);
                        self.count_dirty(l, true);
                    }
                    let view = super::View {
                        map: &self.map,
                        locks: &self.locks,
                    };
                    self.cleaning.on_dirty(&mut self.lists, l, self.now, &view);
                }
                if !fua {
                    self.cache_flush.writes_done += 1;
                }
                self.finish(r, Ok(()), actions);
            }
            Plan::WriteThrough => {
                if let Some(e) = r.core_err {
                    self.drop_clean_copies(&r);
                    self.unmap_new(&mut r);
                    return self.finish(r, Err(ReqError::Io(e)), actions);
                }
                self.note_core_write(r.core, fua);
                if r.cache_err.is_some() {
                    // The core has the data; the cache copy is unknown: drop it (and free the
                    // lines this request mapped: they never got a valid block).
                    self.faults.counters.write_through_cache_failed += 1;
                    #[cfg(not(feature = "canary-empty-line"))]
                    self.unmap_new(&mut r);
                    return self.drop_after_core_write(r, fua, actions);
                }
                let mut over_dirty = false;
                for p in &r.parts {
                    let l = p.line.expect("write-through lines are mapped");
                    #[allow(unused_mut)]
                    let mut v = self.state.valid(l) | p.mask;
                    #[cfg(feature = "canary-stale-partial")]
                    {
                        v = crate::units::full_mask(self.bpl);
                    }
                    let d = self.state.dirty(l);
                    over_dirty |= d & p.mask != 0;
                    self.state.set(&mut self.lists, l, v, d);
                    self.meta_note(l);
                }
                if over_dirty {
                    // Blocks that stay dirty now hold this write in the cache, and after a
                    // crash their dirty copy wins over the core's: the next flush (and the
                    // journal commit's preflush, before a FUA write is acknowledged) must
                    // cover this cache write.
                    self.cache_flush.writes_done += 1;
                }
                self.touch_hits(&r);
                self.finish(r, Ok(()), actions);
            }
            Plan::Invalidate => {
                if let Some(e) = r.core_err {
                    self.drop_clean_copies(&r);
                    return self.finish(r, Err(ReqError::Io(e)), actions);
                }
                self.note_core_write(r.core, fua);
                self.drop_after_core_write(r, fua, actions);
            }
            Plan::None | Plan::Read { .. } | Plan::Flush => unreachable!(),
        }
    }

    /// The core now has the request's data: drop the cache's copy of its blocks, after a core
    /// flush if any of them is dirty (unless the write was FUA).
    fn drop_after_core_write(&mut self, mut r: Box<Request>, fua: bool, actions: &mut Vec<Action>) {
        let any_dirty = r
            .parts
            .iter()
            .any(|p| p.line.is_some_and(|l| self.state.dirty(l) & p.mask != 0));
        if any_dirty && !fua {
            let core = self.cores[r.core.0 as usize].as_ref().expect("core exists");
            let covers = core.flush.writes_done;
            let io = self.new_io(IoOwner::Req {
                req: r.id,
                kind: IoKind::Flush {
                    dev: Dev::Core(r.core),
                    covers,
                },
            });
            actions.push(Action::Flush {
                io,
                dev: Dev::Core(r.core),
            });
            r.pending += 1;
            r.phase = Phase::FlushBeforeDrop;
            self.reqs.insert(r.id, r);
            return;
        }
        self.drop_all(&r);
        self.finish(r, Ok(()), actions);
    }

    /// A lazy write whose cache write failed goes to the core instead: it gives its locks back
    /// and waits at the head of the queue for its lines exclusive with no writeback in flight
    /// (an older writeback must not land after it), then is planned as a write-invalidate.
    fn fallback_to_core(&mut self, mut r: Box<Request>) {
        self.faults.counters.lazy_write_fallbacks += 1;
        if r.locked {
            self.unlock_lines(r.core, r.first, r.last, r.lock);
            r.locked = false;
            self.wake_waiters = true;
        }
        r.lock = LockKind::ExclusiveNoWb;
        r.fallback = true;
        r.cache_err = None;
        r.core_err = None;
        r.plan = Plan::None;
        r.phase = Phase::Queued;
        let id = r.id;
        self.reqs.insert(id, r);
        // Overlapping requests queued meanwhile arrived after it: it goes first.
        self.requeue(id, true);
    }

    /// Drops the request's blocks from lines holding no dirty data (a cache read of them
    /// failed; they are clean, so the core has them). Lines that may still be named by
    /// persistent metadata are left alone (changing them needs a journal commit).
    pub(crate) fn drop_clean_lines(&mut self, r: &Request) {
        for p in &r.parts {
            if let Some(l) = p.line
                && self.map.is_mapped(l)
                && self.state.dirty(l) == 0
                && !self.lists.durable_dirty(l)
            {
                self.drop_blocks(l, p.mask);
            }
        }
    }

    fn note_core_write(&mut self, core: CoreId, fua: bool) {
        if !fua {
            let c = self.cores[core.0 as usize].as_mut().expect("core exists");
            c.flush.writes_done += 1;
        }
    }

    /// Drops every block of the request from the cache.
    fn drop_all(&mut self, r: &Request) {
        for p in &r.parts {
            if let Some(l) = p.line
                && self.map.is_mapped(l)
            {
                self.drop_blocks(l, p.mask);
            }
        }
    }

    /// Drops the request's blocks that are clean in the cache; dirty ones stay.
    fn drop_clean_copies(&mut self, r: &Request) {
        for p in &r.parts {
            if let Some(l) = p.line
                && self.map.is_mapped(l)
            {
                let d = self.state.dirty(l);
                self.drop_blocks(l, p.mask & !d);
            }
        }
    }

    /// Invalidates `mask` in `line`, keeping lists and counters right; frees the line if no
    /// valid block is left. The caller holds the line.
    pub(crate) fn drop_blocks(&mut self, line: LineId, mask: BlockMask) {
        let v = self.state.valid(line);
        let d = self.state.dirty(line);
        let nv = v & !mask;
        let nd = d & !mask;
        if nv == v {
            return;
        }
        self.state.set(&mut self.lists, line, nv, nd);
        self.meta_note(line);
        if d != 0 && nd == 0 {
            self.note_clean(line);
            let (c, cl) = self.map.position(line);
            let class = self.lists.class(line);
            self.eviction
                .insert(&mut self.lists, line, class, position_key(c, cl));
        }
        if nv == 0 {
            self.free_line(line);
        }
    }
}
