//! Write intents: which clean lines a crash may bring back (docs/SAFETY.md, "Clean state after
//! a crash").
//!
//! A checkpoint marks a line *proven* when its clean blocks were equal to the core when the
//! chunk was captured and stay so: the line's region was quiet (no request or writeback holding
//! any of its lines), every change before the capture had completed, and the checkpoint flushes
//! the cache device and every core before the superblock names it. Before anything can make a
//! proven line's cache copy or core copy differ from what was captured — a write, trim or
//! write-zeroes to the line, the line's slot unmapped (evicted, invalidated, dropped) and so
//! free for another core line, or its core line written once it is no longer mapped — a
//! journal **intent** op for the line's region is made durable (its commit's record is written
//! with FUA) and the change waits for it. Recovery keeps the clean blocks of a line only if the
//! checkpoint says proven and no intent or new mapping for it follows in the journal replayed
//! on top of that checkpoint.
//!
//! RAM: one state byte per region of [`REGION_LINES`] lines (within a checkpoint chunk), so
//! about 0.016 bytes per line (smaller caches have smaller regions, down to one line below
//! 1,024 lines: [`region_lines`]):
//! - `PROVEN`: every possibly-in-force persistent view may say "proven": a change needs an
//!   intent first;
//! - `QUEUED`: an intent is queued or being written: a change waits;
//! - `OPEN`: an intent is durable in every view that may be in force (or the views say
//!   "unproven" anyway): changes are free;
//! - `HOT`: `OPEN`, and changed (or opened) since the last checkpoint captured it.
//!
//! A chunk capture records an `OPEN` region proven only if it is quiet, and the region becomes
//! `PROVEN` at that moment: a later change's intent lands in a record at or after the
//! checkpoint's journal start, so it is replayed over this checkpoint as well as over the one
//! still in force. A `HOT` region is recorded unproven and cools to `OPEN`: a region written
//! in every checkpoint interval stays open, so a stream of writes spread over the cache does
//! not pay an intent (a commit written with FUA, before the write) per region per checkpoint,
//! which, with small records and a small journal, made checkpoints come faster and the
//! intents with them. Such a region's clean lines are not kept after a crash (its dirty lines
//! are, from the journal). A `QUEUED` region is recorded unproven. A `PROVEN` region is
//! recorded proven (nothing changed since its last capture; the new checkpoint flushes the
//! cores again).
//!
//! Lines unmapped while their region is not open (`OPEN` or `HOT`) wait (in limbo, [`Meta::limbo`]) until the
//! intent is durable before they are reused, and their core lines are *ghosts* until then: a
//! write to a ghost waits too. An eviction that finds its victim in such a region gives the
//! victim to limbo and fails the allocation (the request goes pass-through, as when nothing
//! can be evicted).

use super::Cache;
use super::meta::Meta;
use crate::hash::FxHashMap;
use crate::policy::LineView;
use crate::units::{CoreId, LineId, ReqId};
use std::collections::VecDeque;
use tiercache_format::journal::LineOp;
use tiercache_format::superblock::lines_per_chunk;

/// Lines per intent region (at most).
pub const REGION_LINES: u32 = 64;

/// Lines per intent region in a cache of `lines`: [`REGION_LINES`] from 64Ki lines up, fewer
/// below (one line per region under 1,024 lines), so a small cache is not one region that
/// is never quiet.
pub fn region_lines(lines: u32) -> u32 {
    (lines.next_power_of_two() / 1024).clamp(1, REGION_LINES)
}
/// Intent ops in one commit at most.
const INTENTS_PER_COMMIT: usize = 2048;

const PROVEN: u8 = 0;
const QUEUED: u8 = 1;
const OPEN: u8 = 2;
const HOT: u8 = 3;

/// Counters of the intent machinery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IntentCounters {
    /// Intent ops written (regions opened).
    pub intents: u64,
    /// Requests that waited for an intent before their IO.
    pub waits: u64,
    /// Allocations refused because the victim's region had no durable intent yet.
    pub refused_allocs: u64,
    /// Regions captured proven by checkpoints.
    pub proven_regions: u64,
    /// Checkpoints written without proof because a core flush failed.
    pub unproven_checkpoints: u64,
}

/// Per-region intent state and what waits for intents.
pub(crate) struct Intents {
    state: Vec<u8>,
    lines: u32,
    lpc: u32,
    rpc: u32,
    /// Lines per region.
    rl: u32,
    /// Regions whose intent is queued, with the generation that covers them.
    queue: VecDeque<(u64, u32)>,
    queued_gen: u64,
    durable_gen: u64,
    /// Core lines unmapped from a not-yet-open region: writes to them wait for `upto`.
    ghosts: FxHashMap<(u16, u64), u64>,
    /// Requests waiting for intents: (generation, request).
    parked: Vec<(u64, ReqId)>,
    /// Unmapped lines waiting in limbo for their region's intent: (generation, line).
    limbo: Vec<(u64, u32)>,
    /// A core flush of a checkpoint failed: the next checkpoint proves nothing.
    pub(crate) no_proof: bool,
    pub(crate) counters: IntentCounters,
}

impl Intents {
    /// All regions `OPEN` (a new cache, or a recovery that proves everything it keeps).
    pub(crate) fn new(lines: u32, line_size: u32) -> Intents {
        let lpc = lines_per_chunk(line_size);
        let rl = region_lines(lines);
        let rpc = lpc.div_ceil(rl);
        let chunks = lines.div_ceil(lpc);
        Intents {
            state: vec![OPEN; (chunks * rpc) as usize],
            lines,
            lpc,
            rpc,
            rl,
            queue: VecDeque::new(),
            queued_gen: 0,
            durable_gen: 0,
            ghosts: FxHashMap::default(),
            parked: Vec::new(),
            limbo: Vec::new(),
            no_proof: false,
            counters: IntentCounters::default(),
        }
    }

    /// Every region `PROVEN` (after a clean load: the final checkpoint may prove every line).
    pub(crate) fn all_proven(&mut self) {
        self.state.fill(PROVEN);
    }

    #[inline]
    fn region(&self, line: u32) -> usize {
        let chunk = line / self.lpc;
        (chunk * self.rpc + (line % self.lpc) / self.rl) as usize
    }

    /// Lines of region `r`: (first, count).
    fn region_lines(&self, r: usize) -> (u32, u32) {
        let r = r as u32;
        let chunk = r / self.rpc;
        let first = chunk * self.lpc + (r % self.rpc) * self.rl;
        let end = ((chunk + 1) * self.lpc).min(self.lines);
        (first, (first + self.rl).min(end).saturating_sub(first))
    }

    /// Queues an intent for `line`'s region if it needs one; the generation a change to
    /// `line` must wait for (0: none).
    fn need(&mut self, line: u32) -> u64 {
        let r = self.region(line);
        match self.state[r] {
            OPEN => {
                self.state[r] = HOT;
                0
            }
            HOT => 0,
            QUEUED => self.queued_gen,
            _ => {
                self.state[r] = QUEUED;
                self.queued_gen += 1;
                self.queue.push_back((self.queued_gen, r as u32));
                self.queued_gen
            }
        }
    }

    /// Whether intents are queued (a commit should be started).
    pub(crate) fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Whether anything waits for an intent.
    pub(crate) fn has_work(&self) -> bool {
        !self.queue.is_empty() || !self.parked.is_empty() || !self.limbo.is_empty()
    }

    /// Takes queued intents for a commit: the ops and the generation they cover.
    pub(crate) fn take_for_commit(&mut self, ops: &mut Vec<LineOp>) -> (Vec<u32>, u64) {
        let mut taken = Vec::new();
        let mut upto = 0;
        while taken.len() < INTENTS_PER_COMMIT {
            let Some((g, r)) = self.queue.pop_front() else {
                break;
            };
            let (line, count) = self.region_lines(r as usize);
            if count > 0 {
                ops.push(LineOp::Intent { line, count });
            }
            taken.push(r);
            upto = g;
        }
        (taken, upto)
    }

    /// A commit holding intents failed: they go back to the front of the queue.
    pub(crate) fn commit_failed(&mut self, regions: &[u32], upto: u64) {
        for &r in regions.iter().rev() {
            self.queue.push_front((upto, r));
        }
    }
}

impl Meta {
    /// The intent state.
    pub(crate) fn intents(&mut self) -> &mut Intents {
        &mut self.intents
    }
}

impl Cache {
    #[inline]
    fn intents_on(&self) -> bool {
        !cfg!(feature = "canary-skip-intent") && self.meta.is_some()
    }

    /// Before a write, trim or write-zeroes of `core` lines `first..` (`lines`: each part's
    /// mapped cache line) does any IO: the intent generation it must wait for, queuing intents
    /// for proven regions it touches; `None` if it may go ahead.
    pub(crate) fn intent_gate(
        &mut self,
        core: CoreId,
        first: u64,
        lines: impl Iterator<Item = Option<LineId>>,
    ) -> Option<u64> {
        if !self.intents_on() {
            return None;
        }
        let it = self.meta.as_mut().expect("persistent").intents();
        let mut need = 0;
        for (i, line) in lines.enumerate() {
            if !it.ghosts.is_empty()
                && let Some(&g) = it.ghosts.get(&(core.0, first + i as u64))
            {
                need = need.max(g);
            }
            if let Some(l) = line {
                need = need.max(it.need(l.0));
            }
        }
        // Also while the cache device fails (bypass): a write that went to the core without
        // its intent could leave a proven clean copy the core no longer matches, trusted after
        // a crash if the device comes back. If the intent cannot be written, the write fails
        // ([`Cache::intents_failed`]).
        (need > it.durable_gen).then_some(need)
    }

    /// Parks request `id` (in `reqs`, holding its locks) until intent generation `upto` is
    /// durable.
    pub(crate) fn intent_park(&mut self, id: ReqId, upto: u64) {
        let it = self.meta.as_mut().expect("persistent").intents();
        it.counters.waits += 1;
        it.parked.push((upto, id));
    }

    /// `line` (mapped) is about to be unmapped: if its region may be proven, queue its intent
    /// and make its core line a ghost until the intent is durable.
    pub(crate) fn intent_unmapping(&mut self, line: LineId) {
        if !self.intents_on() {
            return;
        }
        let (c, cl) = self.map.position(line);
        let it = self.meta.as_mut().expect("persistent").intents();
        let g = it.need(line.0);
        if g > it.durable_gen {
            it.ghosts.insert((c.0, cl), g);
        }
    }

    /// An unmapped line whose region has no durable intent yet goes to limbo until it has
    /// (returns true); otherwise the caller frees it.
    pub(crate) fn intent_limbo(&mut self, line: LineId) -> bool {
        if !self.intents_on() {
            return false;
        }
        let Some(m) = self.meta.as_mut() else {
            return false;
        };
        let it = &mut m.intents;
        let r = it.region(line.0);
        if it.state[r] >= OPEN {
            return false;
        }
        let g = it.queued_gen;
        it.limbo.push((g, line.0));
        self.lists.push_back(m.limbo, line.0);
        m.limbo_len += 1;
        true
    }

    /// An eviction victim could not be used at once (its region waits for an intent).
    pub(crate) fn intent_refused_alloc(&mut self) {
        if let Some(m) = self.meta.as_mut() {
            m.intents.counters.refused_allocs += 1;
        }
    }

    /// The intents up to generation `upto` are durable: their regions open, their ghosts and
    /// limbo lines are released, the requests waiting for them are planned.
    pub(crate) fn intents_durable(
        &mut self,
        regions: &[u32],
        upto: u64,
        actions: &mut Vec<crate::event::Action>,
    ) {
        let m = self.meta.as_mut().expect("persistent");
        let it = &mut m.intents;
        it.counters.intents += regions.len() as u64;
        for &r in regions {
            it.state[r as usize] = HOT;
        }
        it.durable_gen = it.durable_gen.max(upto);
        let d = it.durable_gen;
        it.ghosts.retain(|_, g| *g > d);
        let mut freed = Vec::new();
        it.limbo.retain(|&(g, l)| {
            if g <= d {
                freed.push(l);
                false
            } else {
                true
            }
        });
        for l in freed {
            m.limbo_len -= 1;
            self.lists.unlink(l);
            self.lists.push_back(self.free, l);
        }
        let m = self.meta.as_mut().expect("persistent");
        let mut due = Vec::new();
        m.intents.parked.retain(|&(g, id)| {
            if g <= d {
                due.push(id);
                false
            } else {
                true
            }
        });
        for id in due {
            self.resume_after_intent(id, actions);
        }
    }

    /// A commit holding intents up to generation `upto` failed: the requests waiting for them
    /// fail with its error (their change was not made; the intents stay queued and the next
    /// request to the region waits for the next try), as a lazy write whose commit fails.
    pub(crate) fn intents_failed(
        &mut self,
        upto: u64,
        e: crate::event::IoError,
        actions: &mut Vec<crate::event::Action>,
    ) {
        let m = self.meta.as_mut().expect("persistent");
        let mut due = Vec::new();
        m.intents.parked.retain(|&(g, id)| {
            if g <= upto {
                due.push(id);
                false
            } else {
                true
            }
        });
        for id in due {
            self.fail_after_intent(id, e, actions);
        }
    }

    /// Proven flags for the checkpoint chunk of lines `first..last` being captured now, and
    /// the region states that follow (`OPEN` and quiet → `PROVEN`, `HOT` → `OPEN`). `prove`:
    /// false when the checkpoint proves nothing (a core flush failed before).
    pub(crate) fn intent_capture(&mut self, first: u32, last: u32, prove: bool) -> Vec<bool> {
        let mut out = vec![false; (last - first) as usize];
        if !prove {
            return out;
        }
        let mut l = first;
        while l < last {
            let it = &self.meta.as_ref().expect("persistent").intents;
            let r = it.region(l);
            let (rf, rc) = it.region_lines(r);
            let end = (rf + rc).min(last);
            let st = it.state[r];
            if st == PROVEN {
                // Unchanged since its last capture but for fills of invalid blocks or free
                // slots and writebacks: a line with one in flight is left unproven.
                for x in l..end {
                    let line = LineId(x);
                    out[(x - first) as usize] = self.map.is_mapped(line) && !self.line_busy(line);
                }
            } else if st == HOT {
                // Changed in this interval: recorded unproven; proven at a later capture if
                // nothing changes it until then.
                self.meta.as_mut().expect("persistent").intents.state[r] = OPEN;
            } else if st == OPEN && (l..end).all(|x| !self.line_busy(LineId(x))) {
                let m = self.meta.as_mut().expect("persistent");
                m.intents.state[r] = PROVEN;
                m.intents.counters.proven_regions += 1;
                for x in l..end {
                    out[(x - first) as usize] = self.map.is_mapped(LineId(x));
                }
            }
            l = end;
        }
        out
    }

    fn line_busy(&self, line: LineId) -> bool {
        if self.locks.is_empty() {
            return false;
        }
        super::View {
            map: &self.map,
            locks: &self.locks,
        }
        .busy(line)
    }

    /// Counters of the intent machinery (zero without persistence).
    pub fn intent_counters(&self) -> IntentCounters {
        self.meta
            .as_ref()
            .map(|m| m.intents.counters)
            .unwrap_or_default()
    }
}
