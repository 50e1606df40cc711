//! The cache: one owner of all state, driven by [`Cache::apply`].
//!
//! `apply(now, event, actions)` handles one event, then runs *maintenance* (start throttled
//! writes whose time has come, retry requests waiting for locks, run the cleaner, finish a mode
//! switch), then, in test builds and with `strict-asserts`, checks every invariant. Nothing in
//! here blocks or awaits: multi-step work (a request's IO phases, a writeback job) is an
//! explicit state kept in [`request::Request`] and [`writeback::Job`].
//!
//! Files: `request.rs` (client requests: types, arrival, flushes, completion), `admit.rs`
//! (their lock waits), `read.rs` (reads), `write.rs` (writes, write-zeroes, trims), `issue.rs`
//! (a request's device IOs), `writeback.rs` (the cleaner's jobs), `alloc.rs` (line allocation
//! and eviction by IO class), `lock.rs` (line locks), `mgmt.rs` (cores, modes, parameters, IO
//! classes), `check.rs` (invariants).
//!
//! Cost of the pattern: every multi-step operation is a hand-written state machine, and every
//! IO completion must find its owner through [`Cache::ios`].

mod admit;
mod alloc;
mod check;
pub mod health;
mod intent;
mod issue;
mod load;
pub mod lock;
mod meta;
mod mgmt;
mod read;
mod request;
mod tables;
mod wait;
mod write;
mod writeback;

use crate::config::Config;
use crate::event::{Action, Dev, Event, IoError};
use crate::hash::FxHashMap;
use crate::lists::{ListArena, ListId};
use crate::map::Mapping;
use crate::mode::CacheMode;
use crate::policy::cleaning::Cleaning;
use crate::policy::cleaning::rate::RateController;
use crate::policy::cutoff::SeqCutoff;
use crate::policy::eviction::Eviction;
use crate::policy::ioclass::IoClassTable;
use crate::policy::promotion::Promotion;
use crate::policy::{IO_CLASSES_MAX, LineView, position_key};
use crate::state::LineStates;
use crate::stats::{CacheCounters, ReqCounters};
use crate::units::{CoreId, IoId, Lba, LineId, Nanos, ReqId};
use lock::{LockTable, lock_key};

pub use health::{
    CoreFaults, DeviceErrors, FaultCounters, FaultParams, Health, HealthState, Problem,
    WritebackFailure, WritebackFaults, WritebackStatus,
};
pub use intent::IntentCounters;
pub use load::{LoadReport, journal_needed, open, read_superblock, read_tables, scan_journal};
pub use meta::journal_half;
pub use meta::{COMMIT_DELAY_NS, MetaCounters, RECORD_ALIGN};
pub use mgmt::MgmtError;
pub use request::Request;

/// A core attached to the cache.
pub struct CoreState {
    /// Size in blocks.
    pub size_blocks: u64,
    /// Sequential cutoff detector and parameters.
    pub cutoff: SeqCutoff,
    /// Request counters.
    pub counters: ReqCounters,
    /// Flush bookkeeping for this core's device.
    pub flush: FlushState,
    /// What the core table records about it beyond its size (identity, export name); set by
    /// the driver with [`Cache::set_core_record`].
    pub record: Option<CoreRecord>,
    /// Mapped lines of this core with dirty data.
    pub(crate) dirty_lines: u32,
    /// Device errors and writeback failures ([`Cache::core_faults`]).
    pub(crate) faults: CoreFaults,
}

/// A core's identity and export name, as the persistent core table keeps them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreRecord {
    /// How the core device is recognised.
    pub identity: tiercache_format::tables::CoreIdentity,
    /// The NBD export name.
    pub export_name: String,
    /// The device string it was attached with (empty when unknown), for reattaching at load.
    pub device: String,
}

/// What a device has been asked to make durable.
#[derive(Clone, Copy, Debug, Default)]
pub struct FlushState {
    /// Writes completed on the device that a flush must cover (counted, not named).
    pub writes_done: u64,
    /// `writes_done` as of the last device flush that completed successfully.
    pub durable_upto: u64,
}

impl FlushState {
    /// Whether some completed write is not yet covered by a completed flush.
    pub fn needs_flush(&self) -> bool {
        self.writes_done > self.durable_upto
    }
}

/// Who is waiting for a device IO.
#[derive(Clone, Copy, Debug)]
pub(crate) enum IoOwner {
    /// A client request.
    Req { req: ReqId, kind: IoKind },
    /// A writeback job.
    Wb { job: u32, kind: WbIo },
    /// The metadata machinery (journal, checkpoint, superblock).
    Meta { kind: meta::MetaIo },
    /// A flush probing a failing cache device (`health.rs`).
    Probe,
}

/// The IOs in flight, by id. An id is a slot index, reused once its IO has completed (a driver
/// sees each id in exactly one action and gives it back in exactly one `IoDone`), so issuing and
/// completing an IO costs no hashing.
#[derive(Debug, Default)]
pub(crate) struct IoTable {
    slots: Vec<Option<IoOwner>>,
    free: Vec<u32>,
    live: usize,
}

impl IoTable {
    fn insert(&mut self, owner: IoOwner) -> IoId {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(owner);
                IoId(i as u64)
            }
            None => {
                self.slots.push(Some(owner));
                IoId((self.slots.len() - 1) as u64)
            }
        }
    }

    fn remove(&mut self, io: &IoId) -> Option<IoOwner> {
        let owner = self.slots.get_mut(usize::try_from(io.0).ok()?)?.take()?;
        self.free.push(io.0 as u32);
        self.live -= 1;
        Some(owner)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &IoOwner> {
        self.slots.iter().flatten()
    }

    fn get(&self, io: IoId) -> Option<&IoOwner> {
        self.slots.get(usize::try_from(io.0).ok()?)?.as_ref()
    }
}

/// What a request's IO was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoKind {
    CacheRead,
    CoreRead,
    CacheWrite,
    CoreWrite,
    /// A device flush; `covers` is the device's `writes_done` when it was issued.
    Flush {
        dev: Dev,
        covers: u64,
    },
}

/// What a writeback job's IO was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WbIo {
    CacheRead { extent: u32 },
    CoreWrite { extent: u32 },
    CoreFlush { core: CoreId, covers: u64 },
}

/// The cache core. See the module docs.
pub struct Cache {
    pub(crate) cfg: Config,
    /// Events applied (invariant-check sampling; read only in builds with the checks).
    #[cfg_attr(not(any(test, feature = "strict-asserts")), allow(dead_code))]
    events_applied: u64,
    #[cfg_attr(not(any(test, feature = "strict-asserts")), allow(dead_code))]
    check_every: u64,
    pub(crate) bpl: u32,
    pub(crate) shift: u32,
    /// Current mode (reads follow it).
    pub(crate) mode: CacheMode,
    /// Set while leaving a lazy mode: writes already follow it; `mode` becomes it once every
    /// dirty line is written back.
    pub(crate) target_mode: Option<CacheMode>,
    pub(crate) map: Mapping,
    pub(crate) state: LineStates,
    pub(crate) lists: ListArena,
    /// Unmapped lines.
    pub(crate) free: ListId,
    pub(crate) eviction: Box<dyn Eviction>,
    pub(crate) promotion: Box<dyn Promotion>,
    pub(crate) cleaning: Box<dyn Cleaning>,
    pub(crate) rate: RateController,
    pub(crate) classes: IoClassTable,
    /// Mapped lines per IO class.
    pub(crate) class_lines: [u32; IO_CLASSES_MAX],
    /// Counters per IO class.
    pub(crate) class_counters: [ReqCounters; IO_CLASSES_MAX],
    /// Eviction order of classes for a requester: least important first (pinned excluded).
    pub(crate) evict_order: Vec<u8>,
    pub(crate) cores: Vec<Option<CoreState>>,
    pub(crate) locks: LockTable,
    pub(crate) reqs: FxHashMap<ReqId, Box<Request>>,
    /// Boxes of finished requests, reused by new ones (see `on_request`; the boxes are the
    /// point, so clippy's advice to store the requests inline does not apply).
    #[allow(clippy::vec_box)]
    pub(crate) req_pool: Vec<Box<Request>>,
    /// Requests waiting for locks, in arrival order (`wait.rs`).
    pub(crate) waits: wait::WaitQueues,
    /// A retry's scratch: released keys, and the requests to look at in queue order.
    pub(crate) wait_keys: Vec<u64>,
    pub(crate) wait_work: std::collections::BinaryHeap<std::cmp::Reverse<(u64, ReqId)>>,
    /// Writes delayed by the rate controller: (release time, request), unsorted (few).
    pub(crate) throttled: Vec<(Nanos, ReqId)>,
    pub(crate) ios: IoTable,
    pub(crate) jobs: FxHashMap<u32, writeback::Job>,
    pub(crate) next_job: u32,
    pub(crate) free_slots: Vec<u32>,
    /// When the cleaning policy wants to be asked again.
    pub(crate) cleaner_next: Nanos,
    /// A `writeback` command is running: clean everything.
    pub(crate) force_clean: bool,
    /// Lines to clean regardless of policy because an allocation failed.
    pub(crate) ondemand_clean: u32,
    /// Device faults: counters, backoffs, the cache device's bypass (`health.rs`).
    pub(crate) faults: health::Faults,
    /// Mapped lines with at least one dirty block.
    pub(crate) dirty_lines: u32,
    /// Flush bookkeeping for the cache device.
    pub(crate) cache_flush: FlushState,
    /// A lock was released or a writeback finished since waiting requests were last retried.
    pub(crate) wake_waiters: bool,
    pub(crate) counters: CacheCounters,
    pub(crate) now: Nanos,
    /// Scratch for the cleaner's picks.
    pub(crate) pick_buf: Vec<LineId>,
    /// Spare `parts` vectors of finished requests, reused so the hot path does not allocate.
    pub(crate) parts_pool: Vec<Vec<request::Part>>,
    /// Scratch for assembling device IOs.
    pub(crate) runs_buf: Vec<issue::Run>,
    /// Persistent metadata, if the cache has any.
    pub(crate) meta: Option<meta::Meta>,
    /// A cache without persistence was stopped.
    pub(crate) stopped_volatile: bool,
    #[cfg(feature = "canary-broken-eviction")]
    pub(crate) canary_hand: u32,
}

/// What the policies may see of the cache's lines.
pub(crate) struct View<'a> {
    pub(crate) map: &'a Mapping,
    pub(crate) locks: &'a LockTable,
}

impl LineView for View<'_> {
    #[inline]
    fn busy(&self, line: LineId) -> bool {
        if !self.map.is_mapped(line) {
            return false;
        }
        let (c, cl) = self.map.position(line);
        self.locks.busy(lock_key(c, cl))
    }
    #[inline]
    fn evictable(&self, lists: &ListArena, line: LineId) -> bool {
        !lists.durable_dirty(line) && !self.busy(line)
    }
    #[inline]
    fn position(&self, line: LineId) -> (CoreId, u64) {
        self.map.position(line)
    }
    #[inline]
    fn key(&self, line: LineId) -> u64 {
        let (c, cl) = self.map.position(line);
        position_key(c, cl)
    }
}

impl Cache {
    /// A new, empty cache with no cores.
    pub fn new(cfg: Config) -> Result<Cache, String> {
        cfg.validate()?;
        let lines = cfg.lines;
        let bpl = cfg.line_size.blocks();
        let mut lists = ListArena::new(lines);
        let free = lists.new_list();
        for l in 0..lines {
            lists.push_back(free, l);
        }
        let eviction = crate::policy::eviction::build(cfg.eviction, &mut lists, lines);
        let cleaning =
            crate::policy::cleaning::build(cfg.cleaning, cfg.alru, cfg.acp, &mut lists, bpl);
        let promotion = crate::policy::promotion::build(cfg.promotion, cfg.nhit, lines);
        let rate = RateController::new(cfg.rate);
        let mut cache = Cache {
            bpl,
            shift: cfg.line_size.blocks_shift(),
            mode: cfg.mode,
            target_mode: None,
            map: Mapping::new(lines),
            state: LineStates::new(lines, bpl),
            lists,
            free,
            eviction,
            promotion,
            cleaning,
            rate,
            classes: IoClassTable::default_table(),
            class_lines: [0; IO_CLASSES_MAX],
            class_counters: [ReqCounters::default(); IO_CLASSES_MAX],
            evict_order: Vec::new(),
            cores: Vec::new(),
            locks: LockTable::default(),
            reqs: FxHashMap::default(),
            req_pool: Vec::new(),
            waits: wait::WaitQueues::default(),
            wait_keys: Vec::new(),
            wait_work: std::collections::BinaryHeap::new(),
            throttled: Vec::new(),
            ios: IoTable::default(),
            jobs: FxHashMap::default(),
            next_job: 0,
            free_slots: (0..cfg.pool_slots).rev().collect(),
            cleaner_next: Nanos(0),
            force_clean: false,
            ondemand_clean: 0,
            faults: health::Faults::default(),
            dirty_lines: 0,
            cache_flush: FlushState::default(),
            wake_waiters: false,
            counters: CacheCounters::default(),
            now: Nanos(0),
            pick_buf: Vec::new(),
            parts_pool: Vec::new(),
            runs_buf: Vec::new(),
            meta: None,
            stopped_volatile: false,
            #[cfg(feature = "canary-broken-eviction")]
            canary_hand: 0,
            cfg,
            events_applied: 0,
            check_every: 1,
        };
        cache.rebuild_evict_order();
        if let Some(p) = cache.cfg.persist {
            let limbo = cache.lists.new_list();
            let mut m = meta::Meta::new(&p, limbo, p.superblock.journal_seq);
            if p.superblock.generation == 0 {
                // A new cache: zero the journal, write the first superblock, then serve.
                m.push_task(meta::Task::ZeroJournal);
            }
            cache.meta = Some(m);
        }
        Ok(cache)
    }

    /// Handles one event at time `now`, appending what the driver must do to `actions`.
    ///
    /// `now` must not go backwards. Every [`Action`] that is an IO must later come back as
    /// exactly one [`Event::IoDone`].
    pub fn apply(&mut self, now: Nanos, event: Event, actions: &mut Vec<Action>) {
        debug_assert!(now >= self.now, "time went backwards");
        self.now = self.now.max(now);
        match event {
            Event::IoDone { io, result } => self.on_io_done(io, result, actions),
            Event::Tick => {}
            other => self.on_request(other, actions),
        }
        self.maintain(actions);
        #[cfg(any(test, feature = "strict-asserts"))]
        {
            self.events_applied += 1;
            if self.events_applied.is_multiple_of(self.check_every) {
                self.check_invariants();
            }
        }
    }

    /// With invariant checks compiled in (tests, `strict-asserts`), check only every `n`th event
    /// (default 1). For long measurement runs over big caches, where an O(lines) check after
    /// every event would dominate; correctness tests keep the default.
    pub fn set_invariant_check_every(&mut self, n: u64) {
        self.check_every = n.max(1);
    }

    /// The earliest time at which the cache wants an [`Event::Tick`] even if nothing else
    /// happens (cleaner wake-up, throttled writes, a group commit). `None`: only when
    /// something happens. When [`Cache::take_deadline_moved`] says so, it may have moved
    /// earlier than the driver's last reading.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let mut t: Option<Nanos> = self.throttled.iter().map(|&(t, _)| t).min();
        // When the cleaner cannot start a job until a running one frees slots, that is an
        // event of its own: no deadline.
        if self.dirty_lines > 0 && self.cleaner_can_start() {
            let c = self.cleaner_next.max(self.cleaner_blocked_until());
            if c.0 != u64::MAX {
                t = Some(t.map_or(c, |x| x.min(c)));
            }
        }
        if let Some(p) = self.faults_deadline() {
            t = Some(t.map_or(p, |x| x.min(p)));
        }
        if let Some(c) = self.commit_deadline() {
            t = Some(t.map_or(c, |x| x.min(c)));
        }
        t
    }

    fn on_io_done(&mut self, io: IoId, result: Result<(), IoError>, actions: &mut Vec<Action>) {
        let owner = self
            .ios
            .remove(&io)
            .expect("completion for an IO the cache did not issue");
        match owner {
            IoOwner::Req { req, kind } => self.req_io_done(req, kind, result, actions),
            IoOwner::Wb { job, kind } => self.wb_io_done(job, kind, result, actions),
            IoOwner::Meta { kind } => self.meta_io_done(kind, result, actions),
            IoOwner::Probe => self.probe_done(result),
        }
    }

    /// Whether IO `io` (in flight) belongs to a writeback job.
    pub fn is_writeback_io(&self, io: IoId) -> bool {
        matches!(self.ios.get(io), Some(IoOwner::Wb { .. }))
    }

    /// A fresh IO id, registered to `owner`.
    pub(crate) fn new_io(&mut self, owner: IoOwner) -> IoId {
        self.ios.insert(owner)
    }

    /// Always-run upkeep after each event.
    fn maintain(&mut self, actions: &mut Vec<Action>) {
        self.rate
            .update(self.now, self.dirty_lines as u64, self.cfg.lines as u64);
        if !self.throttled.is_empty() {
            self.release_throttled(actions);
        }
        if self.wake_waiters && !self.waits.is_empty() {
            self.wake_waiters = false;
            self.retry_waiting(actions);
        }
        self.wake_waiters = false;
        self.run_cleaner(actions);
        if let Some(target) = self.target_mode
            && self.dirty_lines == 0
            && self.jobs.is_empty()
        {
            self.mode = target;
            self.target_mode = None;
            self.tables_changed();
        }
        if self.force_clean && self.dirty_lines == 0 && self.jobs.is_empty() {
            self.force_clean = false;
        }
        self.faults_maintain(actions);
        self.meta_maintain(actions);
    }

    /// Counts `line` (mapped) becoming dirty (`up`) or clean, cache-wide and for its core.
    #[inline]
    pub(crate) fn count_dirty(&mut self, line: LineId, up: bool) {
        let (c, _) = self.map.position(line);
        let cs = self.cores[c.0 as usize]
            .as_mut()
            .expect("a mapped line's core");
        if up {
            self.dirty_lines += 1;
            cs.dirty_lines += 1;
        } else {
            self.dirty_lines -= 1;
            cs.dirty_lines -= 1;
        }
    }

    /// `line` (mapped) is dirty no more: the cleaning policy lets it go and it leaves the
    /// dirty-line counts. (Their state is apart: the order of the two is free.)
    pub(crate) fn note_clean(&mut self, line: LineId) {
        self.cleaning.on_clean(
            &mut self.lists,
            line,
            &View {
                map: &self.map,
                locks: &self.locks,
            },
        );
        self.count_dirty(line, false);
    }

    /// The cache device block of block `offset` of `line`.
    #[inline]
    pub(crate) fn cache_lba(&self, line: LineId, offset: u32) -> crate::units::Lba {
        crate::units::Lba(self.cfg.data_offset.0 + ((line.0 as u64) << self.shift) + offset as u64)
    }

    /// Where a read of `blocks` at `lba` on `core` will probably find its first line's data on
    /// the cache device: calls `hint(cache_lba, blocks_there)` for the line the mapping table's
    /// first matching slot names (not verified, and not checked for valid blocks: it may be
    /// wrong), or not at all. A driver whose cache device is memory calls this just before it
    /// applies the read, to start loading the data into CPU cache while the core decides
    /// (the data's misses then overlap the metadata's). Changes nothing.
    #[inline]
    pub fn read_hint(&self, core: CoreId, lba: Lba, blocks: u32, hint: impl FnOnce(Lba, u32)) {
        let cl = lba.0 >> self.shift;
        let Some(line) = self.map.candidate(core, cl) else {
            return;
        };
        self.state.prefetch(line.0);
        self.lists.prefetch(line.0);
        let offset = (lba.0 - (cl << self.shift)) as u32;
        let n = blocks.min((1u32 << self.shift) - offset);
        hint(self.cache_lba(line, offset), n);
    }

    // ----- read-only accessors -----

    /// Configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// The current mode (reads follow it).
    pub fn mode(&self) -> CacheMode {
        self.mode
    }
    /// The mode being switched to while dirty data is written back, if any.
    pub fn target_mode(&self) -> Option<CacheMode> {
        self.target_mode
    }
    /// Mapped lines.
    pub fn occupancy(&self) -> u32 {
        self.map.mapped()
    }
    /// Lines with dirty data.
    pub fn dirty_lines(&self) -> u32 {
        self.dirty_lines
    }
    /// Dirty blocks across the cache (walks every line: for stats, not hot paths).
    pub fn dirty_blocks(&self) -> u64 {
        (0..self.cfg.lines)
            .map(|l| self.state.dirty(LineId(l)).count_ones() as u64)
            .sum()
    }
    /// Cache-wide counters.
    pub fn counters(&self) -> &CacheCounters {
        &self.counters
    }
    /// Zeroes every request and device counter (cache, cores, IO classes); state (occupancy,
    /// dirty) is not a counter and stays.
    pub fn reset_counters(&mut self) {
        self.counters = CacheCounters::default();
        self.class_counters = [ReqCounters::default(); IO_CLASSES_MAX];
        for c in self.cores.iter_mut().flatten() {
            c.counters = ReqCounters::default();
        }
        self.faults.reset_counters();
        for c in self.cores.iter_mut().flatten() {
            c.faults.reset_counters();
        }
    }
    /// Counters of a core.
    pub fn core_counters(&self, core: CoreId) -> Option<&ReqCounters> {
        self.core(core).map(|c| &c.counters)
    }
    /// Counters of an IO class.
    pub fn class_counters(&self, class: u8) -> Option<&ReqCounters> {
        self.class_counters.get(class as usize)
    }
    /// Mapped lines of an IO class.
    pub fn class_lines(&self, class: u8) -> u32 {
        self.class_lines.get(class as usize).copied().unwrap_or(0)
    }
    /// The IO class table in force.
    pub fn io_classes(&self) -> &IoClassTable {
        &self.classes
    }
    /// A core, if attached.
    pub fn core(&self, core: CoreId) -> Option<&CoreState> {
        self.cores.get(core.0 as usize).and_then(|c| c.as_ref())
    }
    /// Requests in flight (accepted, not yet completed).
    pub fn requests_in_flight(&self) -> usize {
        self.reqs.len()
    }
    /// Device IOs in flight.
    pub fn ios_in_flight(&self) -> usize {
        self.ios.len()
    }
    /// Writeback jobs in flight.
    pub fn writebacks_in_flight(&self) -> usize {
        self.jobs.len()
    }
    /// Nothing in flight at all.
    pub fn is_idle(&self) -> bool {
        self.reqs.is_empty() && self.ios.is_empty() && self.jobs.is_empty()
    }
    /// Whether the cache has work it will do without a new request: IO in flight, writeback,
    /// metadata commits or tasks pending. A driver that stops must wait until this is false.
    pub fn has_work(&self) -> bool {
        !self.is_idle() || self.meta.as_ref().is_some_and(|m| m.has_work())
    }
    /// Valid and dirty masks of the line holding `core_line` of `core`, if mapped (tests and
    /// inspection).
    pub fn line_state(&self, core: CoreId, core_line: u64) -> Option<(LineId, u128, u128)> {
        let l = self.map.lookup(core, core_line)?;
        Some((l, self.state.valid(l), self.state.dirty(l)))
    }
    /// Heap bytes of every per-line structure: mapping, state, lists, eviction, promotion,
    /// cleaning (the RAM-per-line figure of SPEC P7).
    pub fn metadata_heap_bytes(&self) -> usize {
        self.map.heap_bytes()
            + self.state.heap_bytes()
            + self.lists.heap_bytes()
            + self.eviction.heap_bytes()
            + self.promotion.heap_bytes()
            + self.cleaning.heap_bytes()
    }
    /// Names of the policies in force: (eviction, promotion, cleaning).
    pub fn policy_names(&self) -> (&'static str, &'static str, &'static str) {
        (
            self.eviction.name(),
            self.promotion.name(),
            self.cleaning.name(),
        )
    }
}
