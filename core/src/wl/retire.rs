//! Retiring written-back entries: the cores' flushes, then the index and the superblock's tail.

use super::entry::{EState, WbOp, WbWhat};
use super::{INTERNAL_REQ, WriteLog};
use crate::event::Event;
use crate::units::{CoreId, ReqId};
use std::collections::BTreeSet;
use tiercache_format::wlog::LogKind;

impl WriteLog {
    /// Flushes the cores the first `n` entries touched, then retires them (`upto`: a prefix
    /// of the front generation; `None`: all of it). Retires at once when they touched none.
    pub(super) fn flush_for_retire(&mut self, n: usize, upto: Option<u64>) {
        let cores: BTreeSet<u16> = self
            .entries
            .iter()
            .take(n)
            .filter(|e| matches!(e.kind, LogKind::Write | LogKind::Trim | LogKind::Zero))
            .map(|e| e.core)
            .collect();
        if cores.is_empty() {
            self.retire_front(upto);
            return;
        }
        self.wb_flushing = true;
        self.wb_flush_upto = upto;
        self.wb_flushes_left = cores.len() as u32;
        for c in cores {
            let op = self.new_op(WbOp {
                seq: 0,
                offset: 0,
                blocks: 0,
                slot: None,
                slot_off: 0,
                what: WbWhat::Flush,
            });
            self.inner_events.push_back(Event::Flush {
                req: ReqId(INTERNAL_REQ | op),
                core: CoreId(c),
            });
        }
    }

    /// Retires the front generation (`upto: None`) or its entries before sequence number
    /// `upto` (all written back and flushed on their cores), and has the superblock's tail
    /// follow.
    pub(super) fn retire_front(&mut self, upto: Option<u64>) {
        let g = self.entries[0].gen_;
        while let Some(e) = self.entries.front() {
            if e.gen_ != g || upto.is_some_and(|u| e.seq >= u) {
                break;
            }
            let e = self.entries.pop_front().expect("front");
            debug_assert_eq!(e.state, EState::Done, "retiring an entry not written back");
            // The canary leaves the retired entry's extents in the index.
            if matches!(e.kind, LogKind::Write | LogKind::Trim | LogKind::Zero)
                && !cfg!(feature = "canary-wl-index-keeps-retired")
            {
                self.index
                    .retire(e.core, e.lba, e.lba + e.blocks as u64, e.seq);
            }
        }
        if upto.is_some() {
            self.counters.prefix_retires += 1;
        } else {
            self.counters.gens_retired += 1;
            self.gen_gate_seq = self.tail().1;
        }
        self.sb_due = Some(self.tail());
    }
}
