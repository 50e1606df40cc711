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

mod extents;
pub mod readahead;
mod ring;
mod work;

pub use ring::{EngineIo, IoTicket, ReplySink, ReplyTo};

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
    buf: AlignedBuf,
    reply: Option<ReplyTo>,
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
}

/// The engine. Dropping it without [`Engine::stop`] is a crash: nothing more is written.
pub struct Engine {
    sh: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

fn io_error(e: &IoErr) -> IoError {
    match e {
        IoErr::Io { kind, .. } if *kind == std::io::ErrorKind::StorageFull => IoError::NoSpace,
        IoErr::Io { kind, .. } if *kind == std::io::ErrorKind::TimedOut => IoError::TimedOut,
        _ => IoError::Io,
    }
}

impl Shared {
    fn now(&self) -> Nanos {
        let n = self.epoch.elapsed().as_nanos() as u64;
        // Monotonic across threads even if two read the clock out of order.
        let prev = self.last_now.fetch_max(n, Ordering::Relaxed);
        Nanos(n.max(prev))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `ev` and everything it leads to that can run inline.
    fn drive(&self, g: &mut Inner, ev: Event) {
        let mut events = std::mem::take(&mut g.events);
        let mut actions = std::mem::take(&mut g.actions);
        // Buffers may have come back since the last drive (every completion drives).
        self.retry_starved(g, &mut events);
        events.push_back(ev);
        // One clock read per drive: the events it applies (a request and the completions of
        // the inline IOs it starts) happen within a few microseconds, and a clock read costs
        // about as much as a core decision's bookkeeping. Kept monotonic under the lock (no
        // atomic needed: every drive holds it).
        let now = Nanos((self.epoch.elapsed().as_nanos() as u64).max(g.last_drive));
        g.last_drive = now.0;
        while let Some(ev) = events.pop_front() {
            let Inner { m, reqs, .. } = &mut *g;
            m.apply(now, ev, &mut actions, &mut |req| {
                tiercache_format::crc::crc32c(&reqs[&req].buf)
            });
            let mut i = 0;
            while i < actions.len() {
                let n = self.write_run(g, &actions[i..]);
                if n > 1 {
                    self.execute_run(g, &actions[i..i + n]);
                    i += n;
                    continue;
                }
                self.execute(g, actions[i].clone(), &mut events);
                i += 1;
            }
            actions.clear();
        }
        g.events = events;
        g.actions = actions;
        if g.waiting > 0 {
            self.done_cv.notify_all();
        }
    }

    /// Waits on `done_cv` (at most `timeout`), counted so `drive` knows to notify.
    fn wait_done<'a>(
        &self,
        mut g: MutexGuard<'a, Inner>,
        timeout: Duration,
    ) -> MutexGuard<'a, Inner> {
        g.waiting += 1;
        let mut g = self
            .done_cv
            .wait_timeout(g, timeout)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        g.waiting -= 1;
        g
    }

    fn device(g: &Inner, dev: Dev) -> Device {
        Self::device_ref(g, dev).clone()
    }

    fn device_ref(g: &Inner, dev: Dev) -> &Device {
        device_in(&g.cache_dev, &g.cores, dev)
    }

    /// A buffer of `blocks` for IO action `a` from the pool; `None` if `a` was queued to wait
    /// for room (or behind IOs already waiting: they go first).
    fn io_buf(&self, g: &mut Inner, a: &Action, blocks: u32) -> Option<AlignedBuf> {
        if let Some(b) = g.handoff.take() {
            return Some(b);
        }
        let len = blocks as usize * 512;
        if !g.bufs.fits(len) {
            g.stats.buffer_oversize += 1;
            return Some(AlignedBuf::new(len));
        }
        let b = if g.starved.is_empty() {
            g.bufs.try_get(len)
        } else {
            None
        };
        if b.is_none() {
            g.stats.buffer_waits += 1;
            g.starved.push_back(a.clone());
        }
        b
    }

    /// Starts the IOs waiting for buffers that now fit, oldest first.
    fn retry_starved(&self, g: &mut Inner, events: &mut VecDeque<Event>) {
        while let Some(a) = g.starved.front() {
            let blocks = match a {
                Action::Read { blocks, .. } | Action::Write { blocks, .. } => *blocks,
                _ => unreachable!("only reads and writes wait for buffers"),
            };
            if g.dead {
                g.starved.clear();
                return;
            }
            let Some(b) = g.bufs.try_get(blocks as usize * 512) else {
                return;
            };
            let a = g.starved.pop_front().expect("front exists");
            g.handoff = Some(b);
            self.execute(g, a, events);
            debug_assert!(g.handoff.is_none(), "the IO took its buffer");
        }
    }

    fn execute(&self, g: &mut Inner, a: Action, events: &mut VecDeque<Event>) {
        match a.clone() {
            Action::Complete { req, result } => {
                let slot = g.reqs.remove(&req).expect("completion of a live request");
                g.stats.requests += 1;
                if let Some(to) = slot.reply {
                    // Under the lock: the sink only queues the reply (ReplySink's contract).
                    to.sink.reply(to.tag, result, slot.buf);
                    return;
                }
                if g.driving == Some(req) {
                    g.own_done = Some((result, slot.buf));
                    return;
                }
                g.done.insert(req, (result, slot.buf));
                if !g.waiters.is_empty()
                    && let Some(t) = g.waiters.remove(&req)
                {
                    t.unpark();
                }
            }
            Action::Copy { src, dst, blocks } => {
                let data = buf_ref(g, src, blocks).to_vec();
                buf_mut(g, dst, blocks).copy_from_slice(&data);
            }
            Action::Read {
                io,
                dev,
                lba,
                blocks,
                buf,
            } => {
                if Self::device_ref(g, dev).inline() {
                    // Device and buffer borrowed side by side: no reference count touched.
                    let Inner {
                        cache_dev,
                        cores,
                        reqs,
                        pool,
                        ..
                    } = &mut *g;
                    let d = device_in(cache_dev, cores, dev);
                    let r = d.read(lba.0, buf_mut_in(reqs, pool, buf, blocks));
                    g.stats.inline_ios += 1;
                    events.push_back(done(io, r));
                } else {
                    let d = Self::device(g, dev);
                    let Some(b) = self.io_buf(g, &a, blocks) else {
                        return;
                    };
                    g.reads.insert(io, buf);
                    self.submit(g, io, d, JobOp::Read { lba: lba.0, buf: b });
                }
            }
            Action::Write {
                io,
                dev,
                lba,
                blocks,
                buf,
                fua,
            } => {
                let d = Self::device_ref(g, dev);
                if d.inline() {
                    let r = d.write(lba.0, buf_ref(g, buf, blocks), fua);
                    g.stats.inline_ios += 1;
                    events.push_back(done(io, r));
                } else {
                    let d = Self::device(g, dev);
                    let Some(mut b) = self.io_buf(g, &a, blocks) else {
                        return;
                    };
                    b.copy_from_slice(buf_ref(g, buf, blocks));
                    self.submit(
                        g,
                        io,
                        d,
                        JobOp::Write {
                            lba: lba.0,
                            buf: b,
                            fua,
                        },
                    );
                }
            }
            Action::WriteZeroes {
                io,
                dev,
                lba,
                blocks,
                fua,
            } => self.simple(
                g,
                io,
                dev,
                JobOp::WriteZeroes {
                    lba: lba.0,
                    blocks: blocks as u64,
                    fua,
                },
                events,
            ),
            Action::Trim {
                io,
                dev,
                lba,
                blocks,
            } => self.simple(
                g,
                io,
                dev,
                JobOp::Trim {
                    lba: lba.0,
                    blocks: blocks as u64,
                },
                events,
            ),
            Action::Flush { io, dev } => {
                if cfg!(feature = "canary-skip-flush") {
                    events.push_back(done(io, Ok(())));
                    return;
                }
                self.simple(g, io, dev, JobOp::Flush, events)
            }
        }
    }

    /// How many actions from the start of `acts` are writes that go to an IO thread as one:
    /// writes to the same device that is neither inline nor asynchronous, each starting where
    /// the one before ended, with the same FUA flag, [`MERGE_MAX_BYTES`] in all at most (a
    /// write log's entry header and its data, consecutive entries). 0 or 1: no run.
    fn write_run(&self, g: &Inner, acts: &[Action]) -> usize {
        let Some(Action::Write {
            dev,
            lba,
            blocks,
            fua,
            ..
        }) = acts.first()
        else {
            return 0;
        };
        let (dev, fua) = (*dev, *fua);
        let mut end = lba.0 + *blocks as u64;
        let mut total = *blocks as u64;
        let mut n = 1;
        for a in &acts[1..] {
            match a {
                Action::Write {
                    dev: d,
                    lba: l,
                    blocks: b,
                    fua: f,
                    ..
                } if *d == dev
                    && l.0 == end
                    && *f == fua
                    && (total + *b as u64) * 512 <= MERGE_MAX_BYTES =>
                {
                    end += *b as u64;
                    total += *b as u64;
                    n += 1;
                }
                _ => break,
            }
        }
        if n > 1 {
            let d = Self::device(g, dev);
            if d.inline() || d.is_async() {
                return 1;
            }
        }
        n
    }

    /// Runs the writes of a [`Shared::write_run`] as one IO: one buffer, one job, every
    /// write's IO completed with its result.
    fn execute_run(&self, g: &mut Inner, acts: &[Action]) {
        let Some(&Action::Write { dev, lba, fua, .. }) = acts.first() else {
            unreachable!("a run of writes")
        };
        let total: usize = acts
            .iter()
            .map(|a| match a {
                Action::Write { blocks, .. } => *blocks as usize * 512,
                _ => 0,
            })
            .sum();
        let mut b = if !g.bufs.fits(total) {
            g.stats.buffer_oversize += 1;
            AlignedBuf::new(total)
        } else if let Some(b) = g
            .starved
            .is_empty()
            .then(|| g.bufs.try_get(total))
            .flatten()
        {
            b
        } else {
            // No room: the writes wait one by one (unmerged).
            g.stats.buffer_waits += acts.len() as u64;
            g.starved.extend(acts.iter().cloned());
            return;
        };
        let mut off = 0;
        let mut ios = Vec::with_capacity(acts.len() - 1);
        for a in acts {
            if let Action::Write {
                io, blocks, buf, ..
            } = a
            {
                let len = *blocks as usize * 512;
                b[off..off + len].copy_from_slice(buf_ref(g, *buf, *blocks));
                off += len;
                ios.push(*io);
            }
        }
        let first = ios.remove(0);
        let d = Self::device(g, dev);
        g.stats.merged_ios += ios.len() as u64;
        self.submit_job(
            g,
            Job {
                io: first,
                also: ios,
                dev: d,
                op: JobOp::Write {
                    lba: lba.0,
                    buf: b,
                    fua,
                },
                background: false,
            },
        );
    }

    /// An IO without a buffer: inline or on an IO thread.
    fn simple(&self, g: &mut Inner, io: IoId, dev: Dev, op: JobOp, events: &mut VecDeque<Event>) {
        let d = Self::device(g, dev);
        if d.inline() {
            g.stats.inline_ios += 1;
            events.push_back(done(io, run(&*d, op).1));
        } else {
            self.submit(g, io, d, op);
        }
    }

    fn submit(&self, g: &mut Inner, io: IoId, dev: Device, op: JobOp) {
        if g.dead {
            return;
        }
        if dev.is_async() {
            g.stats.in_flight += 1;
            g.stats.in_flight_max = g.stats.in_flight_max.max(g.stats.in_flight);
            // Issued here, under the lock; the device's completion thread drives the core
            // with the result. No IO thread waits for it.
            g.stats.async_ios += 1;
            let me = self.me.clone();
            let done: AsyncDone = Box::new(move |buf, r| {
                let Some(sh) = me.upgrade() else { return };
                let mut g = sh.lock();
                if g.dead {
                    return;
                }
                let ev = Shared::finished(&mut g, io, buf, r);
                // The IOs this completion starts on IO-thread devices (the write log reading
                // the next entry to write back) run here, as a request's thread runs its own.
                let job = sh.drive_capture(&mut g, ev);
                sh.run_chain(g, job);
            });
            dev.submit_async(op, done);
            return;
        }
        let job = Job {
            io,
            also: Vec::new(),
            dev,
            op,
            background: false,
        };
        self.submit_job(g, job);
    }

    /// Hands a job to an IO thread (or to the capturing request's thread).
    fn submit_job(&self, g: &mut Inner, mut job: Job) {
        if g.dead {
            return;
        }
        job.background = g.m.is_writeback_io(job.io);
        g.stats.in_flight += 1;
        g.stats.in_flight_max = g.stats.in_flight_max.max(g.stats.in_flight);
        g.stats.thread_ios += 1;
        if g.capture != Capture::Off {
            g.captured.push(job);
            return;
        }
        self.hand_over(std::iter::once(job));
    }

    /// Gives jobs to the IO threads.
    fn hand_over(&self, jobs: impl IntoIterator<Item = Job>) {
        let mut w = self.work.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        for j in jobs {
            w.push(j);
            n += 1;
        }
        drop(w);
        for _ in 0..n {
            self.work_cv.notify_one();
        }
    }

    /// Drives the core with `ev` and returns the IOs it started, to be run by this thread:
    /// the first one to run now, the rest handed to the IO threads at once (so that the IOs
    /// of one request still run in parallel).
    fn drive_capture(&self, g: &mut Inner, ev: Event) -> Option<Job> {
        g.capture = Capture::First;
        self.drive(g, ev);
        g.capture = Capture::Off;
        let mut jobs = std::mem::take(&mut g.captured);
        // The first client IO; writeback's go to the IO threads, behind client IOs (a
        // request's thread must not wait for an HDD write of writeback).
        let first = jobs
            .iter()
            .position(|j| !j.background)
            .map(|i| jobs.remove(i));
        if !jobs.is_empty() {
            self.hand_over(jobs.drain(..));
        }
        g.captured = jobs;
        first
    }

    /// Queues the completions of the writes a merged job did besides its first (the next
    /// `drive` applies them).
    fn finished_also(g: &mut Inner, also: &[IoId], r: &Result<(), IoErr>) {
        for &io in also {
            g.events.push_back(Event::IoDone {
                io,
                result: r.as_ref().map(|_| ()).map_err(io_error),
            });
        }
    }

    /// The event for a finished IO (a read's data copied to where the core wants it).
    fn finished(g: &mut Inner, io: IoId, buf: Option<AlignedBuf>, r: Result<(), IoErr>) -> Event {
        g.stats.in_flight -= 1;
        if let Some(dst) = g.reads.remove(&io)
            && let Some(b) = buf
            && r.is_ok()
        {
            let blocks = (b.len() / 512) as u32;
            buf_mut(g, dst, blocks).copy_from_slice(&b);
        }
        done(io, r)
    }

    /// An IO thread: run jobs, report their completions.
    fn io_thread(&self) {
        loop {
            let job = {
                let mut w = self.work.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(j) = w.pop() {
                        break j;
                    }
                    if self.quit.load(Ordering::Acquire) {
                        return;
                    }
                    w = self
                        .work_cv
                        .wait_timeout(w, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            };
            let bg = job.background;
            let (g, next) = self.run_job(job);
            drop(g);
            if bg {
                let more = self
                    .work
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .bg_done();
                if more {
                    self.work_cv.notify_one();
                }
            }
            let mut job = next;
            while let Some(j) = job.take() {
                job = self.run_job(j).1;
            }
        }
    }

    /// Runs `job` (the lock not held), then takes the lock and applies its completion.
    /// Returns the lock and the first IO that completion started, for this thread to run next
    /// (none once the engine is dead: a dead engine applies nothing).
    fn run_job(&self, job: Job) -> (MutexGuard<'_, Inner>, Option<Job>) {
        let (buf, r) = run(&*job.dev, job.op);
        let mut g = self.lock();
        if g.dead {
            return (g, None);
        }
        Self::finished_also(&mut g, &job.also, &r);
        let ev = Self::finished(&mut g, job.io, buf, r);
        let next = self.drive_capture(&mut g, ev);
        (g, next)
    }

    /// Runs `job` (one the calling thread captured) without the lock, applies its completion,
    /// and goes on with the first IO that completion starts, until there is none: a thread
    /// that finished an IO runs the next one itself instead of waking another.
    fn run_chain(&self, g: MutexGuard<'_, Inner>, mut job: Option<Job>) {
        drop(g);
        while let Some(j) = job.take() {
            job = self.run_job(j).1;
        }
    }

    /// The ticker: `Tick` at the core's deadline, at least every 50 ms.
    fn ticker(&self) {
        while !self.quit.load(Ordering::Acquire) {
            let wait = {
                let mut g = self.lock();
                if !g.dead {
                    self.drive(&mut g, Event::Tick);
                }
                let now = self.now();
                g.m.next_deadline()
                    .map(|d| Duration::from_nanos(d.0.saturating_sub(now.0)))
                    .unwrap_or(Duration::from_millis(50))
                    .min(Duration::from_millis(50))
                    .max(Duration::from_micros(200))
            };
            std::thread::sleep(wait);
        }
    }
}

/// The regions a load reads whole, in the order it reads them: the journal, then the current
/// checkpoint (none when the superblock cannot be read: the load then says why).
fn load_plan(dev: &dyn Backend) -> Vec<(u64, u64)> {
    let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
        dev.read(off / 512, buf).map_err(|e| e.to_string())
    };
    let Ok((sb, _, other)) = tiercache_core::cache::read_superblock(&mut read) else {
        return Vec::new();
    };
    let mut plan = Vec::new();
    if tiercache_core::cache::journal_needed(&sb, other.is_none()) {
        plan.push((sb.layout.journal.offset, sb.layout.journal.bytes));
    }
    if sb.has_checkpoint {
        let region = sb.layout.checkpoint[sb.checkpoint as usize & 1];
        let bytes =
            tiercache_format::superblock::checkpoint_region_bytes(sb.lines as u64, sb.line_size)
                .unwrap_or(0)
                .min(region.bytes);
        plan.push((region.offset, bytes));
    }
    plan.retain(|&(off, bytes)| bytes > 0 && off.is_multiple_of(512) && bytes.is_multiple_of(512));
    plan
}

fn done(io: IoId, r: Result<(), IoErr>) -> Event {
    Event::IoDone {
        io,
        result: r.map_err(|e| io_error(&e)),
    }
}

/// Runs one IO; returns a read's buffer.
fn run(dev: &dyn Backend, op: JobOp) -> (Option<AlignedBuf>, Result<(), IoErr>) {
    tiercache_io::run_sync(dev, op)
}

fn buf_ref(g: &Inner, b: BufRef, blocks: u32) -> &[u8] {
    let len = blocks as usize * 512;
    match b {
        BufRef::Req { req, offset } => {
            let s = offset as usize * 512;
            &g.reqs[&req].buf[s..s + len]
        }
        BufRef::Pool { slot, offset } => {
            let s = offset as usize * 512;
            &g.pool[slot as usize][s..s + len]
        }
        BufRef::Meta { id, offset } => {
            let s = offset as usize * 512;
            &g.m.meta_buf(id)[s..s + len]
        }
    }
}

fn buf_mut(g: &mut Inner, b: BufRef, blocks: u32) -> &mut [u8] {
    buf_mut_in(&mut g.reqs, &mut g.pool, b, blocks)
}

/// [`buf_mut`] from the two places a writable buffer lives (so a device can be borrowed from
/// the engine's state beside it).
fn buf_mut_in<'a>(
    reqs: &'a mut tiercache_core::hash::FxHashMap<ReqId, Slot>,
    pool: &'a mut [AlignedBuf],
    b: BufRef,
    blocks: u32,
) -> &'a mut [u8] {
    let len = blocks as usize * 512;
    match b {
        BufRef::Req { req, offset } => {
            let s = offset as usize * 512;
            &mut reqs.get_mut(&req).expect("buffer of a live request").buf[s..s + len]
        }
        BufRef::Pool { slot, offset } => {
            let s = offset as usize * 512;
            &mut pool[slot as usize][s..s + len]
        }
        BufRef::Meta { .. } => unreachable!("metadata buffers are write sources only"),
    }
}

/// The device `dev` names.
fn device_in<'a>(cache_dev: &'a Device, cores: &'a [Option<Device>], dev: Dev) -> &'a Device {
    match dev {
        Dev::Cache => cache_dev,
        Dev::Core(c) => cores[c.0 as usize]
            .as_ref()
            .expect("the core names only attached cores"),
    }
}

/// A client request's kind (its range and buffer are given beside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqOp {
    /// Read into the request's buffer.
    Read,
    /// Write the request's buffer (durable at completion with `fua`).
    Write {
        /// Force unit access.
        fua: bool,
    },
    /// Write zeros.
    WriteZeroes {
        /// Force unit access.
        fua: bool,
    },
    /// Discard (reads back as zeros).
    Trim,
    /// Make every write completed before it durable.
    Flush,
}

type Op = ReqOp;

impl Shared {
    /// Names a new request, keeps its buffer (and where its reply goes, if no thread waits
    /// for it), and returns its id and the core's event for it. A read on a memory cache
    /// starts loading the data a hit will copy while the core decides.
    fn open_request(
        g: &mut Inner,
        op: Op,
        core: CoreId,
        lba: u64,
        blocks: u32,
        buf: AlignedBuf,
        reply: Option<ReplyTo>,
    ) -> (ReqId, Event) {
        let req = ReqId(g.next_req);
        g.next_req += 1;
        g.reqs.insert(req, Slot { buf, reply });
        let lba = Lba(lba);
        if matches!(op, Op::Read) && g.cache_dev.inline() {
            let Inner { m, cache_dev, .. } = &*g;
            m.read_hint(core, lba, blocks, |at, n| {
                cache_dev.prefetch(at.0, n as u64)
            });
        }
        (req, request_event(op, req, core, lba, blocks))
    }
}

/// The core's event for request `req`.
fn request_event(op: Op, req: ReqId, core: CoreId, lba: Lba, blocks: u32) -> Event {
    match op {
        Op::Read => Event::Read {
            req,
            core,
            lba,
            blocks,
        },
        Op::Write { fua } => Event::Write {
            req,
            core,
            lba,
            blocks,
            fua,
        },
        Op::WriteZeroes { fua } => Event::WriteZeroes {
            req,
            core,
            lba,
            blocks,
            fua,
        },
        Op::Trim => Event::Trim {
            req,
            core,
            lba,
            blocks,
        },
        Op::Flush => Event::Flush { req, core },
    }
}

/// A request that did not finish when it was started ([`Engine::read_start`]).
/// [`Pending::finish`] waits for it on the calling thread, running the IO the start left for
/// it (a hit on a file cache: its pread); dropping it does the same and discards the reply, so
/// a started request is never left without the thread that runs its first IO.
pub struct Pending {
    sh: Arc<Shared>,
    req: ReqId,
    mine: Option<Job>,
    finished: bool,
}

impl Pending {
    /// Waits until the request completes; its result and buffer.
    pub fn finish(mut self) -> (Result<(), ReqError>, AlignedBuf) {
        self.finished = true;
        let mine = self.mine.take();
        self.sh.wait_for(self.req, mine)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.finished {
            let mine = self.mine.take();
            let _ = self.sh.wait_for(self.req, mine);
        }
    }
}

impl Shared {
    /// Runs `mine` (the IO a request's start left to its thread) and the IOs its completions
    /// start, then waits until request `req` completes.
    fn wait_for(&self, req: ReqId, mut mine: Option<Job>) -> (Result<(), ReqError>, AlignedBuf) {
        let mut g = self.lock();
        loop {
            if let Some(r) = g.done.remove(&req) {
                if let Some(job) = mine {
                    self.hand_over(std::iter::once(job));
                }
                return r;
            }
            if let Some(job) = mine.take() {
                drop(g);
                (g, mine) = self.run_job(job);
                continue;
            }
            // Parked until the completion names this request (a timeout only re-checks).
            g.waiters.insert(req, std::thread::current());
            drop(g);
            std::thread::park_timeout(Duration::from_millis(100));
            g = self.lock();
            g.waiters.remove(&req);
        }
    }
}

impl Engine {
    fn start(
        m: Machine,
        cache_dev: Device,
        cores: &[(CoreId, Device)],
        ec: EngineConfig,
    ) -> Engine {
        let (slots, slot_blocks) = m.pool();
        let pool = (0..slots)
            .map(|_| AlignedBuf::new(slot_blocks as usize * 512))
            .collect();
        let mut devs: Vec<Option<Device>> = Vec::new();
        for (id, d) in cores {
            let i = id.0 as usize;
            if devs.len() <= i {
                devs.resize(i + 1, None);
            }
            devs[i] = Some(d.clone());
        }
        let sh = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            inner: Mutex::new(Inner {
                m,
                cache_dev,
                cores: devs,
                reqs: Default::default(),
                done: Default::default(),
                reads: Default::default(),
                pool,
                bufs: BufPool::new(ec.io_buffer_bytes),
                starved: VecDeque::new(),
                handoff: None,
                next_req: 1,
                stats: EngineStats::default(),
                dead: false,
                waiting: 0,
                events: VecDeque::new(),
                actions: Vec::new(),
                capture: Capture::Off,
                captured: Vec::new(),
                waiters: Default::default(),
                driving: None,
                own_done: None,
                last_drive: 0,
            }),
            done_cv: Condvar::new(),
            work: Mutex::new(work::WorkQueue::new(ec.io_threads.max(1))),
            work_cv: Condvar::new(),
            quit: AtomicBool::new(false),
            epoch: Instant::now(),
            last_now: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        for i in 0..ec.io_threads.max(1) {
            let s = sh.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("tc-io-{i}"))
                    .spawn(move || s.io_thread())
                    .expect("spawn an IO thread"),
            );
        }
        let s = sh.clone();
        threads.push(
            std::thread::Builder::new()
                .name("tc-tick".into())
                .spawn(move || s.ticker())
                .expect("spawn the ticker"),
        );
        Engine { sh, threads }
    }

    /// Creates a cache on `cache_dev` with `cfg` (persistent if `cfg.persist` is set: the
    /// journal is zeroed and the first superblock written) and attaches `cores`. Returns once
    /// the cache serves and its tables are durable.
    pub fn create(
        cfg: Config,
        cache_dev: Device,
        cores: Vec<CoreSpec>,
        ec: EngineConfig,
    ) -> Result<Engine, String> {
        let mut cache = Cache::new(cfg)?;
        for c in &cores {
            cache
                .add_core(c.id, c.dev.blocks())
                .map_err(|e| e.to_string())?;
            cache.set_core_record(c.id, c.record.clone())?;
        }
        let devs: Vec<(CoreId, Device)> = cores.iter().map(|c| (c.id, c.dev.clone())).collect();
        let e = Engine::start(Machine::Cache(Box::new(cache)), cache_dev, &devs, ec);
        e.wait(|c| c.is_ready() && c.tables_durable());
        Ok(e)
    }

    /// Creates a write log (mode `wl`) on `cache_dev` with `cfg` (its read cache persistent
    /// when `cfg.read_cache.persist` is set) and attaches `cores`. Returns once the log serves
    /// and its tables are durable.
    pub fn create_wl(
        cfg: WlConfig,
        cache_dev: Device,
        cores: Vec<CoreSpec>,
        ec: EngineConfig,
    ) -> Result<Engine, String> {
        let mut wl = tiercache_core::wl::WriteLog::create(cfg)?;
        for c in &cores {
            wl.add_core(c.id, c.dev.blocks())?;
            wl.set_core_record(c.id, c.record.clone())?;
        }
        let devs: Vec<(CoreId, Device)> = cores.iter().map(|c| (c.id, c.dev.clone())).collect();
        let e = Engine::start(Machine::Wl(Box::new(wl)), cache_dev, &devs, ec);
        e.wait(|c| c.is_ready() && c.tables_durable());
        Ok(e)
    }

    /// Loads the cache on `cache_dev` (clean load or crash recovery) with the given core
    /// devices, which must be every core the cache has, by id, of the recorded size. `base`
    /// gives what the device does not store (pool sizes). Returns once the cache serves.
    pub fn open(
        base: &Config,
        cache_dev: Device,
        cores: Vec<(CoreId, Device)>,
        ec: EngineConfig,
    ) -> Result<(Engine, LoadReport), String> {
        Engine::open_inner(base, cache_dev, cores, ec, false)
    }

    fn open_inner(
        base: &Config,
        cache_dev: Device,
        cores: Vec<(CoreId, Device)>,
        ec: EngineConfig,
        allow_growth: bool,
    ) -> Result<(Engine, LoadReport), String> {
        // The journal and the checkpoint are read ahead of the core (readahead.rs).
        let mut ra = readahead::ReadAhead::start(cache_dev.clone(), &load_plan(&*cache_dev));
        let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            ra.read(off, buf)
                .map_err(|e| format!("reading the cache device at byte {off}: {e}"))
        };
        let (cache, report) = tiercache_core::wl::device::open_device(base, &mut read)?;
        drop(ra);
        for e in &report.cores {
            let id = CoreId(e.id as u16);
            let Some((_, d)) = cores.iter().find(|(c, _)| *c == id) else {
                return Err(format!(
                    "core {} (export {:?}) of this cache was not given; attach its device",
                    e.id, e.export_name
                ));
            };
            if d.blocks() < e.size_blocks || (d.blocks() > e.size_blocks && !allow_growth) {
                return Err(format!(
                    "core {} is {} blocks, the cache recorded {}: not the same device{}",
                    e.id,
                    d.blocks(),
                    e.size_blocks,
                    if d.blocks() < e.size_blocks {
                        ", or it shrank (grow it back)"
                    } else {
                        ""
                    }
                ));
            }
        }
        let e = Engine::start(cache, cache_dev, &cores, ec);
        e.wait(|c| c.is_ready());
        // A core that grew while the cache was down (its identity matched): take the new size.
        for (id, d) in &cores {
            let recorded = e.with_cache(|c| c.core(*id).map(|s| s.size_blocks));
            if recorded.is_some_and(|r| d.blocks() > r) {
                e.resize_core(*id, d.clone())?;
            }
        }
        Ok((e, report))
    }

    /// The engine's clock: the time the core's [`Nanos`] are on (for example the `since` and
    /// `next_retry` of `Cache::health`).
    pub fn now(&self) -> Nanos {
        self.sh.now()
    }

    /// Waits until `pred` holds for the core (checked whenever something happens, and every
    /// 10 ms).
    pub fn wait(&self, pred: impl Fn(&Machine) -> bool) {
        let mut g = self.sh.lock();
        while !pred(&g.m) {
            g = self.sh.wait_done(g, Duration::from_millis(10));
        }
    }

    /// Runs `f` on the core under the engine's lock (management, statistics), then lets the
    /// core act on what changed.
    ///
    /// In mode `wl` this is the write log's read cache (statistics, policies, core records);
    /// what concerns the log goes through [`Engine::with_machine`].
    pub fn with_cache<R>(&self, f: impl FnOnce(&mut Cache) -> R) -> R {
        let mut g = self.sh.lock();
        let r = f(g.m.cache_mut());
        self.sh.drive(&mut g, Event::Tick);
        r
    }

    /// Runs `f` on the state machine under the engine's lock, then lets it act on what
    /// changed.
    pub fn with_machine<R>(&self, f: impl FnOnce(&mut Machine) -> R) -> R {
        let mut g = self.sh.lock();
        let r = f(&mut g.m);
        self.sh.drive(&mut g, Event::Tick);
        r
    }

    /// Whether this is a write log (mode `wl`).
    pub fn is_wl(&self) -> bool {
        self.sh.lock().m.wl().is_some()
    }

    /// Attaches a core at run time (the cache shares its lines with every core) and returns
    /// once the core table naming it is durable (persistent caches).
    pub fn add_core(&self, spec: CoreSpec) -> Result<(), String> {
        {
            let mut g = self.sh.lock();
            g.m.add_core(spec.id, spec.dev.blocks())?;
            g.m.set_core_record(spec.id, spec.record)?;
            let i = spec.id.0 as usize;
            if g.cores.len() <= i {
                g.cores.resize(i + 1, None);
            }
            g.cores[i] = Some(spec.dev);
            self.sh.drive(&mut g, Event::Tick);
        }
        self.wait(|c| c.tables_durable());
        Ok(())
    }

    /// Detaches core `id` (refused while it has dirty data or IO in flight: write it back
    /// first) and returns once the core table without it is durable.
    pub fn remove_core(&self, id: CoreId) -> Result<(), String> {
        {
            let mut g = self.sh.lock();
            g.m.remove_core(id)?;
            if let Some(d) = g.cores.get_mut(id.0 as usize) {
                *d = None;
            }
            self.sh.drive(&mut g, Event::Tick);
        }
        self.wait(|c| c.tables_durable());
        Ok(())
    }

    /// Replaces core `id`'s device by `dev` (the same device reopened at a new size) and
    /// records the new size (see `Cache::resize_core`: a shrink below cached data is refused,
    /// and nothing changes). Returns once the core table is durable.
    pub fn resize_core(&self, id: CoreId, dev: Device) -> Result<(), String> {
        {
            let mut g = self.sh.lock();
            g.m.resize_core(id, dev.blocks())?;
            if let Some(d) = g.cores.get_mut(id.0 as usize) {
                *d = Some(dev);
            }
            self.sh.drive(&mut g, Event::Tick);
        }
        self.wait(|c| c.tables_durable());
        Ok(())
    }

    /// Serves core `id` from `dev` from now on: the same device behind another handle (e.g.
    /// wrapped in an IO timeout). IOs already running finish on the old handle. Refused when
    /// the core is not attached or `dev` has another size.
    pub fn replace_core_device(&self, id: CoreId, dev: Device) -> Result<(), String> {
        let mut g = self.sh.lock();
        let slot = g
            .cores
            .get_mut(id.0 as usize)
            .and_then(|d| d.as_mut())
            .ok_or_else(|| format!("core {} is not attached", id.0))?;
        if slot.blocks() != dev.blocks() {
            return Err(format!(
                "core {}: the new handle has {} blocks, the device {}",
                id.0,
                dev.blocks(),
                slot.blocks()
            ));
        }
        *slot = dev;
        Ok(())
    }

    /// The device of core `id`, if attached.
    pub fn core_device(&self, id: CoreId) -> Option<Device> {
        self.sh.lock().cores.get(id.0 as usize).cloned().flatten()
    }

    /// Engine counters.
    pub fn stats(&self) -> EngineStats {
        let g = self.sh.lock();
        let b = g.bufs.stats();
        EngineStats {
            buffer_bytes: b.bytes,
            buffer_in_use: b.in_use,
            buffer_peak: b.peak,
            ..g.stats
        }
    }

    fn request(
        &self,
        op: Op,
        core: CoreId,
        lba: u64,
        blocks: u32,
        buf: AlignedBuf,
    ) -> (Result<(), ReqError>, AlignedBuf) {
        match self.start_request(op, core, lba, blocks, buf) {
            Ok(r) => r,
            Err(p) => p.finish(),
        }
    }

    /// Applies a request and whatever runs inline with it (IOs on inline devices such as RAM,
    /// and their completions): `Ok` with the reply if that finished it, else the
    /// [`Pending`] request, holding the first IO it started for the thread that finishes it.
    /// (`Pending` is large, and moved once; boxing it would cost an allocation per request.)
    #[allow(clippy::result_large_err)]
    fn start_request(
        &self,
        op: Op,
        core: CoreId,
        lba: u64,
        blocks: u32,
        buf: AlignedBuf,
    ) -> Result<(Result<(), ReqError>, AlignedBuf), Pending> {
        let mut g = self.sh.lock();
        let (req, ev) = Shared::open_request(&mut g, op, core, lba, blocks, buf, None);
        // The IOs this request starts run on this thread (one at a time; any others at once
        // on IO threads), and so do the IOs their completions start, until the request is
        // done: a hit costs one pread and no thread hop.
        g.driving = Some(req);
        let mine = self.sh.drive_capture(&mut g, ev);
        g.driving = None;
        if let Some(r) = g.own_done.take() {
            if let Some(job) = mine {
                self.sh.hand_over(std::iter::once(job));
            }
            return Ok(r);
        }
        Err(Pending {
            sh: self.sh.clone(),
            req,
            mine,
            finished: false,
        })
    }

    /// Starts a read like [`Engine::read_owned`], but returns at once if it cannot finish
    /// without waiting for a device that is not inline: `Ok` with the reply (a hit in a `ram:`
    /// cache), or the [`Pending`] read for another thread to finish. An NBD connection's
    /// reader answers hits this way without handing them to a worker.
    #[allow(clippy::result_large_err)]
    pub fn read_start(
        &self,
        core: CoreId,
        lba: u64,
        buf: AlignedBuf,
    ) -> Result<(Result<(), ReqError>, AlignedBuf), Pending> {
        let blocks = (buf.len() / 512) as u32;
        self.start_request(Op::Read, core, lba, blocks, buf)
    }

    /// Reads into `buf` (a multiple of 512 bytes) from core `core` at block `lba`; returns
    /// the buffer with the result.
    pub fn read_owned(
        &self,
        core: CoreId,
        lba: u64,
        buf: AlignedBuf,
    ) -> (Result<(), ReqError>, AlignedBuf) {
        let blocks = (buf.len() / 512) as u32;
        self.request(Op::Read, core, lba, blocks, buf)
    }

    /// Writes `buf` to core `core` at block `lba`; returns the buffer with the result.
    pub fn write_owned(
        &self,
        core: CoreId,
        lba: u64,
        buf: AlignedBuf,
        fua: bool,
    ) -> (Result<(), ReqError>, AlignedBuf) {
        let blocks = (buf.len() / 512) as u32;
        self.request(Op::Write { fua }, core, lba, blocks, buf)
    }

    /// Reads into `out` (a multiple of 512 bytes).
    pub fn read(&self, core: CoreId, lba: u64, out: &mut [u8]) -> Result<(), ReqError> {
        let (r, b) = self.read_owned(core, lba, AlignedBuf::new(out.len()));
        if r.is_ok() {
            out.copy_from_slice(&b);
        }
        r
    }

    /// Writes `data` (a multiple of 512 bytes).
    pub fn write(&self, core: CoreId, lba: u64, data: &[u8], fua: bool) -> Result<(), ReqError> {
        let mut b = AlignedBuf::new(data.len());
        b.copy_from_slice(data);
        self.write_owned(core, lba, b, fua).0
    }

    /// Writes zeros over `blocks` blocks.
    pub fn write_zeroes(
        &self,
        core: CoreId,
        lba: u64,
        blocks: u32,
        fua: bool,
    ) -> Result<(), ReqError> {
        self.request(
            Op::WriteZeroes { fua },
            core,
            lba,
            blocks,
            AlignedBuf::new(0),
        )
        .0
    }

    /// Discards `blocks` blocks (they read back as zeros).
    pub fn trim(&self, core: CoreId, lba: u64, blocks: u32) -> Result<(), ReqError> {
        self.request(Op::Trim, core, lba, blocks, AlignedBuf::new(0))
            .0
    }

    /// Makes every write completed before it durable.
    pub fn flush(&self, core: CoreId) -> Result<(), ReqError> {
        self.request(Op::Flush, core, 0, 0, AlignedBuf::new(0)).0
    }

    /// Stops cleanly: waits for requests in flight, writes the final checkpoint (persistent
    /// caches; dirty data stays dirty and persisted unless writeback ran first), flushes the
    /// core devices, stops the threads.
    pub fn stop(mut self) -> Result<(), String> {
        self.stop_shared()?;
        self.shutdown();
        Ok(())
    }

    /// Does what [`Engine::stop`] does to the devices — waits for requests in flight, writes
    /// the final checkpoint, flushes the core devices — for an engine other threads still hold
    /// (NBD connections): requests after this fail with `NotRunning`, and the threads end
    /// when the last holder drops the engine. Every core device is flushed even when one
    /// fails; the error names each core whose flush failed (the cache itself is stopped then:
    /// its final checkpoint is written).
    pub fn stop_shared(&self) -> Result<(), String> {
        self.with_machine(|c| c.stop());
        self.wait(|c| c.is_stopped());
        let devs: Vec<(usize, Device)> = {
            let g = self.sh.lock();
            g.cores
                .iter()
                .enumerate()
                .filter_map(|(i, d)| Some((i, d.clone()?)))
                .collect()
        };
        let failed: Vec<String> = devs
            .iter()
            .filter_map(|(i, d)| d.flush().err().map(|e| format!("core {i}: {e}")))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "flushing core devices failed: {}",
                failed.join("; ")
            ))
        }
    }

    /// Stops dead, as a crash would: no IO is started after this, completions are dropped, and
    /// nothing is flushed or written. The devices hold what they hold.
    pub fn kill(mut self) {
        self.sh.lock().dead = true;
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.sh.quit.store(true, Ordering::Release);
        self.sh.work_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.sh.lock().dead = true;
            self.shutdown();
        }
    }
}

/// How a device is recognised, for the core table (SPEC C18): a block device by its WWN or
/// serial (from sysfs), a regular file by its file system's id and its inode.
pub mod identity {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::path::Path;
    use tiercache_format::tables::CoreIdentity;

    /// The identity of the device or file at `path`.
    pub fn of_path(path: &Path) -> Result<CoreIdentity, String> {
        let md = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if md.file_type().is_block_device() {
            let (maj, min) = (libc_major(md.rdev()), libc_minor(md.rdev()));
            let sys = format!("/sys/dev/block/{maj}:{min}/device");
            let read = |f: &str| {
                std::fs::read_to_string(f)
                    .ok()
                    .map(|s| s.trim().trim_matches(char::from(0)).to_string())
                    .filter(|s| !s.is_empty())
            };
            for f in ["wwid", "serial", "vpd_pg80"] {
                if let Some(s) = read(&format!("{sys}/{f}")) {
                    return Ok(CoreIdentity::Block { serial: s });
                }
            }
            // A loop device is its backing file (the same data, whichever loop number it
            // gets); a device-mapper device is its DM UUID.
            let dev = format!("/sys/dev/block/{maj}:{min}");
            if let Some(f) = read(&format!("{dev}/loop/backing_file")) {
                return of_path(Path::new(&f))
                    .map_err(|e| format!("{}: its backing file: {e}", path.display()));
            }
            if let Some(u) = read(&format!("{dev}/dm/uuid")) {
                return Ok(CoreIdentity::Block {
                    serial: format!("dm:{u}"),
                });
            }
            return Err(format!(
                "{}: the block device reports no WWN, serial, loop backing file or device-mapper UUID in sysfs, so it cannot be told from another one",
                path.display()
            ));
        }
        if !md.is_file() {
            return Err(format!("{}: not a file or block device", path.display()));
        }
        // The file system's id: st_dev and statfs's f_fsid together, 16 bytes.
        let fsid = statfs_fsid(path)?;
        let mut fs = [0u8; 16];
        fs[..8].copy_from_slice(&md.dev().to_le_bytes());
        fs[8..].copy_from_slice(&fsid.to_le_bytes());
        Ok(CoreIdentity::File {
            fs_uuid: fs,
            inode: md.ino(),
        })
    }

    fn libc_major(dev: u64) -> u64 {
        ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)
    }

    fn libc_minor(dev: u64) -> u64 {
        ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)
    }

    fn statfs_fsid(path: &Path) -> Result<u64, String> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| format!("{}: path holds a NUL byte", path.display()))?;
        let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
        // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable memory of the
        // size statfs writes; the result is read only if the call succeeded.
        let r = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
        if r != 0 {
            return Err(format!(
                "{}: statfs: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: statfs returned 0, so it filled `st`.
        let st = unsafe { st.assume_init() };
        // SAFETY: fsid_t is two i32s with no invalid bit patterns; read it as bytes.
        let raw: [u8; 8] = unsafe { std::mem::transmute(st.f_fsid) };
        Ok(u64::from_le_bytes(raw))
    }
}

impl Engine {
    /// [`Engine::open`] with the identities checked too: every core the cache recorded must be
    /// given with the recorded identity — a swapped device of the same size is refused (SPEC
    /// C18), since writing another disk's dirty data onto it would destroy it. A core with the
    /// recorded identity that grew since is accepted at its new size (SPEC C22); one that
    /// shrank is refused.
    pub fn open_checked(
        base: &Config,
        cache_dev: Device,
        cores: Vec<CoreSpec>,
        ec: EngineConfig,
    ) -> Result<(Engine, LoadReport), String> {
        let dev = cache_dev.clone();
        let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            dev.read(off / 512, buf)
                .map_err(|e| format!("reading the cache device at byte {off}: {e}"))
        };
        // The core table only (the read cache's records, in mode `wl` too): no log scan here.
        let (_, report) = tiercache_core::cache::open(base, &mut read)?;
        for e in &report.cores {
            if let Some(c) = cores.iter().find(|c| c.id.0 == e.id as u16)
                && !e.identity.same_device(&c.record.identity)
            {
                return Err(format!(
                    "core {} (export {:?}) was recorded as {:?}, the device given is {:?}: not the same device; refusing to load (attach the right device, or remove the core with --force)",
                    e.id, e.export_name, e.identity, c.record.identity
                ));
            }
        }
        Engine::open_inner(
            base,
            cache_dev,
            cores.into_iter().map(|c| (c.id, c.dev)).collect(),
            ec,
            true,
        )
    }
}
