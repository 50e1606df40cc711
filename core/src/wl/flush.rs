//! Client flushes (sync generations end) and the log superblock.

use super::entry::OwnIo;
use super::{SB_BUF, WriteLog};
use crate::event::{Action, BufRef, Dev};
use crate::units::Lba;
use tiercache_format::wlog::LogSuper;

impl WriteLog {
    pub(super) fn run_flushes(&mut self, acts: &mut Vec<Action>) {
        let min_writing = self.writing.first().copied().unwrap_or(u64::MAX);
        let done = self.log_writes_done;
        for w in &mut self.flush_waiters {
            let earlier_written = min_writing >= w.need_seq;
            #[cfg(feature = "canary-wl-flush-early")]
            let earlier_written = earlier_written || true;
            if w.mark.is_none() && earlier_written {
                w.mark = Some(done);
            }
        }
        // Complete those a finished flush covers.
        let upto = self.durable_upto;
        let unacked = &mut self.unacked;
        self.flush_waiters.retain(|w| match w.mark {
            Some(m) if m <= upto => {
                if let Some(s) = w.fua_seq {
                    unacked.remove(&s);
                }
                acts.push(Action::Complete {
                    req: w.req,
                    result: Ok(()),
                });
                false
            }
            _ => true,
        });
        let need = self.flush_waiters.iter().filter_map(|w| w.mark).max();
        if let Some(m) = need
            && m > self.durable_upto
            && !self.flush_in_flight
        {
            self.flush_in_flight = true;
            let io = self.new_io(OwnIo::Flush {
                covers: self.log_writes_done,
                covers_seq: self.written_below(),
            });
            acts.push(Action::Flush {
                io,
                dev: Dev::Cache,
            });
        }
    }

    pub(super) fn run_super(&mut self, acts: &mut Vec<Action>) {
        if self.sb_in_flight {
            return;
        }
        let Some((tail_pos, tail_seq)) = self.sb_due.take() else {
            return;
        };
        self.sb_gen += 1;
        self.sb_copy ^= 1;
        let tail_gen = self.entries.front().map_or(self.open_gen, |e| e.gen_);
        self.sb_buf = LogSuper {
            cache_id: self.cfg.cache_id,
            sb_gen: self.sb_gen,
            epoch: self.epoch,
            ring_blocks: self.cfg.ring_blocks(),
            tail_pos,
            tail_seq,
            tail_gen,
            durable_seq: self.durable_seq,
        }
        .encode();
        self.sb_in_flight = true;
        let io = self.new_io(OwnIo::Super { tail_pos, tail_seq });
        acts.push(Action::Write {
            io,
            dev: Dev::Cache,
            lba: Lba(self.cfg.log_start.0 + self.sb_copy as u64),
            blocks: 1,
            buf: BufRef::Meta {
                id: SB_BUF,
                offset: 0,
            },
            fua: true,
        });
    }

    pub(super) fn super_done(&mut self, tail_pos: u64, tail_seq: u64, ok: bool) {
        self.sb_in_flight = false;
        if !ok {
            // Write the same copy again later (the failed one may be torn; the other is
            // fine), with the newest tail: one retired meanwhile is due already.
            self.sb_copy ^= 1;
            self.sb_gen -= 1;
            self.sb_due.get_or_insert((tail_pos, tail_seq));
            return;
        }
        if self.create_second_copy {
            // A new log: both copies must be valid before the first entry.
            self.create_second_copy = false;
            self.sb_due = Some((tail_pos, tail_seq));
            return;
        }
        self.sb_tail_pos = tail_pos;
        self.sb_tail_seq = tail_seq;
        if !self.ready && self.sb_due.is_none() {
            self.ready = true;
        }
    }
}
