//! Writeback, generation by generation, through staging slots in batches.

use super::config::ext_src_lba;
use super::entry::{EState, OpenBatch, OwnIo, WbOp, WbWhat};
use super::pace::{self, LogState, Pace};
use super::{INTERNAL_REQ, RETRY_NS, WriteLog};
use crate::event::{Action, BufRef, Dev, Event, ReqError};
use crate::units::{CoreId, Lba, Nanos, ReqId};
use tiercache_format::wlog::LogKind;

/// The most blocks between two entries' data that a batch reads along (headers of the entries
/// between, TRIMs and WRITE_ZEROES among them) rather than starting another read.
const MAX_BATCH_GAP: u64 = 8;

impl WriteLog {
    /// Whether writeback may start something new now ([`pace`]).
    pub(super) fn pace(&self) -> Pace {
        let (used, ring) = self.log_fill();
        pace::pace(
            &self.cfg.pacing,
            self.now,
            &LogState {
                used,
                ring,
                last_request: self.last_request,
                oldest: self.entries.front().map(|e| e.at),
                urgent: self.space_waiting || self.draining,
            },
        )
    }

    pub(super) fn run_writeback(&mut self, acts: &mut Vec<Action>) {
        // After a whole generation retired, the next one starts only once a superblock with
        // the new tail is durable: a recovery from an older tail would write the retired
        // generation again over the next one's writes on the core. A prefix retired early
        // needs no such wait (writing a prefix of a generation again over later writes of the
        // same generation leaves each block with a value of that generation).
        if self.sb_tail_seq < self.gen_gate_seq
            || !self.is_ready()
            || (self.stopping && self.pending.is_empty())
            || self.wb_paused
            || !self.invalidating.is_empty()
        {
            return;
        }
        if let Some(t) = self.wb_retry_at {
            if self.now < t {
                return;
            }
            self.wb_retry_at = None;
        }
        let Some(front) = self.entries.front() else {
            self.draining = false;
            return;
        };
        let g = front.gen_;
        // Held: nothing new starts (what is in flight goes on, and a generation it finishes
        // is flushed and retired below).
        let hold = matches!(self.pace(), Pace::Hold { .. });
        if g == self.open_gen {
            if hold {
                return;
            }
            // Nothing closed: close the open generation so writeback can proceed.
            self.close_gen();
            if g == self.open_gen {
                return;
            }
        }
        if self.wb_flushing && self.wb_flush_upto.is_none() {
            // The generation's closing flush: nothing of the next one may start before it.
            return;
        }
        // Issue chunks in log order while staging lasts; an entry overlapping one of its
        // generation still in flight waits for it.
        // Entries before the cursor are started (in writeback or done); those in writeback are
        // `wb_active` (at most a few: staging bounds them), so each call costs what it starts.
        let front_seq = self.entries[0].seq;
        let n = self.entries.len();
        self.wb_cursor = self.wb_cursor.max(front_seq);
        let mut i = (self.wb_cursor - front_seq) as usize;
        let mut reached_end = true;
        let mut batch = None;
        while i < n {
            let e = &self.entries[i];
            debug_assert_eq!(e.seq, front_seq + i as u64, "entries are consecutive");
            if e.gen_ != g {
                break;
            }
            match e.state {
                EState::Writing { .. } | EState::Voiding | EState::VoidDue => {
                    reached_end = false;
                    break;
                }
                EState::Done | EState::Wb { .. } => {}
                EState::Logged if hold => {
                    reached_end = false;
                    break;
                }
                EState::Logged => {
                    let (core, lba, blocks, kind) = (e.core, e.lba, e.blocks, e.kind);
                    // Any overlapping entry in writeback blocks it: an earlier one (log order),
                    // or a later one still in flight after a failed flush made this one go
                    // again (it goes again after this one).
                    let blocked = self.wb_overlaps(core, lba, blocks);
                    debug_assert_eq!(
                        blocked,
                        self.wb_active.iter().any(|&s| {
                            self.entries[(s - front_seq) as usize].overlaps(core, lba, blocks)
                        })
                    );
                    if blocked || !self.start_entry_wb(i, kind, &mut batch, acts) {
                        reached_end = false;
                        break;
                    }
                }
            }
            if self.wb_cursor == front_seq + i as u64 {
                self.wb_cursor += 1;
            }
            i += 1;
        }
        self.close_batch(&mut batch, acts);
        if self.wb_flushing {
            // A prefix's flush: the rest of the generation goes on meanwhile.
            return;
        }
        let all_done = reached_end && self.wb_active.is_empty() && self.wb_partial.is_none();
        if all_done {
            // Every entry of generation g is on its core: flush the cores it touched.
            let n = self.entries.iter().take_while(|e| e.gen_ == g).count();
            self.flush_for_retire(n, None);
        } else if self.space_waiting {
            // Writes wait for room: retire the written-back prefix of the generation once it
            // is big enough, instead of all of it at the end (the core's copy of the prefix is
            // made durable first; nothing of a later generation has started, so losing the
            // cache still leaves the core a prefix of generations plus part of one).
            let front_seq = self.entries[0].seq;
            self.wb_done_upto = self.wb_done_upto.max(front_seq);
            while let Some(e) = self.entries.get((self.wb_done_upto - front_seq) as usize) {
                if e.gen_ != g || e.state != EState::Done {
                    break;
                }
                self.wb_done_upto += 1;
            }
            let n = (self.wb_done_upto - front_seq) as usize;
            let end_pos = self.entries.get(n).map_or(self.head_pos, |e| e.pos);
            let big = n as u64 >= (self.cfg.gen_max_writes as u64 / 256).max(1)
                || end_pos - self.entries[0].pos >= self.cfg.ring_blocks() / 512;
            if n > 0 && big {
                self.flush_for_retire(n, Some(self.wb_done_upto));
            }
        }
    }

    pub(super) fn new_op(&mut self, op: WbOp) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        self.wb_ops.insert(id, op);
        id
    }

    /// Starts writeback of entry `i`, or as much of it as staging allows. Returns false when
    /// staging ran out (the caller stops).
    fn start_entry_wb(
        &mut self,
        i: usize,
        kind: LogKind,
        batch: &mut Option<OpenBatch>,
        acts: &mut Vec<Action>,
    ) -> bool {
        let e = self.entries[i].clone();
        match kind {
            LogKind::Pad | LogKind::Void => {
                self.entries[i].state = EState::Done;
                true
            }
            LogKind::Trim | LogKind::Zero => {
                let what = if kind == LogKind::Trim {
                    WbWhat::Trim
                } else {
                    WbWhat::Zero
                };
                let op = self.new_op(WbOp {
                    seq: e.seq,
                    offset: 0,
                    blocks: e.blocks,
                    slot: None,
                    slot_off: 0,
                    what,
                });
                let req = ReqId(INTERNAL_REQ | op);
                let (core, lba, blocks) = (CoreId(e.core), Lba(e.lba), e.blocks);
                self.inner_events.push_back(if kind == LogKind::Trim {
                    Event::Trim {
                        req,
                        core,
                        lba,
                        blocks,
                    }
                } else {
                    Event::WriteZeroes {
                        req,
                        core,
                        lba,
                        blocks,
                        fua: false,
                    }
                });
                self.entries[i].state = EState::Wb { issued: 1, done: 0 };
                self.wb_activate(e.seq);
                true
            }
            LogKind::Write => {
                let slot_blocks = self.pool_slot_blocks();
                if e.blocks <= slot_blocks {
                    return self.batch_entry_wb(i, batch, acts);
                }
                let chunks = e.blocks.div_ceil(slot_blocks);
                if self.free_slots.len() < chunks.min(self.cfg.staging_slots) as usize
                    || (chunks > self.cfg.staging_slots && !self.wb_ops.is_empty())
                {
                    return false;
                }
                // Issue what staging allows now; an entry longer than the whole pool goes in
                // rounds (its chunks do not overlap each other): `continue_partial` issues
                // chunks from the recorded offset while slots last.
                self.entries[i].state = EState::Wb { issued: 0, done: 0 };
                self.wb_activate(e.seq);
                self.wb_partial = Some((e.seq, 0));
                self.continue_partial(acts);
                true
            }
        }
    }

    /// Issues writeback chunks of the entry whose chunks did not all fit in staging, from
    /// where it stopped, while slots last.
    pub(super) fn continue_partial(&mut self, acts: &mut Vec<Action>) {
        let Some((seq, mut off)) = self.wb_partial else {
            return;
        };
        let e = self.entry_mut(seq).clone();
        let slot_blocks = self.pool_slot_blocks();
        let mut more = 0;
        while off < e.blocks {
            let Some(slot) = self.free_slots.pop() else {
                break;
            };
            let n = (e.blocks - off).min(slot_blocks);
            let op = self.new_op(WbOp {
                seq,
                offset: off,
                blocks: n,
                slot: Some(slot),
                slot_off: 0,
                what: WbWhat::Data,
            });
            self.slot_refs[(slot - self.inner_slots) as usize] += 1;
            let start = ext_src_lba(&self.cfg, e.pos + 1 + off as u64);
            self.close_batch(
                &mut Some(OpenBatch {
                    slot,
                    start,
                    end: start + n as u64,
                    ops: vec![op],
                }),
                acts,
            );
            off += n;
            more += 1;
        }
        if let EState::Wb { issued, done } = self.entry_mut(seq).state {
            self.entry_mut(seq).state = EState::Wb {
                issued: issued + more,
                done,
            };
        }
        self.wb_partial = if off < e.blocks {
            Some((seq, off))
        } else {
            None
        };
    }

    /// Starts writeback of entry `i` (a write that fits one staging slot) as a chunk of the
    /// open batch, or of a new one: one read brings the log data of a batch's chunks into
    /// one slot (written-back entries are adjacent in the ring, so that read is one IO
    /// instead of one per entry). Returns false when staging or the writeback budget ran out.
    fn batch_entry_wb(
        &mut self,
        i: usize,
        batch: &mut Option<OpenBatch>,
        acts: &mut Vec<Action>,
    ) -> bool {
        let e = &self.entries[i];
        let (seq, blocks) = (e.seq, e.blocks as u64);
        let p = ext_src_lba(&self.cfg, e.pos + 1);
        let slot_blocks = self.pool_slot_blocks() as u64;
        let active = self.wb_active.len();
        let staging = self.cfg.staging_slots as usize;
        // Entries in writeback at most (`pacing.depth`), and the fewest a new batch starts
        // with room for: with one slot freed per finished entry, batches would be one entry
        // each.
        let cap = self.cfg.pacing.depth.max(1) as usize;
        let min_batch = (staging / 4).min(cap.div_ceil(3)).max(1);
        if let Some(b) = batch.as_ref() {
            let joins = p >= b.end
                && p - b.end <= MAX_BATCH_GAP
                && p + blocks - b.start <= slot_blocks
                && active < cap;
            if !joins {
                self.close_batch(batch, acts);
            }
        }
        if batch.is_none() {
            if active > 0 && active + min_batch > cap {
                return false;
            }
            let Some(slot) = self.free_slots.pop() else {
                return false;
            };
            *batch = Some(OpenBatch {
                slot,
                start: p,
                end: p,
                ops: Vec::new(),
            });
        }
        let (slot, start) = batch.as_ref().map(|b| (b.slot, b.start)).expect("batch");
        let op = self.new_op(WbOp {
            seq,
            offset: 0,
            blocks: blocks as u32,
            slot: Some(slot),
            slot_off: (p - start) as u32,
            what: WbWhat::Data,
        });
        let b = batch.as_mut().expect("batch");
        b.end = p + blocks;
        b.ops.push(op);
        self.slot_refs[(slot - self.inner_slots) as usize] += 1;
        self.entries[i].state = EState::Wb { issued: 1, done: 0 };
        self.wb_activate(seq);
        true
    }

    /// Issues the read of a batch's log data into its slot.
    fn close_batch(&mut self, batch: &mut Option<OpenBatch>, acts: &mut Vec<Action>) {
        let Some(b) = batch.take() else {
            return;
        };
        let id = self.next_batch;
        self.next_batch += 1;
        let io = self.new_io(OwnIo::WbRead { batch: id });
        acts.push(Action::Read {
            io,
            dev: Dev::Cache,
            lba: Lba(b.start),
            blocks: (b.end - b.start) as u32,
            buf: BufRef::Pool {
                slot: b.slot,
                offset: 0,
            },
        });
        self.wb_batches.insert(id, b.ops);
    }

    /// A writeback chunk is done with its staging slot.
    fn release_slot(&mut self, slot: u32) {
        let r = &mut self.slot_refs[(slot - self.inner_slots) as usize];
        *r -= 1;
        if *r == 0 {
            self.free_slots.push(slot);
        }
    }

    pub(super) fn wb_read_done(&mut self, batch: u64, ok: bool) {
        let ops = self.wb_batches.remove(&batch).expect("writeback batch");
        if !ok {
            self.counters.wb_errors += 1;
            // Read them again later.
            for op in ops {
                let o = self.wb_ops.remove(&op).expect("writeback chunk");
                self.release_slot(o.slot.expect("slot"));
                self.chunk_failed(o);
            }
            return;
        }
        for op in ops {
            let o = self.wb_ops[&op];
            let e = self.entry_mut(o.seq);
            let (core, lba) = (e.core, e.lba);
            self.inner_events.push_back(Event::Write {
                req: ReqId(INTERNAL_REQ | op),
                core: CoreId(core),
                lba: Lba(lba + o.offset as u64),
                blocks: o.blocks,
                fua: false,
            });
        }
    }

    /// A chunk failed: the entry's writeback restarts from scratch after a delay (its chunks
    /// still in flight finish first).
    fn chunk_failed(&mut self, o: WbOp) {
        self.wb_retry_at = Some(Nanos(self.now.0 + RETRY_NS));
        let e = self.entry_mut(o.seq);
        if let EState::Wb { issued, done } = e.state {
            e.state = EState::Wb {
                issued: issued - 1,
                done,
            };
        }
        self.failed_entries.insert(o.seq);
        self.settle_entry(o.seq);
    }

    /// Entry `seq` goes into writeback.
    fn wb_activate(&mut self, seq: u64) {
        let e = self.entry_mut(seq);
        let (core, lba, blocks) = (e.core, e.lba, e.blocks as u64);
        self.wb_active.insert(seq);
        self.wb_ranges.insert((core, lba, seq), lba + blocks);
        self.wb_max_blocks = self.wb_max_blocks.max(blocks);
    }

    /// Whether an entry in writeback overlaps the range (as [`Entry::overlaps`]).
    fn wb_overlaps(&self, core: u16, lba: u64, blocks: u32) -> bool {
        let lo = lba.saturating_sub(self.wb_max_blocks);
        self.wb_ranges
            .range((core, lo, 0)..(core, lba + blocks as u64, 0))
            .any(|(_, &end)| end > lba)
    }

    fn settle_entry(&mut self, seq: u64) {
        let partial = self.wb_partial.is_some_and(|(s, _)| s == seq);
        let e = self.entry_mut(seq);
        if let EState::Wb { issued, done } = e.state
            && issued == done
            && !partial
        {
            let (core, lba) = (e.core, e.lba);
            self.wb_active.remove(&seq);
            self.wb_ranges.remove(&(core, lba, seq));
            if self.failed_entries.remove(&seq) {
                self.entry_mut(seq).state = EState::Logged;
                self.wb_cursor = self.wb_cursor.min(seq);
            } else {
                let e = self.entry_mut(seq);
                e.state = EState::Done;
                let b = if e.kind == LogKind::Write {
                    e.blocks as u64
                } else {
                    0
                };
                self.counters.entries_written_back += 1;
                self.counters.blocks_written_back += b;
            }
        }
    }

    pub(super) fn internal_done(&mut self, op: u64, result: Result<(), ReqError>) {
        let o = self.wb_ops.remove(&op).expect("internal request");
        if let Some(s) = o.slot {
            self.release_slot(s);
        }
        if o.what == WbWhat::Flush {
            if result.is_err() {
                self.counters.wb_errors += 1;
                self.wb_flush_failed = true;
            }
            self.wb_flushes_left -= 1;
            if self.wb_flushes_left == 0 {
                self.wb_flushing = false;
                let upto = self.wb_flush_upto.take();
                if std::mem::take(&mut self.wb_flush_failed) {
                    // Write what the generation has written back again after a delay: the
                    // core may have lost part of it. Entries still in writeback (a prefix's
                    // flush runs beside them) go again too once they settle: an earlier entry
                    // written again must not land after a later overlapping one.
                    self.wb_retry_at = Some(Nanos(self.now.0 + RETRY_NS));
                    let g = self.entries[0].gen_;
                    for e in self.entries.iter_mut().take_while(|e| e.gen_ == g) {
                        match e.state {
                            EState::Done => e.state = EState::Logged,
                            EState::Wb { .. } => {
                                self.failed_entries.insert(e.seq);
                            }
                            _ => {}
                        }
                    }
                    self.wb_cursor = self.entries[0].seq;
                    self.wb_done_upto = self.entries[0].seq;
                } else {
                    self.retire_front(upto);
                }
            }
            return;
        }
        if result.is_err() {
            self.counters.wb_errors += 1;
            self.chunk_failed(o);
            return;
        }
        let e = self.entry_mut(o.seq);
        if let EState::Wb { issued, done } = e.state {
            e.state = EState::Wb {
                issued,
                done: done + 1,
            };
        }
        self.settle_entry(o.seq);
    }
}
