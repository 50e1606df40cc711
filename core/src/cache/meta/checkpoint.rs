//! The metadata tasks, run one at a time in order: a checkpoint (every line's state in
//! fixed-size chunks to the other checkpoint region, a flush of the cache device and of the
//! cores it proves lines for, then the tables and the superblock that names it), a superblock
//! write with its tables, and the zeroing of the journal. A failed task starts over later; a
//! failed superblock write is tried again with the same contents. Part of the metadata
//! machinery (`meta.rs`).

use super::{CHUNKS_IN_FLIGHT, MetaIo, RECORD_ALIGN, RETRY_NS, StopCores, Task, blocks, pad};
use crate::cache::{Cache, IoOwner};
use crate::event::{Action, BufRef, Dev, IoError};
use crate::units::{Lba, LineId, Nanos};
use tiercache_format::checkpoint::{LineRecord, chunk_version, encode_chunk_record};
use tiercache_format::record::{self, RecordKind};
use tiercache_format::superblock::{
    CHECKPOINT_CHUNK_BYTES, CacheState, SUPERBLOCK_OFFSETS, Superblock, TABLES_BYTES,
    TABLES_OFFSETS, lines_per_chunk,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Zero,
    Chunks,
    ChunkFlush,
    Tables,
    TablesFlush,
    Super,
}

pub(super) struct TaskRun {
    task: Task,
    phase: Phase,
    in_flight: u32,
    failed: bool,
    next_chunk: u32,
    chunks: u32,
    /// Checkpoint: the journal sequence number replay starts from once this checkpoint is in
    /// force; the region it goes to.
    cp_seq: u64,
    cp_region: u8,
    /// The superblock being written.
    sb: Superblock,
    copy: usize,
    tables_gen: u64,
    /// Checkpoint: it may record lines as proven (no core flush failed since the last one).
    prove: bool,
}

impl Cache {
    pub(super) fn admin_step(&mut self, actions: &mut Vec<Action>) {
        let now = self.now;
        let m = self.meta.as_mut().expect("persistent");
        if m.run.is_some() && now < m.admin_retry_at {
            // A failed superblock write waits before it is tried again.
            return;
        }
        if m.run.is_none() {
            if now < m.admin_retry_at {
                return;
            }
            let Some(mut task) = m.tasks.pop_front() else {
                return;
            };
            // New tables (a core removed, say) must not be durable beside a checkpoint that
            // still proves lines they dropped while those lines' intents are not durable yet
            // (after a crash the lines could come back for a core that is gone, or for another
            // device given the same id): such a superblock write becomes a checkpoint, which
            // writes the tables with the state that dropped the lines.
            let intents_pending =
                m.intents.has_queued() || m.commit.as_ref().is_some_and(|c| !c.intents.is_empty());
            if intents_pending
                && task
                    == (Task::Superblock {
                        state: CacheState::Running,
                    })
            {
                task = Task::Checkpoint {
                    state: CacheState::Running,
                };
            }
            let copy = 1 - m.sb_copy;
            let mut sb = m.sb;
            sb.generation += 1;
            let lpc = lines_per_chunk(sb.line_size);
            let (phase, cp_seq, cp_region) = match task {
                Task::ZeroJournal => (Phase::Zero, 0, 0),
                Task::Superblock { state } => {
                    sb.state = state;
                    (Phase::Tables, 0, 0)
                }
                Task::Checkpoint { state } => {
                    sb.state = state;
                    let region = if sb.has_checkpoint {
                        1 - sb.checkpoint
                    } else {
                        0
                    };
                    (Phase::Chunks, m.next_seq, region)
                }
            };
            m.run = Some(TaskRun {
                task,
                phase,
                in_flight: 0,
                failed: false,
                next_chunk: 0,
                chunks: sb.lines.div_ceil(lpc),
                cp_seq,
                cp_region,
                sb,
                copy,
                tables_gen: m.tables_gen,
                prove: !m.intents.no_proof,
            });
        }
        self.admin_issue(actions);
    }

    fn admin_io(
        &mut self,
        actions: &mut Vec<Action>,
        buf: Option<u32>,
        a: impl FnOnce(crate::units::IoId) -> Action,
    ) {
        let io = self.new_io(IoOwner::Meta {
            kind: MetaIo::Admin { buf },
        });
        actions.push(a(io));
        self.meta
            .as_mut()
            .and_then(|m| m.run.as_mut())
            .expect("a task")
            .in_flight += 1;
    }

    /// Writes `data` (a metadata buffer) at byte `offset` of the cache device for the task.
    fn admin_write(&mut self, actions: &mut Vec<Action>, offset: u64, data: Vec<u8>, fua: bool) {
        let lba = Lba(offset / 512);
        let n = blocks(data.len() as u64);
        let id = self.meta.as_mut().expect("persistent").new_buf(data);
        self.admin_io(actions, Some(id), |io| Action::Write {
            io,
            dev: Dev::Cache,
            lba,
            blocks: n,
            buf: BufRef::Meta { id, offset: 0 },
            fua,
        });
    }

    /// Issues the IO(s) of the running task's current phase (its completion advances the phase).
    fn admin_issue(&mut self, actions: &mut Vec<Action>) {
        loop {
            let m = self.meta.as_mut().expect("persistent");
            let Some(run) = m.run.as_mut() else { return };
            if run.in_flight > 0 && run.phase != Phase::Chunks {
                return;
            }
            match run.phase {
                Phase::Zero => {
                    let j = m.sb.layout.journal;
                    self.admin_io(actions, None, |io| Action::WriteZeroes {
                        io,
                        dev: Dev::Cache,
                        lba: Lba(j.offset / 512),
                        blocks: blocks(j.bytes),
                        fua: false,
                    });
                    return;
                }
                Phase::Chunks => {
                    if run.next_chunk >= run.chunks {
                        if run.in_flight == 0 {
                            run.phase = Phase::ChunkFlush;
                            continue;
                        }
                        return;
                    }
                    if run.in_flight >= CHUNKS_IN_FLIGHT {
                        return;
                    }
                    let i = run.next_chunk;
                    run.next_chunk += 1;
                    let region = m.sb.layout.checkpoint[run.cp_region as usize];
                    let lpc = lines_per_chunk(m.sb.line_size);
                    let first = i * lpc;
                    let last = (first + lpc).min(m.sb.lines);
                    let (cp_seq, prove) = (run.cp_seq, run.prove);
                    let proven = self.intent_capture(first, last, prove);
                    let rec = encode_chunk_record(
                        first,
                        cp_seq,
                        last - first,
                        self.cfg.line_size.bytes() as u32,
                        chunk_version(&proven),
                        RECORD_ALIGN as usize,
                        // Inlined, so the record stays in registers: returned through memory,
                        // its 16-byte mask loads missed store forwarding and stalled (about a
                        // quarter of a 16M-line checkpoint's time).
                        #[inline(always)]
                        |i| {
                            let rec = self.line_record(LineId(first + i));
                            (rec, proven[i as usize])
                        },
                    );
                    debug_assert!(rec.len() as u64 <= CHECKPOINT_CHUNK_BYTES);
                    let at = region.offset + i as u64 * CHECKPOINT_CHUNK_BYTES;
                    self.admin_write(actions, at, rec, false);
                }
                Phase::ChunkFlush | Phase::TablesFlush => {
                    let cores = run.phase == Phase::ChunkFlush && run.prove;
                    self.admin_io(actions, None, |io| Action::Flush {
                        io,
                        dev: Dev::Cache,
                    });
                    if cores {
                        self.checkpoint_core_flushes(actions);
                    }
                    return;
                }
                Phase::Tables => {
                    let copy = run.copy;
                    let tables = self.tables_bytes();
                    self.admin_write(actions, TABLES_OFFSETS[copy], tables, false);
                    return;
                }
                Phase::Super => {
                    let (sb, copy) = (run.sb.encode(), run.copy);
                    self.admin_write(actions, SUPERBLOCK_OFFSETS[copy], sb, true);
                    return;
                }
            }
        }
    }

    pub(super) fn admin_io_done(
        &mut self,
        buf: Option<u32>,
        result: Result<(), IoError>,
        actions: &mut Vec<Action>,
    ) {
        let now = self.now;
        let m = self.meta.as_mut().expect("persistent");
        if let Some(id) = buf {
            m.free_buf(id);
        }
        let run = m.run.as_mut().expect("admin IO without a task");
        run.in_flight -= 1;
        if result.is_err() {
            run.failed = true;
        }
        if run.in_flight > 0 {
            return;
        }
        if run.failed && run.phase == Phase::Super {
            // The superblock write may have landed although it failed (a power cut or an
            // outage mid-write): what it names must stay intact, so only the superblock write
            // is tried again, later, with the same contents. (Starting a checkpoint over would
            // write its chunks into the region that superblock names.)
            run.failed = false;
            m.counters.errors += 1;
            m.admin_retry_at = now.plus(Nanos(RETRY_NS));
            return;
        }
        if run.failed {
            // Start the task over later; the superblock in force is untouched.
            let task = run.task;
            m.run = None;
            m.counters.errors += 1;
            m.tasks.push_front(task);
            m.admin_retry_at = now.plus(Nanos(RETRY_NS));
            return;
        }
        match run.phase {
            Phase::Zero => run.phase = Phase::Tables,
            Phase::Chunks => {}
            Phase::ChunkFlush => {
                // The chunks are durable: the superblock may now name them.
                run.sb.checkpoint = run.cp_region;
                run.sb.has_checkpoint = true;
                run.sb.journal_seq = run.cp_seq;
                run.phase = Phase::Tables;
            }
            Phase::Tables => run.phase = Phase::TablesFlush,
            Phase::TablesFlush => run.phase = Phase::Super,
            Phase::Super => {
                let run = m.run.take().expect("a task");
                if matches!(run.task, Task::Checkpoint { .. }) {
                    m.counters.checkpoints += 1;
                    if !run.prove {
                        // This one proved nothing; the next one tries again.
                        m.intents.no_proof = false;
                        m.intents.counters.unproven_checkpoints += 1;
                    }
                    let cp = run.cp_seq;
                    while m.live.front().is_some_and(|&(s, _)| s < cp) {
                        let (_, b) = m.live.pop_front().expect("non-empty");
                        m.used -= b;
                    }
                    // The journal has room again: a waiting commit may start.
                    m.no_room = false;
                }
                m.sb = run.sb;
                m.sb_copy = run.copy;
                m.counters.superblocks += 1;
                m.tables_durable = m.tables_durable.max(run.tables_gen);
                m.ready = true;
                if m.stopping && m.stop_cores == StopCores::Final && m.tasks.is_empty() {
                    m.stopped = true;
                }
            }
        }
        self.admin_issue(actions);
    }

    /// A checkpoint's flushes of every core with writes no flush covered yet, beside its
    /// chunks' cache flush (counted as IOs of the running task).
    fn checkpoint_core_flushes(&mut self, actions: &mut Vec<Action>) {
        let kind = |core, covers| MetaIo::CheckpointCoreFlush { core, covers };
        let n = self.flush_cores(kind, actions);
        self.meta
            .as_mut()
            .and_then(|m| m.run.as_mut())
            .expect("a task")
            .in_flight += n;
    }

    /// The persistent record of `line` now.
    #[inline(always)]
    pub(crate) fn line_record(&self, line: LineId) -> LineRecord {
        if !self.map.is_mapped(line) {
            return LineRecord::default();
        }
        let (c, cl) = self.map.position(line);
        LineRecord {
            core: Some(c.0 as u8),
            core_line: cl,
            class: self.lists.class(line),
            valid: self.state.valid(line),
            dirty: self.state.dirty(line),
        }
    }

    /// The configuration and core-table records, framed and padded.
    fn tables_bytes(&self) -> Vec<u8> {
        let mut out = record::encode(
            RecordKind::Config,
            &tiercache_format::tables::encode_config(&self.config_record()),
        );
        out.extend(record::encode(
            RecordKind::CoreTable,
            &tiercache_format::tables::encode_cores(&self.core_entries()),
        ));
        assert!(out.len() <= TABLES_BYTES, "tables over their area");
        pad(out)
    }
}
