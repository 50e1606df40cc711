//! Counters and state queries (fill, lag, dirty blocks, idleness).

use super::WriteLog;
use super::entry::EState;
use crate::units::{CoreId, ReqId};
use tiercache_format::wlog::LogKind;

/// Counters of the write log (SPEC C20's `wl` fields and `rbd status`-like state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WlCounters {
    /// Writes, TRIMs and WRITE_ZEROES logged.
    pub entries_logged: u64,
    /// Blocks of data logged.
    pub blocks_logged: u64,
    /// Reads served entirely from the log.
    pub read_hits_full: u64,
    /// Reads served partly from the log.
    pub read_hits_partial: u64,
    /// Reads the log had nothing of.
    pub read_misses: u64,
    /// Entries written back.
    pub entries_written_back: u64,
    /// Blocks of data written back.
    pub blocks_written_back: u64,
    /// Generations retired.
    pub gens_retired: u64,
    /// Times a written-back prefix of a generation was retired early (the log was full).
    pub prefix_retires: u64,
    /// Writeback IOs that failed (retried).
    pub wb_errors: u64,
    /// Log writes that failed.
    pub log_errors: u64,
    /// Writes that had to wait for ring space.
    pub waited_for_space: u64,
}

impl WriteLog {
    /// Counters.
    pub fn counters(&self) -> WlCounters {
        self.counters
    }

    /// Blocks of data in the log not yet written back (dirty).
    pub fn dirty_blocks(&self) -> u64 {
        self.index.blocks()
    }

    /// Live entries (not yet retired).
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Ring blocks in use, and the ring's size.
    pub fn log_fill(&self) -> (u64, u64) {
        (self.head_pos - self.reuse_bound(), self.cfg.ring_blocks())
    }

    /// Generations between the one being written back and the open one.
    pub fn generation_lag(&self) -> u64 {
        self.entries
            .front()
            .map_or(0, |e| self.open_gen.saturating_sub(e.gen_))
    }

    /// Entries in the log (not yet retired) of `core` (every core: `None`), and the blocks of
    /// data they hold that are not yet written back.
    pub fn pending(&self, core: Option<CoreId>) -> (u64, u64) {
        let mut n = 0;
        let mut blocks = 0;
        for e in &self.entries {
            if e.kind == LogKind::Pad || core.is_some_and(|c| c.0 != e.core) {
                continue;
            }
            n += 1;
            if e.kind == LogKind::Write && e.state != EState::Done {
                blocks += e.blocks as u64;
            }
        }
        (n, blocks)
    }

    /// The longest write (or TRIM / WRITE_ZEROES: no data) one entry takes, in blocks: half the
    /// ring less the header. A longer one fails with `NoSpace`; the NBD server advertises this
    /// as its maximum request size, so clients split what is longer.
    pub fn max_request_blocks(&self) -> u64 {
        self.cfg.ring_blocks() / 2 - 1
    }

    /// Blocks of write data the log holds on the device from its tail: what a load would
    /// find, counting entries already written back whose generation is not retired yet (a
    /// stop can leave some; they are written back again after the load).
    pub fn logged_blocks(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.kind == LogKind::Write)
            .map(|e| e.blocks as u64)
            .sum()
    }

    /// Whether everything logged has been written back.
    pub fn is_clean(&self) -> bool {
        self.entries.is_empty() && self.pending.is_empty()
    }

    /// Whether nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.ios.iter().all(Option::is_none)
            && self.reads.is_empty()
            && self.pending.is_empty()
            && self.inner.is_idle()
            && self.wb_ops.is_empty()
    }

    /// Test hook: the (request, sequence number, generation) of each entry issued since the
    /// last call.
    pub fn take_issued(&mut self) -> Vec<(ReqId, u64, u64)> {
        std::mem::take(&mut self.issued_log)
    }
}
