//! Client reads: the plan (which blocks come from the cache, which from the core, whether to
//! promote), the completion (a merged core read's cache overlay, a retry from the core after a
//! cache read error, the backfill), and what a completed read tells the eviction policy. Part
//! of the request path (`request.rs`).

use super::Cache;
use super::issue::{Dir, Run, Runs};
use super::lock::LockKind;
use super::request::{Phase, Plan, Request};
use crate::event::{Action, Dev, ReqError};
use crate::policy::position_key;
use crate::stats::Outcome;
use crate::units::LineId;

impl Cache {
    pub(crate) fn plan_read(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
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
                self.issue(&mut r, run, Dir::Read, actions);
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
        self.issue_runs(&mut r, runs, Dir::Read, actions);
        self.reqs.insert(r.id, r);
    }

    pub(crate) fn read_io_done(&mut self, mut r: Box<Request>, actions: &mut Vec<Action>) {
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
                    self.issue_runs(&mut r, overlay, Dir::Read, actions);
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
                    self.issue_runs(&mut r, vec![run], Dir::Read, actions);
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
                        self.issue_runs(&mut r, runs, Dir::Write { fua: false }, actions);
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
    pub(crate) fn touch_hits(&mut self, r: &Request) {
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
}
