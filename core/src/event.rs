//! What happens to a cache ([`Event`]) and what the cache asks the outside world to do
//! ([`Action`]).
//!
//! The core never touches bytes. Request data lives in buffers the driver owns, named by the
//! request ([`BufRef::Req`]); the core's own staging buffers (writeback, backfill) are slots of a
//! preallocated pool the driver also owns, named by slot index ([`BufRef::Pool`]). Every slot is
//! [`crate::Config::pool_slot_blocks`] blocks long and the core never hands out more than
//! [`crate::Config::pool_slots`] at once, so the driver can allocate the whole pool up front.

use crate::units::{CoreId, IoId, Lba, ReqId};

/// An operating error from a device, as the core sees it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum IoError {
    /// The device returned an IO error (EIO and friends).
    Io,
    /// The device is full (ENOSPC).
    NoSpace,
    /// The device did not answer within its timeout.
    TimedOut,
}

/// The error a client request completes with.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReqError {
    /// A device error that the request could not hide (core read, write-through write, ...).
    Io(IoError),
    /// The request is out of range for its core (reads and trims: EINVAL).
    OutOfRange,
    /// A write past the end of the core (ENOSPC, as the NBD protocol says).
    PastEnd,
    /// The core named does not exist.
    NoSuchCore,
    /// The cache stopped admitting requests (stopping, or not running).
    NotRunning,
}

/// Which device an [`Action`] is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dev {
    /// The cache device.
    Cache,
    /// A core device.
    Core(CoreId),
}

/// A place in a buffer the driver owns. Offsets are in 512-byte blocks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum BufRef {
    /// The data buffer of a client request: its read destination or its write source. It is
    /// `blocks * 512` bytes long, where `blocks` is the request's length.
    Req {
        /// The request.
        req: ReqId,
        /// Offset into the request's buffer.
        offset: u32,
    },
    /// A metadata buffer the core encoded (journal record, checkpoint chunk, superblock and
    /// tables); the driver reads it through [`crate::Cache::meta_buf`]. Only ever a write source.
    Meta {
        /// Buffer id.
        id: u32,
        /// Offset into the buffer.
        offset: u32,
    },
    /// A slot of the core's staging pool.
    Pool {
        /// Slot index, `< Config::pool_slots`.
        slot: u32,
        /// Offset into the slot.
        offset: u32,
    },
}

/// One thing that happened. The engine or the simulator produces these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Read `blocks` blocks of core `core` at `lba` into the request's buffer.
    Read {
        /// Request id.
        req: ReqId,
        /// Core.
        core: CoreId,
        /// First block.
        lba: Lba,
        /// Length in blocks (> 0).
        blocks: u32,
    },
    /// Write the request's buffer to core `core` at `lba`.
    Write {
        /// Request id.
        req: ReqId,
        /// Core.
        core: CoreId,
        /// First block.
        lba: Lba,
        /// Length in blocks (> 0).
        blocks: u32,
        /// Force unit access: durable when completed.
        fua: bool,
    },
    /// Make every write completed before this event durable (NBD_CMD_FLUSH).
    Flush {
        /// Request id.
        req: ReqId,
        /// The core whose export received the flush.
        core: CoreId,
    },
    /// Discard blocks. The core treats a TRIM like WRITE_ZEROES: the driver guarantees that a
    /// trimmed range reads back as zeros on every device it ships (see docs/SAFETY.md).
    Trim {
        /// Request id.
        req: ReqId,
        /// Core.
        core: CoreId,
        /// First block.
        lba: Lba,
        /// Length in blocks (> 0).
        blocks: u32,
    },
    /// Write zeros (NBD_CMD_WRITE_ZEROES).
    WriteZeroes {
        /// Request id.
        req: ReqId,
        /// Core.
        core: CoreId,
        /// First block.
        lba: Lba,
        /// Length in blocks (> 0).
        blocks: u32,
        /// Force unit access.
        fua: bool,
    },
    /// A device IO the core asked for finished.
    IoDone {
        /// The IO.
        io: IoId,
        /// Its result.
        result: Result<(), IoError>,
    },
    /// Time passed; run timers (cleaner wake-ups, throttled writes).
    Tick,
}

/// One thing the core asks the driver to do. IOs complete with [`Event::IoDone`] carrying the
/// same `io`; `Complete` and `Copy` are done by the driver at once, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Read from a device into a buffer.
    Read {
        /// IO id.
        io: IoId,
        /// Device.
        dev: Dev,
        /// First block on the device.
        lba: Lba,
        /// Length in blocks.
        blocks: u32,
        /// Destination.
        buf: BufRef,
    },
    /// Write a buffer to a device.
    Write {
        /// IO id.
        io: IoId,
        /// Device.
        dev: Dev,
        /// First block on the device.
        lba: Lba,
        /// Length in blocks.
        blocks: u32,
        /// Source.
        buf: BufRef,
        /// Durable on completion.
        fua: bool,
    },
    /// Write zeros to a device range.
    WriteZeroes {
        /// IO id.
        io: IoId,
        /// Device.
        dev: Dev,
        /// First block on the device.
        lba: Lba,
        /// Length in blocks.
        blocks: u32,
        /// Durable on completion.
        fua: bool,
    },
    /// Discard a device range; it must read back as zeros afterwards.
    Trim {
        /// IO id.
        io: IoId,
        /// Device.
        dev: Dev,
        /// First block on the device.
        lba: Lba,
        /// Length in blocks.
        blocks: u32,
    },
    /// Make every write the device completed before this action durable.
    Flush {
        /// IO id.
        io: IoId,
        /// Device.
        dev: Dev,
    },
    /// Copy `blocks` blocks between two buffers (the driver does it at once).
    Copy {
        /// Source.
        src: BufRef,
        /// Destination.
        dst: BufRef,
        /// Length in blocks.
        blocks: u32,
    },
    /// Reply to a client request. Its buffer is the driver's again.
    Complete {
        /// Request id.
        req: ReqId,
        /// Result.
        result: Result<(), ReqError>,
    },
}
