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

use super::health::IoClass;
use super::lock::{LockKind, lock_key};
use super::{Cache, IoKind, IoOwner};
use crate::config::REQUEST_BLOCKS_MAX;
use crate::event::{Action, BufRef, Dev, Event, IoError, ReqError};
use crate::mode::WriteRule;
use crate::policy::ioclass::IoInfo;
use crate::policy::position_key;
use crate::stats::Outcome;
use crate::units::{BlockMask, CoreId, Lba, LineId, ReqId, block_range_mask, mask_runs};

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
    fn fua(self) -> bool {
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
    line: Option<LineId>,
    /// Blocks of the line the request covers.
    mask: BlockMask,
    /// Blocks to write into the cache after the read (backfill).
    fill: BlockMask,
    /// Mapped by this request (freed again if it ends up empty).
    new: bool,
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

/// A contiguous device IO being assembled from parts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    dev: Dev,
    lba: u64,
    buf_off: u32,
    blocks: u32,
}

/// Two run builders (cache and core) that merge contiguous pieces.
struct Runs {
    cache: Option<Run>,
    core: Option<Run>,
    out: Vec<Run>,
}

impl Runs {
    /// A builder writing into `out` (cleared).
    fn new(mut out: Vec<Run>) -> Runs {
        out.clear();
        Runs {
            cache: None,
            core: None,
            out,
        }
    }

    fn add(&mut self, run: Run) {
        let slot = if run.dev == Dev::Cache {
            &mut self.cache
        } else {
            &mut self.core
        };
        if let Some(cur) = slot
            && cur.lba + cur.blocks as u64 == run.lba
            && cur.buf_off + cur.blocks == run.buf_off
        {
            cur.blocks += run.blocks;
            return;
        }
        if let Some(prev) = slot.replace(run) {
            self.out.push(prev);
        }
    }
    fn finish(mut self) -> Vec<Run> {
        self.out.extend(self.cache.take());
        self.out.extend(self.core.take());
        self.out
    }
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
    fn lookup_parts(&self, r: &mut Request) {
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

    /// Starts a request if its lines are free and no earlier waiting request overlaps it;
    /// otherwise queues it.
    pub(crate) fn admit(&mut self, id: ReqId, actions: &mut Vec<Action>) {
        let r = &self.reqs[&id];
        let (core, first, last) = (r.core, r.first, r.last);
        if !self.waits.overlaps(core, first, last) && self.locks.can_lock(core, first, last, r.lock)
        {
            self.start_locked(id, actions);
        } else {
            self.counters.deferred += 1;
            self.waits.push_back(id, core, first, last);
            self.locks.record_releases(true);
        }
    }

    /// Queues request `id` (in `reqs`) again, at the back or (it arrived before every request
    /// waiting now) at the front, to be looked at by the next retry.
    fn requeue(&mut self, id: ReqId, front: bool) {
        let r = &self.reqs[&id];
        let (core, first, last) = (r.core, r.first, r.last);
        if front {
            self.waits.push_front(id, core, first, last);
        } else {
            self.waits.push_back(id, core, first, last);
        }
        self.locks.record_releases(true);
        self.locks.note_released(lock_key(core, first));
        self.counters.deferred += 1;
    }

    /// Retries waiting requests in arrival order; a request never passes an earlier waiting
    /// request it overlaps. Only the requests that head the queue of a line released since the
    /// last retry can start, and those that come to head a queue as the ones before them start
    /// (`wait.rs`). The order is the queue order; a line released during the retry whose
    /// first request comes before the one being looked at is left for the next retry (as a
    /// scan of one arrival-ordered list, which this replaces, would do).
    pub(crate) fn retry_waiting(&mut self, actions: &mut Vec<Action>) {
        let mut keys = std::mem::take(&mut self.wait_keys);
        let mut work = std::mem::take(&mut self.wait_work);
        let mut later: Vec<u64> = Vec::new();
        let mut cursor = 0u64;
        loop {
            self.locks.take_released(&mut keys);
            for &key in &keys {
                if let Some((s, id)) = self.waits.front_of(key) {
                    if s < cursor {
                        later.push(key);
                    } else {
                        work.push(std::cmp::Reverse((s, id)));
                    }
                }
            }
            let Some(std::cmp::Reverse((s, id))) = work.pop() else {
                break;
            };
            if self.waits.seq(id) != Some(s) {
                continue; // started already (a second entry), or queued again since
            }
            cursor = s;
            let r = &self.reqs[&id];
            if !self.waits.is_first(id) || !self.locks.can_lock(r.core, r.first, r.last, r.lock) {
                continue;
            }
            self.waits
                .remove_first(id, &mut |s, id| work.push(std::cmp::Reverse((s, id))));
            self.start_locked(id, actions);
        }
        self.locks.record_releases(!self.waits.is_empty());
        for key in later {
            self.locks.note_released(key);
        }
        self.wait_keys = keys;
        self.wait_work = work;
    }

    /// Releases throttled writes whose time has come, oldest first.
    pub(crate) fn release_throttled(&mut self, actions: &mut Vec<Action>) {
        let now = self.now;
        let mut due: Vec<(crate::units::Nanos, ReqId)> = self
            .throttled
            .iter()
            .copied()
            .filter(|&(t, _)| t <= now)
            .collect();
        if due.is_empty() {
            return;
        }
        self.throttled.retain(|&(t, _)| t > now);
        due.sort();
        for (_, id) in due {
            self.admit(id, actions);
        }
    }

    /// Locks the lines of waiting request `id` and plans it.
    fn start_locked(&mut self, id: ReqId, actions: &mut Vec<Action>) {
        let r = self.reqs.remove(&id).expect("request exists");
        self.start(r, false, actions);
    }

    /// Locks the request's lines and plans it. `fresh`: its parts were looked up during this
    /// same event and nothing has changed the mapping since (else they are looked up again).
    fn start(&mut self, r: Box<Request>, fresh: bool, actions: &mut Vec<Action>) {
        self.locks.lock(r.core, r.first, r.last, r.lock);
        self.plan(r, fresh, actions);
    }

    /// Plans a request whose lines were just locked (see [`Cache::start`] for `fresh`).
    fn plan(&mut self, mut r: Box<Request>, fresh: bool, actions: &mut Vec<Action>) {
        r.locked = true;
        if !fresh {
            self.lookup_parts(&mut r);
        }
        self.plan_locked(r, actions);
    }

    /// Plans a request holding its locks, its parts looked up. A change to lines whose clean
    /// state may be proven waits first for a durable write intent (`intent.rs`).
    fn plan_locked(&mut self, r: Box<Request>, actions: &mut Vec<Action>) {
        if r.op != Op::Read
            && self.meta.is_some()
            && let Some(upto) = self.intent_gate(r.core, r.first, r.parts.iter().map(|p| p.line))
        {
            let id = r.id;
            self.reqs.insert(id, r);
            return self.intent_park(id, upto);
        }
        match r.op {
            Op::Read => self.plan_read(r, actions),
            _ => self.plan_write(r, actions),
        }
    }

    /// A request parked by [`Self::plan_locked`] fails: the intent it waited for could not be
    /// written. Nothing of it was done.
    pub(crate) fn fail_after_intent(
        &mut self,
        id: ReqId,
        e: crate::event::IoError,
        actions: &mut Vec<Action>,
    ) {
        let r = self.reqs.remove(&id).expect("parked request");
        self.finish(r, Err(ReqError::Io(e)), actions);
    }

    /// A request parked by [`Self::plan_locked`] may go on: look its lines up again and plan.
    pub(crate) fn resume_after_intent(&mut self, id: ReqId, actions: &mut Vec<Action>) {
        let mut r = self.reqs.remove(&id).expect("parked request");
        self.lookup_parts(&mut r);
        self.plan_locked(r, actions);
    }

    /// Valid blocks of the request: (valid, total).
    fn count_valid(&self, r: &Request) -> (u32, u32) {
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

    fn outcome_of(valid: u32, total: u32) -> Outcome {
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
    fn map_all(&mut self, r: &mut Request) -> bool {
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
    fn unmap_new(&mut self, r: &mut Request) {
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

    /// Buffer offset (blocks into the request's buffer) of block `b` of core line `cl`.
    #[inline]
    fn buf_off(&self, r: &Request, cl: u64, b: u32) -> u32 {
        ((cl << self.shift) + b as u64 - r.lba) as u32
    }

    /// Adds the runs of `mask` in part `i` of `r` to `runs`, for `dev`.
    fn add_runs(&self, r: &Request, i: usize, mask: BlockMask, dev: Dev, runs: &mut Runs) {
        let cl = r.first + i as u64;
        for (b, n) in mask_runs(mask) {
            let lba = match dev {
                Dev::Cache => self.cache_lba(r.parts[i].line.expect("mapped"), b).0,
                Dev::Core(_) => (cl << self.shift) + b as u64,
            };
            runs.add(Run {
                dev,
                lba,
                buf_off: self.buf_off(r, cl, b),
                blocks: n,
            });
        }
    }

    fn issue_reads(&mut self, r: &mut Request, runs: Vec<Run>, actions: &mut Vec<Action>) {
        for &run in &runs {
            self.issue_read(r, run, actions);
        }
        self.runs_buf = runs;
    }

    /// Issues one device read of `r`.
    #[inline]
    fn issue_read(&mut self, r: &mut Request, run: Run, actions: &mut Vec<Action>) {
        let kind = if run.dev == Dev::Cache {
            IoKind::CacheRead
        } else {
            IoKind::CoreRead
        };
        let io = self.new_io(IoOwner::Req { req: r.id, kind });
        if run.dev == Dev::Cache {
            self.counters.cache_blocks_read += run.blocks as u64;
        } else {
            self.counters.core_blocks_read += run.blocks as u64;
        }
        actions.push(Action::Read {
            io,
            dev: run.dev,
            lba: Lba(run.lba),
            blocks: run.blocks,
            buf: BufRef::Req {
                req: r.id,
                offset: run.buf_off,
            },
        });
        r.pending += 1;
    }

    fn issue_writes(&mut self, r: &mut Request, runs: Vec<Run>, fua: bool, a: &mut Vec<Action>) {
        for &run in &runs {
            self.issue_write(r, run, fua, a);
        }
        self.runs_buf = runs;
    }

    /// Issues one device write of `r`.
    #[inline]
    fn issue_write(&mut self, r: &mut Request, run: Run, fua: bool, a: &mut Vec<Action>) {
        let kind = if run.dev == Dev::Cache {
            IoKind::CacheWrite
        } else {
            IoKind::CoreWrite
        };
        let io = self.new_io(IoOwner::Req { req: r.id, kind });
        if run.dev == Dev::Cache {
            self.counters.cache_blocks_written += run.blocks as u64;
        } else {
            self.counters.core_blocks_written += run.blocks as u64;
        }
        a.push(Action::Write {
            io,
            dev: run.dev,
            lba: Lba(run.lba),
            blocks: run.blocks,
            buf: BufRef::Req {
                req: r.id,
                offset: run.buf_off,
            },
            fua,
        });
        r.pending += 1;
    }

    /// The one cache IO of a request within one mapped line whose blocks `mask` (contiguous,
    /// as every part's mask is) all go to or come from the cache: what the run builder would
    /// produce, without it.
    #[inline]
    fn single_cache_run(&self, r: &Request, line: LineId, mask: BlockMask) -> Run {
        let b = mask.trailing_zeros();
        Run {
            dev: Dev::Cache,
            lba: self.cache_lba(line, b).0,
            buf_off: self.buf_off(r, r.first, b),
            blocks: mask.count_ones(),
        }
    }

    // ----- reads -----

    fn plan_read(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
        let rules = self.read_rules();
        if self.bypass() {
            self.faults.counters.bypassed_requests += 1;
        }
        let (valid, total) = self.count_valid(&r);
        r.outcome = if r.cut || !rules.read_clean_from_cache || self.class_allocation(r.class) == 0
        {
            Outcome::PassThrough
        } else {
            Self::outcome_of(valid, total)
        };
        let mut backfill = false;
        if r.lock != LockKind::Shared
            && valid < total
            && rules.read_promotes
            && !r.cut
            && self.class_allocation(r.class) > 0
        {
            if self.map_all(&mut r) {
                backfill = true;
            } else {
                self.counters.alloc_failures += 1;
                r.outcome = Outcome::PassThrough;
            }
        }
        if let [p] = r.parts[..]
            && let Some(l) = p.line
            && !backfill
        {
            // One line, every block from the cache (a full hit): one cache read.
            let v = self.state.valid(l) & p.mask;
            let from_cache = if rules.read_clean_from_cache {
                v
            } else {
                v & self.state.dirty(l)
            };
            if from_cache == p.mask {
                r.plan = Plan::Read { backfill };
                r.phase = Phase::Io;
                let run = self.single_cache_run(&r, l, p.mask);
                self.issue_read(&mut r, run, actions);
                self.reqs.insert(r.id, r);
                return;
            }
        }
        let mut runs = Runs::new(std::mem::take(&mut self.runs_buf));
        for i in 0..r.parts.len() {
            let p = r.parts[i];
            let from_cache = match p.line {
                Some(l) => {
                    let v = self.state.valid(l) & p.mask;
                    if rules.read_clean_from_cache {
                        v
                    } else {
                        v & self.state.dirty(l)
                    }
                }
                None => 0,
            };
            let from_core = p.mask & !from_cache;
            if from_cache != 0 {
                self.add_runs(&r, i, from_cache, Dev::Cache, &mut runs);
            }
            if from_core != 0 {
                self.add_runs(&r, i, from_core, Dev::Core(r.core), &mut runs);
                if backfill {
                    r.parts[i].fill = from_core;
                }
            }
        }
        r.plan = Plan::Read { backfill };
        r.phase = Phase::Io;
        let mut runs = runs.finish();
        // Core blocks in pieces (cached blocks between them, e.g. a sequential read over a
        // partly dirty range): one core read of the whole span instead, then the cache's blocks
        // over it. A disk streams the span; the pieces would each cost a seek or a rotation.
        if runs.iter().filter(|x| x.dev != Dev::Cache).count() > 1 {
            let (core_runs, cache_runs): (Vec<Run>, Vec<Run>) =
                runs.drain(..).partition(|x| x.dev != Dev::Cache);
            let lo = core_runs.iter().map(|x| x.lba).min().expect("core runs");
            let hi = core_runs
                .iter()
                .map(|x| x.lba + x.blocks as u64)
                .max()
                .expect("core runs");
            runs.push(Run {
                dev: Dev::Core(r.core),
                lba: lo,
                buf_off: (lo - r.lba) as u32,
                blocks: (hi - lo) as u32,
            });
            self.counters.merged_core_reads += 1;
            r.overlay = cache_runs;
        }
        self.issue_reads(&mut r, runs, actions);
        self.reqs.insert(r.id, r);
    }

    fn read_io_done(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
        match r.phase {
            Phase::Io => {
                if let Some(e) = r.core_err {
                    r.overlay.clear();
                    self.unmap_new(&mut r);
                    return self.finish(r, Err(ReqError::Io(e)), actions);
                }
                if !r.overlay.is_empty() {
                    // The merged core read is in: now the cache's blocks over it.
                    let overlay = std::mem::take(&mut r.overlay);
                    self.issue_reads(&mut r, overlay, actions);
                    self.reqs.insert(r.id, r);
                    return;
                }
                if let Some(e) = r.cache_err {
                    // Clean blocks can be read again from the core; dirty ones exist nowhere
                    // else: the read fails with the cache's error.
                    let dirty_read = r
                        .parts
                        .iter()
                        .any(|p| p.line.is_some_and(|l| self.state.dirty(l) & p.mask != 0));
                    self.unmap_new(&mut r);
                    if dirty_read {
                        self.faults.counters.dirty_read_errors += 1;
                        return self.finish(r, Err(ReqError::Io(e)), actions);
                    }
                    self.faults.counters.read_retries_from_core += 1;
                    // The clean copies it read may be bad: stop serving them.
                    if r.lock != LockKind::Shared {
                        self.drop_clean_lines(&r);
                    }
                    r.phase = Phase::ReadRetry;
                    r.cache_err = None;
                    let run = Run {
                        dev: Dev::Core(r.core),
                        lba: r.lba,
                        buf_off: 0,
                        blocks: r.blocks,
                    };
                    self.issue_reads(&mut r, vec![run], actions);
                    self.reqs.insert(r.id, r);
                    return;
                }
                if r.plan == (Plan::Read { backfill: true }) && self.bypass() {
                    // The cache device failed meanwhile: insert nothing.
                    self.unmap_new(&mut r);
                } else if r.plan == (Plan::Read { backfill: true }) {
                    let mut runs = Runs::new(std::mem::take(&mut self.runs_buf));
                    for i in 0..r.parts.len() {
                        let fill = r.parts[i].fill;
                        if fill != 0 {
                            self.add_runs(&r, i, fill, Dev::Cache, &mut runs);
                        }
                    }
                    let runs = runs.finish();
                    if !runs.is_empty() {
                        r.phase = Phase::Backfill;
                        self.issue_writes(&mut r, runs, false, actions);
                        self.reqs.insert(r.id, r);
                        return;
                    }
                }
                self.finish_read(r, actions);
            }
            Phase::Backfill => {
                if r.cache_err.is_some() {
                    self.faults.counters.backfill_failures += 1;
                } else {
                    for p in &r.parts {
                        if p.fill != 0 {
                            let l = p.line.expect("backfilled line is mapped");
                            let v = self.state.valid(l) | p.fill;
                            let d = self.state.dirty(l);
                            self.state.set(&mut self.lists, l, v, d);
                            self.meta_note(l);
                        }
                    }
                }
                self.unmap_new(&mut r);
                self.finish_read(r, actions);
            }
            Phase::ReadRetry => {
                let res = match r.core_err {
                    Some(e) => Err(ReqError::Io(e)),
                    None => Ok(()),
                };
                self.finish(r, res, actions);
            }
            Phase::Queued | Phase::FlushBeforeDrop => unreachable!("read in phase {:?}", r.phase),
        }
    }

    /// Touches and reclassifies the lines a read used, then completes it.
    fn finish_read(&mut self, r: Box<Request>, actions: &mut Vec<Action>) {
        let reclassify = self.read_rules().reclassifies;
        for p in &r.parts {
            let Some(l) = p.line else { continue };
            if !self.map.is_mapped(l) {
                continue;
            }
            if reclassify && self.lists.class(l) != r.class {
                self.reclassify(l, r.class);
            }
        }
        self.touch_hits(&r);
        self.finish(r, Ok(()), actions);
    }

    /// Tells the eviction policy about the lines a completed read or write-through write hit,
    /// in address order: a write hit refreshes LRU recency and counts for S3-FIFO exactly as a
    /// read hit does (as in Open CAS and textbook LRU). A line this request just inserted is
    /// not a hit (S3-FIFO would otherwise promote every new line at once); a dirty line is on
    /// no eviction list.
    fn touch_hits(&mut self, r: &Request) {
        for p in &r.parts {
            let Some(l) = p.line else { continue };
            if !p.new
                && self.map.is_mapped(l)
                && self.state.dirty(l) == 0
                && self.state.valid(l) & p.mask != 0
            {
                let class = self.lists.class(l);
                self.eviction.touch(&mut self.lists, l, class);
            }
        }
    }

    /// Moves `line` to IO class `class`.
    pub(crate) fn reclassify(&mut self, line: LineId, class: u8) {
        let old = self.lists.class(line);
        let clean = self.state.dirty(line) == 0;
        if clean {
            self.eviction.remove(&mut self.lists, line, old);
        }
        self.class_lines[old as usize] -= 1;
        self.class_lines[class as usize] += 1;
        self.lists.set_class(line, class);
        if clean {
            let (c, cl) = self.map.position(line);
            self.eviction
                .insert(&mut self.lists, line, class, position_key(c, cl));
        }
    }

    // ----- writes, write-zeroes, trims -----

    fn plan_write(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
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
                self.issue_write(&mut r, run, fua, actions);
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
                self.issue_writes(&mut r, runs, fua, actions);
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
                self.issue_writes(&mut r, cache_runs, false, actions);
                self.issue_writes(&mut r, core_runs, fua, actions);
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

    fn write_io_done(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
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
    fn drop_clean_lines(&mut self, r: &Request) {
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
            self.count_dirty(line, false);
            self.cleaning.on_clean(
                &mut self.lists,
                line,
                &super::View {
                    map: &self.map,
                    locks: &self.locks,
                },
            );
            let (c, cl) = self.map.position(line);
            let class = self.lists.class(line);
            self.eviction
                .insert(&mut self.lists, line, class, position_key(c, cl));
        }
        if nv == 0 {
            self.free_line(line);
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
    fn finish(
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
