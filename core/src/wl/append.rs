//! Appending entries to the ring: waiting writes, headers, log-write completions, void rewrites.

use super::config::ext_src_lba;
use super::entry::{EState, Entry, FlushWaiter, OwnIo};
use super::index::Src;
use super::{HDR_BUF0, MgmtFlushState, RETRY_NS, WriteLog};
use crate::event::{Action, BufRef, Dev, IoError, ReqError};
use crate::units::{IoId, Lba, Nanos, ReqId};
use tiercache_format::wlog::{LogHeader, LogKind};

impl WriteLog {
    /// Entries before this sequence number have their log writes finished.
    pub(super) fn written_below(&self) -> u64 {
        self.writing.first().copied().unwrap_or(self.next_seq)
    }

    /// The tail: the oldest entry's position and sequence number (the head when empty).
    pub(super) fn tail(&self) -> (u64, u64) {
        match self.entries.front() {
            Some(e) => (e.pos, e.seq),
            None => (self.head_pos, self.next_seq),
        }
    }

    pub(super) fn reuse_bound(&self) -> u64 {
        let p = self.pins.keys().next().copied().unwrap_or(u64::MAX);
        self.sb_tail_pos.min(p)
    }

    pub(super) fn new_io(&mut self, o: OwnIo) -> IoId {
        let i = match self.free_ios.pop() {
            Some(i) => {
                self.ios[i as usize] = Some(o);
                i
            }
            None => {
                self.ios.push(Some(o));
                (self.ios.len() - 1) as u32
            }
        };
        IoId(((i as u64) << 1) | 1)
    }

    fn new_hdr(&mut self, h: &LogHeader) -> u32 {
        let b = h.encode();
        match self.free_hdr.pop() {
            Some(i) => {
                self.hdr_bufs[i as usize] = b;
                i + HDR_BUF0
            }
            None => {
                self.hdr_bufs.push(b);
                (self.hdr_bufs.len() - 1) as u32 + HDR_BUF0
            }
        }
    }

    fn header_of(&self, e: &Entry, kind: LogKind, data_crc: u32) -> LogHeader {
        LogHeader {
            kind,
            cache_id: self.cfg.cache_id,
            epoch: self.epoch,
            seq: e.seq,
            gen_: e.gen_,
            core: e.core,
            lba: e.lba,
            blocks: e.blocks,
            data_crc,
            durable_seq: self.durable_seq,
        }
    }

    pub(super) fn close_gen(&mut self) {
        if self.open_gen_writes > 0 {
            self.open_gen += 1;
            self.open_gen_writes = 0;
            self.open_gen_blocks = 0;
        }
    }

    /// Starts logging waiting writes, in order, while they fit and overlap nothing in flight.
    pub(super) fn issue_pending(
        &mut self,
        acts: &mut Vec<Action>,
        data_crc: &mut dyn FnMut(ReqId) -> u32,
    ) {
        self.space_waiting = false;
        while let Some(&p) = self.pending.front() {
            let busy = self.writing.iter().any(|s| {
                let e = &self.entries[(s - self.entries[0].seq) as usize];
                e.overlaps(p.core, p.lba, p.blocks)
            }) || self.unacked.values().any(|&(c, l, b)| {
                c == p.core && l < p.lba + p.blocks as u64 && p.lba < l + b as u64
            });
            if busy {
                return;
            }
            let span = 1 + if p.kind == LogKind::Write {
                p.blocks as u64
            } else {
                0
            };
            let ring = self.cfg.ring_blocks();
            if span > ring / 2 {
                self.pending.pop_front();
                acts.push(Action::Complete {
                    req: p.req,
                    result: Err(ReqError::Io(IoError::NoSpace)),
                });
                continue;
            }
            let phys = self.head_pos % ring;
            let pad = if phys + span > ring { ring - phys } else { 0 };
            if self.head_pos + pad + span - self.reuse_bound() > ring {
                self.counters.waited_for_space += 1;
                self.space_waiting = true;
                return;
            }
            self.pending.pop_front();
            if pad > 0 {
                self.append(LogKind::Pad, 0, 0, (pad - 1) as u32, None, 0, acts);
            }
            let crc = if p.kind == LogKind::Write {
                data_crc(p.req)
            } else {
                0
            };
            self.append(
                p.kind,
                p.core,
                p.lba,
                p.blocks,
                Some((p.req, p.fua)),
                crc,
                acts,
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        kind: LogKind,
        core: u16,
        lba: u64,
        blocks: u32,
        req: Option<(ReqId, bool)>,
        data_crc: u32,
        acts: &mut Vec<Action>,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut e = Entry {
            seq,
            gen_: self.open_gen,
            kind,
            core,
            lba,
            blocks,
            pos: self.head_pos,
            state: EState::Logged,
            req,
            hdr_buf: None,
            at: self.now,
        };
        self.head_pos += e.span();
        if let Some((r, _)) = req {
            self.issued_log.push((r, seq, e.gen_));
            self.open_gen_writes += 1;
            self.open_gen_blocks += blocks as u64;
        }
        let h = self.header_of(&e, kind, data_crc);
        let hb = self.new_hdr(&h);
        e.hdr_buf = Some(hb);
        let hdr_lba = ext_src_lba(&self.cfg, e.pos);
        let io = self.new_io(OwnIo::LogWrite { seq });
        acts.push(Action::Write {
            io,
            dev: Dev::Cache,
            lba: Lba(hdr_lba),
            blocks: 1,
            buf: BufRef::Meta { id: hb, offset: 0 },
            fua: false,
        });
        let mut left = 1;
        if kind == LogKind::Write {
            let (r, _) = req.expect("a write has a request");
            let io = self.new_io(OwnIo::LogWrite { seq });
            acts.push(Action::Write {
                io,
                dev: Dev::Cache,
                lba: Lba(hdr_lba + 1),
                blocks,
                buf: BufRef::Req { req: r, offset: 0 },
                fua: false,
            });
            left = 2;
        }
        e.state = EState::Writing {
            left,
            failed: false,
        };
        self.writing.insert(seq);
        self.entries.push_back(e);
        if self.open_gen_writes >= self.cfg.gen_max_writes
            || self.open_gen_blocks >= self.cfg.gen_max_blocks
        {
            self.close_gen();
        }
    }

    pub(super) fn entry_mut(&mut self, seq: u64) -> &mut Entry {
        let first = self.entries[0].seq;
        &mut self.entries[(seq - first) as usize]
    }

    pub(super) fn log_write_done(&mut self, seq: u64, ok: bool, acts: &mut Vec<Action>) {
        self.log_writes_done += 1;
        let e = self.entry_mut(seq);
        let EState::Writing { left, failed } = e.state else {
            unreachable!("log write done for an entry not writing")
        };
        let failed = failed || !ok;
        if left > 1 {
            e.state = EState::Writing {
                left: left - 1,
                failed,
            };
            return;
        }
        let hb = e.hdr_buf.take().expect("header buffer");
        self.free_hdr.push(hb - HDR_BUF0);
        if failed {
            self.counters.log_errors += 1;
            let e = self.entry_mut(seq);
            e.state = EState::VoidDue;
            if let Some((r, _)) = e.req.take() {
                acts.push(Action::Complete {
                    req: r,
                    result: Err(ReqError::Io(IoError::Io)),
                });
            }
            self.issue_void(seq, acts);
            return;
        }
        let e = self.entry_mut(seq);
        e.state = EState::Logged;
        let (kind, core, lba, blocks, pos, req) =
            (e.kind, e.core, e.lba, e.blocks, e.pos, e.req.take());
        self.writing.remove(&seq);
        match kind {
            LogKind::Write => {
                self.index.insert(
                    core,
                    lba,
                    lba + blocks as u64,
                    seq,
                    pos,
                    Src::Log { data_pos: pos + 1 },
                );
            }
            LogKind::Trim | LogKind::Zero => {
                self.index
                    .insert(core, lba, lba + blocks as u64, seq, pos, Src::Zero);
            }
            LogKind::Pad | LogKind::Void => {}
        }
        if let Some((r, fua)) = req {
            self.counters.entries_logged += 1;
            self.counters.blocks_logged += blocks as u64;
            if fua {
                self.unacked.insert(seq, (core, lba, blocks));
                self.flush_waiters.push(FlushWaiter {
                    req: r,
                    fua_seq: Some(seq),
                    need_seq: seq + 1,
                    mark: None,
                });
            } else {
                acts.push(Action::Complete {
                    req: r,
                    result: Ok(()),
                });
            }
        }
    }

    pub(super) fn issue_void(&mut self, seq: u64, acts: &mut Vec<Action>) {
        let e = self.entry_mut(seq).clone();
        let h = self.header_of(&e, LogKind::Void, 0);
        // A void entry spans what the failed one did.
        let h = LogHeader {
            blocks: (e.span() - 1) as u32,
            ..h
        };
        let hb = self.new_hdr(&h);
        let io = self.new_io(OwnIo::VoidWrite { seq });
        let em = self.entry_mut(seq);
        em.hdr_buf = Some(hb);
        em.state = EState::Voiding;
        acts.push(Action::Write {
            io,
            dev: Dev::Cache,
            lba: Lba(ext_src_lba(&self.cfg, e.pos)),
            blocks: 1,
            buf: BufRef::Meta { id: hb, offset: 0 },
            fua: false,
        });
    }

    pub(super) fn void_done(&mut self, seq: u64, ok: bool) {
        self.log_writes_done += 1;
        let now = self.now;
        let e = self.entry_mut(seq);
        let hb = e.hdr_buf.take().expect("header buffer");
        self.free_hdr.push(hb - HDR_BUF0);
        if ok && self.inv_seqs.remove(&seq) && self.inv_seqs.is_empty() {
            self.inv_flush = MgmtFlushState::No;
        }
        let e = self.entry_mut(seq);
        if ok {
            // Entry spans as before, now void: writeback skips it.
            let after_header = (e.span() - 1) as u32;
            e.kind = LogKind::Void;
            e.blocks = after_header;
            e.state = EState::Logged;
            self.writing.remove(&seq);
        } else {
            e.state = EState::VoidDue;
            self.void_retry_at = Some(Nanos(now.0 + RETRY_NS));
        }
    }
}
