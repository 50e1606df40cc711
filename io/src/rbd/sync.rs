//! The synchronous path: requests issued as librbd aio and waited for by the caller (`Pending`,
//! `Job`), batches, and the [`Backend`] implementation.

use super::*;

/// One asynchronous librbd request in flight. It borrows the caller's buffer for `'b`, and is
/// always waited for before it goes away (on drop too), so librbd never touches a buffer that
/// was given back.
pub(super) struct Pending<'b> {
    pub(super) lib: &'static Lib,
    pub(super) c: CompT,
    /// Bytes a successful read returns.
    pub(super) expect: Option<usize>,
    /// What it is, for the error message.
    pub(super) what: &'static str,
    pub(super) off: u64,
    pub(super) len: u64,
    pub(super) done: bool,
    pub(super) _buf: PhantomData<&'b mut [u8]>,
}

impl Pending<'_> {
    /// Waits for the request and releases its completion; returns librbd's return value.
    pub(super) fn wait(&mut self) -> isize {
        if self.done {
            return 0;
        }
        // SAFETY: `c` is a completion that was handed to a successfully issued aio request and
        // not yet released; waiting, reading its value and releasing it once is its protocol.
        let r = unsafe {
            (self.lib.rbd_aio_wait_for_complete)(self.c);
            let r = (self.lib.rbd_aio_get_return_value)(self.c);
            (self.lib.rbd_aio_release)(self.c);
            r
        };
        self.done = true;
        r
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.wait();
    }
}

/// One request of a batch: started parts, or a result known without waiting.
pub(super) struct Job<'b> {
    pub(super) early: Option<Result<(), IoErr>>,
    pub(super) parts: Vec<Pending<'b>>,
    pub(super) fua: bool,
}

impl Job<'_> {
    pub(super) fn done(r: Result<(), IoErr>) -> Self {
        Job {
            early: Some(r),
            parts: Vec::new(),
            fua: false,
        }
    }
}

/// Zeros for the fallback without `rbd_aio_write_zeroes` (never freed, shared by every write).
pub(super) fn zeros() -> &'static [u8] {
    static Z: OnceLock<Vec<u8>> = OnceLock::new();
    Z.get_or_init(|| vec![0u8; ZERO_CHUNK])
}

impl RbdBackend {
    pub(super) fn err(&self, r: isize, stage: Stage<'_>) -> IoErr {
        rbd_err(r, &self.target, stage)
    }

    /// Checks `blocks` at `lba` against the size last seen, and against a fresh one when that
    /// fails (the image may have grown).
    pub(super) fn check(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        match check_blocks(lba, blocks, self.size_blocks.load(Ordering::Relaxed)) {
            Ok(()) => Ok(()),
            Err(e) => match self.refresh_size() {
                Ok(now) => check_blocks(lba, blocks, now),
                Err(_) => Err(e),
            },
        }
    }

    pub(super) fn completion(&self) -> Result<CompT, IoErr> {
        let mut c: CompT = std::ptr::null_mut();
        // SAFETY: no callback (NULL) and no argument; `c` is a valid out-pointer.
        let r = unsafe { (self.lib.rbd_aio_create_completion)(std::ptr::null_mut(), None, &mut c) };
        if r < 0 {
            return Err(self.err(r as isize, Stage::Op("creating an aio completion")));
        }
        Ok(c)
    }

    /// Issues one aio request through `issue`, which gets the completion; a request librbd
    /// refuses at once has its completion released here (it will never complete).
    pub(super) fn issue<'b>(
        &self,
        what: &'static str,
        off: u64,
        len: u64,
        expect: Option<usize>,
        issue: impl FnOnce(CompT) -> c_int,
    ) -> Result<Pending<'b>, IoErr> {
        let c = self.completion()?;
        let r = issue(c);
        if r < 0 {
            // SAFETY: the request was refused, so librbd holds no reference to `c`: release it.
            unsafe { (self.lib.rbd_aio_release)(c) };
            return Err(self.err(r as isize, Stage::Op(what)));
        }
        Ok(Pending {
            lib: self.lib,
            c,
            expect,
            what,
            off,
            len,
            done: false,
            _buf: PhantomData,
        })
    }

    pub(super) fn start_read<'b>(&self, lba: u64, buf: &'b mut [u8]) -> Job<'b> {
        if buf.len() % BLOCK != 0 {
            return Job::done(Err(IoErr::Misaligned { len: buf.len() }));
        }
        if let Err(e) = self.check(lba, (buf.len() / BLOCK) as u64) {
            return Job::done(Err(e));
        }
        if buf.is_empty() {
            return Job::done(Ok(()));
        }
        let (off, len) = (lba * BLOCK as u64, buf.len());
        let (img, f) = (self.image.h, self.lib.rbd_aio_read);
        let ptr = buf.as_mut_ptr().cast::<c_char>();
        // SAFETY: `ptr` is valid for writes of `len` bytes for 'b, and the returned Pending
        // borrows the buffer for 'b and waits for the read before it is dropped.
        let p = self.issue("read", off, len as u64, Some(len), |c| unsafe {
            f(img, off, len, ptr, c)
        });
        match p {
            Ok(p) => Job {
                early: None,
                parts: vec![p],
                fua: false,
            },
            Err(e) => Job::done(Err(e)),
        }
    }

    pub(super) fn start_write<'b>(&self, lba: u64, buf: &'b [u8], fua: bool) -> Job<'b> {
        if buf.len() % BLOCK != 0 {
            return Job::done(Err(IoErr::Misaligned { len: buf.len() }));
        }
        if let Err(e) = self.check(lba, (buf.len() / BLOCK) as u64) {
            return Job::done(Err(e));
        }
        if buf.is_empty() {
            return Job {
                early: None,
                parts: Vec::new(),
                fua,
            };
        }
        let (off, len) = (lba * BLOCK as u64, buf.len());
        let (img, f) = (self.image.h, self.lib.rbd_aio_write);
        let ptr = buf.as_ptr().cast::<c_char>();
        // SAFETY: `ptr` is valid for reads of `len` bytes for 'b, and the returned Pending
        // borrows the buffer for 'b and waits for the write before it is dropped.
        let p = self.issue("write", off, len as u64, None, |c| unsafe {
            f(img, off, len, ptr, c)
        });
        match p {
            Ok(p) => Job {
                early: None,
                parts: vec![p],
                fua,
            },
            Err(e) => Job::done(Err(e)),
        }
    }

    pub(super) fn start_zeroes<'b>(
        &self,
        lba: u64,
        blocks: u64,
        fua: bool,
        what: &'static str,
    ) -> Job<'b> {
        if let Err(e) = self.check(lba, blocks) {
            return Job::done(Err(e));
        }
        let mut job = Job {
            early: None,
            parts: Vec::new(),
            fua,
        };
        if blocks == 0 {
            return job;
        }
        let (off, len, img) = (lba * BLOCK as u64, blocks * BLOCK as u64, self.image.h);
        if let Some(f) = self.lib.rbd_aio_write_zeroes {
            let Ok(n) = usize::try_from(len) else {
                return Job::done(Err(IoErr::OutOfRange {
                    lba,
                    blocks,
                    dev_blocks: self.size_blocks.load(Ordering::Relaxed),
                }));
            };
            // SAFETY: no buffer is involved; the image is open. Flags 0: zeroes may be thin.
            match self.issue(what, off, len, None, |c| unsafe { f(img, off, n, c, 0, 0) }) {
                Ok(p) => job.parts.push(p),
                Err(e) => return Job::done(Err(e)),
            }
            return job;
        }
        let z = zeros();
        let f = self.lib.rbd_aio_write;
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(z.len() as u64) as usize;
            let o = off + done;
            // SAFETY: `z` is a static buffer of zeros, valid for reads of `n` bytes forever.
            match self.issue(what, o, n as u64, None, |c| unsafe {
                f(img, o, n, z.as_ptr().cast(), c)
            }) {
                Ok(p) => job.parts.push(p),
                Err(e) => {
                    // What was issued is waited for when `job` drops.
                    drop(job);
                    return Job::done(Err(e));
                }
            }
            done += n as u64;
        }
        job
    }

    pub(super) fn start<'b>(&self, r: &'b mut Req<'_>) -> Job<'b> {
        match r {
            Req::Read { lba, buf } => self.start_read(*lba, buf),
            Req::Write { lba, buf, fua } => self.start_write(*lba, buf, *fua),
            Req::WriteZeroes { lba, blocks, fua } => {
                self.start_zeroes(*lba, *blocks, *fua, "write zeroes")
            }
            Req::Trim { lba, blocks } => self.start_zeroes(*lba, *blocks, false, "trim"),
            Req::Flush => Job::done(self.flush()),
        }
    }

    /// Waits for every part of every job, then flushes once for the FUA writes that succeeded.
    pub(super) fn finish(
        &self,
        jobs: Vec<(usize, Job<'_>)>,
        out: &mut [Option<Result<(), IoErr>>],
    ) {
        let mut fua_ok = Vec::new();
        for (i, mut job) in jobs {
            let mut res = job.early.take().unwrap_or(Ok(()));
            for p in &mut job.parts {
                let r = p.wait();
                if res.is_err() {
                    continue;
                }
                if r < 0 {
                    let what = format!("{} of {} bytes at byte {}", p.what, p.len, p.off);
                    res = Err(self.err(r, Stage::Op(&what)));
                } else if let Some(n) = p.expect
                    && r as usize != n
                {
                    res = Err(IoErr::Io {
                        kind: ErrorKind::UnexpectedEof,
                        msg: format!(
                            "rbd:{}: read of {} bytes at byte {} returned {r} bytes",
                            self.target.spec(),
                            p.len,
                            p.off
                        ),
                    });
                }
            }
            if res.is_ok() && job.fua {
                fua_ok.push(i);
            }
            out[i] = Some(res);
        }
        if !fua_ok.is_empty()
            && let Err(e) = self.flush()
        {
            for i in fua_ok {
                out[i] = Some(Err(IoErr::Io {
                    kind: ErrorKind::Other,
                    msg: format!("flush after a FUA write: {e}"),
                }));
            }
        }
    }
}

impl Backend for RbdBackend {
    fn name(&self) -> String {
        let conf = match &self.target.opts.conf {
            Some(c) => format!(", conf {}", c.display()),
            None => String::new(),
        };
        let zeroes = if self.lib.rbd_aio_write_zeroes.is_some() {
            "rbd_aio_write_zeroes"
        } else {
            "zeros written"
        };
        let flush = if self.completed_durable {
            "flush: none needed, rbd_cache off"
        } else {
            "flush: rbd_aio_flush"
        };
        format!(
            "rbd:{} (client.{}{conf}; librbd aio; {} KiB objects; trim/zeroes: {zeroes}; {flush}; exclusive lock held)",
            self.target.spec(),
            self.target.opts.client_id(),
            self.obj_size >> 10
        )
    }

    /// The size last seen: at open, by [`RbdBackend::refresh_size`], or by a request past
    /// that end (which looks again before it fails). Never a call into librbd: with the
    /// cluster unresponsive, `rbd_get_size` can wait for a header refresh that does not come,
    /// and this is asked on every request's path (range checks, IO timeouts, NBD sizes).
    fn blocks(&self) -> u64 {
        self.size_blocks.load(Ordering::Relaxed)
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        let mut r = [Req::Read { lba, buf }];
        self.submit_batch(&mut r).pop().unwrap_or(Ok(()))
    }

    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        let mut r = [Req::Write { lba, buf, fua }];
        self.submit_batch(&mut r).pop().unwrap_or(Ok(()))
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        let mut r = [Req::WriteZeroes { lba, blocks, fua }];
        self.submit_batch(&mut r).pop().unwrap_or(Ok(()))
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        let mut r = [Req::Trim { lba, blocks }];
        self.submit_batch(&mut r).pop().unwrap_or(Ok(()))
    }

    fn flush(&self) -> Result<(), IoErr> {
        if self.completed_durable {
            return Ok(());
        }
        let (img, f) = (self.image.h, self.lib.rbd_aio_flush);
        // SAFETY: the image is open; a flush takes no buffer.
        let mut p = self.issue("flush", 0, 0, None, |c| unsafe { f(img, c) })?;
        let r = p.wait();
        if r < 0 {
            return Err(self.err(r, Stage::Op("flush")));
        }
        Ok(())
    }

    /// Asynchronous when librbd has `rbd_aio_write_zeroes` (every request is then one aio
    /// call).
    fn is_async(&self) -> bool {
        self.lib.rbd_aio_write_zeroes.is_some()
    }

    /// One `rbd_aio_*` call whose completion callback hands the request to this image's
    /// completion thread (started by the first call), which issues a FUA write's flush and
    /// calls `done`: nothing of the caller runs on librbd's threads, and no thread waits per
    /// request.
    fn submit_async(&self, req: AsyncReq, done: AsyncDone) {
        if !self.is_async() {
            return crate::submit_sync(self, req, done);
        }
        let c = self.completer();
        c.q.lock().inflight += 1;
        let op = Box::new(AsyncOp {
            lib: self.lib,
            q: c.q.clone(),
            req,
            done,
            stage: AsyncStage::Io,
            ret: 0,
            early: None,
        });
        self.start_async(op);
    }

    /// Issues every request before waiting for any; a flush first waits for the requests
    /// before it (and so covers them), as the trait asks.
    fn submit_batch(&self, reqs: &mut [Req<'_>]) -> Vec<Result<(), IoErr>> {
        let mut out: Vec<Option<Result<(), IoErr>>> = (0..reqs.len()).map(|_| None).collect();
        let mut inflight: Vec<(usize, Job<'_>)> = Vec::new();
        for (i, r) in reqs.iter_mut().enumerate() {
            if matches!(r, Req::Flush) {
                self.finish(std::mem::take(&mut inflight), &mut out);
                out[i] = Some(self.flush());
                continue;
            }
            inflight.push((i, self.start(r)));
        }
        self.finish(inflight, &mut out);
        out.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }
}
