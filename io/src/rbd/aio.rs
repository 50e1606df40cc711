//! The asynchronous path ([`Backend::submit_async`]): librbd completion callbacks hand requests to
//! a completer thread that finishes them (a FUA write's flush, the result, the caller's `done`).

use super::*;

/// What an asynchronous request waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AsyncStage {
    /// Its IO.
    Io,
    /// The flush after a FUA write.
    FuaFlush,
}

/// One request of the asynchronous path ([`Backend::submit_async`]). Boxed and handed to
/// librbd as its completion's argument; librbd's callback gives it back to the completer
/// thread, which finishes it. It owns the buffer librbd reads from or writes into, so the
/// buffer lives until librbd is done with it.
pub(super) struct AsyncOp {
    pub(super) lib: &'static Lib,
    pub(super) q: Arc<AsyncQueue>,
    pub(super) req: AsyncReq,
    pub(super) done: AsyncDone,
    pub(super) stage: AsyncStage,
    /// librbd's return value, set by the callback.
    pub(super) ret: isize,
    /// A result known without (more) IO: a request refused at once, or an empty one.
    pub(super) early: Option<Result<(), IoErr>>,
}

#[derive(Default)]
pub(super) struct AsyncState {
    /// Requests librbd has completed (or refused), to be finished by the completer. Boxed:
    /// the box is what went through librbd as the completion's argument.
    pub(super) ready: std::collections::VecDeque<Box<AsyncOp>>,
    /// Requests submitted whose `done` has not been called yet.
    pub(super) inflight: u64,
    pub(super) quit: bool,
}

/// The asynchronous path's queue, between librbd's callbacks and the completer thread.
#[derive(Default)]
pub(super) struct AsyncQueue {
    pub(super) st: Mutex<AsyncState>,
    /// The completer waits here for ready requests (or `quit`).
    pub(super) cv: Condvar,
    /// The backend's Drop waits here for `inflight` to reach 0.
    pub(super) idle: Condvar,
}

impl AsyncQueue {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, AsyncState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn push(&self, op: Box<AsyncOp>) {
        let mut st = self.lock();
        let wake = st.ready.is_empty();
        st.ready.push_back(op);
        drop(st);
        if wake {
            self.cv.notify_one();
        }
    }
}

/// What the completer needs of the backend: a FUA write's flush is issued from there, and
/// errors name the image. Valid while requests are in flight (the backend's Drop waits for
/// every one before it closes the image).
pub(super) struct AsyncCtx {
    pub(super) lib: &'static Lib,
    pub(super) img: ImageT,
    pub(super) target: RbdTarget,
    /// [`RbdBackend::completed_durable`]: a FUA write needs no flush.
    pub(super) completed_durable: bool,
}

// SAFETY: `img` is an open librbd image handle, usable from any thread (librbd's API is
// thread-safe); it is only used while the backend, which closes it, waits for the requests.
unsafe impl Send for AsyncCtx {}
// SAFETY: as for Send.
unsafe impl Sync for AsyncCtx {}

/// The thread that finishes asynchronous requests — a FUA write's flush, the result, the
/// caller's `done` — so that no caller code runs on librbd's own threads.
pub(super) struct Completer {
    pub(super) q: Arc<AsyncQueue>,
    pub(super) ctx: Arc<AsyncCtx>,
    pub(super) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(super) id: std::thread::ThreadId,
}

/// librbd's completion callback of the asynchronous path: records the return value, releases
/// the completion and queues the request for the completer. Runs on a librbd thread; does
/// nothing else there.
pub(super) extern "C" fn aio_done(c: CompT, arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<AsyncOp>` that `issue_async` leaked for this completion; librbd
    // calls this exactly once per completion, so the box is taken back exactly once.
    let mut op = unsafe { Box::from_raw(arg.cast::<AsyncOp>()) };
    // SAFETY: `c` is the completion this callback is for; reading its value and releasing it
    // once is its protocol (librbd holds its own reference while the callback runs).
    op.ret = unsafe {
        let r = (op.lib.rbd_aio_get_return_value)(c);
        (op.lib.rbd_aio_release)(c);
        r
    };
    let q = op.q.clone();
    q.push(op);
}

/// Issues one asynchronous librbd request through `issue` with a completion whose callback
/// queues `op` for the completer; a request librbd refuses at once is queued with its error.
/// `op` must not be touched after a successful issue: it may be finished already.
pub(super) fn issue_async(
    lib: &'static Lib,
    target: &RbdTarget,
    op: Box<AsyncOp>,
    what: &str,
    issue: impl FnOnce(CompT) -> c_int,
) {
    let q = op.q.clone();
    let arg = Box::into_raw(op);
    let mut c: CompT = std::ptr::null_mut();
    // SAFETY: `arg` stays valid until the callback takes it back; `c` is a valid out-pointer.
    let r = unsafe { (lib.rbd_aio_create_completion)(arg.cast(), Some(aio_done), &mut c) };
    let r = if r < 0 {
        r
    } else {
        let r = issue(c);
        if r < 0 {
            // SAFETY: the request was refused, so librbd holds no reference to `c` and will
            // never call the callback: release it.
            unsafe { (lib.rbd_aio_release)(c) };
        }
        r
    };
    if r < 0 {
        // SAFETY: no callback will run for `arg` (no completion, or a refused request): the box
        // is still ours.
        let mut op = unsafe { Box::from_raw(arg) };
        op.early = Some(Err(rbd_err(r as isize, target, Stage::Op(what))));
        q.push(op);
    }
}

impl AsyncCtx {
    /// Finishes a request librbd completed: issues a FUA write's flush, or works out the result
    /// and calls `done`.
    pub(super) fn finish(&self, mut op: Box<AsyncOp>) {
        let res = match op.early.take() {
            Some(r) => r,
            None => self.result(&op),
        };
        if res.is_ok()
            && !self.completed_durable
            && op.stage == AsyncStage::Io
            && matches!(
                op.req,
                AsyncReq::Write { fua: true, .. } | AsyncReq::WriteZeroes { fua: true, .. }
            )
        {
            op.stage = AsyncStage::FuaFlush;
            let (img, f) = (self.img, self.lib.rbd_aio_flush);
            // SAFETY: the image is open (the backend waits for this request before closing it);
            // a flush takes no buffer.
            issue_async(self.lib, &self.target, op, "flush", |c| unsafe {
                f(img, c)
            });
            return;
        }
        let res = match (res, op.stage) {
            (Err(e), AsyncStage::FuaFlush) => Err(IoErr::Io {
                kind: ErrorKind::Other,
                msg: format!("flush after a FUA write: {e}"),
            }),
            (r, _) => r,
        };
        let AsyncOp { req, done, q, .. } = *op;
        let buf = match req {
            AsyncReq::Read { buf, .. } | AsyncReq::Write { buf, .. } => Some(buf),
            _ => None,
        };
        {
            let mut st = q.lock();
            st.inflight -= 1;
            if st.inflight == 0 {
                q.idle.notify_all();
            }
        }
        done(buf, res);
    }

    /// The result of a completed request from librbd's return value.
    pub(super) fn result(&self, op: &AsyncOp) -> Result<(), IoErr> {
        let r = op.ret;
        if op.stage == AsyncStage::FuaFlush || matches!(op.req, AsyncReq::Flush) {
            return if r < 0 {
                Err(rbd_err(r, &self.target, Stage::Op("flush")))
            } else {
                Ok(())
            };
        }
        let (what, lba, len) = match &op.req {
            AsyncReq::Read { lba, buf } => ("read", *lba, buf.len() as u64),
            AsyncReq::Write { lba, buf, .. } => ("write", *lba, buf.len() as u64),
            AsyncReq::WriteZeroes { lba, blocks, .. } => ("write zeroes", *lba, blocks * 512),
            AsyncReq::Trim { lba, blocks } => ("trim", *lba, blocks * 512),
            AsyncReq::Flush => unreachable!("handled above"),
        };
        let off = lba * BLOCK as u64;
        if r < 0 {
            let what = format!("{what} of {len} bytes at byte {off}");
            return Err(rbd_err(r, &self.target, Stage::Op(&what)));
        }
        if matches!(op.req, AsyncReq::Read { .. }) && r as u64 != len {
            return Err(IoErr::Io {
                kind: ErrorKind::UnexpectedEof,
                msg: format!(
                    "rbd:{}: read of {len} bytes at byte {off} returned {r} bytes",
                    self.target.spec()
                ),
            });
        }
        Ok(())
    }

    /// The completer's loop: finishes ready requests until `quit` (or, with `until_idle`,
    /// until none is in flight).
    ///
    /// Requests are taken from the queue one at a time, so that a `done` that drops the
    /// backend (its Drop then runs this loop again, on this thread) finds every request not yet
    /// finished still in the queue.
    pub(super) fn run(&self, q: &AsyncQueue, until_idle: bool) {
        loop {
            let op = {
                let mut st = q.lock();
                loop {
                    if let Some(op) = st.ready.pop_front() {
                        break op;
                    }
                    if st.quit || (until_idle && st.inflight == 0) {
                        return;
                    }
                    st = q.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            self.finish(op);
        }
    }
}

impl RbdBackend {
    pub(super) fn completer(&self) -> &Completer {
        self.completer.get_or_init(|| {
            let q = Arc::new(AsyncQueue::default());
            let ctx = Arc::new(AsyncCtx {
                lib: self.lib,
                img: self.image.h,
                target: self.target.clone(),
                completed_durable: self.completed_durable,
            });
            let (q2, ctx2) = (q.clone(), ctx.clone());
            let t = std::thread::Builder::new()
                .name("tc-rbd-done".into())
                .spawn(move || ctx2.run(&q2, false))
                .expect("spawn the librbd completion thread");
            Completer {
                q,
                ctx,
                id: t.thread().id(),
                thread: Mutex::new(Some(t)),
            }
        })
    }

    /// Issues `op` (stage `Io`): checks it, then one `rbd_aio_*` call.
    pub(super) fn start_async(&self, mut op: Box<AsyncOp>) {
        let (img, lib) = (self.image.h, self.lib);
        let blocks = match &op.req {
            AsyncReq::Read { buf, .. } | AsyncReq::Write { buf, .. } => {
                if buf.len() % BLOCK != 0 {
                    op.early = Some(Err(IoErr::Misaligned { len: buf.len() }));
                    op.q.clone().push(op);
                    return;
                }
                (buf.len() / BLOCK) as u64
            }
            AsyncReq::WriteZeroes { blocks, .. } | AsyncReq::Trim { blocks, .. } => *blocks,
            AsyncReq::Flush => 0,
        };
        let lba = match &op.req {
            AsyncReq::Read { lba, .. }
            | AsyncReq::Write { lba, .. }
            | AsyncReq::WriteZeroes { lba, .. }
            | AsyncReq::Trim { lba, .. } => *lba,
            AsyncReq::Flush => 0,
        };
        let checked = self.check(lba, blocks).and_then(|()| {
            usize::try_from(blocks * BLOCK as u64).map_err(|_| IoErr::OutOfRange {
                lba,
                blocks,
                dev_blocks: self.size_blocks.load(Ordering::Relaxed),
            })
        });
        let len = match checked {
            Ok(len) => len,
            Err(e) => {
                op.early = Some(Err(e));
                op.q.clone().push(op);
                return;
            }
        };
        if matches!(op.req, AsyncReq::Flush) && self.completed_durable {
            // Every completed write is on the OSDs already (see `completed_durable`).
            op.early = Some(Ok(()));
            op.q.clone().push(op);
            return;
        }
        if len == 0 && !matches!(op.req, AsyncReq::Flush) {
            // Nothing to do (a FUA write of nothing still flushes, as the sync path does).
            op.early = Some(Ok(()));
            op.q.clone().push(op);
            return;
        }
        let off = lba * BLOCK as u64;
        let t = &self.target;
        match &mut op.req {
            AsyncReq::Read { buf, .. } => {
                let (ptr, f) = (buf.as_mut_ptr().cast::<c_char>(), lib.rbd_aio_read);
                // SAFETY: `ptr` points into the op's own heap buffer, valid for writes of `len`
                // bytes until the callback hands the op back (the op owns the buffer).
                issue_async(lib, t, op, "read", |c| unsafe { f(img, off, len, ptr, c) });
            }
            AsyncReq::Write { buf, .. } => {
                let (ptr, f) = (buf.as_ptr().cast::<c_char>(), lib.rbd_aio_write);
                // SAFETY: as for reads: the op owns the buffer until the callback.
                issue_async(lib, t, op, "write", |c| unsafe { f(img, off, len, ptr, c) });
            }
            AsyncReq::WriteZeroes { .. } | AsyncReq::Trim { .. } => {
                let what = if matches!(op.req, AsyncReq::Trim { .. }) {
                    "trim"
                } else {
                    "write zeroes"
                };
                let f = lib
                    .rbd_aio_write_zeroes
                    .expect("is_async holds only with rbd_aio_write_zeroes");
                // SAFETY: no buffer is involved; the image is open. Flags 0: zeroes may be thin.
                issue_async(lib, t, op, what, |c| unsafe { f(img, off, len, c, 0, 0) });
            }
            AsyncReq::Flush => {
                let f = lib.rbd_aio_flush;
                // SAFETY: the image is open; a flush takes no buffer.
                issue_async(lib, t, op, "flush", |c| unsafe { f(img, c) });
            }
        }
    }
}
