//! Client reads: the log index first, then the read cache (and the core) for the rest.

use super::config::ext_src_lba;
use super::entry::{OwnIo, ReadState};
use super::index::{self, Src};
use super::{WriteLog, ZERO_BLOCKS, ZERO_BUF};
use crate::event::{Action, BufRef, Dev, Event};
use crate::units::{CoreId, Lba, ReqId};

impl WriteLog {
    pub(super) fn client_read(
        &mut self,
        req: ReqId,
        core: u16,
        lba: u64,
        blocks: u32,
        acts: &mut Vec<Action>,
    ) {
        let pieces = self.index.lookup(core, lba, lba + blocks as u64);
        let covered: u64 = pieces.iter().map(|p| p.len).sum();
        let mut st = ReadState {
            overlay: Vec::new(),
            pins: Vec::new(),
            ios_left: 0,
            inner_pending: false,
            failed: None,
        };
        for p in &pieces {
            if matches!(p.src, Src::Log { .. }) {
                *self.pins.entry(p.hdr_pos).or_default() += 1;
                st.pins.push(p.hdr_pos);
            }
        }
        if covered == blocks as u64 {
            self.counters.read_hits_full += 1;
            self.reads.insert(req, st);
            self.issue_overlay(req, pieces, acts);
            self.finish_read_if_done(req, acts);
            return;
        }
        if covered == 0 {
            self.counters.read_misses += 1;
        } else {
            self.counters.read_hits_partial += 1;
        }
        st.overlay = pieces;
        st.inner_pending = true;
        self.reads.insert(req, st);
        self.inner_events.push_back(Event::Read {
            req,
            core: CoreId(core),
            lba: Lba(lba),
            blocks,
        });
    }

    pub(super) fn issue_overlay(
        &mut self,
        req: ReqId,
        pieces: Vec<index::Piece>,
        acts: &mut Vec<Action>,
    ) {
        for p in pieces {
            match p.src {
                Src::Log { data_pos } => {
                    let io = self.new_io(OwnIo::ClientRead { req });
                    self.reads.get_mut(&req).expect("read").ios_left += 1;
                    acts.push(Action::Read {
                        io,
                        dev: Dev::Cache,
                        lba: Lba(ext_src_lba(&self.cfg, data_pos)),
                        blocks: p.len as u32,
                        buf: BufRef::Req {
                            req,
                            offset: p.offset as u32,
                        },
                    });
                }
                Src::Zero => {
                    let mut off = p.offset as u32;
                    let mut left = p.len as u32;
                    while left > 0 {
                        let n = left.min(ZERO_BLOCKS);
                        acts.push(Action::Copy {
                            src: BufRef::Meta {
                                id: ZERO_BUF,
                                offset: 0,
                            },
                            dst: BufRef::Req { req, offset: off },
                            blocks: n,
                        });
                        off += n;
                        left -= n;
                    }
                }
            }
        }
    }

    pub(super) fn finish_read_if_done(&mut self, req: ReqId, acts: &mut Vec<Action>) {
        let st = &self.reads[&req];
        if st.ios_left > 0 || st.inner_pending {
            return;
        }
        let st = self.reads.remove(&req).expect("read");
        for p in st.pins {
            self.unpin(p);
        }
        acts.push(Action::Complete {
            req,
            result: st.failed.map_or(Ok(()), Err),
        });
    }

    fn unpin(&mut self, pos: u64) {
        let c = self.pins.get_mut(&pos).expect("pinned");
        *c -= 1;
        if *c == 0 {
            self.pins.remove(&pos);
        }
    }
}
