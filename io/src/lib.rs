//! IO backends of tiercache behind one trait, [`Backend`], with one conformance suite
//! ([`conformance::conformance`]) that every backend passes.
//!
//! Backends speak block-device semantics in 512-byte blocks ([`BLOCK`]):
//! - [`FileBackend`]: a regular file or a block device, with `O_DIRECT` where the file system
//!   allows it (buffered otherwise) and io_uring where the kernel allows it (`pread`/`pwrite`
//!   otherwise), chosen at run time; the path in use is reported by [`Backend::name`].
//! - [`RamBackend`]: volatile memory; flush is a no-op.
//! - [`RbdBackend`]: a Ceph RBD image through librbd, loaded at run time (`rbd:POOL/IMAGE`).
//! - [`FaultBackend`]: a wrapper that injects seeded errors (EIO, ENOSPC, timeouts), delays
//!   (a very slow device) and hangs, and emulates a power cut that drops or tears (at 512 B
//!   granularity) writes not covered by a completed flush.
//! - [`TimeoutBackend`]: a wrapper that fails an IO with `TimedOut` after a configurable time
//!   and keeps late writes from being overtaken.
//!
//! [`BufPool`] is a bounded, preallocated pool of aligned IO buffers (the engine's).
//! [`identity`] tells devices apart for the core table (a block device's WWN or serial, a
//! file's file system id and inode).
//!
//! The API is synchronous: the engine calls it from its worker threads. A backend with an
//! asynchronous path of its own ([`RbdBackend`]: librbd's aio with completion callbacks) also
//! offers [`Backend::submit_async`], which returns at once and reports the completion through a
//! callback, so that an engine need not block a thread per IO. Every request is checked
//! first: a buffer whose length is not a multiple of 512 gives [`IoErr::Misaligned`], a range past
//! the end gives [`IoErr::OutOfRange`]; neither changes anything and nothing panics.

mod aligned;
pub mod conformance;
mod emu;
mod error;
mod fault;
mod file;
mod forward;
pub mod identity;
pub mod log;
mod nbd;
mod overlay;
mod pool;
mod ram;
mod rbd;
mod ring;
mod slab;
mod timeout;
mod uring;

pub use aligned::{ALIGN, AlignedBuf};
pub use emu::{EmuBackend, EmuStats, EmuTarget, open_emu, parse_emu};
pub use error::IoErr;
pub use fault::{
    FaultBackend, FaultConfig, InjectedError, OpKind, PowerCutPattern, PowerCutReport,
};
pub use file::{FileBackend, FileOptions, IoPath};
pub use nbd::{NbdBackend, NbdEvent, NbdExportInfo, NbdOptions, nbd_endpoints};
pub use overlay::OverlayBackend;
pub use pool::{BufPool, PoolStats};
pub use ram::RamBackend;
pub use rbd::{
    DEFAULT_CLIENT_ID, DIRTY_KEY, RbdBackend, RbdIdentity, RbdOptions, RbdTarget, parse_rbd,
    rbd_available, rbd_identity,
};
pub use ring::{Ring, RingDone, RingOp};
pub use slab::Slab;
pub use timeout::{TimeoutBackend, TimeoutStats};

/// Size of one block in bytes: every LBA counts 512-byte blocks and every buffer is a multiple
/// of it.
pub const BLOCK: usize = 512;

/// A block device: reads, writes, zeroing, trim and flush in 512-byte blocks.
///
/// Implementations are shared between threads; concurrent requests to disjoint ranges must all
/// land. Requests to overlapping ranges that run concurrently have no defined order.
pub trait Backend: Send + Sync {
    /// A human-readable description, including the IO path in use
    /// (for example `file:/dev/nvme0n1 (O_DIRECT, pread/pwrite)`).
    fn name(&self) -> String;

    /// The capacity in 512-byte blocks.
    fn blocks(&self) -> u64;

    /// Reads `buf.len() / 512` blocks starting at `lba` into `buf`.
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr>;

    /// Writes `buf` at `lba`. With `fua` the data is durable when the call returns
    /// (force unit access); otherwise it is durable after the next completed [`Backend::flush`].
    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr>;

    /// Writes `blocks` blocks of zeros at `lba` (durable at return with `fua`).
    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr>;

    /// Discards `blocks` blocks at `lba`. Discarded blocks read back as zeros.
    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr>;

    /// Makes everything completed before this call durable, including the device's volatile
    /// write cache (`fdatasync` for files and block devices).
    fn flush(&self) -> Result<(), IoErr>;

    /// Whether requests complete in well under a microsecond per 4 KiB without blocking (RAM):
    /// an engine may then run them inline instead of handing them to an IO thread.
    fn inline(&self) -> bool {
        false
    }

    /// A hint that a read of `blocks` blocks at `lba` probably follows within a microsecond:
    /// an inline device (memory) may start loading the first of them into CPU cache, so that
    /// the read's copy finds them on the way. Never changes results, never fails, never waits;
    /// the default does nothing.
    fn prefetch(&self, _lba: u64, _blocks: u64) {}

    /// What the device knows of the allocation of blocks `[lba, lba + blocks)` (NBD block
    /// status): consecutive runs from `lba`, covering at least the first block (when `blocks`
    /// is not 0) and at most `blocks`; a device may stop early, and the caller asks again from
    /// where it stopped. A run marked [`Extent::hole`] must read as zeros. The default knows
    /// nothing: one allocated run, which is always correct. A wrapper that keeps data of its
    /// own (unflushed writes, an overlay) must not forward this.
    fn extents(&self, lba: u64, blocks: u64) -> Result<Vec<Extent>, IoErr> {
        check_blocks(lba, blocks, self.blocks())?;
        Ok(Extent::allocated(blocks))
    }

    /// The file descriptor on which this device's reads, writes and flushes are `pread`,
    /// `pwrite` (with `RWF_DSYNC` for FUA) and `fdatasync` at byte offset `lba * 512`, for a
    /// caller that runs them on an io_uring of its own ([`Ring`]). `None` (the default): only
    /// the calls of this trait are this device's IO — a wrapper that injects faults, delays or
    /// timeouts must not give one; a device that keeps state of its own beside the file may,
    /// if [`Backend::ring_completed`] keeps that state. A caller that gets an error or a short
    /// transfer from the ring runs the request again through the calls (which then report the
    /// error, or apply their fallbacks).
    fn ring_fd(&self) -> Option<std::os::unix::io::RawFd> {
        None
    }

    /// Called by a caller that ran a write or a flush on [`Backend::ring_fd`] and had all of it
    /// done, before it uses the result: a device with state of its own beside the file (the
    /// power-cut overlay's log of un-flushed writes) records the IO here. An error replaces
    /// the ring's success. The default does nothing.
    fn ring_completed(&self, _io: RingCompleted<'_>) -> Result<(), IoErr> {
        Ok(())
    }

    /// Whether [`Backend::submit_async`] returns without waiting for the IO (and never calls
    /// its callback on the submitting thread). Without it, `submit_async` runs the request
    /// synchronously and calls the callback before it returns.
    fn is_async(&self) -> bool {
        false
    }

    /// Starts `req` and calls `done` exactly once when it has finished, with the request's
    /// buffer (a read's data, or the written buffer given back) and the result.
    ///
    /// When [`Backend::is_async`] holds, this returns at once and `done` runs later on another
    /// thread (the backend's), even for a request refused at once; so a caller may hold a lock
    /// that `done` takes. The default runs the request with the synchronous calls, then `done`,
    /// before returning. Requests in flight at the same time have no defined order; a
    /// [`AsyncReq::Flush`] covers the requests completed before it was submitted.
    fn submit_async(&self, req: AsyncReq, done: AsyncDone) {
        submit_sync(self, req, done)
    }

    /// Executes a batch of requests and returns one result per request, in order.
    ///
    /// The default runs them one after the other; a backend with an asynchronous path (such as
    /// io_uring) may overlap them. Requests in one batch must not overlap each other.
    fn submit_batch(&self, reqs: &mut [Req<'_>]) -> Vec<Result<(), IoErr>> {
        reqs.iter_mut()
            .map(|r| match r {
                Req::Read { lba, buf } => self.read(*lba, buf),
                Req::Write { lba, buf, fua } => self.write(*lba, buf, *fua),
                Req::WriteZeroes { lba, blocks, fua } => self.write_zeroes(*lba, *blocks, *fua),
                Req::Trim { lba, blocks } => self.trim(*lba, *blocks),
                Req::Flush => self.flush(),
            })
            .collect()
    }
}

/// A write or flush that a caller ran on a device's [`Backend::ring_fd`], reported to the
/// device with [`Backend::ring_completed`].
#[derive(Debug, Clone, Copy)]
pub enum RingCompleted<'a> {
    /// `data` was written at block `lba` (with `RWF_DSYNC` when `fua`).
    Write {
        /// First block.
        lba: u64,
        /// What was written.
        data: &'a [u8],
        /// Force unit access.
        fua: bool,
    },
    /// The descriptor was `fdatasync`ed.
    Flush,
}

/// A run of blocks and what a device knows of them ([`Backend::extents`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Blocks in the run.
    pub blocks: u64,
    /// Not allocated on the device (a hole of a sparse file): reads as zeros. `false` means
    /// allocated, or not known.
    pub hole: bool,
}

impl Extent {
    /// `blocks` blocks allocated (or not known): one run, none for 0 blocks.
    pub fn allocated(blocks: u64) -> Vec<Extent> {
        if blocks == 0 {
            Vec::new()
        } else {
            vec![Extent {
                blocks,
                hole: false,
            }]
        }
    }

    /// Appends a run to `v`, merging it into the last one when it is of the same kind.
    pub fn push(v: &mut Vec<Extent>, blocks: u64, hole: bool) {
        if blocks == 0 {
            return;
        }
        match v.last_mut() {
            Some(l) if l.hole == hole => l.blocks += blocks,
            _ => v.push(Extent { blocks, hole }),
        }
    }
}

/// One request of a [`Backend::submit_batch`] call.
#[derive(Debug)]
pub enum Req<'a> {
    /// Read into `buf` from `lba`.
    Read {
        /// First block.
        lba: u64,
        /// Destination, a multiple of 512 bytes.
        buf: &'a mut [u8],
    },
    /// Write `buf` at `lba`.
    Write {
        /// First block.
        lba: u64,
        /// Source, a multiple of 512 bytes.
        buf: &'a [u8],
        /// Durable on completion.
        fua: bool,
    },
    /// Write zeros.
    WriteZeroes {
        /// First block.
        lba: u64,
        /// Number of blocks.
        blocks: u64,
        /// Durable on completion.
        fua: bool,
    },
    /// Discard blocks (they read back as zeros).
    Trim {
        /// First block.
        lba: u64,
        /// Number of blocks.
        blocks: u64,
    },
    /// Make everything completed before it durable.
    Flush,
}

/// A request of [`Backend::submit_async`]: like [`Req`], but it owns its buffer, which
/// [`AsyncDone`] gives back.
#[derive(Debug)]
pub enum AsyncReq {
    /// Read `buf.len()` bytes from `lba` into `buf`.
    Read {
        /// First block.
        lba: u64,
        /// Destination, a multiple of 512 bytes.
        buf: AlignedBuf,
    },
    /// Write `buf` at `lba`.
    Write {
        /// First block.
        lba: u64,
        /// Source, a multiple of 512 bytes.
        buf: AlignedBuf,
        /// Durable on completion.
        fua: bool,
    },
    /// Write zeros.
    WriteZeroes {
        /// First block.
        lba: u64,
        /// Number of blocks.
        blocks: u64,
        /// Durable on completion.
        fua: bool,
    },
    /// Discard blocks (they read back as zeros).
    Trim {
        /// First block.
        lba: u64,
        /// Number of blocks.
        blocks: u64,
    },
    /// Make everything completed before it durable.
    Flush,
}

/// The completion of a [`Backend::submit_async`] request: the request's buffer (reads and
/// writes) and its result.
pub type AsyncDone = Box<dyn FnOnce(Option<AlignedBuf>, Result<(), IoErr>) + Send>;

/// Runs an [`AsyncReq`] with the synchronous calls of `dev`, then `done`: what
/// [`Backend::submit_async`] does for a backend without an asynchronous path.
pub fn submit_sync<B: Backend + ?Sized>(dev: &B, req: AsyncReq, done: AsyncDone) {
    let (buf, r) = run_sync(dev, req);
    done(buf, r)
}

/// Runs an [`AsyncReq`] with the synchronous calls of `dev`: the request's buffer (reads and
/// writes) and the result.
pub fn run_sync<B: Backend + ?Sized>(
    dev: &B,
    req: AsyncReq,
) -> (Option<AlignedBuf>, Result<(), IoErr>) {
    match req {
        AsyncReq::Read { lba, mut buf } => {
            let r = dev.read(lba, &mut buf);
            (Some(buf), r)
        }
        AsyncReq::Write { lba, buf, fua } => {
            let r = dev.write(lba, &buf, fua);
            (Some(buf), r)
        }
        AsyncReq::WriteZeroes { lba, blocks, fua } => (None, dev.write_zeroes(lba, blocks, fua)),
        AsyncReq::Trim { lba, blocks } => (None, dev.trim(lba, blocks)),
        AsyncReq::Flush => (None, dev.flush()),
    }
}

/// Checks a request of `len` bytes at `lba` against a device of `dev_blocks` blocks and returns
/// its length in blocks: [`IoErr::Misaligned`] when `len` is not a multiple of [`BLOCK`],
/// [`IoErr::OutOfRange`] when the range does not fit (without overflowing).
pub fn check_bytes(lba: u64, len: usize, dev_blocks: u64) -> Result<u64, IoErr> {
    if len % BLOCK != 0 {
        return Err(IoErr::Misaligned { len });
    }
    let blocks = (len / BLOCK) as u64;
    check_blocks(lba, blocks, dev_blocks)?;
    Ok(blocks)
}

/// Checks that `blocks` blocks at `lba` fit in a device of `dev_blocks` blocks.
pub fn check_blocks(lba: u64, blocks: u64, dev_blocks: u64) -> Result<(), IoErr> {
    match lba.checked_add(blocks) {
        Some(end) if end <= dev_blocks => Ok(()),
        _ => Err(IoErr::OutOfRange {
            lba,
            blocks,
            dev_blocks,
        }),
    }
}

/// Forwards every operation to the pointed-to backend, so that wrappers such as
/// [`FaultBackend`] can hold a shared or boxed (also `dyn`) backend.
impl<T: Backend + ?Sized> Backend for Box<T> {
    crate::forward_backend!(*; all);
}

/// As for `Box`.
impl<T: Backend + ?Sized> Backend for std::sync::Arc<T> {
    crate::forward_backend!(*; all);
}
