//! Events in: `apply`, client requests, and the loop that runs every step until nothing changes (`maintain`).

use super::entry::{EState, FlushWaiter, Pending};
use super::pace::Pace;
use super::{INTERNAL_REQ, WriteLog};
use crate::config::REQUEST_BLOCKS_MAX;
use crate::event::{Action, Event, ReqError};
use crate::units::{IoId, Nanos, ReqId};
use tiercache_format::wlog::LogKind;

impl WriteLog {
    /// The earliest time the log wants a [`Event::Tick`].
    pub fn next_deadline(&self) -> Option<Nanos> {
        let held = match self.pace() {
            Pace::Hold { until } => Some(until),
            Pace::Go => None,
        };
        [
            self.inner.next_deadline(),
            self.wb_retry_at,
            self.void_retry_at,
            held,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Handles one event at time `now`, appending what the driver must do to `actions`.
    ///
    /// `data_crc(req)` must return the CRC32C of the data buffer of client write `req` (the
    /// one byte-level fact the log needs: it goes into the entry's header so that recovery
    /// can tell a torn entry). It is called only for writes still in flight.
    pub fn apply(
        &mut self,
        now: Nanos,
        event: Event,
        actions: &mut Vec<Action>,
        data_crc: &mut dyn FnMut(ReqId) -> u32,
    ) {
        self.now = self.now.max(now);
        match event {
            Event::IoDone { io, result } => {
                if io.0 & 1 == 0 {
                    self.inner_events.push_back(Event::IoDone {
                        io: IoId(io.0 >> 1),
                        result,
                    });
                } else {
                    self.own_io_done(io, result, actions);
                }
            }
            Event::Tick => self.inner_events.push_back(Event::Tick),
            ev if !self.is_ready() => self.not_ready.push_back(ev),
            ev => self.on_request(ev, actions),
        }
        self.maintain(actions, data_crc);
        #[cfg(any(test, feature = "strict-asserts"))]
        {
            // After every event while the log is small; every 8th event once it holds more
            // than 256 entries (the checks are O(entries)), and the index coverage check
            // every 16th: on every event they nearly doubled the time of core/tests/wl.rs.
            self.events_applied += 1;
            let n = self.events_applied;
            if self.entries.len() <= 64 || n.is_multiple_of(8) {
                self.check_invariants_but(!n.is_multiple_of(16));
            }
        }
    }

    fn on_request(&mut self, ev: Event, actions: &mut Vec<Action>) {
        self.last_request = self.now;
        let (req, core, lba, blocks) = match ev {
            Event::Read {
                req,
                core,
                lba,
                blocks,
            }
            | Event::Write {
                req,
                core,
                lba,
                blocks,
                ..
            }
            | Event::WriteZeroes {
                req,
                core,
                lba,
                blocks,
                ..
            }
            | Event::Trim {
                req,
                core,
                lba,
                blocks,
            } => (req, core, lba.0, blocks),
            Event::Flush { req, core } => (req, core, 0, 0),
            Event::IoDone { .. } | Event::Tick => unreachable!("not a request"),
        };
        let reply = |actions: &mut Vec<Action>, r: Result<(), ReqError>| {
            actions.push(Action::Complete { req, result: r });
        };
        if req.0 >= INTERNAL_REQ {
            return reply(actions, Err(ReqError::OutOfRange));
        }
        if self.stopping {
            return reply(actions, Err(ReqError::NotRunning));
        }
        let Some(size) = self.cores.get(core.0 as usize).copied().flatten() else {
            return reply(actions, Err(ReqError::NoSuchCore));
        };
        let is_write = !matches!(ev, Event::Read { .. } | Event::Flush { .. });
        if !matches!(ev, Event::Flush { .. }) {
            let end = lba.checked_add(blocks as u64);
            if end.is_none_or(|e| e > size) || blocks > REQUEST_BLOCKS_MAX {
                let e = if is_write
                    && !matches!(ev, Event::Trim { .. })
                    && blocks <= REQUEST_BLOCKS_MAX
                {
                    ReqError::PastEnd
                } else {
                    ReqError::OutOfRange
                };
                return reply(actions, Err(e));
            }
            if blocks == 0 {
                return reply(actions, Ok(()));
            }
        }
        match ev {
            Event::Read { .. } => self.client_read(req, core.0, lba, blocks, actions),
            Event::Flush { .. } => {
                self.close_gen();
                self.flush_waiters.push(FlushWaiter {
                    req,
                    fua_seq: None,
                    need_seq: self.next_seq,
                    mark: None,
                });
            }
            Event::Write { fua, .. } => self.pending.push_back(Pending {
                req,
                kind: LogKind::Write,
                core: core.0,
                lba,
                blocks,
                fua,
            }),
            Event::WriteZeroes { fua, .. } => self.pending.push_back(Pending {
                req,
                kind: LogKind::Zero,
                core: core.0,
                lba,
                blocks,
                fua,
            }),
            Event::Trim { .. } => self.pending.push_back(Pending {
                req,
                kind: LogKind::Trim,
                core: core.0,
                lba,
                blocks,
                fua: false,
            }),
            _ => unreachable!(),
        }
    }

    fn maintain(&mut self, acts: &mut Vec<Action>, crc: &mut dyn FnMut(ReqId) -> u32) {
        for _ in 0..64 {
            let before = acts.len() + self.inner_events.len();
            self.pump_inner(acts);
            if self.is_ready() {
                while let Some(ev) = self.not_ready.pop_front() {
                    self.on_request(ev, acts);
                }
            }
            if self.void_retry_at.is_some_and(|t| self.now >= t) {
                self.void_retry_at = None;
                let due: Vec<u64> = self
                    .entries
                    .iter()
                    .filter(|e| e.state == EState::VoidDue)
                    .map(|e| e.seq)
                    .collect();
                for s in due {
                    self.issue_void(s, acts);
                }
            }
            if self.ready {
                self.issue_pending(acts, crc);
            }
            self.run_flushes(acts);
            self.continue_partial(acts);
            self.run_writeback(acts);
            self.run_super(acts);
            self.run_mgmt(acts);
            self.pump_inner(acts);
            if acts.len() + self.inner_events.len() == before && self.inner_events.is_empty() {
                break;
            }
        }
    }
}
