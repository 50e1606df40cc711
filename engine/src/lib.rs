//! # tiercache-engine: the pure cache core, driven with real IO
//!
//! The core (`tiercache-core`) decides; the engine does. It owns the core, the devices
//! ([`tiercache_io::Backend`]s), every buffer the core names, and the threads:
//!
//! - **Callers** (any number of threads: NBD connections, a benchmark's queues) submit a
//!   request and wait for its reply. The submitting thread applies the event to the core under
//!   the engine's lock and executes what comes out. IOs on *inline* devices (RAM) run right
//!   there, so a RAM hit is one lock, one core decision and one copy, with no thread hop.
//! - **IO threads** (a fixed pool) run IOs on every other device. An IO gets its own aligned
//!   buffer from the engine's IO buffer pool (a write's data is copied into it under the lock;
//!   a read's data is copied out of it under the lock when it completes), so no two threads
//!   ever share a buffer.
//! - **Callers with a ring of their own** (an NBD connection's reactor, `nbd/src/reactor.rs`)
//!   submit without waiting ([`Engine::submit`], `ring.rs`): the file IOs a drive starts come
//!   back to them as [`EngineIo`]s to run on their io_uring and give back with
//!   [`Engine::complete`], and each reply goes to the request's [`ReplySink`], on whichever
//!   thread completes it.
//! - **A ticker** applies `Tick` at the core's next deadline (cleaner wake-ups, throttled
//!   writes, metadata retries) and at least every 50 ms.
//!
//! Memory is bounded and allocated up front: the core's staging pool (`pool_slots ×
//! pool_slot_blocks`, the core says how much) and the IO buffer pool
//! ([`EngineConfig::io_buffer_bytes`], a [`tiercache_io::BufPool`]). When the IO buffer pool
//! has no room, an IO waits in a queue (oldest first) until IOs in flight give theirs back;
//! only an IO larger than the whole pool gets a buffer of its own. Request buffers belong to
//! the caller; the owned-buffer calls ([`Engine::read_owned`], [`Engine::write_owned`]) avoid
//! copying them.
//!
//! How this scales past two CPUs is in `docs/ARCHITECTURE.md` ("How it scales").
//!
//! The path, file by file: a request is named and applied in `submit.rs`; `drive.rs` runs
//! the core's actions (inline, or as IOs); `buffers.rs` gives those IOs their buffers;
//! `completion.rs` runs them on the IO threads or an asynchronous device and applies their
//! results; `ring.rs` is the same for callers with an io_uring of their own, and `work.rs`
//! the IO threads' queue (writeback behind client IOs); `lifecycle.rs` starts, loads, manages
//! and stops an engine. How devices are told apart for the core table is `tiercache_io::identity`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiercache_core::cache::{CoreRecord, LoadReport};
use tiercache_core::event::{Action, BufRef, Dev, Event, IoError, ReqError};
use tiercache_core::units::{CoreId, IoId, Lba, Nanos, ReqId};
use tiercache_core::wl::WlConfig;
use tiercache_core::{Cache, Config, Machine};
use tiercache_io::{AlignedBuf, AsyncDone, Backend, BufPool, IoErr};

mod buffers;
mod completion;
mod drive;
mod extents;
/// Device identity moved to `tiercache-io`; re-exported for callers that name it here.
pub use tiercache_io::identity;
mod lifecycle;
pub mod readahead;
mod ring;
mod submit;
mod work;

use buffers::{buf_mut, buf_mut_in, buf_ref};
use completion::{done, run};
pub use ring::{EngineIo, IoTicket, ReplySink, ReplyTo};
use submit::Op;
pub use submit::{Pending, ReqOp};

/// The most bytes of contiguous writes the engine merges into one IO.
const MERGE_MAX_BYTES: u64 = 256 << 10;

/// A device shared between the engine's threads.
pub type Device = Arc<dyn Backend>;

/// Engine settings.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// IO threads for devices that are not inline (the most IOs in flight at once).
    pub io_threads: usize,
    /// Bytes of the IO buffer pool (rounded up to a power of two), allocated when the engine
    /// starts: the buffers of the IOs on devices that are not inline. At least the largest
    /// request (32 MiB over NBD) so that such a request waits for room instead of allocating.
    pub io_buffer_bytes: usize,
}

/// The default [`EngineConfig::io_buffer_bytes`]: 64 MiB.
pub const IO_BUFFER_BYTES: usize = 64 << 20;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            io_threads: 16,
            io_buffer_bytes: IO_BUFFER_BYTES,
        }
    }
}

impl EngineConfig {
    /// The default configuration with `io_threads` IO threads.
    pub fn threads(io_threads: usize) -> EngineConfig {
        EngineConfig {
            io_threads,
            ..EngineConfig::default()
        }
    }
}

/// A core device to attach: its id, device and what the core table records about it.
pub struct CoreSpec {
    /// Core id.
    pub id: CoreId,
    /// The device.
    pub dev: Device,
    /// Identity and export name.
    pub record: CoreRecord,
}

/// Counters of the engine itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineStats {
    /// IOs now running on IO threads.
    pub in_flight: u64,
    /// The most IOs that ran on IO threads at once.
    pub in_flight_max: u64,
    /// IOs run inline by the submitting thread.
    pub inline_ios: u64,
    /// IOs run by IO threads.
    pub thread_ios: u64,
    /// IOs run on a caller's io_uring ([`Engine::submit`]: an NBD connection's ring).
    pub ring_ios: u64,
    /// Writes that went to a device as part of another (contiguous writes merged into one
    /// IO: a write log's entry header and its data).
    pub merged_ios: u64,
    /// IOs issued to asynchronous devices ([`Backend::is_async`]: an RBD image), whose
    /// completions come back without an IO thread.
    pub async_ios: u64,
    /// Requests completed.
    pub requests: u64,
    /// IOs that waited for room in the IO buffer pool.
    pub buffer_waits: u64,
    /// IOs that got a buffer of their own because they are larger than the whole pool.
    pub buffer_oversize: u64,
    /// Bytes of the IO buffer pool, in use now, and the most in use at once.
    pub buffer_bytes: u64,
    pub buffer_in_use: u64,
    pub buffer_peak: u64,
}

/// One IO handed to an IO thread.
struct Job {
    io: IoId,
    /// Further IOs done by the same job (writes merged into one, [`Shared::write_run`]):
    /// they complete with its result.
    also: Vec<IoId>,
    dev: Device,
    op: JobOp,
    /// A writeback IO: it runs behind client requests' IOs (`work.rs`).
    background: bool,
}

/// What a job does: the owned-buffer request of the asynchronous backend call, which a
/// synchronous device runs on an IO thread.
type JobOp = tiercache_io::AsyncReq;

/// A request's buffer while the core works on it, and where its reply goes when it was
/// submitted without a thread waiting for it ([`Engine::submit`]).
struct Slot {
    /// The data: a write's payload, a read's destination. A read submitted without a buffer
    /// ([`Engine::submit`] with an empty one) has none until something writes into it
    /// ([`Slot::data`]), and takes the IO buffer itself when one device read fills all of it
    /// (`Shared::finished`: no copy).
    buf: AlignedBuf,
    /// The bytes `buf` must hold (`buf.len()` once it exists).
    want: usize,
    reply: Option<ReplyTo>,
    /// A write's CRC32C in mode `wl`, computed before the request took the engine's lock
    /// ([`Shared::write_crc`]): the log's entry header carries it.
    crc: Option<u32>,
}

impl Slot {
    /// The request's buffer, made (zeroed) if it does not exist yet.
    fn data(&mut self) -> &mut AlignedBuf {
        if self.buf.len() < self.want {
            self.buf = AlignedBuf::new(self.want);
        }
        &mut self.buf
    }
}

/// What happens to the IOs a drive starts on devices that are not inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Capture {
    /// Handed to the IO threads.
    Off,
    /// Kept for the driving thread, which runs the first itself ([`Shared::drive_capture`]).
    First,
    /// Kept for the driving thread's ring ([`Engine::submit`]): those on devices with a
    /// [`Backend::ring_fd`] go there, the rest to the IO threads.
    Ring,
}

struct Inner {
    /// The cache's state machine (an Open CAS-style cache or a write log).
    m: Machine,
    cache_dev: Device,
    cores: Vec<Option<Device>>,
    reqs: tiercache_core::hash::FxHashMap<ReqId, Slot>,
    done: tiercache_core::hash::FxHashMap<ReqId, (Result<(), ReqError>, AlignedBuf)>,
    /// Where the data of a read running on an IO thread goes: (destination, blocks).
    reads: tiercache_core::hash::FxHashMap<IoId, BufRef>,
    pool: Vec<AlignedBuf>,
    /// Buffers of IOs on devices that are not inline.
    bufs: BufPool,
    /// IOs waiting for room in `bufs`, oldest first (their source buffers stay put: the core
    /// does not reuse a buffer before the IO that names it completes).
    starved: VecDeque<Action>,
    /// The buffer [`Shared::retry_starved`] got for the IO it starts.
    handoff: Option<AlignedBuf>,
    next_req: u64,
    stats: EngineStats,
    /// Set by [`Engine::kill`]: no new IO is started, completions are dropped.
    dead: bool,
    /// Threads waiting on `done_cv` (notified only when there are any).
    waiting: u32,
    /// Reused between `drive` calls so the hot path does not allocate.
    events: VecDeque<Event>,
    actions: Vec<Action>,
    /// While a request's own thread drives the core (`capture`), the IOs it starts are kept
    /// here for that thread to run itself instead of handing them to an IO thread: a cache
    /// hit on a file then costs no thread hop (see [`Engine::request`]).
    capture: Capture,
    captured: Vec<Job>,
    /// Threads parked until their request completes (woken one by one, not all at once).
    waiters: tiercache_core::hash::FxHashMap<ReqId, std::thread::Thread>,
    /// The request whose own thread is driving the core now ([`Engine::request`]), and its
    /// reply if it completed during that drive: the common case (a hit) then goes back to
    /// its caller without a round trip through `done`.
    driving: Option<ReqId>,
    own_done: Option<(Result<(), ReqError>, AlignedBuf)>,
    /// The time of the last drive (each drive's time is at least this).
    last_drive: u64,
}

struct Shared {
    /// Itself, for the completions of asynchronous devices.
    me: Weak<Shared>,
    inner: Mutex<Inner>,
    /// Signalled when a request completes or the core's state moves (waiters re-check).
    done_cv: Condvar,
    work: Mutex<work::WorkQueue>,
    work_cv: Condvar,
    quit: AtomicBool,
    epoch: Instant,
    last_now: AtomicU64,
    /// The state machine is a write log (mode `wl`; fixed for the engine's life).
    wl: bool,
    /// The ticker thread, unparked when the core's deadline moves earlier.
    ticker: std::sync::OnceLock<std::thread::Thread>,
}

/// The engine. Dropping it without [`Engine::stop`] is a crash: nothing more is written.
pub struct Engine {
    sh: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}
