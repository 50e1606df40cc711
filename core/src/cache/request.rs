//! Client requests: read, write, write-zeroes, trim, flush.
//!
//! A request's life: *arrive* (validate, classify, sequential-cutoff check, maybe throttle) →
//! *lock* its core lines (or wait in arrival order) → *plan* (which blocks come from or go to
//! which device, which lines to map) → *IO* → optional second phase (backfill after a read miss;
//! a core flush before dirty blocks are dropped) → *complete* (reply, unlock, wake waiters).
//!
//! Rules that keep the durability contract (docs/SAFETY.md):
//! - Dirty blocks are always read from the cache; only writeback (after a core flush) makes a
//!   dirty block clean, so an acknowledged lazy write is never lost while the cache lives.
//! - Dirty blocks are dropped (write-invalidate, trim, write-zeroes, a failed cache write in
//!   write-through) only after the core's newer copy is durable: a core flush comes first.
//! - A failed write leaves each block with its old or its new data and keeps whichever the cache
//!   will keep serving: clean copies of blocks a failed write touched are invalidated, dirty
//!   blocks are kept.
//!
//! Device faults (`health.rs`, docs/SAFETY.md "Faults"):
//! - a core error is the request's result (reads, write-through and pass-through writes,
//!   trims, write-zeroes, flushes);
//! - a cache error is hidden where the data allows: clean blocks whose cache read failed are
//!   read again from the core (dirty ones fail the read: they exist nowhere else); a
//!   write-through write's core copy stands and the cache's copy is dropped; a lazy write whose
//!   cache write failed is written to the core instead (*fallback*: it waits like any core write
//!   for writebacks of its lines, then drops the cache's copy after a core flush); a failed
//!   backfill only leaves the lines unfilled. Then the cache is in *bypass* and plans every
//!   request with `pt`'s rules until a probe of the device succeeds.
//!
//! Files: this one holds the request's types, its arrival, the planning helpers reads and
//! writes share, flushes and the completion; `admit.rs` locks or queues it (and retries the
//! queue), `read.rs` and `write.rs` plan and complete reads and writes (write-zeroes and trims
//! with the writes), `issue.rs` turns a plan into device IOs.

use super::health::IoClass;
use super::issue::Run;
use super::lock::LockKind;
use super::{Cache, IoKind, IoOwner};
use crate::config::REQUEST_BLOCKS_MAX;
use crate::event::{Action, Dev, Event, IoError, ReqError};
use crate::mode::WriteRule;
use crate::policy::ioclass::IoInfo;
use crate::stats::Outcome;
use crate::units::{BlockMask, CoreId, Lba, LineId, ReqId, block_range_mask};

/// A request's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write { fua: bool },
    WriteZeroes { fua: bool },
    Trim,
    Flush,
}

impl Op {
    pub(crate) fn fua(self) -> bool {
        matches!(
            self,
            Op::Write { fua: true } | Op::WriteZeroes { fua: true }
        )
    }
}

/// The part of a request inside one core line.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    /// The cache line, if mapped.
    pub(crate) line: Option<LineId>,
    /// Blocks of the line the request covers.
    pub(crate) mask: BlockMask,
    /// Blocks to write into the cache after the read (backfill).
    pub(crate) fill: BlockMask,
    /// Mapped by this request (freed again if it ends up empty).
    pub(crate) new: bool,
}

/// What the request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not planned yet.
    None,
    /// Read; backfill `fill` blocks afterwards if `backfill`.
    Read { backfill: bool },
    /// Write to the cache only; lines become dirty.
    WriteBack,
    /// Write to cache and core.
    WriteThrough,
    /// Write (or zero, or trim) the core; drop the cache's copy.
    Invalidate,
    /// Flush devices.
    Flush,
}

/// Where a request is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for locks or throttled.
    Queued,
    /// Main IO in flight.
    Io,
    /// Backfill writes in flight.
    Backfill,
    /// A core flush in flight before dirty blocks are dropped.
    FlushBeforeDrop,
    /// Re-reading from the core after a cache read error.
    ReadRetry,
}

/// A client request in flight.
#[derive(Debug)]
pub struct Request {
    pub(crate) id: ReqId,
    pub(crate) op: Op,
    pub(crate) core: CoreId,
    pub(crate) lba: u64,
    pub(crate) blocks: u32,
    pub(crate) class: u8,
    /// First and last core line touched.
    pub(crate) first: u64,
    pub(crate) last: u64,
    /// Sequential cutoff fired.
    pub(crate) cut: bool,
    pub(crate) lock: LockKind,
    pub(crate) locked: bool,
    pub(crate) phase: Phase,
    pub(crate) plan: Plan,
    pub(crate) pending: u32,
    pub(crate) cache_err: Option<IoError>,
    pub(crate) core_err: Option<IoError>,
    pub(crate) parts: Vec<Part>,
    pub(crate) outcome: Outcome,
    /// A lazy write whose cache write failed, re-planned as a write to the core.
    pub(crate) fallback: bool,
    /// A read whose core blocks were not contiguous reads the whole core span in one IO
    /// first; these cache reads then lay the cache's blocks over it (a second step).
    pub(crate) overlay: Vec<Run>,
}

impl Cache {
    /// A client request arrived.
    pub(crate) fn on_request(&mut self, event: Event, actions: &mut Vec<Action>) {
        let (req, op, core, lba, blocks) = match event {
            Event::Read {
                req,
                core,
                lba,
                blocks,
            } => (req, Op::Read, core, lba, blocks),
            Event::Write {
                req,
                core,
                lba,
                blocks,
                fua,
            } => (req, Op::Write { fua }, core, lba, blocks),
            Event::WriteZeroes {
                req,
                core,
                lba,
                blocks,
                fua,
            } => (req, Op::WriteZeroes { fua }, core, lba, blocks),
            Event::Trim {
                req,
                core,
                lba,
                blocks,
            } => (req, Op::Trim, core, lba, blocks),
            Event::Flush { req, core } => (req, Op::Flush, core, Lba(0), 0),
            Event::IoDone { .. } | Event::Tick => unreachable!("not a request"),
        };
        assert!(
            !self.reqs.contains_key(&req),
            "request id {req:?} reused while in flight"
        );
        if self.refusing() {
            return Self::reply(actions, req, Err(ReqError::NotRunning));
        }
        let Some(core_state) = self.core(core) else {
            return Self::reply(actions, req, Err(ReqError::NoSuchCore));
        };
        let size = core_state.size_blocks;
        if op != Op::Flush && blocks > 0 {
            // Start the mapping-table misses now; validation, classification and the cutoff
            // check below run while they are in flight.
            let first = lba.0 >> self.shift;
            let last = (lba.0.saturating_add(blocks as u64 - 1) >> self.shift).min(first + 3);
            for cl in first..=last {
                self.map.prefetch(core, cl);
            }
        }
        let end = lba.0.checked_add(blocks as u64);
        if op != Op::Flush {
            if end.is_none_or(|e| e > size) || blocks > REQUEST_BLOCKS_MAX {
                let e = match op {
                    Op::Write { .. } | Op::WriteZeroes { .. } if blocks <= REQUEST_BLOCKS_MAX => {
                        ReqError::PastEnd
                    }
                    _ => ReqError::OutOfRange,
                };
                return Self::reply(actions, req, Err(e));
            }
            if blocks == 0 {
                return Self::reply(actions, req, Ok(()));
            }
        }
        self.cleaning.on_client_io(self.now);
        let is_write = !matches!(op, Op::Read);
        let class = if op == Op::Flush {
            0
        } else {
            self.classes.classify(&IoInfo {
                core,
                is_write,
                lba,
                bytes: blocks as u64 * crate::units::BLOCK_BYTES,
            })
        };
        let (first, last) = if op == Op::Flush {
            (0, 0)
        } else {
            (
                lba.0 >> self.shift,
                (lba.0 + blocks as u64 - 1) >> self.shift,
            )
        };
        let cut = if matches!(op, Op::Read | Op::Write { .. }) {
            let lines_needed = (last - first + 1) as u32;
            let free = self.cfg.lines - self.map.mapped();
            let full = free <= 512 + lines_needed;
            let cs = self.cores[core.0 as usize].as_mut().expect("checked");
            cs.cutoff.check(is_write, lba, blocks, full)
        } else {
            false
        };
        let fields = Request {
            id: req,
            op,
            core,
            lba: lba.0,
            blocks,
            class,
            first,
            last,
            cut,
            lock: LockKind::Exclusive,
            locked: false,
            phase: Phase::Queued,
            plan: Plan::None,
            pending: 0,
            cache_err: None,
            core_err: None,
            parts: self.parts_pool.pop().unwrap_or_default(),
            outcome: Outcome::Miss,
            fallback: false,
            overlay: Vec::new(),
        };
        // Requests live in boxes recycled through `req_pool`: a request moves between
        // functions and in and out of `reqs` several times in its life, and a box moves as a
        // pointer where the request itself is a copy of over 100 bytes.
        let mut r = match self.req_pool.pop() {
            Some(mut b) => {
                *b = fields;
                b
            }
            None => Box::new(fields),
        };
        if op == Op::Flush {
            self.start_flush(r, actions);
            return;
        }
        // Throttle writes that would create new dirty lines.
        let lazy_write =
            matches!(op, Op::Write { .. }) && !cut && self.write_rules().write == WriteRule::Back;
        // Reads and lazy writes look their lines up now (the lock kind and the throttle depend
        // on them); if the request starts at once, its plan uses these parts as they are.
        let looked_up = op == Op::Read || lazy_write;
        if looked_up {
            self.lookup_parts(&mut r);
        }
        r.lock = self.initial_lock_kind(&r);
        let new_dirty = if lazy_write {
            Self::new_dirty_lines(&r, &self.state)
        } else {
            0
        };
        if new_dirty > 0 {
            let delay = self.rate.throttle_delay(self.now, new_dirty);
            if delay.0 > 0 {
                self.counters.throttled_writes += 1;
                self.counters.throttle_ns += delay.0;
                self.reqs.insert(req, r);
                self.throttled.push((self.now.plus(delay), req));
                return;
            }
        }
        // The common case: nobody waits (so no earlier request can overlap this one) and its
        // lines are free: start it here, without parking it in `reqs` first. The same decision
        // `admit` makes, minus a hash-table round trip.
        if self.waits.is_empty() && self.locks.try_lock(core, first, last, r.lock) {
            return self.plan(r, looked_up, actions);
        }
        self.reqs.insert(req, r);
        self.admit(req, actions);
    }

    /// Fills `r.parts` from the mapping as it is now, starting the loads of each mapped line's
    /// records (state, tag and links) while the next key is looked up.
    pub(crate) fn lookup_parts(&self, r: &mut Request) {
        r.parts.clear();
        for cl in r.first..=r.last {
            let mask = self.part_mask(r, cl);
            let line = self.map.lookup_hinted(r.core, cl, |l| {
                self.state.prefetch(l);
                self.lists.prefetch(l);
            });
            r.parts.push(Part {
                line,
                mask,
                fill: 0,
                new: false,
            });
        }
    }

    /// Lines of `r` (its parts just looked up) that are not dirty now (a write there makes them
    /// newly dirty).
    fn new_dirty_lines(r: &Request, state: &crate::state::LineStates) -> u32 {
        r.parts
            .iter()
            .filter(|p| p.line.is_none_or(|l| state.dirty(l) == 0))
            .count() as u32
    }

    /// The rules writes follow now (the target's while leaving a lazy mode; `pt`'s while the
    /// cache device fails).
    #[inline]
    pub(crate) fn write_rules(&self) -> &'static crate::mode::ModeRules {
        if self.bypass() {
            return crate::mode::CacheMode::Pt.rules();
        }
        self.target_mode.unwrap_or(self.mode).rules()
    }

    /// The rules reads follow now (`pt`'s while the cache device fails: dirty blocks are still
    /// read from the cache, clean ones from the core, nothing is promoted).
    #[inline]
    pub(crate) fn read_rules(&self) -> &'static crate::mode::ModeRules {
        if self.bypass() {
            return crate::mode::CacheMode::Pt.rules();
        }
        self.mode.rules()
    }

    /// Lock kind chosen at arrival (a read's parts looked up); re-checked when the plan is made.
    fn initial_lock_kind(&self, r: &Request) -> LockKind {
        match r.op {
            Op::Read => {
                // `r.parts` were just looked up.
                let full_hit = r.parts.iter().all(|p| {
                    p.line
                        .is_some_and(|l| self.state.valid(l) & p.mask == p.mask)
                });
                if full_hit {
                    LockKind::Shared
                } else {
                    LockKind::Exclusive
                }
            }
            Op::Write { .. } if !r.cut && self.write_rules().write == WriteRule::Back => {
                LockKind::Exclusive
            }
            _ => LockKind::ExclusiveNoWb,
        }
    }

    /// Blocks of core line `cl` that request `r` covers.
    #[inline]
    pub(crate) fn part_mask(&self, r: &Request, cl: u64) -> BlockMask {
        let line_start = cl << self.shift;
        let s = r.lba.max(line_start) - line_start;
        let e = (r.lba + r.blocks as u64).min(line_start + self.bpl as u64) - line_start;
        block_range_mask(s as u32, (e - s) as u32)
    }

    /// Valid blocks of the request: (valid, total).
    pub(crate) fn count_valid(&self, r: &Request) -> (u32, u32) {
        let mut v = 0;
        let mut t = 0;
        for p in &r.parts {
            t += p.mask.count_ones();
            if let Some(l) = p.line {
                v += (self.state.valid(l) & p.mask).count_ones();
            }
        }
        (v, t)
    }

    pub(crate) fn outcome_of(valid: u32, total: u32) -> Outcome {
        if valid == total {
            Outcome::FullHit
        } else if valid > 0 {
            Outcome::PartialHit
        } else {
            Outcome::Miss
        }
    }

    /// Maps every unmapped part of `r` (asking promotion unless some part is mapped). On
    /// failure, unmaps what it mapped and returns false.
    pub(crate) fn map_all(&mut self, r: &mut Request) -> bool {
        let unmapped = r.parts.iter().filter(|p| p.line.is_none()).count() as u32;
        if unmapped == 0 {
            return true;
        }
        let any_mapped = unmapped < r.parts.len() as u32;
        if !any_mapped
            && !self.promotion.admit(
                r.core,
                r.first,
                r.parts.len() as u32,
                self.map.mapped(),
                self.cfg.lines,
            )
        {
            return false;
        }
        for i in 0..r.parts.len() {
            if r.parts[i].line.is_some() {
                continue;
            }
            let cl = r.first + i as u64;
            match self.alloc_line(r.class, r.core, cl) {
                Some(l) => {
                    r.parts[i].line = Some(l);
                    r.parts[i].new = true;
                }
                None => {
                    self.unmap_new(r);
                    return false;
                }
            }
        }
        self.promotion
            .on_inserted(r.core, r.first, r.parts.len() as u32);
        true
    }

    /// Frees lines this request mapped that hold no valid block.
    pub(crate) fn unmap_new(&mut self, r: &mut Request) {
        for p in r.parts.iter_mut() {
            if p.new
                && let Some(l) = p.line
                && self.state.valid(l) == 0
            {
                p.new = false;
                self.free_line(l);
                p.line = None;
            }
        }
    }

    // ----- flushes -----

    fn start_flush(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
        r.plan = Plan::Flush;
        r.phase = Phase::Io;
        r.lock = LockKind::Shared;
        if cfg!(feature = "canary-early-flush-ack") {
            // Planted bug: reply before anything is durable.
            return self.finish(r, Ok(()), actions);
        }
        if self.cache_flush.needs_flush() {
            let covers = self.cache_flush.writes_done;
            let io = self.new_io(IoOwner::Req {
                req: r.id,
                kind: IoKind::Flush {
                    dev: Dev::Cache,
                    covers,
                },
            });
            actions.push(Action::Flush {
                io,
                dev: Dev::Cache,
            });
            r.pending += 1;
        }
        let core = self.cores[r.core.0 as usize].as_ref().expect("core exists");
        if core.flush.needs_flush() {
            let covers = core.flush.writes_done;
            let dev = Dev::Core(r.core);
            let io = self.new_io(IoOwner::Req {
                req: r.id,
                kind: IoKind::Flush { dev, covers },
            });
            actions.push(Action::Flush { io, dev });
            r.pending += 1;
        }
        if r.pending == 0 {
            return self.finish(r, Ok(()), actions);
        }
        self.reqs.insert(r.id, r);
    }

    // ----- completions -----

    /// A device IO of request `id` finished.
    pub(crate) fn req_io_done(
        &mut self,
        id: ReqId,
        kind: IoKind,
        result: Result<(), IoError>,
        actions: &mut Vec<Action>,
    ) {
        let mut r = self.reqs.remove(&id).expect("IO for a request in flight");
        let (dev, class) = match kind {
            IoKind::CacheRead => (Dev::Cache, IoClass::Read),
            IoKind::CacheWrite => (Dev::Cache, IoClass::Write),
            IoKind::CoreRead => (Dev::Core(r.core), IoClass::Read),
            IoKind::CoreWrite => (Dev::Core(r.core), IoClass::Write),
            IoKind::Flush { dev, .. } => (dev, IoClass::Flush),
        };
        match (dev, result) {
            (_, Ok(())) => {
                if let IoKind::Flush { dev, covers } = kind {
                    let fs = match dev {
                        Dev::Cache => &mut self.cache_flush,
                        Dev::Core(c) => &mut self.cores[c.0 as usize].as_mut().expect("core").flush,
                    };
                    fs.durable_upto = fs.durable_upto.max(covers);
                }
                if let Dev::Core(c) = dev {
                    self.note_core_ok(c);
                }
            }
            (Dev::Cache, Err(e)) => {
                self.counters.cache_errors += 1;
                self.note_cache_error(class, e);
                r.cache_err = Some(e);
            }
            (Dev::Core(c), Err(e)) => {
                self.counters.core_errors += 1;
                self.note_core_error(c, class, e, false);
                r.core_err = Some(e);
            }
        }
        r.pending -= 1;
        if r.pending > 0 {
            self.reqs.insert(id, r);
            return;
        }
        match r.op {
            Op::Flush => {
                let res = match r.cache_err.or(r.core_err) {
                    Some(e) => Err(ReqError::Io(e)),
                    None => Ok(()),
                };
                self.finish(r, res, actions);
            }
            Op::Read => self.read_io_done(r, actions),
            _ => self.write_io_done(r, actions),
        }
    }

    /// Completes `r`: counters, unlock, reply.
    pub(crate) fn finish(
        &mut self,
        mut r: Box<Request>,
        result: Result<(), ReqError>,
        actions: &mut Vec<Action>,
    ) {
        let cls = &mut self.class_counters[r.class as usize];
        let core = &mut self.cores[r.core.0 as usize]
            .as_mut()
            .expect("core exists")
            .counters;
        for c in [cls, core] {
            match r.op {
                Op::Read => {
                    c.read.count(r.outcome);
                    c.blocks_read += r.blocks as u64;
                }
                Op::Write { .. } | Op::WriteZeroes { .. } => {
                    c.write.count(r.outcome);
                    c.blocks_written += r.blocks as u64;
                }
                Op::Trim => c.trims += 1,
                Op::Flush => c.flushes += 1,
            }
            if result.is_err() {
                c.errors += 1;
            }
        }
        let must_wait = self.meta_must_wait();
        let flush_waits = r.op == Op::Flush
            && result.is_ok()
            && !cfg!(feature = "canary-flush-skips-journal")
            && self.meta_flush_must_wait();
        if must_wait || flush_waits {
            // Its change must be journaled first; it keeps its locks until then. A request
            // that needs no durability (not FUA, not a flush) and succeeded is answered now:
            // until a flush, a crash may lose it (SPEC durability point 2), and recovery finds
            // the older state (its blocks' clean copies are not trusted unless an intent
            // guards them). A flush waits for the records of everything answered before it.
            let lock = r.locked.then_some((r.core, r.first, r.last, r.lock));
            let fua = r.op.fua() || r.op == Op::Flush;
            let replied = !fua && result.is_ok();
            if replied {
                Self::reply(actions, r.id, result);
            }
            self.meta_park(super::meta::Waiter {
                req: r.id,
                result,
                lock,
                fua,
                replied,
            });
        } else {
            if r.locked {
                self.unlock_lines(r.core, r.first, r.last, r.lock);
                self.wake_waiters = true;
            }
            Self::reply(actions, r.id, result);
        }
        let mut parts = std::mem::take(&mut r.parts);
        if self.parts_pool.len() < 256 && parts.capacity() <= 64 {
            parts.clear();
            self.parts_pool.push(parts);
        }
        if self.req_pool.len() < 256 {
            self.req_pool.push(r);
        }
    }

    fn reply(actions: &mut Vec<Action>, req: ReqId, result: Result<(), ReqError>) {
        actions.push(Action::Complete { req, result });
    }
}
