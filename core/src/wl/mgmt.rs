//! Management: cores, clean stop, `invalidate`, writeback pause/pacing/drain, buffers, and the management steps (`run_mgmt`).

use super::entry::{EState, OwnIo};
use super::pace::{Pace, Pacing};
use super::{HDR_BUF0, INNER_META, MgmtFlushState, SB_BUF, WriteLog, ZERO_BUF};
use crate::cache::Cache;
use crate::event::{Action, Dev};
use crate::units::CoreId;
use tiercache_format::wlog::LogKind;

impl WriteLog {
    /// Attaches a core of `size_blocks` blocks.
    pub fn add_core(&mut self, core: CoreId, size_blocks: u64) -> Result<(), String> {
        self.inner
            .add_core(core, size_blocks)
            .map_err(|e| format!("{e:?}"))?;
        let i = core.0 as usize;
        if self.cores.len() <= i {
            self.cores.resize(i + 1, None);
        }
        self.cores[i] = Some(size_blocks);
        Ok(())
    }

    /// Whether the log serves requests (its opening superblock is durable, and the read
    /// cache's too when it is persistent).
    pub fn is_ready(&self) -> bool {
        self.ready && self.inner.is_ready()
    }

    /// Records a core's identity and export name (in the read cache's core table; durable
    /// once [`WriteLog::tables_durable`]).
    pub fn set_core_record(
        &mut self,
        core: CoreId,
        record: crate::cache::CoreRecord,
    ) -> Result<(), String> {
        self.inner.set_core_record(core, record)
    }

    /// Whether every table change is durable (always, for a read cache without persistence).
    pub fn tables_durable(&self) -> bool {
        self.inner.tables_durable()
    }

    /// Detaches core `core`: refused while the log holds any of its entries (write them back
    /// first) or requests for it are in flight.
    pub fn remove_core(&mut self, core: CoreId) -> Result<(), String> {
        if self.cores.get(core.0 as usize).copied().flatten().is_none() {
            return Err(format!("no core {}", core.0));
        }
        if self
            .entries
            .iter()
            .any(|e| e.core == core.0 && e.kind != LogKind::Pad)
            || self.pending.iter().any(|p| p.core == core.0)
        {
            return Err(format!(
                "core {} has data in the write log; write it back first",
                core.0
            ));
        }
        self.inner.remove_core(core).map_err(|e| e.to_string())?;
        self.cores[core.0 as usize] = None;
        Ok(())
    }

    /// Records a new size for core `core` (a shrink below logged data is refused).
    pub fn resize_core(&mut self, core: CoreId, size_blocks: u64) -> Result<(), String> {
        if self.entries.iter().any(|e| {
            e.core == core.0 && e.lba + e.blocks as u64 > size_blocks && e.kind != LogKind::Pad
        }) {
            return Err(format!(
                "core {} has logged data beyond {size_blocks} blocks; write it back first",
                core.0
            ));
        }
        self.inner
            .resize_core(core, size_blocks)
            .map_err(|e| e.to_string())?;
        if let Some(s) = self.cores.get_mut(core.0 as usize).and_then(|c| c.as_mut()) {
            *s = size_blocks;
        }
        Ok(())
    }

    /// Begins a clean stop: new requests are refused, no new writeback starts; once nothing
    /// is in flight the cache device is flushed (every logged entry durable) and the read
    /// cache stops (its final checkpoint). Logged data stays in the log for the next open.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// Whether a clean stop has completed.
    pub fn is_stopped(&self) -> bool {
        self.stopping
            && self.stop_flush == MgmtFlushState::Done
            && self.sb_due.is_none()
            && !self.sb_in_flight
            && self.inner.is_stopped()
    }

    /// Drops the logged data of `core` that is not written back (SPEC's `invalidate`): once
    /// writeback is idle, every entry of that core is rewritten as void and the cache device
    /// flushed; its blocks then read from the core. Returns the blocks of data it drops; see
    /// [`WriteLog::invalidate_done`].
    pub fn invalidate(&mut self, core: CoreId) -> Result<u64, String> {
        if self.cores.get(core.0 as usize).copied().flatten().is_none() {
            return Err(format!("no core {}", core.0));
        }
        let blocks = self
            .entries
            .iter()
            .filter(|e| e.core == core.0 && e.kind == LogKind::Write)
            .map(|e| e.blocks as u64)
            .sum();
        self.invalidating.insert(core.0);
        Ok(blocks)
    }

    /// Whether every `invalidate` asked for has completed (void headers durable), and the
    /// blocks of logged data dropped so far.
    pub fn invalidate_done(&self) -> (bool, u64) {
        (
            self.invalidating.is_empty()
                && self.inv_seqs.is_empty()
                && self.inv_flush == MgmtFlushState::Done,
            self.invalidated_blocks,
        )
    }

    /// Cores attached, with their sizes.
    pub fn cores(&self) -> Vec<(CoreId, u64)> {
        self.cores
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (CoreId(i as u16), s)))
            .collect()
    }

    /// Holds writeback (`true`) or lets it run again: data stays in the log, writes wait for
    /// ring space once it is full. For tests and for benchmarks that fill the log (as cleaning
    /// `nop` does for the other modes).
    pub fn set_writeback_paused(&mut self, paused: bool) {
        self.wb_paused = paused;
    }

    /// The read cache, for its statistics and policies (never for writes or mode changes).
    pub fn read_cache_mut(&mut self) -> &mut Cache {
        &mut self.inner
    }

    /// When writeback runs ([`pace`]).
    pub fn pacing(&self) -> Pacing {
        self.cfg.pacing
    }

    /// Changes when writeback runs; refused (nothing changes) if the policy is invalid.
    pub fn set_pacing(&mut self, p: Pacing) -> Result<(), String> {
        p.validate()?;
        self.cfg.pacing = p;
        Ok(())
    }

    /// Whether writeback holds now (clients busy, the log under its background fill: see
    /// [`pace`]).
    pub fn writeback_held(&self) -> bool {
        matches!(self.pace(), Pace::Hold { .. })
    }

    /// Asks writeback to go as fast as the core allows until the log is empty, whatever
    /// [`pace`] would say (`tiercache writeback`, leaving the mode, removing a core).
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// Staging slots the driver must allocate (read cache's and writeback's), each
    /// [`WriteLog::pool_slot_blocks`] long.
    pub fn pool_slots(&self) -> u32 {
        self.inner.config().pool_slots + self.cfg.staging_slots
    }

    /// Blocks per staging slot.
    pub fn pool_slot_blocks(&self) -> u32 {
        self.inner.config().pool_slot_blocks
    }

    /// The bytes of a metadata buffer named by a [`BufRef::Meta`] action.
    pub fn meta_buf(&self, id: u32) -> &[u8] {
        if id & INNER_META != 0 {
            return self.inner.meta_buf(id & !INNER_META);
        }
        match id {
            ZERO_BUF => &self.zero,
            SB_BUF => &self.sb_buf,
            _ => &self.hdr_bufs[(id - HDR_BUF0) as usize],
        }
    }

    /// The read cache.
    pub fn read_cache(&self) -> &Cache {
        &self.inner
    }

    /// Management steps: `invalidate`'s voiding once writeback is idle, and the flushes of
    /// `invalidate` and of a clean stop.
    pub(super) fn run_mgmt(&mut self, acts: &mut Vec<Action>) {
        let wb_idle = self.wb_ops.is_empty() && !self.wb_flushing && self.wb_partial.is_none();
        if !self.invalidating.is_empty() && wb_idle {
            let cores = std::mem::take(&mut self.invalidating);
            let victims: Vec<u64> = self
                .entries
                .iter()
                .filter(|e| {
                    cores.contains(&e.core)
                        && e.state == EState::Logged
                        && matches!(e.kind, LogKind::Write | LogKind::Trim | LogKind::Zero)
                })
                .map(|e| e.seq)
                .collect();
            for seq in victims {
                let e = self.entry_mut(seq).clone();
                self.index
                    .retire(e.core, e.lba, e.lba + e.blocks as u64, e.seq);
                if e.kind == LogKind::Write {
                    self.invalidated_blocks += e.blocks as u64;
                }
                self.inv_seqs.insert(seq);
                self.issue_void(seq, acts);
            }
            self.inv_flush = if self.inv_seqs.is_empty() {
                MgmtFlushState::Done
            } else {
                MgmtFlushState::No
            };
        }
        let can_flush = !self.flush_in_flight && self.void_retry_at.is_none_or(|t| self.now >= t);
        if self.inv_flush == MgmtFlushState::No && self.inv_seqs.is_empty() && can_flush {
            self.inv_flush = MgmtFlushState::InFlight;
            let covers_seq = self.written_below();
            let io = self.new_io(OwnIo::MgmtFlush { covers_seq });
            acts.push(Action::Flush {
                io,
                dev: Dev::Cache,
            });
        }
        if self.stopping && self.stop_flush == MgmtFlushState::No && can_flush {
            let quiet = self.ios.iter().all(Option::is_none)
                && self.reads.is_empty()
                && self.pending.is_empty()
                && self.wb_ops.is_empty()
                && self.flush_waiters.is_empty()
                && self.sb_due.is_none()
                && self.inv_seqs.is_empty()
                && self.inv_flush == MgmtFlushState::Done;
            if quiet {
                self.stop_flush = MgmtFlushState::InFlight;
                let covers_seq = self.written_below();
                let io = self.new_io(OwnIo::MgmtFlush { covers_seq });
                acts.push(Action::Flush {
                    io,
                    dev: Dev::Cache,
                });
            }
        }
    }
}
