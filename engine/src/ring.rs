//! Requests that no thread waits for: [`Engine::submit`] applies a request and returns at
//! once; the file IOs it starts come back to the caller as [`EngineIo`]s to run on its own
//! io_uring ([`tiercache_io::Ring`]), and the reply goes to a [`ReplySink`] when the request
//! completes — on whichever thread completes it.
//!
//! This is the path of an NBD connection's reactor (`nbd/src/reactor.rs`): one thread reads
//! the socket, submits requests, runs their file IO on its ring and answers, with no thread
//! hand-off for a cache hit on a file cache. IOs on devices without a ring descriptor
//! ([`Backend::ring_fd`]: RAM, emulated or remote devices, fault wrappers) take the engine's
//! usual ways: inline, the IO threads, or the device's own asynchronous path.

use super::{Capture, Engine, Event, Inner, Job, JobOp, Op, Shared};
use std::os::unix::io::RawFd;
use std::sync::Arc;
use tiercache_core::event::ReqError;
use tiercache_core::units::BLOCK_BYTES;
use tiercache_core::units::{CoreId, IoId};
use tiercache_io::BLOCK;
use tiercache_io::{AlignedBuf, IoErr, RingCompleted, RingOp};

/// Where the reply of a request submitted with [`Engine::submit`] goes.
pub trait ReplySink: Send + Sync {
    /// The request tagged `tag` completed with `result`; `buf` is its buffer (a read's data).
    ///
    /// Called with the engine's lock held, on the thread that completed the request (the
    /// submitter's, an IO thread, a device's completion thread): it must only queue the reply
    /// (and wake whoever sends it), never call into the engine or block.
    fn reply(&self, tag: u64, result: Result<(), ReqError>, buf: AlignedBuf);
}

/// A [`ReplySink`] and the caller's tag for one request.
#[derive(Clone)]
pub struct ReplyTo {
    /// The sink.
    pub sink: Arc<dyn ReplySink>,
    /// Given back to the sink with the reply.
    pub tag: u64,
}

/// An IO the engine started for a caller of [`Engine::submit`] or [`Engine::complete`], to run
/// on the caller's ring: [`EngineIo::into_ring`] gives the ring operation (owning its buffer)
/// and the ticket that completes it.
pub struct EngineIo {
    job: Job,
    fd: RawFd,
}

/// What completes an [`EngineIo`] that ran on a ring: give it to [`Engine::complete`] with the
/// ring's result.
pub struct IoTicket {
    io: IoId,
    also: Vec<IoId>,
    dev: super::Device,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    Read { lba: u64 },
    Write { lba: u64, fua: bool },
    Flush,
}

impl EngineIo {
    /// The ring operation and its ticket.
    pub fn into_ring(self) -> (RingOp, IoTicket) {
        let Job {
            io, also, dev, op, ..
        } = self.job;
        let fd = self.fd;
        let (op, kind) = match op {
            JobOp::Read { lba, buf } => (
                RingOp::Read {
                    fd,
                    off: lba * BLOCK_BYTES,
                    buf,
                },
                Kind::Read { lba },
            ),
            JobOp::Write { lba, buf, fua } => (
                RingOp::Write {
                    fd,
                    off: lba * BLOCK_BYTES,
                    buf,
                    dsync: fua,
                },
                Kind::Write { lba, fua },
            ),
            JobOp::Flush => (RingOp::Fsync { fd }, Kind::Flush),
            _ => unreachable!("only reads, writes and flushes go to a ring (ring_job)"),
        };
        (
            op,
            IoTicket {
                io,
                also,
                dev,
                kind,
            },
        )
    }
}

impl IoTicket {
    /// The IO's outcome from the ring's result `res` (bytes or `-errno`): done when the ring did
    /// all of it; otherwise (an error, a short transfer, `EAGAIN`, `RWF_DSYNC` refused) it runs
    /// again through the device's calls, which report the error with its context or apply
    /// their fallbacks. Runs on the caller's thread, without the engine's lock.
    fn outcome(
        &self,
        buf: Option<AlignedBuf>,
        res: i32,
    ) -> (Option<AlignedBuf>, Result<(), IoErr>) {
        let want = buf.as_ref().map_or(0, |b| b.len());
        if res >= 0 && res as usize == want {
            // The device hears of what its descriptor did (the power-cut overlay logs it).
            let r = match (self.kind, &buf) {
                (Kind::Write { lba, fua }, Some(b)) => self
                    .dev
                    .ring_completed(RingCompleted::Write { lba, data: b, fua }),
                (Kind::Flush, _) => self.dev.ring_completed(RingCompleted::Flush),
                _ => Ok(()),
            };
            return (buf, r);
        }
        let req = match (self.kind, buf) {
            (Kind::Read { lba }, Some(buf)) => JobOp::Read { lba, buf },
            (Kind::Write { lba, fua }, Some(buf)) => JobOp::Write { lba, buf, fua },
            (Kind::Flush, _) => JobOp::Flush,
            _ => unreachable!("reads and writes come back with their buffer"),
        };
        tiercache_io::run_sync(&*self.dev, req)
    }
}

/// A job a ring can run: a read, write or flush on a device with a ring descriptor.
fn ring_job(job: Job) -> Result<EngineIo, Job> {
    let ok = matches!(
        job.op,
        JobOp::Read { .. } | JobOp::Write { .. } | JobOp::Flush
    );
    match job.dev.ring_fd() {
        Some(fd) if ok => Ok(EngineIo { job, fd }),
        _ => Err(job),
    }
}

impl Shared {
    /// Drives the core with `ev`; the IOs it starts go to `ios` (those a ring can run) or to
    /// the IO threads.
    fn drive_ring(&self, g: &mut Inner, ev: Event, ios: &mut Vec<EngineIo>) {
        g.capture = Capture::Ring;
        self.drive(g, ev);
        g.capture = Capture::Off;
        let mut threads = Vec::new();
        let mut moved = 0;
        for job in g.captured.drain(..) {
            match ring_job(job) {
                Ok(io) => {
                    ios.push(io);
                    moved += 1;
                }
                Err(job) => threads.push(job),
            }
        }
        // submit_job counted them as IO-thread IOs.
        g.stats.thread_ios -= moved;
        g.stats.ring_ios += moved;
        if !threads.is_empty() {
            self.hand_over(threads);
        }
    }
}

impl Engine {
    /// Applies a request and returns without waiting for it: its reply goes to `reply` when it
    /// completes (possibly before this returns: a hit on a memory cache), and the IOs it
    /// starts that a ring can run are appended to `ios`, for the caller to run and give back
    /// to [`Engine::complete`]. `blocks` is the length of a write-zeroes or trim, and of a
    /// read given an empty buffer; writes, and reads given a buffer, take their buffer's.
    ///
    /// A read given an empty buffer gets one from the engine: the IO buffer itself when one
    /// device read fills all of it (no copy: the reply carries a buffer of the engine's IO
    /// pool, back in the pool when the caller drops it), else a zeroed buffer its data is
    /// copied into.
    ///
    /// The caller must run every IO it is given (they may belong to other requests too: the
    /// ones this request's drive unblocked, or writeback).
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &self,
        op: Op,
        core: CoreId,
        lba: u64,
        blocks: u32,
        buf: AlignedBuf,
        reply: ReplyTo,
        ios: &mut Vec<EngineIo>,
    ) {
        let blocks = match op {
            Op::Read if buf.is_empty() => blocks,
            Op::Read | Op::Write { .. } => (buf.len() / BLOCK) as u32,
            _ => blocks,
        };
        let mut slot = self.sh.slot(op, buf, Some(reply));
        if op == Op::Read {
            slot.want = blocks as usize * BLOCK;
        }
        let mut g = self.sh.lock();
        let (_, ev) = Shared::open_request(&mut g, op, core, lba, blocks, slot);
        self.sh.drive_ring(&mut g, ev, ios);
    }

    /// Applies the completion of an IO that ran on the caller's ring (`res`: bytes
    /// transferred or `-errno`; `buf`: the buffer the ring gave back). The IOs it starts go to
    /// `ios`, or with `None` (a caller that is closing its ring) to the IO threads.
    pub fn complete(
        &self,
        t: IoTicket,
        buf: Option<AlignedBuf>,
        res: i32,
        ios: Option<&mut Vec<EngineIo>>,
    ) {
        let (buf, r) = t.outcome(buf, res);
        let mut g = self.sh.lock();
        if g.dead {
            return;
        }
        Shared::finished_also(&mut g, &t.also, &r);
        let ev = Shared::finished(&mut g, t.io, buf, r);
        match ios {
            Some(ios) => self.sh.drive_ring(&mut g, ev, ios),
            None => self.sh.drive(&mut g, ev),
        }
    }

    /// The pool the buffers of this engine's device IOs come from (for a caller's ring to
    /// register: [`tiercache_io::Ring::register_pool`]).
    pub fn io_pool(&self) -> tiercache_io::BufPool {
        self.sh.lock().bufs.clone()
    }

    /// Whether the engine was killed ([`Engine::kill`] or a drop without stop): it completes
    /// nothing more.
    pub fn is_dead(&self) -> bool {
        self.sh.lock().dead
    }
}
