//! Requests: a client request named, its buffer kept, applied to the core by the
//! submitting thread; a request that cannot finish at once is [`Pending`] and finished by the
//! thread that waits for it.

use super::*;
use tiercache_io::BLOCK;

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

pub(crate) type Op = ReqOp;

impl Shared {
    /// A request's slot, made by the submitting thread before it takes the engine's lock: with
    /// a write's CRC32C when a write log needs it for the entry header (about 0.5 µs per 4 KiB
    /// that other threads would otherwise wait behind).
    pub(crate) fn slot(&self, op: Op, buf: AlignedBuf, reply: Option<ReplyTo>) -> Slot {
        let crc = (self.wl && matches!(op, Op::Write { .. }))
            .then(|| tiercache_format::crc::crc32c(&buf));
        Slot {
            want: buf.len(),
            buf,
            reply,
            crc,
        }
    }

    /// Names a new request, keeps its buffer (and where its reply goes, if no thread waits
    /// for it), and returns its id and the core's event for it. A read on a memory cache
    /// starts loading the data a hit will copy while the core decides.
    pub(crate) fn open_request(
        g: &mut Inner,
        op: Op,
        core: CoreId,
        lba: u64,
        blocks: u32,
        slot: Slot,
    ) -> (ReqId, Event) {
        let req = ReqId(g.next_req);
        g.next_req += 1;
        g.reqs.insert(req, slot);
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
pub(crate) fn request_event(op: Op, req: ReqId, core: CoreId, lba: Lba, blocks: u32) -> Event {
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
    pub(crate) fn wait_for(
        &self,
        req: ReqId,
        mut mine: Option<Job>,
    ) -> (Result<(), ReqError>, AlignedBuf) {
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
    pub(crate) fn request(
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
    pub(crate) fn start_request(
        &self,
        op: Op,
        core: CoreId,
        lba: u64,
        blocks: u32,
        buf: AlignedBuf,
    ) -> Result<(Result<(), ReqError>, AlignedBuf), Pending> {
        let slot = self.sh.slot(op, buf, None);
        let mut g = self.sh.lock();
        let (req, ev) = Shared::open_request(&mut g, op, core, lba, blocks, slot);
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
        let blocks = (buf.len() / BLOCK) as u32;
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
        let blocks = (buf.len() / BLOCK) as u32;
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
        let blocks = (buf.len() / BLOCK) as u32;
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
}
