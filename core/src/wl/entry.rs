//! Log entries and the records the log keeps about its own work: waiting writes, own IOs,
//! flush waiters, reads in progress, writeback chunks and batches.

use super::index::{self};
use crate::event::ReqError;
use crate::units::{Nanos, ReqId};
use tiercache_format::wlog::LogKind;

/// What an entry is doing.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum EState {
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
pub(super) struct Entry {
    pub(super) seq: u64,
    pub(super) gen_: u64,
    pub(super) kind: LogKind,
    pub(super) core: u16,
    pub(super) lba: u64,
    pub(super) blocks: u32,
    /// Virtual ring position of the header.
    pub(super) pos: u64,
    pub(super) state: EState,
    /// The client request waiting for it (until acknowledged).
    pub(super) req: Option<(ReqId, bool)>,
    /// Meta buffer holding the header, while its write is in flight.
    pub(super) hdr_buf: Option<u32>,
    /// When it was logged (found, for an entry recovered by a scan).
    pub(super) at: Nanos,
}

impl Entry {
    pub(super) fn span(&self) -> u64 {
        1 + if self.kind.has_data() || matches!(self.kind, LogKind::Pad | LogKind::Void) {
            self.blocks as u64
        } else {
            0
        }
    }

    pub(super) fn overlaps(&self, core: u16, lba: u64, blocks: u32) -> bool {
        self.core == core
            && matches!(self.kind, LogKind::Write | LogKind::Trim | LogKind::Zero)
            && self.lba < lba + blocks as u64
            && lba < self.lba + self.blocks as u64
    }
}

/// A client write waiting to be logged.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    pub(super) req: ReqId,
    pub(super) kind: LogKind,
    pub(super) core: u16,
    pub(super) lba: u64,
    pub(super) blocks: u32,
    pub(super) fua: bool,
}

/// One of the write log's own IOs.
#[derive(Clone, Copy, Debug)]
pub(super) enum OwnIo {
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
pub(super) struct FlushWaiter {
    pub(super) req: ReqId,
    /// A FUA write's entry (it keeps blocking overlapping writes until acknowledged).
    pub(super) fua_seq: Option<u64>,
    /// Every entry with a smaller sequence number must be written first.
    pub(super) need_seq: u64,
    /// `log_writes_done` once that was true (then a flush covering it is what is left).
    pub(super) mark: Option<u64>,
}

/// A client read in progress.
#[derive(Debug)]
pub(super) struct ReadState {
    /// Overlay pieces still to apply after the read cache answered (offset, len, src).
    pub(super) overlay: Vec<index::Piece>,
    /// Positions pinned for this read.
    pub(super) pins: Vec<u64>,
    /// Log reads in flight.
    pub(super) ios_left: u32,
    /// Waiting for the read cache.
    pub(super) inner_pending: bool,
    pub(super) failed: Option<ReqError>,
}

/// One chunk of writeback: an internal request to the read cache.
#[derive(Clone, Copy, Debug)]
pub(super) struct WbOp {
    pub(super) seq: u64,
    /// Block offset inside the entry.
    pub(super) offset: u32,
    pub(super) blocks: u32,
    /// Staging slot (global index), for writes.
    pub(super) slot: Option<u32>,
    /// Where its data starts in the slot (blocks): the chunks of a batch share one slot.
    pub(super) slot_off: u32,
    /// What the internal request is.
    pub(super) what: WbWhat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WbWhat {
    Data,
    Trim,
    Zero,
    Flush,
}

/// Writeback chunks being gathered into one read: log data from `start` to `end` (physical
/// blocks of the cache device) into staging slot `slot`.
#[derive(Debug)]
pub(super) struct OpenBatch {
    pub(super) slot: u32,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) ops: Vec<u64>,
}
