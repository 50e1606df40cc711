//! Invariants of the write log, checked after every event in tests and with `strict-asserts`
//! (as [`crate::Cache::check_invariants`] is for the other modes). Each failure starts with
//! `WL INVARIANT` and names the entry, slot or extent and what is wrong. O(entries + extents +
//! IOs): meant for test-sized logs.

use super::entry::{EState, OwnIo, WbWhat};
use super::index::Src;
use super::{MgmtFlushState, WriteLog};
use std::collections::{BTreeMap, BTreeSet};
use tiercache_format::wlog::LogKind;

macro_rules! check {
    ($cond:expr, $($arg:tt)+) => {
        assert!($cond, "WL INVARIANT: {}", format_args!($($arg)+))
    };
}

fn data_kind(k: LogKind) -> bool {
    matches!(k, LogKind::Write | LogKind::Trim | LogKind::Zero)
}

impl WriteLog {
    /// Panics (`WL INVARIANT: ...`) if any invariant of the log is broken.
    pub fn check_invariants(&self) {
        self.check_invariants_but(false);
    }

    /// [`WriteLog::check_invariants`], leaving out the O(entries × log) check that every
    /// logged entry is covered in the index when `skip_coverage` (`apply` runs it on every
    /// 16th event only).
    pub(super) fn check_invariants_but(&self, skip_coverage: bool) {
        self.check_entries();
        self.check_ios();
        self.check_writeback();
        self.check_slots();
        self.check_reads_and_pins();
        self.check_flushes();
        self.check_index(skip_coverage);
    }

    /// The ring: entries consecutive in sequence and position, head and tails in order,
    /// generations non-decreasing, each entry's state and header buffer agreeing.
    fn check_entries(&self) {
        let ring = self.cfg.ring_blocks();
        let (tail_pos, tail_seq) = self.tail();
        check!(
            self.sb_tail_pos <= tail_pos && self.sb_tail_seq <= tail_seq,
            "the superblock's tail ({}, seq {}) is past the log's tail ({tail_pos}, seq {tail_seq})",
            self.sb_tail_pos,
            self.sb_tail_seq
        );
        check!(
            self.gen_gate_seq <= tail_seq,
            "the generation gate {} is past the tail seq {tail_seq}",
            self.gen_gate_seq
        );
        check!(
            self.head_pos >= tail_pos && self.head_pos - self.reuse_bound() <= ring,
            "ring overfull: head {} reuse bound {} ring {ring}",
            self.head_pos,
            self.reuse_bound()
        );
        let mut pos = tail_pos;
        let mut gen_ = self.entries.front().map_or(0, |e| e.gen_);
        let front_gen = gen_;
        let (mut open_writes, mut open_writes_max) = (0u32, 0u32);
        for (i, e) in self.entries.iter().enumerate() {
            let s = e.seq;
            check!(
                s == tail_seq + i as u64,
                "entry {i} has seq {s}, expected {}",
                tail_seq + i as u64
            );
            check!(
                e.pos == pos,
                "entry {s} at ring position {}, expected {pos}",
                e.pos
            );
            check!(
                e.pos % ring + e.span() <= ring,
                "entry {s} (span {}) crosses the ring's end",
                e.span()
            );
            if e.kind == LogKind::Pad {
                check!(
                    e.pos % ring + e.span() == ring,
                    "pad {s} does not end at the ring's end"
                );
            }
            pos += e.span();
            check!(
                e.gen_ >= gen_,
                "entry {s}: generation {} after {gen_}",
                e.gen_
            );
            gen_ = e.gen_;
            check!(
                e.gen_ <= self.open_gen,
                "entry {s}: generation {} after the open one {}",
                e.gen_,
                self.open_gen
            );
            if e.gen_ == self.open_gen {
                open_writes += data_kind(e.kind) as u32;
                open_writes_max += (e.kind != LogKind::Pad) as u32;
            }
            let writing = self.writing.contains(&s);
            match e.state {
                EState::Writing { left, .. } => {
                    check!(writing, "entry {s} is writing but not in `writing`");
                    check!((1..=2).contains(&left), "entry {s}: {left} log writes left");
                }
                EState::Voiding | EState::VoidDue => check!(
                    writing || self.inv_seqs.contains(&s),
                    "entry {s} is being voided, neither after a failed write nor by invalidate"
                ),
                _ => check!(!writing, "entry {s} is in `writing` in state {:?}", e.state),
            }
            check!(
                e.hdr_buf.is_some() == matches!(e.state, EState::Writing { .. } | EState::Voiding),
                "entry {s}: header buffer {:?} in state {:?}",
                e.hdr_buf,
                e.state
            );
            if matches!(e.state, EState::Wb { .. } | EState::Done) {
                check!(
                    e.gen_ == front_gen,
                    "entry {s} of generation {} is in writeback while the front is {front_gen}",
                    e.gen_
                );
            }
            if data_kind(e.kind)
                && let Some(Some(size)) = self.cores.get(e.core as usize)
            {
                check!(
                    e.lba + e.blocks as u64 <= *size,
                    "entry {s} ends past core {}'s {size} blocks",
                    e.core
                );
            }
        }
        check!(
            pos == self.head_pos,
            "entries end at {pos}, the head is {}",
            self.head_pos
        );
        if let Some(e) = self.entries.back() {
            check!(
                self.next_seq == e.seq + 1,
                "next seq {} after last entry {}",
                self.next_seq,
                e.seq
            );
        }
        for &s in &self.writing {
            check!(
                self.entries.front().is_some_and(|f| s >= f.seq) && s < self.next_seq,
                "`writing` names {s}, not a live entry"
            );
        }
        check!(
            open_writes <= self.open_gen_writes && self.open_gen_writes <= open_writes_max,
            "open generation counts {} writes, its entries {open_writes}..={open_writes_max}",
            self.open_gen_writes
        );
        check!(
            self.open_gen_writes < self.cfg.gen_max_writes
                && self.open_gen_blocks < self.cfg.gen_max_blocks
                && (self.open_gen_writes > 0 || self.open_gen_blocks == 0),
            "open generation not closed at its limits: {} writes, {} blocks",
            self.open_gen_writes,
            self.open_gen_blocks
        );
        check!(
            self.durable_seq <= self.written_below() && self.written_below() <= self.next_seq,
            "durable seq {} / written below {} / next seq {} out of order",
            self.durable_seq,
            self.written_below(),
            self.next_seq
        );
        check!(
            self.durable_upto <= self.log_writes_done,
            "flushes cover {} log writes, {} are done",
            self.durable_upto,
            self.log_writes_done
        );
    }

    /// Own IOs: ids recycled exactly once; each IO agrees with the state that waits for it.
    fn check_ios(&self) {
        let free: BTreeSet<u32> = self.free_ios.iter().copied().collect();
        check!(free.len() == self.free_ios.len(), "an IO id is free twice");
        let mut log_writes: BTreeMap<u64, u8> = BTreeMap::new();
        let mut void_writes: BTreeMap<u64, u32> = BTreeMap::new();
        let mut client_reads: BTreeMap<u64, u32> = BTreeMap::new();
        let (mut flushes, mut supers, mut mgmt) = (0, 0, 0);
        let mut wb_reads = BTreeSet::new();
        for (i, o) in self.ios.iter().enumerate() {
            check!(
                o.is_none() == free.contains(&(i as u32)),
                "IO id {i}: in use {} but free {}",
                o.is_some(),
                free.contains(&(i as u32))
            );
            match o {
                None => {}
                Some(OwnIo::LogWrite { seq }) => *log_writes.entry(*seq).or_default() += 1,
                Some(OwnIo::VoidWrite { seq }) => *void_writes.entry(*seq).or_default() += 1,
                Some(OwnIo::Flush { covers, covers_seq }) => {
                    flushes += 1;
                    check!(
                        *covers <= self.log_writes_done && *covers_seq <= self.written_below(),
                        "a flush covers more than was written"
                    );
                }
                Some(OwnIo::Super { tail_pos, .. }) => {
                    supers += 1;
                    check!(
                        *tail_pos <= self.tail().0,
                        "a superblock write with tail {tail_pos} past the log's tail"
                    );
                }
                Some(OwnIo::ClientRead { req }) => *client_reads.entry(req.0).or_default() += 1,
                Some(OwnIo::WbRead { batch }) => {
                    check!(wb_reads.insert(*batch), "batch {batch} read twice");
                    check!(
                        self.wb_batches.contains_key(batch),
                        "a read for batch {batch}, which is not open"
                    );
                }
                Some(OwnIo::MgmtFlush { .. }) => mgmt += 1,
            }
        }
        check!(
            flushes == self.flush_in_flight as u32,
            "{flushes} log flushes in flight, flag {}",
            self.flush_in_flight
        );
        check!(
            supers == self.sb_in_flight as u32,
            "{supers} superblock writes in flight, flag {}",
            self.sb_in_flight
        );
        let mgmt_flag = [self.stop_flush, self.inv_flush].contains(&MgmtFlushState::InFlight);
        check!(
            !mgmt_flag || mgmt > 0,
            "a management flush is in flight without its IO"
        );
        check!(
            wb_reads.len() == self.wb_batches.len(),
            "{} writeback batches, {} reads",
            self.wb_batches.len(),
            wb_reads.len()
        );
        for e in &self.entries {
            let s = e.seq;
            let lw = log_writes.remove(&s).unwrap_or(0);
            let vw = void_writes.remove(&s).unwrap_or(0);
            match e.state {
                EState::Writing { left, .. } => {
                    check!(
                        lw == left,
                        "entry {s}: {lw} log writes in flight, {left} left"
                    )
                }
                _ => check!(lw == 0, "entry {s}: log writes in flight in {:?}", e.state),
            }
            check!(
                vw == (e.state == EState::Voiding) as u32,
                "entry {s}: {vw} void writes in flight in state {:?}",
                e.state
            );
        }
        check!(
            log_writes.is_empty() && void_writes.is_empty(),
            "log writes in flight for entries not live: {:?} {:?}",
            log_writes,
            void_writes
        );
        for (req, st) in &self.reads {
            let n = client_reads.remove(&req.0).unwrap_or(0);
            check!(
                n == st.ios_left,
                "read {}: {n} log reads in flight, {} counted",
                req.0,
                st.ios_left
            );
        }
        check!(
            client_reads.is_empty(),
            "log reads for reads not in progress: {client_reads:?}"
        );
        let hdr_used = self.entries.iter().filter(|e| e.hdr_buf.is_some()).count();
        check!(
            hdr_used + self.free_hdr.len() == self.hdr_bufs.len(),
            "{hdr_used} header buffers in use + {} free != {}",
            self.free_hdr.len(),
            self.hdr_bufs.len()
        );
    }

    /// Writeback: the entries in writeback, their ranges, chunks, batches, flushes, cursors.
    fn check_writeback(&self) {
        let in_wb: BTreeSet<u64> = self
            .entries
            .iter()
            .filter(|e| matches!(e.state, EState::Wb { .. }))
            .map(|e| e.seq)
            .collect();
        check!(
            in_wb == self.wb_active,
            "entries in writeback {in_wb:?}, `wb_active` {:?}",
            self.wb_active
        );
        check!(
            self.wb_ranges.len() == self.wb_active.len(),
            "{} writeback ranges for {} entries",
            self.wb_ranges.len(),
            self.wb_active.len()
        );
        check!(
            self.failed_entries.is_subset(&self.wb_active),
            "failed entries {:?} not in writeback",
            self.failed_entries
        );
        let mut chunks: BTreeMap<u64, u32> = BTreeMap::new();
        let mut wb_flushes = 0;
        for o in self.wb_ops.values() {
            if o.what == WbWhat::Flush {
                wb_flushes += 1;
                check!(o.slot.is_none(), "a core flush holds a staging slot");
                continue;
            }
            *chunks.entry(o.seq).or_default() += 1;
            check!(
                o.slot.is_some() == (o.what == WbWhat::Data),
                "chunk of entry {} ({:?}) slot {:?}",
                o.seq,
                o.what,
                o.slot
            );
        }
        check!(
            wb_flushes == self.wb_flushes_left && self.wb_flushing == (wb_flushes > 0),
            "{wb_flushes} core flushes in flight, {} left, flushing {}",
            self.wb_flushes_left,
            self.wb_flushing
        );
        check!(
            self.wb_flush_upto.is_none() || self.wb_flushing,
            "a prefix flush is recorded but none is in flight"
        );
        let front = self.entries.front().map(|e| (e.seq, e.gen_));
        for &s in &self.wb_active {
            let e = self.live(s).expect("in writeback");
            let EState::Wb { issued, done } = e.state else {
                unreachable!()
            };
            let n = chunks.remove(&s).unwrap_or(0);
            check!(
                done <= issued && issued - done == n,
                "entry {s}: {issued} chunks issued, {done} done, {n} in flight"
            );
            check!(
                self.wb_ranges.get(&(e.core, e.lba, s)) == Some(&(e.lba + e.blocks as u64)),
                "entry {s}: writeback range missing or wrong"
            );
            check!(
                e.blocks as u64 <= self.wb_max_blocks,
                "entry {s} ({} blocks) longer than the longest in writeback {}",
                e.blocks,
                self.wb_max_blocks
            );
        }
        check!(
            chunks.is_empty(),
            "chunks of entries not in writeback: {chunks:?}"
        );
        if let Some((s, off)) = self.wb_partial {
            check!(
                self.wb_active.contains(&s) && self.live(s).is_some_and(|e| off < e.blocks),
                "partial writeback of {s} at {off} is not in progress"
            );
        }
        let mut in_batch = BTreeSet::new();
        for (b, ops) in &self.wb_batches {
            let mut slot = None;
            for op in ops {
                check!(in_batch.insert(*op), "chunk {op} in two batches");
                let o = self.wb_ops.get(op);
                check!(
                    o.is_some_and(|o| o.what == WbWhat::Data),
                    "batch {b}: chunk {op} is not a data chunk in flight"
                );
                let s = o.and_then(|o| o.slot);
                check!(
                    slot.is_none() || slot == s,
                    "batch {b}: chunks in different slots"
                );
                slot = s;
            }
        }
        // Started entries of the front generation: before the cursor, and before the
        // written-back mark (those are written back).
        if let Some((_, g)) = front {
            for e in self.entries.iter().take_while(|e| e.gen_ == g) {
                if e.seq < self.wb_cursor {
                    check!(
                        matches!(e.state, EState::Wb { .. } | EState::Done),
                        "entry {} before the writeback cursor {} is {:?}",
                        e.seq,
                        self.wb_cursor,
                        e.state
                    );
                }
                if e.seq < self.wb_done_upto {
                    check!(
                        e.state == EState::Done,
                        "entry {} before the written-back mark {} is {:?}",
                        e.seq,
                        self.wb_done_upto,
                        e.state
                    );
                }
            }
        }
    }

    /// Staging slots: each either free (once) or held by as many chunks as its count says.
    fn check_slots(&self) {
        let n = self.cfg.staging_slots;
        let mut held = vec![0u32; n as usize];
        for o in self.wb_ops.values() {
            if let Some(s) = o.slot {
                check!(
                    s >= self.inner_slots && s < self.inner_slots + n,
                    "chunk of entry {} in slot {s}, not a staging slot",
                    o.seq
                );
                held[(s - self.inner_slots) as usize] += 1;
            }
        }
        let mut free = vec![false; n as usize];
        for &s in &self.free_slots {
            check!(
                s >= self.inner_slots && s < self.inner_slots + n,
                "free slot {s} is not a staging slot"
            );
            let i = (s - self.inner_slots) as usize;
            check!(!free[i], "slot {s} is free twice");
            free[i] = true;
        }
        for i in 0..n as usize {
            let s = i as u32 + self.inner_slots;
            check!(
                self.slot_refs[i] == held[i],
                "slot {s}: {} references counted, {} chunks hold it",
                self.slot_refs[i],
                held[i]
            );
            check!(
                free[i] == (held[i] == 0),
                "slot {s}: free {} with {} chunks holding it",
                free[i],
                held[i]
            );
        }
    }

    /// Pins are exactly the reads' pins; a read in progress waits for something.
    fn check_reads_and_pins(&self) {
        let mut pins: BTreeMap<u64, u32> = BTreeMap::new();
        for (req, st) in &self.reads {
            check!(
                st.ios_left > 0 || st.inner_pending,
                "read {} waits for nothing",
                req.0
            );
            for &p in &st.pins {
                check!(p < self.head_pos, "read {} pins {p}, past the head", req.0);
                *pins.entry(p).or_default() += 1;
            }
        }
        check!(
            pins == self.pins,
            "pins {:?}, the reads hold {pins:?}",
            self.pins
        );
    }

    /// Flush waiters and the FUA writes they acknowledge.
    fn check_flushes(&self) {
        let fua: BTreeSet<u64> = self
            .flush_waiters
            .iter()
            .filter_map(|w| w.fua_seq)
            .collect();
        let unacked: BTreeSet<u64> = self.unacked.keys().copied().collect();
        check!(
            fua == unacked,
            "FUA waiters {fua:?}, unacknowledged FUA entries {unacked:?}"
        );
        for w in &self.flush_waiters {
            check!(
                w.need_seq <= self.next_seq && w.mark.is_none_or(|m| m <= self.log_writes_done),
                "flush waiter of request {}: needs seq {}, mark {:?}",
                w.req.0,
                w.need_seq,
                w.mark
            );
        }
        check!(
            !self.space_waiting || !self.pending.is_empty(),
            "waiting for space with nothing pending"
        );
    }

    /// The index: extents sorted, apart, counted, each pointing into a live logged entry of
    /// its core at the right place; each live logged entry covered by itself or a newer one
    /// (except where a newer entry was voided by `invalidate`).
    fn check_index(&self, skip_coverage: bool) {
        let mut blocks = 0;
        let mut last: Option<(u16, u64)> = None;
        for (core, start, x) in self.index.extents() {
            check!(x.end > start, "core {core}: empty extent at {start}");
            if let Some((c, end)) = last {
                check!(
                    c != core || start >= end,
                    "core {core}: extents overlap at {start}"
                );
            }
            last = Some((core, x.end));
            blocks += x.end - start;
            let s = x.seq;
            let Some(e) = self.live(s) else {
                panic!("WL INVARIANT: core {core} blocks {start}.. point at entry {s}, not live");
            };
            check!(
                e.core == core
                    && data_kind(e.kind)
                    && matches!(e.state, EState::Logged | EState::Wb { .. } | EState::Done),
                "core {core} blocks {start}.. point at entry {s} ({:?} core {} {:?})",
                e.kind,
                e.core,
                e.state
            );
            check!(
                e.lba <= start && x.end <= e.lba + e.blocks as u64 && x.hdr_pos == e.pos,
                "core {core} extent {start}..{} outside entry {s}",
                x.end
            );
            let want = match e.kind {
                LogKind::Write => Src::Log {
                    data_pos: e.pos + 1 + (start - e.lba),
                },
                _ => Src::Zero,
            };
            check!(
                x.src == want,
                "core {core} extent at {start}: source {:?}, expected {want:?}",
                x.src
            );
        }
        check!(
            blocks == self.index.blocks(),
            "index counts {} blocks, its extents {blocks}",
            self.index.blocks()
        );
        if skip_coverage {
            return;
        }
        for e in &self.entries {
            let logged = matches!(e.state, EState::Logged | EState::Wb { .. } | EState::Done);
            if !data_kind(e.kind) || !logged {
                continue;
            }
            let end = e.lba + e.blocks as u64;
            let mut at = e.lba;
            let pieces = self.index.lookup(e.core, e.lba, end);
            let gaps = pieces
                .iter()
                .map(|p| (e.lba + p.offset, Some(p)))
                .chain([(end, None)]);
            for (next, p) in gaps {
                if next > at {
                    check!(
                        self.voided_after(e.seq, e.core, at),
                        "entry {}: core {} blocks {at}..{next} missing from the index",
                        e.seq,
                        e.core
                    );
                }
                if let Some(p) = p {
                    check!(
                        p.seq >= e.seq,
                        "entry {}: an older entry {} holds blocks of it in the index",
                        e.seq,
                        p.seq
                    );
                    at = next + p.len;
                }
            }
        }
    }

    /// Whether an entry after `seq` on `core`, voided by `invalidate` (or being voided), held
    /// block `lba` (a voided TRIM keeps only its first block).
    fn voided_after(&self, seq: u64, core: u16, lba: u64) -> bool {
        self.entries.iter().any(|v| {
            let voided = v.kind == LogKind::Void || self.inv_seqs.contains(&v.seq);
            v.seq > seq
                && v.core == core
                && voided
                && v.lba <= lba
                && (lba < v.lba + v.blocks as u64 || v.blocks == 0)
        })
    }

    fn live(&self, seq: u64) -> Option<&super::entry::Entry> {
        let first = self.entries.front()?.seq;
        self.entries.get(seq.checked_sub(first)? as usize)
    }
}
