//! Mode `wl`, the write log (SPEC C9): a persistent write-back log in front of the cores that
//! keeps each core crash-consistent even if the cache device is lost.
//!
//! [`WriteLog`] is a state machine of its own with the same contract as [`crate::Cache`]:
//! `apply(now, event, &mut actions)`, no IO, no clock, no threads. It owns an inner `Cache` in
//! mode `wa` over a separate part of the cache device as its *read cache*, and drives it with
//! events of its own.
//!
//! - **Writes, TRIMs and WRITE_ZEROES** are appended to a ring on the cache device: one header
//!   block (checksummed, with the CRC32C of the data) and the data. A write is acknowledged once
//!   both are written; it is durable at the next client flush, or at once with FUA. Writes that
//!   overlap one still being logged wait for it, so the log order of overlapping writes is
//!   their acknowledgement order.
//! - **Sync generations**: a client flush ends the current generation; so do `gen_max_writes`
//!   writes or `gen_max_blocks` blocks, and the writeback when it has nothing else to do and
//!   may go.
//! - **When writeback goes** ([`pace`]): while the clients are busy and the log is less than
//!   `pacing.background_fill_pct` full (half, by default), writeback holds (it competes with
//!   them for the core and the host's CPU); it goes once the log is that full, the clients
//!   have been idle for a while, the oldest entry is old, writes wait for room, or a drain is
//!   asked for.
//! - **Flush**: waits until every entry issued before it has been written (so that recovery,
//!   which stops at the first entry it cannot read, finds every acknowledged one), then flushes
//!   the cache device.
//! - **Writeback** goes generation by generation: the entries of one generation are written to
//!   the core through the read cache (concurrently; overlapping entries in log order), then each
//!   core it touched is flushed, then the generation is retired from the index and the log
//!   superblock records the new tail (FUA) — and only then does the next generation start. So a
//!   core always holds "every generation up to k, and some writes of k+1". While writes wait
//!   for room in the log, a written-back prefix of the front generation (1/256 of
//!   `gen_max_writes` entries or 1/512 of the ring) is flushed on its cores and retired early,
//!   the rest of the generation going on meanwhile (also while the superblock with the new
//!   tail is written): room comes back in small steps, not a whole generation at a time. If a
//!   core flush fails, what the generation had written back is written again (entries still
//!   in flight too, after them), in log order. Entries that fit a staging slot are staged in
//!   batches: one read of the cache device brings the data of adjacent entries (the headers
//!   between them along) into one slot, each entry then written to its core from its place in
//!   the slot; the slot is free again when the last of them is done. At most `pacing.depth`
//!   entries are in writeback (48 by default: deeper only queues writes at the core;
//!   [`pace`]), and a new batch starts only with room for 1/4 of `staging_slots` (or a third
//!   of the depth, if less).
//! - **Reads**: the log index first; blocks it does not cover go to the read cache (which
//!   promotes misses by its policy) and the core.
//! - **Recovery** ([`scan`]) reads the log superblock, then every entry from the tail while each
//!   one is valid, in sequence, of a non-decreasing epoch no newer than the superblock's; the
//!   opened log first writes a superblock with a new epoch, so entries of a run that crashed
//!   before being recovered can never be mistaken for live ones.

pub mod device;
pub mod index;
pub mod pace;

use crate::cache::Cache;
use crate::cache::health::IoClass;
use crate::cache::{DeviceErrors, Health, HealthState, Problem};
use crate::config::{Config, REQUEST_BLOCKS_MAX};
use crate::event::{Action, BufRef, Dev, Event, IoError, ReqError};
use crate::mode::CacheMode;
use crate::units::{CoreId, IoId, Lba, Nanos, ReqId};
use index::{Index, Src};
use pace::{LogState, Pace, Pacing};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use tiercache_format::crc::crc32c;
use tiercache_format::wlog::{LOG_BLOCK, LogHeader, LogKind, LogSuper, RING_OFFSET_BLOCKS};

/// Request ids at or above this are the write log's own requests to its read cache; client
/// request ids must stay below it.
pub const INTERNAL_REQ: u64 = 1 << 63;
/// Blocks of the zero buffer ([`WriteLog::meta_buf`] id [`ZERO_BUF`]).
pub const ZERO_BLOCKS: u32 = 64;
/// Metadata buffer id of a buffer of zeros, the source of reads of trimmed ranges.
pub const ZERO_BUF: u32 = 0;
const SB_BUF: u32 = 1;
/// Metadata buffer ids with this bit are the read cache's own (its superblock, tables,
/// journal and checkpoint writes when it is persistent).
const INNER_META: u32 = 1 << 31;
const HDR_BUF0: u32 = 2;
/// How long a failed writeback or log repair waits before it is tried again.
const RETRY_NS: u64 = 50_000_000;

/// Configuration of a write log.
#[derive(Clone, Debug)]
pub struct WlConfig {
    /// The cache's identity, written into every entry and superblock.
    pub cache_id: [u8; 16],
    /// First block of the log region on the cache device.
    pub log_start: Lba,
    /// Blocks of the log region (superblocks + ring).
    pub log_blocks: u64,
    /// A generation ends after this many entries ...
    pub gen_max_writes: u32,
    /// ... or this many blocks.
    pub gen_max_blocks: u64,
    /// Staging slots for writeback (each `read_cache.pool_slot_blocks` long).
    pub staging_slots: u32,
    /// When writeback runs ([`pace`]).
    pub pacing: Pacing,
    /// The read cache: its mode is forced to `wa`, and its `data_offset` must place its lines
    /// outside the log region. With `persist` set it keeps the cache device's superblock and
    /// tables (configuration, core table with each core's identity) and its clean lines, as
    /// any persistent `wa` cache does; without, it restarts cold.
    pub read_cache: Config,
}

impl WlConfig {
    fn ring_start(&self) -> u64 {
        self.log_start.0 + RING_OFFSET_BLOCKS
    }

    fn ring_blocks(&self) -> u64 {
        self.log_blocks - RING_OFFSET_BLOCKS
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        if self.log_blocks < RING_OFFSET_BLOCKS + 64 {
            return Err(format!(
                "the write log needs at least {} blocks, this one has {}",
                RING_OFFSET_BLOCKS + 64,
                self.log_blocks
            ));
        }
        let rc = &self.read_cache;
        let rc_start = rc.data_offset.0;
        let rc_end = rc_start + rc.lines as u64 * rc.line_size.blocks() as u64;
        let (ls, le) = (self.log_start.0, self.log_start.0 + self.log_blocks);
        if rc_start < le && ls < rc_end {
            return Err("the read cache's lines overlap the write log".into());
        }
        if self.staging_slots == 0 || self.gen_max_writes == 0 || self.gen_max_blocks == 0 {
            return Err("staging slots and generation limits must be positive".into());
        }
        self.pacing.validate()?;
        Ok(())
    }
}

/// What an entry is doing.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum EState {
    /// Its header and data writes are in flight (`left` of them).
    Writing { left: u8, failed: bool },
    /// Rewriting its header as `Void` after a failed write.
    Voiding,
    /// A void header is due (retry after a failure).
    VoidDue,
    /// In the log, valid (or void), waiting for writeback.
    Logged,
    /// Being written back: chunks issued and done.
    Wb { issued: u32, done: u32 },
    /// Written back to the core (flush pending with its generation).
    Done,
}

#[derive(Clone, Debug)]
struct Entry {
    seq: u64,
    gen_: u64,
    kind: LogKind,
    core: u16,
    lba: u64,
    blocks: u32,
    /// Virtual ring position of the header.
    pos: u64,
    state: EState,
    /// The client request waiting for it (until acknowledged).
    req: Option<(ReqId, bool)>,
    /// Meta buffer holding the header, while its write is in flight.
    hdr_buf: Option<u32>,
    /// When it was logged (found, for an entry recovered by a scan).
    at: Nanos,
}

impl Entry {
    fn span(&self) -> u64 {
        1 + if self.kind.has_data() || matches!(self.kind, LogKind::Pad | LogKind::Void) {
            self.blocks as u64
        } else {
            0
        }
    }

    fn overlaps(&self, core: u16, lba: u64, blocks: u32) -> bool {
        self.core == core
            && matches!(self.kind, LogKind::Write | LogKind::Trim | LogKind::Zero)
            && self.lba < lba + blocks as u64
            && lba < self.lba + self.blocks as u64
    }
}

/// A client write waiting to be logged.
#[derive(Clone, Copy, Debug)]
struct Pending {
    req: ReqId,
    kind: LogKind,
    core: u16,
    lba: u64,
    blocks: u32,
    fua: bool,
}

/// One of the write log's own IOs.
#[derive(Clone, Copy, Debug)]
enum OwnIo {
    /// Header or data write of entry `seq`.
    LogWrite { seq: u64 },
    /// Void header rewrite of entry `seq`.
    VoidWrite { seq: u64 },
    /// Cache device flush covering `covers` completed log writes, and every entry before
    /// `covers_seq`.
    Flush { covers: u64, covers_seq: u64 },
    /// Superblock write.
    Super { tail_pos: u64, tail_seq: u64 },
    /// Read of log data for a client read.
    ClientRead { req: ReqId },
    /// Read of log data into a staging slot for writeback: one read for the writeback chunks
    /// of batch `batch` (see [`WriteLog::wb_batches`]).
    WbRead { batch: u64 },
    /// Cache-device flush of a management step (clean stop, invalidate), covering every entry
    /// before `covers_seq`.
    MgmtFlush { covers_seq: u64 },
}

/// Who waits for a device flush.
#[derive(Clone, Copy, Debug)]
struct FlushWaiter {
    req: ReqId,
    /// A FUA write's entry (it keeps blocking overlapping writes until acknowledged).
    fua_seq: Option<u64>,
    /// Every entry with a smaller sequence number must be written first.
    need_seq: u64,
    /// `log_writes_done` once that was true (then a flush covering it is what is left).
    mark: Option<u64>,
}

/// A client read in progress.
#[derive(Debug)]
struct ReadState {
    /// Overlay pieces still to apply after the read cache answered (offset, len, src).
    overlay: Vec<index::Piece>,
    /// Positions pinned for this read.
    pins: Vec<u64>,
    /// Log reads in flight.
    ios_left: u32,
    /// Waiting for the read cache.
    inner_pending: bool,
    failed: Option<ReqError>,
}

/// One chunk of writeback: an internal request to the read cache.
#[derive(Clone, Copy, Debug)]
struct WbOp {
    seq: u64,
    /// Block offset inside the entry.
    offset: u32,
    blocks: u32,
    /// Staging slot (global index), for writes.
    slot: Option<u32>,
    /// Where its data starts in the slot (blocks): the chunks of a batch share one slot.
    slot_off: u32,
    /// What the internal request is.
    what: WbWhat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WbWhat {
    Data,
    Trim,
    Zero,
    Flush,
}

/// Writeback chunks being gathered into one read: log data from `start` to `end` (physical
/// blocks of the cache device) into staging slot `slot`.
#[derive(Debug)]
struct OpenBatch {
    slot: u32,
    start: u64,
    end: u64,
    ops: Vec<u64>,
}

/// The most blocks between two entries' data that a batch reads along (headers of the entries
/// between, TRIMs and WRITE_ZEROES among them) rather than starting another read.
const MAX_BATCH_GAP: u64 = 8;

/// Counters of the write log (SPEC C20's `wl` fields and `rbd status`-like state).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WlCounters {
    /// Writes, TRIMs and WRITE_ZEROES logged.
    pub entries_logged: u64,
    /// Blocks of data logged.
    pub blocks_logged: u64,
    /// Reads served entirely from the log.
    pub read_hits_full: u64,
    /// Reads served partly from the log.
    pub read_hits_partial: u64,
    /// Reads the log had nothing of.
    pub read_misses: u64,
    /// Entries written back.
    pub entries_written_back: u64,
    /// Blocks of data written back.
    pub blocks_written_back: u64,
    /// Generations retired.
    pub gens_retired: u64,
    /// Times a written-back prefix of a generation was retired early (the log was full).
    pub prefix_retires: u64,
    /// Writeback IOs that failed (retried).
    pub wb_errors: u64,
    /// Log writes that failed.
    pub log_errors: u64,
    /// Writes that had to wait for ring space.
    pub waited_for_space: u64,
}

/// State a log scan found (see [`scan`]); what [`WriteLog::open`] starts from.
#[derive(Clone, Debug)]
pub struct Recovered {
    /// The superblock in force and its copy index.
    pub sb: LogSuper,
    /// Which copy it was.
    pub sb_copy: usize,
    /// Valid entries from the tail, in order.
    pub entries: Vec<LogHeader>,
    /// Virtual ring position after the last valid entry.
    pub head_pos: u64,
}

/// The write log. See the module docs.
pub struct WriteLog {
    cfg: WlConfig,
    inner: Cache,
    now: Nanos,
    epoch: u32,
    ready: bool,
    /// Live entries (not yet retired), in sequence order.
    entries: VecDeque<Entry>,
    index: Index,
    next_seq: u64,
    open_gen: u64,
    /// Entries and blocks in the open generation.
    open_gen_writes: u32,
    open_gen_blocks: u64,
    head_pos: u64,
    /// The tail as the durable superblock says it.
    sb_tail_pos: u64,
    sb_tail_seq: u64,
    /// The tail right after the last whole generation retired: writeback of the next
    /// generation starts only once the durable superblock's tail is there.
    gen_gate_seq: u64,
    sb_gen: u64,
    sb_copy: usize,
    sb_buf: [u8; LOG_BLOCK],
    sb_in_flight: bool,
    /// A superblock with this tail must be written (after a retirement or at open).
    sb_due: Option<(u64, u64)>,
    /// Readers' pins: virtual header position -> count.
    pins: BTreeMap<u64, u32>,
    /// Sequence numbers of entries whose log writes are not finished.
    writing: BTreeSet<u64>,
    /// Logged FUA entries not yet acknowledged (waiting for their flush): overlapping writes
    /// wait for them too, so overlapping writes are acknowledged in log order.
    unacked: BTreeMap<u64, (u16, u64, u32)>,
    pending: VecDeque<Pending>,
    /// Client requests waiting until the log is ready.
    not_ready: VecDeque<Event>,
    flush_waiters: Vec<FlushWaiter>,
    log_writes_done: u64,
    durable_upto: u64,
    /// Every entry before this sequence number is durable on the cache device (written into
    /// each header and superblock, so that a scan tells damage from a torn tail).
    durable_seq: u64,
    flush_in_flight: bool,
    ios: Vec<Option<OwnIo>>,
    free_ios: Vec<u32>,
    hdr_bufs: Vec<[u8; LOG_BLOCK]>,
    free_hdr: Vec<u32>,
    reads: HashMap<ReqId, ReadState>,
    wb_ops: HashMap<u64, WbOp>,
    next_op: u64,
    free_slots: Vec<u32>,
    /// Writeback chunks holding each staging slot (by global slot index minus the read
    /// cache's slots); a slot is free again when its last chunk is done.
    slot_refs: Vec<u32>,
    /// The read cache's slots (staging slot indices start here).
    inner_slots: u32,
    /// Batches of writeback chunks whose log data one read brings into one slot: batch id ->
    /// the chunks' ops, in log order.
    wb_batches: HashMap<u64, Vec<u64>>,
    next_batch: u64,
    /// Writeback of the front generation: its flushes still to complete, and whether they
    /// were issued.
    wb_flushes_left: u32,
    wb_flushing: bool,
    /// The flush in flight is for a written-back prefix of the front generation: entries
    /// before this sequence number retire when it completes (the whole generation otherwise).
    wb_flush_upto: Option<u64>,
    /// Every entry of the front generation before this sequence number is written back.
    wb_done_upto: u64,
    /// The last attempt to log a write found no room in the ring.
    space_waiting: bool,
    wb_retry_at: Option<Nanos>,
    void_retry_at: Option<Nanos>,
    inner_events: VecDeque<Event>,
    inner_actions: Vec<Action>,
    zero: Vec<u8>,
    counters: WlCounters,
    /// Test hook: (request, seq, generation) of every entry issued for a client request.
    issued_log: Vec<(ReqId, u64, u64)>,
    cores: Vec<Option<u64>>,
    /// A new log writes both superblock copies before it serves.
    create_second_copy: bool,
    /// An entry whose chunks did not all fit in staging: (seq, next offset).
    wb_partial: Option<(u64, u32)>,
    /// Entries a chunk of which failed: they go back to `Logged` once settled.
    failed_entries: BTreeSet<u64>,
    wb_flush_failed: bool,
    /// A clean stop: no new requests, no new writeback; then a cache-device flush, then the
    /// read cache stops.
    stopping: bool,
    stop_flush: MgmtFlushState,
    /// `invalidate`: cores whose logged data is to be voided once writeback is idle.
    invalidating: BTreeSet<u16>,
    /// Entries `invalidate` is rewriting as void.
    inv_seqs: BTreeSet<u64>,
    /// The cache-device flush that makes `invalidate`'s void headers durable.
    inv_flush: MgmtFlushState,
    /// Writeback held (see [`WriteLog::set_writeback_paused`]).
    wb_paused: bool,
    /// When the last client request arrived (for [`pace`]).
    last_request: Nanos,
    /// A drain was asked for ([`WriteLog::drain`]): writeback goes until the log is empty.
    draining: bool,
    /// Sequence number of the first entry of the front generation not yet started.
    wb_cursor: u64,
    /// Entries in writeback now.
    wb_active: BTreeSet<u64>,
    /// The same entries by (core, first block, sequence number) -> end block, to find the
    /// ones overlapping a range without looking at each.
    wb_ranges: BTreeMap<(u16, u64, u64), u64>,
    /// The longest entry (blocks) that was in writeback: how far before a range an
    /// overlapping entry may start.
    wb_max_blocks: u64,
    /// Blocks of logged data dropped by `invalidate`.
    invalidated_blocks: u64,
    /// Errors of the log's own IOs on the cache device (the read cache counts its own).
    log_device: DeviceErrors,
    /// The log device's current episode of errors, if any.
    log_failing: Option<LogEpisode>,
    /// Episodes so far.
    log_episodes: u64,
}

/// An episode of log IO errors: from the first error until an IO of the kinds that failed
/// succeeds (a write or flush once a write or flush failed: reads that work do not make a log
/// that cannot write healthy).
#[derive(Clone, Copy, Debug)]
struct LogEpisode {
    since: Nanos,
    errors: u64,
    write_failed: bool,
}

/// Where a management step's cache-device flush (clean stop, `invalidate`) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MgmtFlushState {
    /// Due (not issued yet).
    No,
    InFlight,
    Done,
}

fn ext_src_lba(cfg: &WlConfig, pos: u64) -> u64 {
    cfg.ring_start() + pos % cfg.ring_blocks()
}

impl WriteLog {
    fn new_empty(mut cfg: WlConfig, inner: Option<Cache>) -> Result<WriteLog, String> {
        let inner = match inner {
            Some(c) => {
                if c.mode() != CacheMode::Wa {
                    return Err("a write log's read cache must be in mode wa".into());
                }
                cfg.read_cache = c.config().clone();
                c
            }
            None => {
                cfg.read_cache.mode = CacheMode::Wa;
                Cache::new(cfg.read_cache.clone())?
            }
        };
        cfg.validate()?;
        let inner_slots = inner.config().pool_slots;
        let free_slots = (inner_slots..inner_slots + cfg.staging_slots)
            .rev()
            .collect();
        Ok(WriteLog {
            inner,
            now: Nanos(0),
            epoch: 1,
            ready: false,
            entries: VecDeque::new(),
            index: Index::default(),
            next_seq: 1,
            open_gen: 1,
            open_gen_writes: 0,
            open_gen_blocks: 0,
            head_pos: 0,
            sb_tail_pos: 0,
            sb_tail_seq: 0,
            gen_gate_seq: 0,
            sb_gen: 0,
            sb_copy: 1,
            sb_buf: [0; LOG_BLOCK],
            sb_in_flight: false,
            sb_due: None,
            pins: BTreeMap::new(),
            writing: BTreeSet::new(),
            unacked: BTreeMap::new(),
            pending: VecDeque::new(),
            not_ready: VecDeque::new(),
            flush_waiters: Vec::new(),
            log_writes_done: 0,
            durable_upto: 0,
            durable_seq: 0,
            flush_in_flight: false,
            ios: Vec::new(),
            free_ios: Vec::new(),
            hdr_bufs: Vec::new(),
            free_hdr: Vec::new(),
            reads: HashMap::new(),
            wb_ops: HashMap::new(),
            next_op: 0,
            free_slots,
            slot_refs: vec![0; cfg.staging_slots as usize],
            inner_slots,
            wb_batches: HashMap::new(),
            next_batch: 0,
            wb_flushes_left: 0,
            wb_flushing: false,
            wb_flush_upto: None,
            wb_done_upto: 0,
            space_waiting: false,
            wb_retry_at: None,
            void_retry_at: None,
            inner_events: VecDeque::new(),
            inner_actions: Vec::new(),
            zero: vec![0; ZERO_BLOCKS as usize * 512],
            counters: WlCounters::default(),
            issued_log: Vec::new(),
            cores: Vec::new(),
            create_second_copy: false,
            wb_partial: None,
            failed_entries: BTreeSet::new(),
            wb_flush_failed: false,
            stopping: false,
            stop_flush: MgmtFlushState::No,
            invalidating: BTreeSet::new(),
            inv_seqs: BTreeSet::new(),
            inv_flush: MgmtFlushState::Done,
            wb_paused: false,
            last_request: Nanos(0),
            draining: false,
            wb_cursor: 0,
            wb_active: BTreeSet::new(),
            wb_ranges: BTreeMap::new(),
            wb_max_blocks: 0,
            invalidated_blocks: 0,
            log_device: DeviceErrors::default(),
            log_failing: None,
            log_episodes: 0,
            cfg,
        })
    }

    /// A new, empty write log. It writes both superblock copies before it serves (requests
    /// that arrive earlier wait).
    pub fn create(cfg: WlConfig) -> Result<WriteLog, String> {
        let mut wl = WriteLog::new_empty(cfg, None)?;
        // Copy 0 first, then copy 1, both carrying the tail of an empty log.
        wl.sb_copy = 1;
        wl.sb_due = Some((0, 1));
        wl.create_second_copy = true;
        Ok(wl)
    }

    /// A write log recovered by [`scan`]: every entry found is kept for writeback; a
    /// superblock with a new epoch is written before anything is served.
    pub fn open(cfg: WlConfig, rec: Recovered) -> Result<WriteLog, String> {
        WriteLog::open_with(cfg, None, rec)
    }

    /// [`WriteLog::open`] with a read cache loaded from the cache device (its configuration
    /// replaces `cfg.read_cache`; the cores it records are the log's cores).
    pub fn open_loaded(cfg: WlConfig, inner: Cache, rec: Recovered) -> Result<WriteLog, String> {
        WriteLog::open_with(cfg, Some(inner), rec)
    }

    fn open_with(cfg: WlConfig, inner: Option<Cache>, rec: Recovered) -> Result<WriteLog, String> {
        let mut wl = WriteLog::new_empty(cfg, inner)?;
        for i in 0..=u8::MAX as u16 {
            if let Some(c) = wl.inner.core(CoreId(i)) {
                let size = c.size_blocks;
                if wl.cores.len() <= i as usize {
                    wl.cores.resize(i as usize + 1, None);
                }
                wl.cores[i as usize] = Some(size);
            }
        }
        if rec.sb.cache_id != wl.cfg.cache_id || rec.sb.ring_blocks != wl.cfg.ring_blocks() {
            return Err("the write log on this device belongs to another cache or geometry".into());
        }
        wl.epoch = rec.sb.epoch + 1;
        // What the last run knew durable stays so (the scan found all of it).
        wl.durable_seq = rec.sb.durable_seq.max(rec.sb.tail_seq);
        wl.sb_gen = rec.sb.sb_gen;
        wl.sb_copy = rec.sb_copy;
        wl.sb_tail_pos = rec.sb.tail_pos;
        wl.sb_tail_seq = rec.sb.tail_seq;
        let mut pos = rec.sb.tail_pos;
        let mut last_gen = rec.sb.tail_gen;
        let mut next_seq = rec.sb.tail_seq;
        for h in &rec.entries {
            let e = Entry {
                seq: h.seq,
                gen_: h.gen_,
                kind: h.kind,
                core: h.core,
                lba: h.lba,
                blocks: h.blocks,
                pos,
                state: EState::Logged,
                req: None,
                hdr_buf: None,
                at: Nanos(0),
            };
            if matches!(h.kind, LogKind::Write | LogKind::Trim | LogKind::Zero) {
                let src = if h.kind == LogKind::Write {
                    Src::Log { data_pos: pos + 1 }
                } else {
                    Src::Zero
                };
                wl.index
                    .insert(h.core, h.lba, h.lba + h.blocks as u64, h.seq, pos, src);
            }
            pos += e.span();
            last_gen = last_gen.max(h.gen_);
            next_seq = h.seq + 1;
            wl.entries.push_back(e);
        }
        debug_assert_eq!(pos, rec.head_pos);
        wl.head_pos = rec.head_pos;
        wl.next_seq = next_seq;
        wl.open_gen = last_gen + 1;
        let (tp, ts) = (rec.sb.tail_pos, rec.sb.tail_seq);
        wl.sb_due = Some((tp, ts));
        Ok(wl)
    }

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

    /// Entries before this sequence number have their log writes finished.
    fn written_below(&self) -> u64 {
        self.writing.first().copied().unwrap_or(self.next_seq)
    }

    /// The tail: the oldest entry's position and sequence number (the head when empty).
    fn tail(&self) -> (u64, u64) {
        match self.entries.front() {
            Some(e) => (e.pos, e.seq),
            None => (self.head_pos, self.next_seq),
        }
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

    /// Counters.
    pub fn counters(&self) -> WlCounters {
        self.counters
    }

    /// Errors of the log's own IOs on the cache device (log writes, reads of logged data,
    /// flushes, log superblocks), by kind of IO and of error; the read cache counts its own
    /// ([`Cache::faults`]).
    pub fn log_device_errors(&self) -> &DeviceErrors {
        &self.log_device
    }

    /// Episodes of log IO errors so far.
    pub fn log_episodes(&self) -> u64 {
        self.log_episodes
    }

    /// [`Problem::LogDevice`] while the log's IOs fail: from the first error until an IO of
    /// the kinds that failed succeeds (a write or flush, once one of those failed).
    pub fn log_problem(&self) -> Option<Problem> {
        self.log_failing.map(|ep| Problem::LogDevice {
            since: ep.since,
            last_error: self.log_device.last.map_or(IoError::Io, |x| x.0),
            errors: ep.errors,
        })
    }

    /// Whether any problem is open: the log's or the read cache's (cheap).
    pub fn is_degraded(&self) -> bool {
        self.log_failing.is_some() || self.inner.is_degraded()
    }

    /// The health of the `wl` cache: the log device's problem and the read cache's (the cache
    /// device, a core failing, writeback to a core failing). While degraded, every block of
    /// logged data not yet written back is at risk: it exists only in the log, and the log is
    /// written back in order, so one failing core holds back every later generation.
    pub fn health(&self) -> Health {
        let mut h = self.inner.health();
        if let Some(p) = self.log_problem() {
            h.problems.insert(0, p);
        }
        self.log_risk(h, None)
    }

    /// The health of one core: the cache-wide problems (the log device, the cache device) and
    /// the core's own, with its logged blocks not yet written back at risk while degraded.
    /// `None`: no such core.
    pub fn core_health(&self, core: CoreId) -> Option<Health> {
        let mut h = self.inner.core_health(core)?;
        if let Some(p) = self.log_problem() {
            h.problems.insert(0, p);
        }
        Some(self.log_risk(h, Some(core)))
    }

    fn log_risk(&self, mut h: Health, core: Option<CoreId>) -> Health {
        if h.problems.is_empty() {
            h.state = HealthState::Running;
            h.dirty_at_risk_blocks = 0;
        } else {
            h.state = HealthState::Degraded;
            h.dirty_at_risk_blocks = self.pending(core).1;
        }
        h
    }

    /// Counts an own IO's result towards the log device's health.
    fn note_log_io(&mut self, class: IoClass, result: Result<(), IoError>) {
        let writes = class != IoClass::Read;
        match result {
            Err(e) => {
                self.log_device.count(class, e, self.now);
                let now = self.now;
                let episodes = &mut self.log_episodes;
                let ep = self.log_failing.get_or_insert_with(|| {
                    *episodes += 1;
                    LogEpisode {
                        since: now,
                        errors: 0,
                        write_failed: false,
                    }
                });
                ep.errors += 1;
                ep.write_failed |= writes;
            }
            Ok(()) => {
                if self
                    .log_failing
                    .is_some_and(|ep| writes || !ep.write_failed)
                {
                    self.log_failing = None;
                }
            }
        }
    }

    /// Blocks of data in the log not yet written back (dirty).
    pub fn dirty_blocks(&self) -> u64 {
        self.index.blocks()
    }

    /// Live entries (not yet retired).
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Ring blocks in use, and the ring's size.
    pub fn log_fill(&self) -> (u64, u64) {
        (self.head_pos - self.reuse_bound(), self.cfg.ring_blocks())
    }

    /// Generations between the one being written back and the open one.
    pub fn generation_lag(&self) -> u64 {
        self.entries
            .front()
            .map_or(0, |e| self.open_gen.saturating_sub(e.gen_))
    }

    /// Entries in the log (not yet retired) of `core` (every core: `None`), and the blocks of
    /// data they hold that are not yet written back.
    pub fn pending(&self, core: Option<CoreId>) -> (u64, u64) {
        let mut n = 0;
        let mut blocks = 0;
        for e in &self.entries {
            if e.kind == LogKind::Pad || core.is_some_and(|c| c.0 != e.core) {
                continue;
            }
            n += 1;
            if e.kind == LogKind::Write && e.state != EState::Done {
                blocks += e.blocks as u64;
            }
        }
        (n, blocks)
    }

    /// The longest write (or TRIM / WRITE_ZEROES: no data) one entry takes, in blocks: half the
    /// ring less the header. A longer one fails with `NoSpace`; the NBD server advertises this
    /// as its maximum request size, so clients split what is longer.
    pub fn max_request_blocks(&self) -> u64 {
        self.cfg.ring_blocks() / 2 - 1
    }

    /// Blocks of write data the log holds on the device from its tail: what a load would
    /// find, counting entries already written back whose generation is not retired yet (a
    /// stop can leave some; they are written back again after the load).
    pub fn logged_blocks(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.kind == LogKind::Write)
            .map(|e| e.blocks as u64)
            .sum()
    }

    /// Whether everything logged has been written back.
    pub fn is_clean(&self) -> bool {
        self.entries.is_empty() && self.pending.is_empty()
    }

    /// Whether nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.ios.iter().all(Option::is_none)
            && self.reads.is_empty()
            && self.pending.is_empty()
            && self.inner.is_idle()
            && self.wb_ops.is_empty()
    }

    /// Test hook: the (request, sequence number, generation) of each entry issued since the
    /// last call.
    pub fn take_issued(&mut self) -> Vec<(ReqId, u64, u64)> {
        std::mem::take(&mut self.issued_log)
    }

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

    // ----- events -----

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

    // ----- reads -----

    fn client_read(
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

    fn issue_overlay(&mut self, req: ReqId, pieces: Vec<index::Piece>, acts: &mut Vec<Action>) {
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

    fn finish_read_if_done(&mut self, req: ReqId, acts: &mut Vec<Action>) {
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

    // ----- log writes -----

    fn reuse_bound(&self) -> u64 {
        let p = self.pins.keys().next().copied().unwrap_or(u64::MAX);
        self.sb_tail_pos.min(p)
    }

    fn new_io(&mut self, o: OwnIo) -> IoId {
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

    fn close_gen(&mut self) {
        if self.open_gen_writes > 0 {
            self.open_gen += 1;
            self.open_gen_writes = 0;
            self.open_gen_blocks = 0;
        }
    }

    /// Starts logging waiting writes, in order, while they fit and overlap nothing in flight.
    fn issue_pending(&mut self, acts: &mut Vec<Action>, data_crc: &mut dyn FnMut(ReqId) -> u32) {
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

    fn entry_mut(&mut self, seq: u64) -> &mut Entry {
        let first = self.entries[0].seq;
        &mut self.entries[(seq - first) as usize]
    }

    fn log_write_done(&mut self, seq: u64, ok: bool, acts: &mut Vec<Action>) {
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

    fn issue_void(&mut self, seq: u64, acts: &mut Vec<Action>) {
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

    fn void_done(&mut self, seq: u64, ok: bool) {
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

    // ----- flushes -----

    fn run_flushes(&mut self, acts: &mut Vec<Action>) {
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

    // ----- superblock -----

    fn run_super(&mut self, acts: &mut Vec<Action>) {
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

    fn super_done(&mut self, tail_pos: u64, tail_seq: u64, ok: bool) {
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

    // ----- writeback -----

    /// Whether writeback may start something new now ([`pace`]).
    fn pace(&self) -> Pace {
        let (used, ring) = self.log_fill();
        pace::pace(
            &self.cfg.pacing,
            self.now,
            &LogState {
                used,
                ring,
                last_request: self.last_request,
                oldest: self.entries.front().map(|e| e.at),
                urgent: self.space_waiting || self.draining,
            },
        )
    }

    fn run_writeback(&mut self, acts: &mut Vec<Action>) {
        // After a whole generation retired, the next one starts only once a superblock with
        // the new tail is durable: a recovery from an older tail would write the retired
        // generation again over the next one's writes on the core. A prefix retired early
        // needs no such wait (writing a prefix of a generation again over later writes of the
        // same generation leaves each block with a value of that generation).
        if self.sb_tail_seq < self.gen_gate_seq
            || !self.is_ready()
            || (self.stopping && self.pending.is_empty())
            || self.wb_paused
            || !self.invalidating.is_empty()
        {
            return;
        }
        if let Some(t) = self.wb_retry_at {
            if self.now < t {
                return;
            }
            self.wb_retry_at = None;
        }
        let Some(front) = self.entries.front() else {
            self.draining = false;
            return;
        };
        let g = front.gen_;
        // Held: nothing new starts (what is in flight goes on, and a generation it finishes
        // is flushed and retired below).
        let hold = matches!(self.pace(), Pace::Hold { .. });
        if g == self.open_gen {
            if hold {
                return;
            }
            // Nothing closed: close the open generation so writeback can proceed.
            self.close_gen();
            if g == self.open_gen {
                return;
            }
        }
        if self.wb_flushing && self.wb_flush_upto.is_none() {
            // The generation's closing flush: nothing of the next one may start before it.
            return;
        }
        // Issue chunks in log order while staging lasts; an entry overlapping one of its
        // generation still in flight waits for it.
        // Entries before the cursor are started (in writeback or done); those in writeback are
        // `wb_active` (at most a few: staging bounds them), so each call costs what it starts.
        let front_seq = self.entries[0].seq;
        let n = self.entries.len();
        self.wb_cursor = self.wb_cursor.max(front_seq);
        let mut i = (self.wb_cursor - front_seq) as usize;
        let mut reached_end = true;
        let mut batch = None;
        while i < n {
            let e = &self.entries[i];
            debug_assert_eq!(e.seq, front_seq + i as u64, "entries are consecutive");
            if e.gen_ != g {
                break;
            }
            match e.state {
                EState::Writing { .. } | EState::Voiding | EState::VoidDue => {
                    reached_end = false;
                    break;
                }
                EState::Done | EState::Wb { .. } => {}
                EState::Logged if hold => {
                    reached_end = false;
                    break;
                }
                EState::Logged => {
                    let (core, lba, blocks, kind) = (e.core, e.lba, e.blocks, e.kind);
                    // Any overlapping entry in writeback blocks it: an earlier one (log order),
                    // or a later one still in flight after a failed flush made this one go
                    // again (it goes again after this one).
                    let blocked = self.wb_overlaps(core, lba, blocks);
                    debug_assert_eq!(
                        blocked,
                        self.wb_active.iter().any(|&s| {
                            self.entries[(s - front_seq) as usize].overlaps(core, lba, blocks)
                        })
                    );
                    if blocked || !self.start_entry_wb(i, kind, &mut batch, acts) {
                        reached_end = false;
                        break;
                    }
                }
            }
            if self.wb_cursor == front_seq + i as u64 {
                self.wb_cursor += 1;
            }
            i += 1;
        }
        self.close_batch(&mut batch, acts);
        if self.wb_flushing {
            // A prefix's flush: the rest of the generation goes on meanwhile.
            return;
        }
        let all_done = reached_end && self.wb_active.is_empty() && self.wb_partial.is_none();
        if all_done {
            // Every entry of generation g is on its core: flush the cores it touched.
            let n = self.entries.iter().take_while(|e| e.gen_ == g).count();
            self.flush_for_retire(n, None);
        } else if self.space_waiting {
            // Writes wait for room: retire the written-back prefix of the generation once it
            // is big enough, instead of all of it at the end (the core's copy of the prefix is
            // made durable first; nothing of a later generation has started, so losing the
            // cache still leaves the core a prefix of generations plus part of one).
            let front_seq = self.entries[0].seq;
            self.wb_done_upto = self.wb_done_upto.max(front_seq);
            while let Some(e) = self.entries.get((self.wb_done_upto - front_seq) as usize) {
                if e.gen_ != g || e.state != EState::Done {
                    break;
                }
                self.wb_done_upto += 1;
            }
            let n = (self.wb_done_upto - front_seq) as usize;
            let end_pos = self.entries.get(n).map_or(self.head_pos, |e| e.pos);
            let big = n as u64 >= (self.cfg.gen_max_writes as u64 / 256).max(1)
                || end_pos - self.entries[0].pos >= self.cfg.ring_blocks() / 512;
            if n > 0 && big {
                self.flush_for_retire(n, Some(self.wb_done_upto));
            }
        }
    }

    /// Flushes the cores the first `n` entries touched, then retires them (`upto`: a prefix
    /// of the front generation; `None`: all of it). Retires at once when they touched none.
    fn flush_for_retire(&mut self, n: usize, upto: Option<u64>) {
        let cores: BTreeSet<u16> = self
            .entries
            .iter()
            .take(n)
            .filter(|e| matches!(e.kind, LogKind::Write | LogKind::Trim | LogKind::Zero))
            .map(|e| e.core)
            .collect();
        if cores.is_empty() {
            self.retire_front(upto);
            return;
        }
        self.wb_flushing = true;
        self.wb_flush_upto = upto;
        self.wb_flushes_left = cores.len() as u32;
        for c in cores {
            let op = self.new_op(WbOp {
                seq: 0,
                offset: 0,
                blocks: 0,
                slot: None,
                slot_off: 0,
                what: WbWhat::Flush,
            });
            self.inner_events.push_back(Event::Flush {
                req: ReqId(INTERNAL_REQ | op),
                core: CoreId(c),
            });
        }
    }

    fn new_op(&mut self, op: WbOp) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        self.wb_ops.insert(id, op);
        id
    }

    /// Starts writeback of entry `i`, or as much of it as staging allows. Returns false when
    /// staging ran out (the caller stops).
    fn start_entry_wb(
        &mut self,
        i: usize,
        kind: LogKind,
        batch: &mut Option<OpenBatch>,
        acts: &mut Vec<Action>,
    ) -> bool {
        let e = self.entries[i].clone();
        match kind {
            LogKind::Pad | LogKind::Void => {
                self.entries[i].state = EState::Done;
                true
            }
            LogKind::Trim | LogKind::Zero => {
                let what = if kind == LogKind::Trim {
                    WbWhat::Trim
                } else {
                    WbWhat::Zero
                };
                let op = self.new_op(WbOp {
                    seq: e.seq,
                    offset: 0,
                    blocks: e.blocks,
                    slot: None,
                    slot_off: 0,
                    what,
                });
                let req = ReqId(INTERNAL_REQ | op);
                let (core, lba, blocks) = (CoreId(e.core), Lba(e.lba), e.blocks);
                self.inner_events.push_back(if kind == LogKind::Trim {
                    Event::Trim {
                        req,
                        core,
                        lba,
                        blocks,
                    }
                } else {
                    Event::WriteZeroes {
                        req,
                        core,
                        lba,
                        blocks,
                        fua: false,
                    }
                });
                self.entries[i].state = EState::Wb { issued: 1, done: 0 };
                self.wb_activate(e.seq);
                true
            }
            LogKind::Write => {
                let slot_blocks = self.pool_slot_blocks();
                if e.blocks <= slot_blocks {
                    return self.batch_entry_wb(i, batch, acts);
                }
                let chunks = e.blocks.div_ceil(slot_blocks);
                if self.free_slots.len() < chunks.min(self.cfg.staging_slots) as usize
                    || (chunks > self.cfg.staging_slots && !self.wb_ops.is_empty())
                {
                    return false;
                }
                // Issue what staging allows now; an entry longer than the whole pool goes in
                // rounds (its chunks do not overlap each other): `continue_partial` issues
                // chunks from the recorded offset while slots last.
                self.entries[i].state = EState::Wb { issued: 0, done: 0 };
                self.wb_activate(e.seq);
                self.wb_partial = Some((e.seq, 0));
                self.continue_partial(acts);
                true
            }
        }
    }

    /// Issues writeback chunks of the entry whose chunks did not all fit in staging, from
    /// where it stopped, while slots last.
    fn continue_partial(&mut self, acts: &mut Vec<Action>) {
        let Some((seq, mut off)) = self.wb_partial else {
            return;
        };
        let e = self.entry_mut(seq).clone();
        let slot_blocks = self.pool_slot_blocks();
        let mut more = 0;
        while off < e.blocks {
            let Some(slot) = self.free_slots.pop() else {
                break;
            };
            let n = (e.blocks - off).min(slot_blocks);
            let op = self.new_op(WbOp {
                seq,
                offset: off,
                blocks: n,
                slot: Some(slot),
                slot_off: 0,
                what: WbWhat::Data,
            });
            self.slot_refs[(slot - self.inner_slots) as usize] += 1;
            let start = ext_src_lba(&self.cfg, e.pos + 1 + off as u64);
            self.close_batch(
                &mut Some(OpenBatch {
                    slot,
                    start,
                    end: start + n as u64,
                    ops: vec![op],
                }),
                acts,
            );
            off += n;
            more += 1;
        }
        if let EState::Wb { issued, done } = self.entry_mut(seq).state {
            self.entry_mut(seq).state = EState::Wb {
                issued: issued + more,
                done,
            };
        }
        self.wb_partial = if off < e.blocks {
            Some((seq, off))
        } else {
            None
        };
    }

    /// Starts writeback of entry `i` (a write that fits one staging slot) as a chunk of the
    /// open batch, or of a new one: one read brings the log data of a batch's chunks into
    /// one slot (written-back entries are adjacent in the ring, so that read is one IO
    /// instead of one per entry). Returns false when staging or the writeback budget ran out.
    fn batch_entry_wb(
        &mut self,
        i: usize,
        batch: &mut Option<OpenBatch>,
        acts: &mut Vec<Action>,
    ) -> bool {
        let e = &self.entries[i];
        let (seq, blocks) = (e.seq, e.blocks as u64);
        let p = ext_src_lba(&self.cfg, e.pos + 1);
        let slot_blocks = self.pool_slot_blocks() as u64;
        let active = self.wb_active.len();
        let staging = self.cfg.staging_slots as usize;
        // Entries in writeback at most (`pacing.depth`), and the fewest a new batch starts
        // with room for: with one slot freed per finished entry, batches would be one entry
        // each.
        let cap = self.cfg.pacing.depth.max(1) as usize;
        let min_batch = (staging / 4).min(cap.div_ceil(3)).max(1);
        if let Some(b) = batch.as_ref() {
            let joins = p >= b.end
                && p - b.end <= MAX_BATCH_GAP
                && p + blocks - b.start <= slot_blocks
                && active < cap;
            if !joins {
                self.close_batch(batch, acts);
            }
        }
        if batch.is_none() {
            if active > 0 && active + min_batch > cap {
                return false;
            }
            let Some(slot) = self.free_slots.pop() else {
                return false;
            };
            *batch = Some(OpenBatch {
                slot,
                start: p,
                end: p,
                ops: Vec::new(),
            });
        }
        let (slot, start) = batch.as_ref().map(|b| (b.slot, b.start)).expect("batch");
        let op = self.new_op(WbOp {
            seq,
            offset: 0,
            blocks: blocks as u32,
            slot: Some(slot),
            slot_off: (p - start) as u32,
            what: WbWhat::Data,
        });
        let b = batch.as_mut().expect("batch");
        b.end = p + blocks;
        b.ops.push(op);
        self.slot_refs[(slot - self.inner_slots) as usize] += 1;
        self.entries[i].state = EState::Wb { issued: 1, done: 0 };
        self.wb_activate(seq);
        true
    }

    /// Issues the read of a batch's log data into its slot.
    fn close_batch(&mut self, batch: &mut Option<OpenBatch>, acts: &mut Vec<Action>) {
        let Some(b) = batch.take() else {
            return;
        };
        let id = self.next_batch;
        self.next_batch += 1;
        let io = self.new_io(OwnIo::WbRead { batch: id });
        acts.push(Action::Read {
            io,
            dev: Dev::Cache,
            lba: Lba(b.start),
            blocks: (b.end - b.start) as u32,
            buf: BufRef::Pool {
                slot: b.slot,
                offset: 0,
            },
        });
        self.wb_batches.insert(id, b.ops);
    }

    /// A writeback chunk is done with its staging slot.
    fn release_slot(&mut self, slot: u32) {
        let r = &mut self.slot_refs[(slot - self.inner_slots) as usize];
        *r -= 1;
        if *r == 0 {
            self.free_slots.push(slot);
        }
    }

    fn wb_read_done(&mut self, batch: u64, ok: bool) {
        let ops = self.wb_batches.remove(&batch).expect("writeback batch");
        if !ok {
            self.counters.wb_errors += 1;
            // Read them again later.
            for op in ops {
                let o = self.wb_ops.remove(&op).expect("writeback chunk");
                self.release_slot(o.slot.expect("slot"));
                self.chunk_failed(o);
            }
            return;
        }
        for op in ops {
            let o = self.wb_ops[&op];
            let e = self.entry_mut(o.seq);
            let (core, lba) = (e.core, e.lba);
            self.inner_events.push_back(Event::Write {
                req: ReqId(INTERNAL_REQ | op),
                core: CoreId(core),
                lba: Lba(lba + o.offset as u64),
                blocks: o.blocks,
                fua: false,
            });
        }
    }

    /// A chunk failed: the entry's writeback restarts from scratch after a delay (its chunks
    /// still in flight finish first).
    fn chunk_failed(&mut self, o: WbOp) {
        self.wb_retry_at = Some(Nanos(self.now.0 + RETRY_NS));
        let e = self.entry_mut(o.seq);
        if let EState::Wb { issued, done } = e.state {
            e.state = EState::Wb {
                issued: issued - 1,
                done,
            };
        }
        self.failed_entries.insert(o.seq);
        self.settle_entry(o.seq);
    }

    /// Entry `seq` goes into writeback.
    fn wb_activate(&mut self, seq: u64) {
        let e = self.entry_mut(seq);
        let (core, lba, blocks) = (e.core, e.lba, e.blocks as u64);
        self.wb_active.insert(seq);
        self.wb_ranges.insert((core, lba, seq), lba + blocks);
        self.wb_max_blocks = self.wb_max_blocks.max(blocks);
    }

    /// Whether an entry in writeback overlaps the range (as [`Entry::overlaps`]).
    fn wb_overlaps(&self, core: u16, lba: u64, blocks: u32) -> bool {
        let lo = lba.saturating_sub(self.wb_max_blocks);
        self.wb_ranges
            .range((core, lo, 0)..(core, lba + blocks as u64, 0))
            .any(|(_, &end)| end > lba)
    }

    fn settle_entry(&mut self, seq: u64) {
        let partial = self.wb_partial.is_some_and(|(s, _)| s == seq);
        let e = self.entry_mut(seq);
        if let EState::Wb { issued, done } = e.state
            && issued == done
            && !partial
        {
            let (core, lba) = (e.core, e.lba);
            self.wb_active.remove(&seq);
            self.wb_ranges.remove(&(core, lba, seq));
            if self.failed_entries.remove(&seq) {
                self.entry_mut(seq).state = EState::Logged;
                self.wb_cursor = self.wb_cursor.min(seq);
            } else {
                let e = self.entry_mut(seq);
                e.state = EState::Done;
                let b = if e.kind == LogKind::Write {
                    e.blocks as u64
                } else {
                    0
                };
                self.counters.entries_written_back += 1;
                self.counters.blocks_written_back += b;
            }
        }
    }

    fn internal_done(&mut self, op: u64, result: Result<(), ReqError>) {
        let o = self.wb_ops.remove(&op).expect("internal request");
        if let Some(s) = o.slot {
            self.release_slot(s);
        }
        if o.what == WbWhat::Flush {
            if result.is_err() {
                self.counters.wb_errors += 1;
                self.wb_flush_failed = true;
            }
            self.wb_flushes_left -= 1;
            if self.wb_flushes_left == 0 {
                self.wb_flushing = false;
                let upto = self.wb_flush_upto.take();
                if std::mem::take(&mut self.wb_flush_failed) {
                    // Write what the generation has written back again after a delay: the
                    // core may have lost part of it. Entries still in writeback (a prefix's
                    // flush runs beside them) go again too once they settle: an earlier entry
                    // written again must not land after a later overlapping one.
                    self.wb_retry_at = Some(Nanos(self.now.0 + RETRY_NS));
                    let g = self.entries[0].gen_;
                    for e in self.entries.iter_mut().take_while(|e| e.gen_ == g) {
                        match e.state {
                            EState::Done => e.state = EState::Logged,
                            EState::Wb { .. } => {
                                self.failed_entries.insert(e.seq);
                            }
                            _ => {}
                        }
                    }
                    self.wb_cursor = self.entries[0].seq;
                    self.wb_done_upto = self.entries[0].seq;
                } else {
                    self.retire_front(upto);
                }
            }
            return;
        }
        if result.is_err() {
            self.counters.wb_errors += 1;
            self.chunk_failed(o);
            return;
        }
        let e = self.entry_mut(o.seq);
        if let EState::Wb { issued, done } = e.state {
            e.state = EState::Wb {
                issued,
                done: done + 1,
            };
        }
        self.settle_entry(o.seq);
    }

    /// Retires the front generation (`upto: None`) or its entries before sequence number
    /// `upto` (all written back and flushed on their cores), and has the superblock's tail
    /// follow.
    fn retire_front(&mut self, upto: Option<u64>) {
        let g = self.entries[0].gen_;
        while let Some(e) = self.entries.front() {
            if e.gen_ != g || upto.is_some_and(|u| e.seq >= u) {
                break;
            }
            let e = self.entries.pop_front().expect("front");
            debug_assert_eq!(e.state, EState::Done, "retiring an entry not written back");
            if matches!(e.kind, LogKind::Write | LogKind::Trim | LogKind::Zero) {
                self.index
                    .retire(e.core, e.lba, e.lba + e.blocks as u64, e.seq);
            }
        }
        if upto.is_some() {
            self.counters.prefix_retires += 1;
        } else {
            self.counters.gens_retired += 1;
            self.gen_gate_seq = self.tail().1;
        }
        self.sb_due = Some(self.tail());
    }

    // ----- IO completions and the read cache -----

    fn own_io_done(&mut self, io: IoId, result: Result<(), IoError>, acts: &mut Vec<Action>) {
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
    fn pump_inner(&mut self, acts: &mut Vec<Action>) {
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

    /// Management steps: `invalidate`'s voiding once writeback is idle, and the flushes of
    /// `invalidate` and of a clean stop.
    fn run_mgmt(&mut self, acts: &mut Vec<Action>) {
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

/// The most blocks one entry spans (a header and 32 MiB of data, the largest NBD request).
const MAX_ENTRY_SPAN: u64 = 1 + (32 << 20) / 512;

/// The scan ended at ring position `pos` where entry `seq` should be: the end of the log, or
/// damage? An entry the log had made durable cannot be missing after a crash (a power cut
/// loses or tears only what no flush covered), so it is damage if the log superblock says
/// `seq` was durable, or if a later entry of this log — looked for in the blocks an entry
/// `seq` could span, and the one after it — says so in its header.
fn check_end(
    cfg: &WlConfig,
    sb: &LogSuper,
    pos: u64,
    seq: u64,
    read: &mut ReadFn<'_>,
) -> Result<(), String> {
    let ring = sb.ring_blocks;
    let damaged = |by: String| {
        Err(format!(
            "the write log is damaged: entry {seq} (ring block {}) cannot be read, but {by} says it was made durable; refusing to load what would lose flushed writes (run tiercache check)",
            pos % ring
        ))
    };
    if sb.durable_seq > seq {
        return damaged("the log superblock".into());
    }
    let end = (pos + 2 * MAX_ENTRY_SPAN).min(sb.tail_pos + ring);
    let mut p = pos + 1;
    let mut buf = Vec::new();
    while p < end {
        // Read up to 1 MiB at a time, not across the ring's end.
        let phys = p % ring;
        let n = (end - p).min(ring - phys).min(2048);
        buf.resize(n as usize * LOG_BLOCK, 0);
        if read(Lba(cfg.ring_start() + phys), &mut buf).is_err() {
            return Ok(()); // unreadable: no evidence either way
        }
        for (i, b) in buf.chunks(LOG_BLOCK).enumerate() {
            if let Ok(h) = LogHeader::decode(b)
                && h.cache_id == cfg.cache_id
                && h.epoch <= sb.epoch
                && h.seq > seq
                && h.durable_seq > seq
            {
                return damaged(format!("entry {} at ring block {}", h.seq, phys + i as u64));
            }
        }
        p += n;
    }
    Ok(())
}

/// How [`scan`] reads the cache device: blocks at an LBA into a buffer.
pub type ReadFn<'a> = dyn FnMut(Lba, &mut [u8]) -> Result<(), String> + 'a;

/// Reads a write log from the cache device: the superblock in force, then every entry from
/// its tail while each one is valid (framed, checksummed, of this cache, next in sequence,
/// of a non-decreasing epoch no newer than the superblock's, with its data's checksum). The
/// first entry that fails any of these ends the log: everything after it was never covered
/// by a completed flush (a flush waits for every earlier entry).
pub fn scan(cfg: &WlConfig, read: &mut ReadFn<'_>) -> Result<Recovered, String> {
    let mut c0 = vec![0u8; LOG_BLOCK];
    let mut c1 = vec![0u8; LOG_BLOCK];
    read(cfg.log_start, &mut c0)?;
    read(Lba(cfg.log_start.0 + 1), &mut c1)?;
    let (sb, sb_copy) = LogSuper::pick(&c0, &c1)
        .map_err(|e| format!("the write log's superblock is damaged ({e}); run tiercache check"))?;
    if sb.cache_id != cfg.cache_id {
        return Err("the write log belongs to another cache".into());
    }
    if sb.ring_blocks != cfg.ring_blocks() {
        return Err(format!(
            "the write log's ring is {} blocks, the configuration says {}",
            sb.ring_blocks,
            cfg.ring_blocks()
        ));
    }
    let ring = sb.ring_blocks;
    let mut pos = sb.tail_pos;
    let mut seq = sb.tail_seq;
    let mut epoch = 0;
    let mut gen_ = sb.tail_gen;
    let mut entries = Vec::new();
    let mut hdr = vec![0u8; LOG_BLOCK];
    let mut data = Vec::new();
    while pos - sb.tail_pos < ring {
        let phys = pos % ring;
        if read(Lba(cfg.ring_start() + phys), &mut hdr).is_err() {
            break;
        }
        let Ok(h) = LogHeader::decode(&hdr) else {
            break;
        };
        if h.cache_id != cfg.cache_id
            || h.seq != seq
            || h.epoch < epoch
            || h.epoch > sb.epoch
            || h.gen_ < gen_
        {
            break;
        }
        let after = match h.kind {
            LogKind::Write | LogKind::Pad | LogKind::Void => h.blocks as u64,
            LogKind::Trim | LogKind::Zero => 0,
        };
        if phys + 1 + after > ring || (h.kind == LogKind::Pad && phys + 1 + after != ring) {
            break;
        }
        if pos + 1 + after - sb.tail_pos > ring {
            break;
        }
        if h.kind == LogKind::Write {
            data.resize(h.blocks as usize * 512, 0);
            if read(Lba(cfg.ring_start() + phys + 1), &mut data).is_err()
                || crc32c(&data) != h.data_crc
            {
                break;
            }
        }
        epoch = h.epoch;
        gen_ = h.gen_;
        seq += 1;
        pos += 1 + after;
        entries.push(h);
    }
    if pos - sb.tail_pos < ring {
        check_end(cfg, &sb, pos, seq, read)?;
    }
    Ok(Recovered {
        sb,
        sb_copy,
        entries,
        head_pos: pos,
    })
}
