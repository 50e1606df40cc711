//! Persistent metadata: the journal with group commit, checkpoints, and the superblock with its
//! tables. Active when [`crate::Config::persist`] is set; everything is still events in,
//! actions out — metadata writes are device writes whose source is a buffer the core encoded
//! ([`BufRef::Meta`]).
//!
//! What is persisted, and why that is enough (docs/SAFETY.md has the argument in full):
//! - **Dirty state is journaled.** A line whose persistent state may show dirty blocks carries
//!   the *durable-dirty* flag. Every change to such a line queues it; a *commit* captures the
//!   current state of every queued line (absolute records: mapping, class, valid and dirty
//!   masks, or "unmapped") into one journal record. A commit first flushes the cache device
//!   (so the data a record points at is durable before the record can be), then writes the
//!   record. A request whose completion changed such a line is acknowledged only once the commit
//!   holding its change is written: a lazy write is acknowledged when its data and the metadata
//!   that finds it are written, and durable at the next flush.
//! - **Slots are not reused while metadata may name them.** A durable-dirty line is never
//!   evicted, and when it is unmapped it waits in *limbo* (not on the free list) until a commit
//!   that captured it clean or unmapped is covered by a device flush. So after a crash a dirty
//!   record always finds its own data — the block holds the data of some write to it since the
//!   last flush, never another core line's.
//! - **Clean state is not journaled, but proven.** A checkpoint flags lines whose clean blocks
//!   it proves equal to the core, and a journal *write intent* for a line's region is made
//!   durable before the first change since that could break the proof (`intent.rs`). After a
//!   crash, clean blocks come back only for proven lines with no intent after their checkpoint;
//!   the others are dropped (a clean copy overwritten in place cannot be told from one that was
//!   not, and a wrong "clean" copy would flip-flop against the core). After a clean stop the
//!   final checkpoint holds every line, clean ones included: warm start.
//! - **Checkpoints** (fuzzy, while running) bound the journal: every line's current state is
//!   written in fixed-size chunks to the other checkpoint region, the device (and every core,
//!   for the proofs) is flushed, then
//!   the superblock flips to it with the journal's new start. Replaying the journal from that
//!   start over the checkpoint gives each line its newest journaled state.
//! - **The superblock** (two copies, alternating) is written after its tables (configuration
//!   and core table, beside each copy) and a flush, with FUA.
//!
//! Files: this one holds the metadata state, what the request path and management ask of it,
//! the upkeep after each event, the clean stop and the dispatch of metadata IO completions;
//! `meta/journal.rs` the group commit, `meta/checkpoint.rs` the tasks (checkpoint, superblock,
//! journal zeroing). They are child modules: the state's fields stay private to the three.

mod checkpoint;
mod journal;

use super::health::IoClass;
use super::{Cache, IoOwner};
use crate::config::Persist;
use crate::event::{Action, Dev, IoError, ReqError};
use crate::hash::{FxHashMap, FxHashSet};
use crate::lists::ListId;
use crate::units::{CoreId, LineId, Nanos, ReqId};
use checkpoint::TaskRun;
use journal::Commit;
use std::collections::VecDeque;
use tiercache_format::superblock::{CacheState, Superblock};

/// Journal records are padded to this (the largest sector size we support).
pub const RECORD_ALIGN: u64 = 4096;
/// Most lines captured by one commit (about 80 KiB of record at 64 KiB lines).
const COMMIT_LINES_MAX: usize = 1500;
/// Checkpoint chunk writes in flight at once.
const CHUNKS_IN_FLIGHT: u32 = 8;
/// Wait after a failed metadata IO before trying again.
const RETRY_NS: u64 = 100_000_000;
/// Longest a queued line waits for its commit when nobody needs the record sooner: changes of
/// requests answered before their record (writes that are not FUA) are group-committed, one
/// record and one device flush for every write in this window, instead of one each.
pub const COMMIT_DELAY_NS: u64 = 5_000_000;
/// Queued lines that start a commit at once (a record of about 24 KiB at 4 KiB lines).
const COMMIT_BATCH_LINES: usize = 1024;

/// What a metadata IO was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MetaIo {
    /// The flush before a commit's record write; `seq` is the newest record written at issue.
    CommitPreflush { seq: u64, covers: u64 },
    /// A commit's record write.
    CommitWrite,
    /// A flush that makes written records durable so limbo lines can be reused.
    JournalFlush { seq: u64, covers: u64 },
    /// An IO of the running admin task, and the buffer it wrote from.
    Admin { buf: Option<u32> },
    /// A clean stop's flush of a core that has writes no flush covered yet (`covers`: the
    /// core's completed writes at issue).
    StopCoreFlush { core: CoreId, covers: u64 },
    /// A checkpoint's flush of a core, after its chunks were captured: the lines it records as
    /// proven hold data the core has durably (`intent.rs`).
    CheckpointCoreFlush { core: CoreId, covers: u64 },
}

/// A clean stop's core flushes: the superblock may say `Clean` (clean lines equal to their
/// cores) only once every core write before it is durable on its core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum StopCores {
    /// Not started (or the stop not asked for).
    #[default]
    Idle,
    /// Flushes in flight; `failed`: one of them failed.
    Flushing { left: u32, failed: bool },
    /// The final checkpoint is queued: with state `Clean`, or `Running` when a core flush
    /// failed (the load then keeps dirty data only, as after a crash).
    Final,
}

/// A management task on the metadata, run one at a time in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Task {
    /// Zero the journal region (a new cache: no stale record may be replayed).
    ZeroJournal,
    /// Write the superblock (and its tables) with `state`.
    Superblock { state: CacheState },
    /// Write a checkpoint, then the superblock with `state`.
    Checkpoint { state: CacheState },
}

/// A finished request whose reply waits for a commit. It keeps its line locks until then, so
/// overlapping requests take effect and are acknowledged in the same order.
pub(crate) struct Waiter {
    pub(crate) req: ReqId,
    pub(crate) result: Result<(), ReqError>,
    pub(crate) lock: Option<(crate::units::CoreId, u64, u64, super::lock::LockKind)>,
    /// The request was FUA: the record holding its change must be durable when written.
    pub(crate) fua: bool,
    /// The client was answered already (a request that was not FUA and succeeded): only its
    /// locks wait for the record. A client flush waits for every such record
    /// ([`Cache::meta_flush_must_wait`]).
    pub(crate) replied: bool,
}

/// Counters of the metadata machinery.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaCounters {
    /// Journal records written.
    pub commits: u64,
    /// Line states captured by commits.
    pub commit_lines: u64,
    /// Journal bytes written (padded records).
    pub journal_bytes: u64,
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Superblock writes completed.
    pub superblocks: u64,
    /// Metadata IOs that failed (each retried).
    pub errors: u64,
    /// Lines that waited in limbo before reuse.
    pub limbo_lines: u64,
    /// Clean stops that ended with the superblock `Running` instead of `Clean` because a
    /// core flush failed (the next load recovers as after a crash: dirty lines only).
    pub stops_unclean: u64,
}

/// The metadata state of a persistent cache.
pub(crate) struct Meta {
    pub(crate) sb: Superblock,
    pub(crate) sb_copy: usize,
    /// Byte offset of the next record in the journal region.
    head: u64,
    pub(crate) next_seq: u64,
    /// Records replay still needs: (seq, bytes they hold in the region).
    live: VecDeque<(u64, u64)>,
    used: u64,
    pub(crate) queued: FxHashSet<u32>,
    waiters_next: Vec<Waiter>,
    /// When the queued lines (and parked requests) are committed even if nobody needs their
    /// record sooner: the first queued since the last commit took everything, plus
    /// [`COMMIT_DELAY_NS`]. `u64::MAX` when nothing waits.
    commit_due: Nanos,
    /// `commit_due` was set since the driver last asked ([`Cache::take_deadline_moved`]).
    due_moved: bool,
    /// Parked requests that are not answered yet (FUA writes, flushes, failures): their
    /// record is needed now.
    urgent: u32,
    /// Management waits for parked requests to be released: commit now.
    hurry: bool,
    /// The last commit found no room in the journal: it waits for a checkpoint, not for a
    /// deadline (so the deadline is not offered to the driver's timer meanwhile).
    no_room: bool,
    commit: Option<Commit>,
    retry_at: Nanos,
    last_written_seq: u64,
    durable_seq: u64,
    /// Lines captured without dirty blocks, waiting for their commit to be durable.
    dd_queue: VecDeque<(u64, u32)>,
    dd_wait: FxHashMap<u32, u64>,
    flush_in_flight: bool,
    pub(crate) limbo: ListId,
    pub(crate) limbo_len: u32,
    tasks: VecDeque<Task>,
    run: Option<TaskRun>,
    admin_retry_at: Nanos,
    bufs: Vec<Option<Vec<u8>>>,
    free_bufs: Vec<u32>,
    /// A line of the request being finished was queued: its reply waits for a commit.
    pub(crate) touched: bool,
    /// Table changes requested / made durable (generation counters).
    tables_gen: u64,
    tables_durable: u64,
    /// Requests are served (false until the first superblock or recovery checkpoint is done).
    pub(crate) ready: bool,
    /// A clean stop was asked for / is complete.
    pub(crate) stopping: bool,
    pub(crate) stopped: bool,
    pub(crate) stop_cores: StopCores,
    pub(crate) counters: MetaCounters,
    /// Write intents (`intent.rs`).
    pub(crate) intents: super::intent::Intents,
}

impl Meta {
    /// Metadata state for a cache whose device holds `sb` in copy `sb_copy`; journal
    /// sequence numbers continue at `next_seq`.
    pub(crate) fn new(p: &Persist, limbo: ListId, next_seq: u64) -> Meta {
        Meta {
            sb: p.superblock,
            sb_copy: p.superblock_copy,
            head: 0,
            next_seq,
            live: VecDeque::new(),
            used: 0,
            queued: FxHashSet::default(),
            waiters_next: Vec::new(),
            commit_due: Nanos(u64::MAX),
            due_moved: false,
            urgent: 0,
            hurry: false,
            no_room: false,
            commit: None,
            retry_at: Nanos(0),
            last_written_seq: 0,
            durable_seq: 0,
            dd_queue: VecDeque::new(),
            dd_wait: FxHashMap::default(),
            flush_in_flight: false,
            limbo,
            limbo_len: 0,
            tasks: VecDeque::new(),
            run: None,
            admin_retry_at: Nanos(0),
            bufs: Vec::new(),
            free_bufs: Vec::new(),
            touched: false,
            tables_gen: 0,
            tables_durable: 0,
            ready: false,
            stopping: false,
            stopped: false,
            stop_cores: StopCores::Idle,
            counters: MetaCounters::default(),
            intents: super::intent::Intents::new(p.superblock.lines, p.superblock.line_size),
        }
    }

    /// A line was queued or a request parked at `now`: the group commit is due by
    /// [`COMMIT_DELAY_NS`] from the first of them.
    #[inline]
    fn arm(&mut self, now: Nanos) {
        if self.commit_due.0 == u64::MAX {
            self.commit_due = now.plus(Nanos(COMMIT_DELAY_NS));
            self.due_moved = true;
        }
    }

    fn new_buf(&mut self, data: Vec<u8>) -> u32 {
        match self.free_bufs.pop() {
            Some(i) => {
                self.bufs[i as usize] = Some(data);
                i
            }
            None => {
                self.bufs.push(Some(data));
                (self.bufs.len() - 1) as u32
            }
        }
    }

    fn free_buf(&mut self, id: u32) {
        self.bufs[id as usize] = None;
        self.free_bufs.push(id);
    }

    /// Queues a task (a superblock write right after an identical queued one is redundant).
    pub(crate) fn push_task(&mut self, t: Task) {
        if matches!(t, Task::Superblock { .. }) && self.tasks.back() == Some(&t) {
            return;
        }
        self.tasks.push_back(t);
    }

    /// Drops queued tasks and table changes (loading: what is on the device is the truth).
    pub(crate) fn reset_tasks(&mut self) {
        self.tasks.clear();
        self.tables_durable = self.tables_gen;
    }

    /// Whether a commit, a durability flush or a task is pending or running.
    pub(crate) fn has_work(&self) -> bool {
        !self.queued.is_empty()
            || self.intents.has_work()
            || !self.waiters_next.is_empty()
            || self.commit.is_some()
            || !self.dd_queue.is_empty()
            || !self.tasks.is_empty()
            || self.run.is_some()
    }

    /// Capacity of the journal: each record is written twice, at the same offset in each half
    /// of the region, so damage to one copy — even of the newest record — is detected and
    /// repaired from the other (docs/FORMAT.md).
    fn journal_bytes(&self) -> u64 {
        journal_half(self.sb.layout.journal.bytes)
    }
}

/// Bytes of each half (primary, mirror) of a journal region of `bytes`.
pub fn journal_half(bytes: u64) -> u64 {
    bytes / 2 / RECORD_ALIGN * RECORD_ALIGN
}

/// Pads `v` with zeros to a multiple of [`RECORD_ALIGN`].
fn pad(mut v: Vec<u8>) -> Vec<u8> {
    let n = (v.len() as u64).div_ceil(RECORD_ALIGN) * RECORD_ALIGN;
    v.resize(n as usize, 0);
    v
}

fn blocks(bytes: u64) -> u32 {
    u32::try_from(bytes / 512).expect("metadata IO fits a u32 of blocks")
}

impl Cache {
    /// The bytes of metadata buffer `id` (the source of a [`BufRef::Meta`] write).
    ///
    /// # Panics
    /// If no such buffer is live (a driver bug: buffers live until their write completes).
    pub fn meta_buf(&self, id: u32) -> &[u8] {
        self.meta
            .as_ref()
            .and_then(|m| m.bufs.get(id as usize))
            .and_then(|b| b.as_deref())
            .expect("live metadata buffer")
    }

    /// Whether the cache serves requests: a persistent cache first writes its superblock (new
    /// cache, load) or a checkpoint (after a crash). Always true without persistence.
    pub fn is_ready(&self) -> bool {
        self.meta.as_ref().is_none_or(|m| m.ready)
    }

    /// Whether every table change (cores, mode, parameters, IO classes) made so far is durable
    /// in the superblock's tables. Management commands wait for this before they report success.
    pub fn tables_durable(&self) -> bool {
        self.meta
            .as_ref()
            .is_none_or(|m| m.tables_durable >= m.tables_gen)
    }

    /// Counters of the metadata machinery (zero without persistence).
    pub fn meta_counters(&self) -> MetaCounters {
        self.meta.as_ref().map(|m| m.counters).unwrap_or_default()
    }

    /// The superblock in force (persistent caches).
    pub fn superblock(&self) -> Option<&Superblock> {
        self.meta.as_ref().map(|m| &m.sb)
    }

    /// Journal bytes replay would read now, and the region's size.
    pub fn journal_fill(&self) -> Option<(u64, u64)> {
        self.meta.as_ref().map(|m| (m.used, m.journal_bytes()))
    }

    /// Begins a clean stop: new requests are refused; once nothing is in flight a final
    /// checkpoint is written and the superblock marked clean ([`Cache::is_stopped`]). Dirty data
    /// stays dirty (persisted) unless the caller ran writeback first.
    pub fn stop(&mut self) {
        match self.meta.as_mut() {
            Some(m) => m.stopping = true,
            None => self.stopped_volatile = true,
        }
    }

    /// Whether a clean stop has completed.
    pub fn is_stopped(&self) -> bool {
        match self.meta.as_ref() {
            Some(m) => m.stopped,
            None => self.stopped_volatile && self.is_idle(),
        }
    }

    /// Whether new requests are refused because the cache is stopping or not ready yet.
    pub(crate) fn refusing(&self) -> bool {
        self.stopped_volatile || self.meta.as_ref().is_some_and(|m| !m.ready || m.stopping)
    }

    /// A management change that the tables record: schedule a superblock write.
    pub(crate) fn tables_changed(&mut self) {
        if let Some(m) = self.meta.as_mut() {
            m.tables_gen += 1;
            m.push_task(Task::Superblock {
                state: CacheState::Running,
            });
        }
    }

    /// Whether `line`'s state is the one its last record (written or being written) holds:
    /// it is durable-dirty and not queued. Called by a write that holds the line's lock and
    /// changed neither its valid nor its dirty blocks: any request that changed the line
    /// earlier kept the lock until its record's commit ended, so the journal (or the commit
    /// in flight, which a later flush waits for) already has this state.
    #[inline]
    pub(crate) fn meta_recorded(&self, line: LineId) -> bool {
        self.meta
            .as_ref()
            .is_some_and(|m| self.lists.durable_dirty(line) && !m.queued.contains(&line.0))
    }

    /// Called after a line's state changed: a line with dirty blocks becomes durable-dirty,
    /// and a durable-dirty line is queued for the next commit.
    #[inline]
    pub(crate) fn meta_note(&mut self, line: LineId) {
        let now = self.now;
        let Some(m) = self.meta.as_mut() else { return };
        if self.state.dirty(line) != 0 {
            self.lists.set_durable_dirty(line, true);
        }
        if self.lists.durable_dirty(line) {
            m.queued.insert(line.0);
            m.touched = true;
            m.arm(now);
        }
    }

    /// Where an unmapped line goes: the free list, or limbo if metadata may still name it.
    /// Returns true if it went to limbo (the caller must not put it on the free list).
    pub(crate) fn meta_limbo(&mut self, line: LineId, durable_dirty: bool) -> bool {
        let Some(m) = self.meta.as_mut() else {
            return false;
        };
        if !durable_dirty {
            return false;
        }
        self.lists.push_back(m.limbo, line.0);
        m.limbo_len += 1;
        m.counters.limbo_lines += 1;
        m.queued.insert(line.0);
        m.touched = true;
        m.arm(self.now);
        true
    }

    /// Whether the request being finished must wait for a commit (its completion queued a
    /// line); clears the mark.
    pub(crate) fn meta_must_wait(&mut self) -> bool {
        self.meta
            .as_mut()
            .is_some_and(|m| std::mem::take(&mut m.touched))
    }

    /// Whether requests of `core` that finished still wait for their commit (they hold their
    /// line locks, and management of the core waits for them: [`Cache::commit_soon`]).
    pub fn parked_on(&self, core: CoreId) -> bool {
        self.meta.as_ref().is_some_and(|m| {
            m.waiters_next
                .iter()
                .chain(m.commit.iter().flat_map(|c| c.waiters.iter()))
                .any(|w| w.lock.is_some_and(|l| l.0 == core))
        })
    }

    /// Whether a client flush that has flushed the devices must still wait for a commit:
    /// changes of requests answered before their record (or of records that failed) are
    /// queued or being written. It then waits as a FUA request does, for a record written
    /// with FUA after a device flush, by which every earlier record and data write is durable.
    pub(crate) fn meta_flush_must_wait(&self) -> bool {
        self.meta.as_ref().is_some_and(|m| {
            !m.queued.is_empty() || m.commit.is_some() || m.waiters_next.iter().any(|w| w.replied)
        })
    }

    /// Parks a finished request until the next commit is written. One not answered yet (a
    /// FUA write, a flush, a failure) makes the commit start at once; the others wait for the
    /// group commit ([`COMMIT_DELAY_NS`]).
    pub(crate) fn meta_park(&mut self, w: Waiter) {
        let now = self.now;
        let m = self.meta.as_mut().expect("persistent");
        if !w.replied {
            m.urgent += 1;
        }
        m.arm(now);
        m.waiters_next.push(w);
    }

    /// Asks for the next commit now rather than at its group-commit deadline (management
    /// waiting for parked requests to release their locks).
    pub fn commit_soon(&mut self) {
        if let Some(m) = self.meta.as_mut() {
            m.hurry = true;
        }
    }

    /// Whether the group-commit deadline was set since the last call ([`Cache::next_deadline`]
    /// may now be earlier than a driver's timer): a driver whose timer sleeps re-reads it.
    pub fn take_deadline_moved(&mut self) -> bool {
        self.meta
            .as_mut()
            .is_some_and(|m| std::mem::take(&mut m.due_moved))
    }

    /// The group-commit deadline, if a commit is waiting for it.
    pub(crate) fn commit_deadline(&self) -> Option<Nanos> {
        self.meta
            .as_ref()
            .filter(|m| m.ready && m.commit.is_none() && !m.no_room && m.commit_due.0 != u64::MAX)
            .map(|m| m.commit_due.max(m.retry_at))
    }

    /// Metadata upkeep after each event: start a commit, a durability flush, the next admin
    /// step, a checkpoint when the journal is half full, the final checkpoint of a stop.
    pub(crate) fn meta_maintain(&mut self, actions: &mut Vec<Action>) {
        let Some(m) = self.meta.as_mut() else { return };
        m.touched = false;
        if m.ready && m.commit.is_none() && self.now >= m.retry_at {
            let pending =
                !m.queued.is_empty() || !m.waiters_next.is_empty() || m.intents.has_queued();
            // A commit starts when someone needs its record: a FUA write or a flush parked, an
            // intent (its write waits), a request waiting for a lock a parked request holds (any
            // lock wait: cheap to check, rarely wrong), limbo lines (their slots), a stop or
            // management; or when the batch is full or its deadline has come.
            let due = m.urgent > 0
                || m.intents.has_queued()
                || m.hurry
                || m.stopping
                || m.limbo_len > 0
                || m.queued.len() >= COMMIT_BATCH_LINES
                || self.now >= m.commit_due
                || !self.waits.is_empty();
            if !pending {
                // Nothing waits: no deadline to offer the driver's timer.
                m.commit_due = Nanos(u64::MAX);
            }
            if pending && due {
                self.start_commit(actions);
            } else if !m.dd_queue.is_empty() && !m.flush_in_flight {
                let m = self.meta.as_mut().expect("persistent");
                m.flush_in_flight = true;
                let seq = m.last_written_seq;
                let covers = self.cache_flush.writes_done;
                let io = self.new_io(IoOwner::Meta {
                    kind: MetaIo::JournalFlush { seq, covers },
                });
                actions.push(Action::Flush {
                    io,
                    dev: Dev::Cache,
                });
            }
        }
        let m = self.meta.as_mut().expect("persistent");
        if m.ready
            && m.used * 2 > m.journal_bytes()
            && m.run.is_none()
            && !m.tasks.iter().any(|t| matches!(t, Task::Checkpoint { .. }))
        {
            m.push_task(Task::Checkpoint {
                state: CacheState::Running,
            });
        }
        if m.stopping
            && !m.stopped
            && m.run.is_none()
            && m.tasks.is_empty()
            && m.commit.is_none()
            && m.queued.is_empty()
            && !m.intents.has_queued()
            && m.waiters_next.is_empty()
            && self.reqs.is_empty()
            && self.jobs.is_empty()
        {
            self.stop_step(actions);
        }
        self.admin_step(actions);
    }

    /// Flushes every core with writes no flush covered yet, each IO a metadata IO of `kind`
    /// (given the core and its completed writes: what the flush covers). Returns how many.
    fn flush_cores(&mut self, kind: fn(CoreId, u64) -> MetaIo, actions: &mut Vec<Action>) -> u32 {
        let due: Vec<(CoreId, u64)> = self
            .cores
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let c = c.as_ref()?;
                c.flush
                    .needs_flush()
                    .then_some((CoreId(i as u16), c.flush.writes_done))
            })
            .collect();
        for &(core, covers) in &due {
            let io = self.new_io(IoOwner::Meta {
                kind: kind(core, covers),
            });
            actions.push(Action::Flush {
                io,
                dev: Dev::Core(core),
            });
        }
        due.len() as u32
    }

    /// The clean stop, once idle: flush every core with writes no flush covered (a
    /// write-through write, a trim passed down), then the final checkpoint and superblock —
    /// `Clean` only if those flushes succeeded. Without the flushes a power cut after the stop
    /// could leave a core older than the clean copy the warm load serves, and the core's data
    /// would come back once the line is evicted (a flip-flop).
    fn stop_step(&mut self, actions: &mut Vec<Action>) {
        let m = self.meta.as_mut().expect("persistent");
        match m.stop_cores {
            StopCores::Idle => {
                let kind = |core, covers| MetaIo::StopCoreFlush { core, covers };
                let left = self.flush_cores(kind, actions);
                let m = self.meta.as_mut().expect("persistent");
                m.stop_cores = StopCores::Flushing {
                    left,
                    failed: false,
                };
                self.stop_step(actions);
            }
            StopCores::Flushing { left: 0, failed } => {
                m.stop_cores = StopCores::Final;
                m.counters.stops_unclean += failed as u64;
                m.push_task(Task::Checkpoint {
                    state: if failed {
                        CacheState::Running
                    } else {
                        CacheState::Clean
                    },
                });
            }
            StopCores::Flushing { .. } | StopCores::Final => {}
        }
    }

    /// A metadata IO completed.
    pub(crate) fn meta_io_done(
        &mut self,
        kind: MetaIo,
        result: Result<(), IoError>,
        actions: &mut Vec<Action>,
    ) {
        if let Err(e) = result {
            // A metadata IO is a cache device IO: its failure is a cache device fault.
            let class = match kind {
                MetaIo::CommitPreflush { .. } | MetaIo::JournalFlush { .. } => IoClass::Flush,
                MetaIo::CommitWrite | MetaIo::Admin { .. } => IoClass::Write,
                MetaIo::StopCoreFlush { core, .. } => {
                    // A core's flush: a core device fault.
                    self.counters.core_errors += 1;
                    self.note_core_error(core, IoClass::Flush, e, false);
                    return self.stop_core_flushed(core, None);
                }
                MetaIo::CheckpointCoreFlush { core, .. } => {
                    // The checkpoint must not prove lines of this core: it starts over
                    // (later) proving nothing.
                    self.counters.core_errors += 1;
                    self.note_core_error(core, IoClass::Flush, e, false);
                    self.meta.as_mut().expect("persistent").intents.no_proof = true;
                    return self.admin_io_done(None, result, actions);
                }
            };
            self.counters.cache_errors += 1;
            self.note_cache_error(class, e);
        }
        match kind {
            MetaIo::CommitPreflush { seq, covers } => match result {
                Ok(()) => {
                    self.cache_flush.durable_upto = self.cache_flush.durable_upto.max(covers);
                    self.meta_durable(seq);
                    self.issue_commit_write(actions);
                }
                Err(e) => self.commit_failed(e, actions),
            },
            MetaIo::CommitWrite => {
                let m = self.meta.as_mut().expect("persistent");
                let c = m.commit.as_mut().expect("a commit");
                c.writes_left -= 1;
                if let Err(e) = result {
                    c.write_err = Some(e);
                }
                if c.writes_left > 0 {
                    return;
                }
                self.commit_written(actions);
            }
            MetaIo::JournalFlush { seq, covers } => {
                let m = self.meta.as_mut().expect("persistent");
                m.flush_in_flight = false;
                if result.is_ok() {
                    self.cache_flush.durable_upto = self.cache_flush.durable_upto.max(covers);
                    self.meta_durable(seq);
                } else {
                    m.counters.errors += 1;
                    m.retry_at = self.now.plus(Nanos(RETRY_NS));
                }
            }
            MetaIo::Admin { buf } => self.admin_io_done(buf, result, actions),
            MetaIo::StopCoreFlush { core, covers } => self.stop_core_flushed(core, Some(covers)),
            MetaIo::CheckpointCoreFlush { core, covers } => {
                if let Some(c) = self.cores.get_mut(core.0 as usize).and_then(|c| c.as_mut()) {
                    c.flush.durable_upto = c.flush.durable_upto.max(covers);
                }
                self.note_core_ok(core);
                self.admin_io_done(None, result, actions);
            }
        }
    }

    /// A clean stop's core flush ended (`covers`: `None` when it failed).
    fn stop_core_flushed(&mut self, core: CoreId, covers: Option<u64>) {
        if let Some(covers) = covers {
            if let Some(c) = self.cores.get_mut(core.0 as usize).and_then(|c| c.as_mut()) {
                c.flush.durable_upto = c.flush.durable_upto.max(covers);
            }
            self.note_core_ok(core);
        }
        let m = self.meta.as_mut().expect("persistent");
        if let StopCores::Flushing { left, failed } = &mut m.stop_cores {
            *left -= 1;
            *failed |= covers.is_none();
        }
    }
}
