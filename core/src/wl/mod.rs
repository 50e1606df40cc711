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
//!
//! Files (each holds one role's `impl WriteLog` block or types):
//!
//! | file | role |
//! |---|---|
//! | `mod.rs` | the [`WriteLog`] type, constants, this map |
//! | `config.rs` | [`WlConfig`], ring geometry |
//! | `entry.rs` | log entries and the records of the log's own work (IOs, flush waiters, reads, writeback chunks) |
//! | `open.rs` | creating a log, opening a recovered one |
//! | `events.rs` | `apply`, client requests, the `maintain` loop, deadlines |
//! | `append.rs` | appending entries to the ring, log-write completions, void rewrites |
//! | `flush.rs` | client flushes and the log superblock |
//! | `read.rs` | client reads (index, then read cache) and pins |
//! | `writeback.rs` | writeback by generation, staging slots and batches |
//! | `retire.rs` | the cores' flushes before retiring, retiring entries |
//! | `io.rs` | completions of own IOs, the read cache's actions translated |
//! | `mgmt.rs` | cores, clean stop, `invalidate`, pause/pacing/drain, buffers |
//! | `health.rs` | the log device's error episodes and health |
//! | `stats.rs` | [`WlCounters`] and state queries |
//! | `recovery.rs` | [`scan`]: the log read back after a crash or stop |
//! | `check.rs` | `check_invariants` (tests and `strict-asserts`) |
//! | `index.rs` | the log index: newest entry per block range |
//! | `pace.rs` | when writeback runs |
//! | `device.rs` | a write log on a cache device |

mod append;
mod check;
mod config;
pub mod device;
mod entry;
mod events;
mod flush;
mod health;
pub mod index;
mod io;
mod mgmt;
mod open;
pub mod pace;
mod read;
mod recovery;
mod retire;
mod stats;
mod writeback;

pub use config::WlConfig;
pub use recovery::{ReadFn, Recovered, scan};
pub use stats::WlCounters;

use self::entry::{Entry, FlushWaiter, OwnIo, Pending, ReadState, WbOp};
use self::health::LogEpisode;

use crate::cache::Cache;
use crate::cache::DeviceErrors;
use crate::event::{Action, Event};
use crate::units::{Nanos, ReqId};
use index::Index;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use tiercache_format::wlog::LOG_BLOCK;

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

/// The write log. See the module docs.
pub struct WriteLog {
    cfg: WlConfig,
    /// Events applied (invariant-check sampling; read only in builds with the checks).
    #[cfg_attr(not(any(test, feature = "strict-asserts")), allow(dead_code))]
    events_applied: u64,
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

/// Where a management step's cache-device flush (clean stop, `invalidate`) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MgmtFlushState {
    /// Due (not issued yet).
    No,
    InFlight,
    Done,
}
