//! The journal's group commit: a commit captures the state of every queued line into one
//! record, flushes the cache device first where the record needs it, writes the record's two
//! copies, and then releases the requests parked on it; a flush that covers written records
//! lets their clean and unmapped lines' slots be reused. A failed commit is retried at the
//! same place with the same sequence number. Part of the metadata machinery (`meta.rs`).

use super::{COMMIT_LINES_MAX, MetaIo, RETRY_NS, StopCores, Task, Waiter, blocks, pad};
use crate::cache::{Cache, IoOwner};
use crate::event::{Action, BufRef, Dev, IoError, ReqError};
use crate::units::{Lba, LineId, Nanos};
use tiercache_format::journal::{Entry, LineOp};
use tiercache_format::record::{self, RecordKind};
use tiercache_format::superblock::CacheState;

/// The journal commit in flight (one at a time).
pub(super) struct Commit {
    seq: u64,
    /// Byte offset in the journal region, record length (padded), bytes skipped at the end of
    /// the region before it.
    at: u64,
    len: u64,
    skipped: u64,
    buf: u32,
    /// Lines captured: (line, captured with dirty blocks).
    lines: Vec<(u32, bool)>,
    /// Intent regions in the record, and the intent generation they complete.
    pub(super) intents: Vec<u32>,
    intent_gen: u64,
    pub(super) waiters: Vec<Waiter>,
    /// Copies of the record still being written, and whether one failed.
    pub(super) writes_left: u8,
    pub(super) write_err: Option<IoError>,
}

impl Cache {
    /// Releases parked requests: unlock, reply.
    fn release_waiters(
        &mut self,
        waiters: Vec<Waiter>,
        err: Option<IoError>,
        actions: &mut Vec<Action>,
    ) {
        for w in waiters {
            if let Some((core, first, last, kind)) = w.lock {
                self.unlock_lines(core, first, last, kind);
                self.wake_waiters = true;
            }
            if w.replied {
                // Answered before its record: a failed record only means its change is not
                // durable yet (its lines are queued again; a flush waits for them).
                continue;
            }
            let result = match err {
                Some(e) => Err(ReqError::Io(e)),
                None => w.result,
            };
            actions.push(Action::Complete { req: w.req, result });
        }
    }

    pub(super) fn start_commit(&mut self, actions: &mut Vec<Action>) {
        let line_size = self.cfg.line_size.bytes() as u32;
        let m = self.meta.as_mut().expect("persistent");
        // A record stays within a quarter of the journal (so the journal always holds several).
        let per_line = 20 + 2 * (self.bpl as u64).div_ceil(8);
        let fit = ((m.journal_bytes() / 4).saturating_sub(64) / per_line).max(1) as usize;
        let mut lines: Vec<u32> = m
            .queued
            .iter()
            .copied()
            .take(COMMIT_LINES_MAX.min(fit))
            .collect();
        lines.sort_unstable();
        let mut ops = Vec::with_capacity(lines.len() * 2);
        let mut captured = Vec::with_capacity(lines.len());
        let mut any_dirty = false;
        for &l in &lines {
            let line = LineId(l);
            if self.map.is_mapped(line) {
                let (c, cl) = self.map.position(line);
                let d = self.state.dirty(line);
                ops.push(LineOp::Map {
                    line: l,
                    core: c.0 as u8,
                    core_line: cl,
                    class: self.lists.class(line),
                });
                ops.push(LineOp::State {
                    line: l,
                    valid: self.state.valid(line),
                    dirty: d,
                });
                any_dirty |= d != 0;
                captured.push((l, d != 0));
            } else {
                ops.push(LineOp::Unmap { line: l });
                captured.push((l, false));
            }
        }
        let m = self.meta.as_mut().expect("persistent");
        let seq = m.next_seq;
        let (intents, intent_gen) = m.intents.take_for_commit(&mut ops);
        let entry = Entry {
            seq,
            line_size,
            ops,
        };
        let rec = pad(record::encode_versioned(
            RecordKind::Journal,
            entry.version(),
            &entry.encode(),
        ));
        let len = rec.len() as u64;
        let jb = m.journal_bytes();
        let (at, skipped) = if m.head + len > jb {
            (0, jb - m.head)
        } else {
            (m.head, 0)
        };
        if m.used + skipped + len > jb {
            m.no_room = true;
            m.intents.commit_failed(&intents, intent_gen);
            // No room until a checkpoint moves the journal's start: ask for one and wait.
            if m.run.is_none() && !m.tasks.iter().any(|t| matches!(t, Task::Checkpoint { .. })) {
                m.push_task(Task::Checkpoint {
                    state: CacheState::Running,
                });
            }
            return;
        }
        m.no_room = false;
        for &l in &lines {
            m.queued.remove(&l);
            // An older record's durability must not release a line this commit re-captures.
            m.dd_wait.remove(&l);
        }
        // A clean load reads no journal (load.rs): nothing may be committed once the final
        // checkpoint of a stop has begun, or the record would be lost at the next load.
        assert!(
            !(m.stopping && m.stop_cores == StopCores::Final),
            "a journal commit during the final checkpoint of a stop"
        );
        // Waiters are released by the commit that leaves nothing queued: a request's lines may
        // not all fit in this one (a large request, or many), and its reply (a FUA write, a
        // flush) or its locks must wait for all of them.
        let waiters = if m.queued.is_empty() {
            // Everything waiting goes in this record: the next group starts afresh.
            m.urgent = 0;
            m.hurry = false;
            m.commit_due = Nanos(u64::MAX);
            std::mem::take(&mut m.waiters_next)
        } else {
            // A full record: the rest follows at once.
            m.commit_due = m.commit_due.min(self.now);
            Vec::new()
        };
        let buf = m.new_buf(rec);
        m.commit = Some(Commit {
            seq,
            at,
            len,
            skipped,
            buf,
            lines: captured,
            intents,
            intent_gen,
            waiters,
            writes_left: 2,
            write_err: None,
        });
        // The flush before a record makes the data it points at durable first, and the record
        // before it: a valid record after a gap can then only be damage (see load.rs).
        let needs_preflush = (any_dirty || m.last_written_seq > m.durable_seq)
            && !cfg!(feature = "canary-no-preflush");
        if needs_preflush && self.cache_flush.needs_flush() {
            let seq = m.last_written_seq;
            let covers = self.cache_flush.writes_done;
            let io = self.new_io(IoOwner::Meta {
                kind: MetaIo::CommitPreflush { seq, covers },
            });
            actions.push(Action::Flush {
                io,
                dev: Dev::Cache,
            });
        } else {
            self.issue_commit_write(actions);
        }
    }

    pub(super) fn issue_commit_write(&mut self, actions: &mut Vec<Action>) {
        let m = self.meta.as_mut().expect("persistent");
        let half = m.journal_bytes();
        let base = m.sb.layout.journal.offset;
        let c = m.commit.as_mut().expect("a commit");
        c.writes_left = 2;
        c.write_err = None;
        let (at, len, buf) = (c.at, c.len, c.buf);
        // A FUA request is durable when it completes: so must the record holding its change be.
        // So must an intent, before the change it announces is made.
        let fua = c.waiters.iter().any(|w| w.fua) || !c.intents.is_empty();
        for copy in [0, half] {
            let io = self.new_io(IoOwner::Meta {
                kind: MetaIo::CommitWrite,
            });
            actions.push(Action::Write {
                io,
                dev: Dev::Cache,
                lba: Lba((base + copy + at) / 512),
                blocks: blocks(len),
                buf: BufRef::Meta { id: buf, offset: 0 },
                fua,
            });
        }
    }

    /// A cache flush that covered every record up to `seq` completed: lines whose clean or
    /// unmapped state those records hold may have their slots reused.
    pub(super) fn meta_durable(&mut self, seq: u64) {
        let m = self.meta.as_mut().expect("persistent");
        if seq <= m.durable_seq {
            return;
        }
        m.durable_seq = seq;
        loop {
            let m = self.meta.as_mut().expect("persistent");
            let Some(&(s, l)) = m.dd_queue.front() else {
                break;
            };
            if s > seq {
                break;
            }
            m.dd_queue.pop_front();
            if m.dd_wait.get(&l) != Some(&s) || m.queued.contains(&l) {
                continue;
            }
            m.dd_wait.remove(&l);
            let line = LineId(l);
            if self.map.is_mapped(line) {
                if self.state.dirty(line) == 0 {
                    self.lists.set_durable_dirty(line, false);
                }
            } else {
                m.limbo_len -= 1;
                self.lists.unlink(l);
                self.lists.push_back(self.free, l);
            }
        }
        self.wake_waiters = true;
    }

    /// Both copies of a commit's record were written (or one failed).
    pub(super) fn commit_written(&mut self, actions: &mut Vec<Action>) {
        let m = self.meta.as_mut().expect("persistent");
        if let Some(e) = m.commit.as_ref().and_then(|c| c.write_err) {
            return self.commit_failed(e, actions);
        }
        self.cache_flush.writes_done += 1;
        let m = self.meta.as_mut().expect("persistent");
        let c = m.commit.take().expect("a commit");
        m.head = c.at + c.len;
        m.used += c.skipped + c.len;
        m.live.push_back((c.seq, c.skipped + c.len));
        m.next_seq = c.seq + 1;
        m.last_written_seq = c.seq;
        m.counters.commits += 1;
        m.counters.commit_lines += c.lines.len() as u64;
        m.counters.journal_bytes += 2 * c.len;
        for &(l, dirty) in &c.lines {
            if dirty {
                m.dd_wait.remove(&l);
            } else {
                m.dd_wait.insert(l, c.seq);
                m.dd_queue.push_back((c.seq, l));
            }
        }
        m.free_buf(c.buf);
        self.release_waiters(c.waiters, None, actions);
        if !c.intents.is_empty() {
            // Written with FUA: durable.
            self.intents_durable(&c.intents, c.intent_gen, actions);
        }
    }

    /// A commit's flush or write failed: its lines go back on the queue and it is retried at the
    /// same place with the same sequence number (so replay never sees a gap); its waiters
    /// complete with the error — their data is in the cache, the metadata may not be.
    pub(super) fn commit_failed(&mut self, e: IoError, actions: &mut Vec<Action>) {
        let m = self.meta.as_mut().expect("persistent");
        let c = m.commit.take().expect("a commit");
        m.counters.errors += 1;
        for &(l, _) in &c.lines {
            m.queued.insert(l);
        }
        m.intents.commit_failed(&c.intents, c.intent_gen);
        m.free_buf(c.buf);
        m.retry_at = self.now.plus(Nanos(RETRY_NS));
        // Its lines are queued again, to be retried as soon as `retry_at` allows.
        m.commit_due = m.commit_due.min(self.now);
        self.release_waiters(c.waiters, Some(e), actions);
        if !c.intents.is_empty() {
            self.intents_failed(c.intent_gen, e, actions);
        }
    }
}
