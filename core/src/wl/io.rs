//! Completions of the log's own IOs, and driving the read cache (its actions translated).

use super::entry::OwnIo;
use super::{INNER_META, INTERNAL_REQ, MgmtFlushState, RETRY_NS, WriteLog};
use crate::cache::health::IoClass;
use crate::event::{Action, BufRef, Event, IoError, ReqError};
use crate::units::{IoId, Nanos};

impl WriteLog {
    pub(super) fn own_io_done(
        &mut self,
        io: IoId,
        result: Result<(), IoError>,
        acts: &mut Vec<Action>,
    ) {
        let i = (io.0 >> 1) as usize;
        let o = self.ios[i]
            .take()
            .expect("completion for an IO the log did not issue");
        self.free_ios.push(i as u32);
        let ok = result.is_ok();
        let class = match o {
            OwnIo::LogWrite { .. } | OwnIo::VoidWrite { .. } | OwnIo::Super { .. } => {
                IoClass::Write
            }
            OwnIo::Flush { .. } | OwnIo::MgmtFlush { .. } => IoClass::Flush,
            OwnIo::ClientRead { .. } | OwnIo::WbRead { .. } => IoClass::Read,
        };
        self.note_log_io(class, result);
        match o {
            OwnIo::LogWrite { seq } => self.log_write_done(seq, ok, acts),
            OwnIo::VoidWrite { seq } => self.void_done(seq, ok),
            OwnIo::Flush { covers, covers_seq } => {
                self.flush_in_flight = false;
                if ok {
                    self.durable_upto = self.durable_upto.max(covers);
                    self.durable_seq = self.durable_seq.max(covers_seq);
                } else {
                    // Fail the waiters it would have covered: their data may not be durable.
                    let mut failed = Vec::new();
                    let unacked = &mut self.unacked;
                    self.flush_waiters.retain(|w| match w.mark {
                        Some(m) if m <= covers => {
                            if let Some(s) = w.fua_seq {
                                unacked.remove(&s);
                            }
                            failed.push(w.req);
                            false
                        }
                        _ => true,
                    });
                    for req in failed {
                        acts.push(Action::Complete {
                            req,
                            result: Err(ReqError::Io(IoError::Io)),
                        });
                    }
                }
            }
            OwnIo::Super { tail_pos, tail_seq } => self.super_done(tail_pos, tail_seq, ok),
            OwnIo::ClientRead { req } => {
                let st = self.reads.get_mut(&req).expect("read");
                st.ios_left -= 1;
                if !ok {
                    st.failed = Some(ReqError::Io(result.expect_err("a failed IO")));
                }
                self.finish_read_if_done(req, acts);
            }
            OwnIo::WbRead { batch } => self.wb_read_done(batch, ok),
            OwnIo::MgmtFlush { covers_seq } => {
                let next = if ok {
                    self.durable_seq = self.durable_seq.max(covers_seq);
                    MgmtFlushState::Done
                } else {
                    MgmtFlushState::No
                };
                if self.stop_flush == MgmtFlushState::InFlight {
                    self.stop_flush = next;
                    if ok {
                        self.inner.stop();
                        self.inner_events.push_back(Event::Tick);
                        // The last superblock says every entry is durable: a scan that ends
                        // before the head has found damage.
                        self.sb_due = Some(self.tail());
                    }
                }
                if self.inv_flush == MgmtFlushState::InFlight {
                    self.inv_flush = next;
                }
                if !ok {
                    self.counters.log_errors += 1;
                    self.void_retry_at = Some(Nanos(self.now.0 + RETRY_NS));
                }
            }
        }
    }

    /// Runs the read cache on queued events and translates what it asks for.
    pub(super) fn pump_inner(&mut self, acts: &mut Vec<Action>) {
        while let Some(ev) = self.inner_events.pop_front() {
            let mut out = std::mem::take(&mut self.inner_actions);
            self.inner.apply(self.now, ev, &mut out);
            for a in out.drain(..) {
                self.translate(a, acts);
            }
            self.inner_actions = out;
        }
    }

    fn map_buf(&self, b: BufRef) -> BufRef {
        match b {
            BufRef::Req { req, offset } if req.0 >= INTERNAL_REQ => {
                let op = &self.wb_ops[&(req.0 & !INTERNAL_REQ)];
                BufRef::Pool {
                    slot: op.slot.expect("a data request has a slot"),
                    offset: op.slot_off + offset,
                }
            }
            BufRef::Meta { id, offset } => BufRef::Meta {
                id: id | INNER_META,
                offset,
            },
            other => other,
        }
    }

    fn translate(&mut self, a: Action, acts: &mut Vec<Action>) {
        let io2 = |io: IoId| IoId(io.0 << 1);
        match a {
            Action::Complete { req, result } => {
                if req.0 >= INTERNAL_REQ {
                    self.internal_done(req.0 & !INTERNAL_REQ, result);
                } else if let Some(st) = self.reads.get_mut(&req) {
                    st.inner_pending = false;
                    match result {
                        Ok(()) => {
                            let overlay = std::mem::take(&mut st.overlay);
                            self.issue_overlay(req, overlay, acts);
                        }
                        Err(e) => st.failed = Some(e),
                    }
                    self.finish_read_if_done(req, acts);
                } else {
                    acts.push(Action::Complete { req, result });
                }
            }
            Action::Read {
                io,
                dev,
                lba,
                blocks,
                buf,
            } => acts.push(Action::Read {
                io: io2(io),
                dev,
                lba,
                blocks,
                buf: self.map_buf(buf),
            }),
            Action::Write {
                io,
                dev,
                lba,
                blocks,
                buf,
                fua,
            } => acts.push(Action::Write {
                io: io2(io),
                dev,
                lba,
                blocks,
                buf: self.map_buf(buf),
                fua,
            }),
            Action::WriteZeroes {
                io,
                dev,
                lba,
                blocks,
                fua,
            } => acts.push(Action::WriteZeroes {
                io: io2(io),
                dev,
                lba,
                blocks,
                fua,
            }),
            Action::Trim {
                io,
                dev,
                lba,
                blocks,
            } => acts.push(Action::Trim {
                io: io2(io),
                dev,
                lba,
                blocks,
            }),
            Action::Flush { io, dev } => acts.push(Action::Flush { io: io2(io), dev }),
            Action::Copy { src, dst, blocks } => acts.push(Action::Copy {
                src: self.map_buf(src),
                dst: self.map_buf(dst),
                blocks,
            }),
        }
    }
}
