//! [`TimeoutBackend`]: a wrapper that gives up on an IO after a configurable time (SPEC C19's
//! "configurable IO timeouts"; docs/SAFETY.md, "Faults").
//!
//! Every IO runs on a helper thread with its own copy of the data; the caller waits at most the
//! timeout and then gets [`IoErr::timed_out`] (an [`IoErr::Io`] of kind `TimedOut`, which the
//! engine reports to the core as `IoError::TimedOut`). The IO itself cannot be cancelled: it
//! goes on in the background (a *late* IO) and finishes when the device lets it. Its buffer is
//! its own, so nothing the caller does with its buffer afterwards is corrupted, and a late
//! read's data is thrown away.
//!
//! **Ordering.** A write (write, write-zeroes, trim) that timed out may still reach the device.
//! The core treats it as a *failed* write — each of its blocks may hold the old or the new data,
//! and whichever it holds must then stay (docs/SAFETY.md, "Failed writes") — which holds only if
//! the late write cannot land after something issued later. So, until it finishes:
//! - every later IO that overlaps its range (read or write) waits for it, then runs; if the
//!   wait uses up the later IO's own timeout, that IO fails with `TimedOut` without being
//!   issued. A later write is never overtaken by the late one, and a read never returns old
//!   data and then, once the late write lands, new data (no flip-flop);
//! - every flush waits for every late write, so a flush that succeeds covers them too.
//!
//! IOs that do not overlap a late write are not held back. Requests issued concurrently (none of
//! them late yet) are unordered, as on any backend. Late reads hold nothing back.
//!
//! **Resources.** A hung IO holds its helper thread until the device returns it. At most
//! `max_threads` helpers exist; when all are busy, new IOs wait in a queue and a queued IO
//! whose timeout runs out is dropped from the queue (it never reaches the device) and fails
//! with `TimedOut`. Each IO costs a copy of its data and a hand-off to a helper thread.

use crate::{AlignedBuf, BLOCK, Backend, IoErr, Req, check_blocks, check_bytes};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Counters of a [`TimeoutBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeoutStats {
    /// IOs that timed out while running on the device (they went on in the background).
    pub timed_out: u64,
    /// IOs that timed out before they reached the device (queued, or waiting for an
    /// overlapping late write).
    pub timed_out_unissued: u64,
    /// Late writes still running now.
    pub late_writes: u64,
    /// IOs that timed out and finished later.
    pub late_done: u64,
    /// IOs that waited for an overlapping late write before they ran.
    pub waited_for_late: u64,
    /// Helper threads now, and the most there were.
    pub threads: u64,
    /// The most helper threads there were.
    pub threads_max: u64,
}

/// One request with its own buffers: the request of [`Backend::submit_async`].
type Op = crate::AsyncReq;

impl Op {
    /// The range a write-type request changes.
    fn written(&self) -> Option<(u64, u64)> {
        match *self {
            Op::Write { lba, ref buf, .. } => Some((lba, (buf.len() / BLOCK) as u64)),
            Op::WriteZeroes { lba, blocks, .. } | Op::Trim { lba, blocks } => Some((lba, blocks)),
            Op::Read { .. } | Op::Flush => None,
        }
    }

    /// The range it touches (`None`: a flush).
    fn range(&self) -> Option<(u64, u64)> {
        match *self {
            Op::Read { lba, ref buf } => Some((lba, (buf.len() / BLOCK) as u64)),
            _ => self.written(),
        }
    }

    fn run(&mut self, dev: &dyn Backend) -> Result<(), IoErr> {
        match self {
            Op::Read { lba, buf } => dev.read(*lba, buf),
            Op::Write { lba, buf, fua } => dev.write(*lba, buf, *fua),
            Op::WriteZeroes { lba, blocks, fua } => dev.write_zeroes(*lba, *blocks, *fua),
            Op::Trim { lba, blocks } => dev.trim(*lba, *blocks),
            Op::Flush => dev.flush(),
        }
    }
}

/// A job for a helper: one request, or a batch run with one `submit_batch` call.
struct Job {
    id: u64,
    ops: Vec<Op>,
    batch: bool,
}

/// What a finished job hands back: its ops (read buffers) and results.
struct Done {
    ops: Vec<Op>,
    results: Vec<Result<(), IoErr>>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    next_id: u64,
    /// The ranges each queued or running job writes.
    writes: HashMap<u64, Vec<(u64, u64)>>,
    done: HashMap<u64, Done>,
    /// Jobs whose caller gave up while they ran (late IOs).
    late: HashSet<u64>,
    idle: usize,
    threads: usize,
    stats: TimeoutStats,
    quit: bool,
}

struct Shared {
    st: Mutex<State>,
    /// A job finished (callers and IOs waiting for late writes re-check).
    done_cv: Condvar,
    /// A job was queued (idle helpers re-check).
    work_cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// A wrapper that fails an IO with `TimedOut` when the device takes longer than a timeout;
/// see the module docs for what happens to the IO and for ordering.
pub struct TimeoutBackend<B: Backend + 'static> {
    inner: Arc<B>,
    timeout_ns: AtomicU64,
    max_threads: usize,
    sh: Arc<Shared>,
}

impl<B: Backend + 'static> TimeoutBackend<B> {
    /// Wraps `inner`: every IO that takes longer than `timeout` fails with `TimedOut`. At most
    /// 64 helper threads.
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self::with_threads(inner, timeout, 64)
    }

    /// Like [`TimeoutBackend::new`] with at most `max_threads` (≥ 1) helper threads.
    pub fn with_threads(inner: B, timeout: Duration, max_threads: usize) -> Self {
        TimeoutBackend {
            inner: Arc::new(inner),
            timeout_ns: AtomicU64::new(timeout.as_nanos().min(u64::MAX as u128) as u64),
            max_threads: max_threads.max(1),
            sh: Arc::new(Shared {
                st: Mutex::new(State::default()),
                done_cv: Condvar::new(),
                work_cv: Condvar::new(),
            }),
        }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The timeout in force.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    /// Changes the timeout (IOs started afterwards use it).
    pub fn set_timeout(&self, t: Duration) {
        self.timeout_ns
            .store(t.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// Counters.
    pub fn stats(&self) -> TimeoutStats {
        let st = self.sh.lock();
        let mut s = st.stats;
        s.late_writes = st
            .late
            .iter()
            .filter(|id| st.writes.get(id).is_some_and(|w| !w.is_empty()))
            .count() as u64;
        s.threads = st.threads as u64;
        s
    }

    /// Runs `ops` (as one batch if `batch`) on a helper, waiting at most the timeout. Returns
    /// the ops (with read data) and one result per op.
    fn run(&self, ops: Vec<Op>, batch: bool, what: &str) -> (Vec<Op>, Vec<Result<(), IoErr>>) {
        let timeout = self.timeout();
        let deadline = Instant::now() + timeout;
        let n = ops.len();
        let fail = |what: &str| {
            (0..n)
                .map(|_| Err(IoErr::timed_out(format!("{what} (limit {timeout:?})"))))
                .collect::<Vec<_>>()
        };
        let mut st = self.sh.lock();
        // Wait until no late write overlaps what these ops touch (a flush: no late write).
        let mut waited = false;
        loop {
            let blocked = st.late.iter().flat_map(|id| &st.writes[id]).any(|&w| {
                ops.iter().any(|o| match o.range() {
                    None => true,
                    Some(r) => overlaps(r, w),
                })
            });
            if !blocked {
                break;
            }
            waited = true;
            let now = Instant::now();
            if now >= deadline {
                st.stats.timed_out_unissued += 1;
                return (ops, fail(&format!("{what} waited for a late write")));
            }
            st = self
                .sh
                .done_cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if waited {
            st.stats.waited_for_late += 1;
        }
        if st.quit {
            return (ops, fail(what));
        }
        let id = st.next_id;
        st.next_id += 1;
        let written: Vec<(u64, u64)> = ops.iter().filter_map(|o| o.written()).collect();
        st.writes.insert(id, written);
        st.queue.push_back(Job { id, ops, batch });
        if st.idle == 0 && st.threads < self.max_threads {
            st.threads += 1;
            st.stats.threads_max = st.stats.threads_max.max(st.threads as u64);
            let sh = self.sh.clone();
            let dev = self.inner.clone();
            let spawned = std::thread::Builder::new()
                .name("tc-timeout".into())
                .spawn(move || helper(sh, dev));
            if spawned.is_err() {
                st.threads -= 1;
            }
        } else {
            self.sh.work_cv.notify_one();
        }
        loop {
            if let Some(d) = st.done.remove(&id) {
                return (d.ops, d.results);
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = self
                .sh
                .done_cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        // Timed out. Still queued: it never reaches the device.
        if let Some(i) = st.queue.iter().position(|j| j.id == id) {
            let job = st.queue.remove(i).expect("found");
            st.writes.remove(&id);
            st.stats.timed_out_unissued += 1;
            return (job.ops, fail(what));
        }
        // Running: it goes on as a late IO, and what it writes holds back overlapping IOs until
        // it finishes. Its ops went with it: the caller gets placeholders (reads: no data).
        st.stats.timed_out += 1;
        st.late.insert(id);
        let placeholders = (0..n).map(|_| Op::Flush).collect();
        (placeholders, fail(what))
    }
}

/// A helper thread: runs queued jobs; hands results to waiting callers, or, for a job whose
/// caller gave up, records that the late IO finished.
fn helper<B: Backend + 'static>(sh: Arc<Shared>, dev: Arc<B>) {
    let mut st = sh.lock();
    loop {
        let Some(mut job) = st.queue.pop_front() else {
            if st.quit {
                st.threads -= 1;
                return;
            }
            st.idle += 1;
            let (g, to) = sh
                .work_cv
                .wait_timeout(st, Duration::from_secs(30))
                .unwrap_or_else(|e| e.into_inner());
            st = g;
            st.idle -= 1;
            if to.timed_out() && st.queue.is_empty() {
                // Idle for long: let the pool shrink back.
                st.threads -= 1;
                return;
            }
            continue;
        };
        drop(st);
        let results = if job.batch {
            let mut reqs: Vec<Req<'_>> = job
                .ops
                .iter_mut()
                .map(|o| match o {
                    Op::Read { lba, buf } => Req::Read { lba: *lba, buf },
                    Op::Write { lba, buf, fua } => Req::Write {
                        lba: *lba,
                        buf,
                        fua: *fua,
                    },
                    Op::WriteZeroes { lba, blocks, fua } => Req::WriteZeroes {
                        lba: *lba,
                        blocks: *blocks,
                        fua: *fua,
                    },
                    Op::Trim { lba, blocks } => Req::Trim {
                        lba: *lba,
                        blocks: *blocks,
                    },
                    Op::Flush => Req::Flush,
                })
                .collect();
            dev.submit_batch(&mut reqs)
        } else {
            job.ops.iter_mut().map(|o| o.run(&*dev)).collect()
        };
        st = sh.lock();
        st.writes.remove(&job.id);
        if st.late.remove(&job.id) {
            st.stats.late_done += 1;
        } else {
            st.done.insert(
                job.id,
                Done {
                    ops: job.ops,
                    results,
                },
            );
        }
        sh.done_cv.notify_all();
    }
}

impl<B: Backend + 'static> Drop for TimeoutBackend<B> {
    fn drop(&mut self) {
        // Idle helpers end now; a helper stuck in a hung IO ends when the IO returns.
        let mut st = self.sh.lock();
        st.quit = true;
        self.sh.work_cv.notify_all();
    }
}

/// Every IO runs on a helper under the timeout: synchronous only (an IO submitted
/// asynchronously runs these calls, so it is timed too; an asynchronous inner device, such as
/// an RBD image, is then driven through its synchronous calls), no ring descriptor. Allocation
/// queries go to the inner device (they move no data).
impl<B: Backend + 'static> Backend for TimeoutBackend<B> {
    crate::forward_backend!(inner; blocks, extents);
    crate::sync_only_backend!();

    fn name(&self) -> String {
        format!("timeout({:?}, {})", self.timeout(), self.inner.name())
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        check_bytes(lba, buf.len(), self.inner.blocks())?;
        let op = Op::Read {
            lba,
            buf: AlignedBuf::new(buf.len()),
        };
        let (mut ops, mut res) = self.run(vec![op], false, &format!("read at lba {lba}"));
        let r = res.pop().expect("one result");
        if r.is_ok()
            && let Some(Op::Read { buf: data, .. }) = ops.pop()
        {
            buf.copy_from_slice(&data);
        }
        r
    }

    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        check_bytes(lba, buf.len(), self.inner.blocks())?;
        let mut copy = AlignedBuf::new(buf.len());
        copy.copy_from_slice(buf);
        let op = Op::Write {
            lba,
            buf: copy,
            fua,
        };
        let (_, mut res) = self.run(vec![op], false, &format!("write at lba {lba}"));
        res.pop().expect("one result")
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.inner.blocks())?;
        let op = Op::WriteZeroes { lba, blocks, fua };
        let (_, mut res) = self.run(vec![op], false, &format!("write-zeroes at lba {lba}"));
        res.pop().expect("one result")
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.inner.blocks())?;
        let op = Op::Trim { lba, blocks };
        let (_, mut res) = self.run(vec![op], false, &format!("trim at lba {lba}"));
        res.pop().expect("one result")
    }

    fn flush(&self) -> Result<(), IoErr> {
        let (_, mut res) = self.run(vec![Op::Flush], false, "flush");
        res.pop().expect("one result")
    }

    fn submit_batch(&self, reqs: &mut [Req<'_>]) -> Vec<Result<(), IoErr>> {
        // Requests that are wrong on their face fail alone, as on the inner device; the rest
        // run as one batch on a helper (the inner device may overlap them), under one timeout.
        let dev_blocks = self.inner.blocks();
        let mut out: Vec<Option<Result<(), IoErr>>> = Vec::with_capacity(reqs.len());
        let mut ops = Vec::new();
        for r in reqs.iter() {
            let checked = match r {
                Req::Read { lba, buf } => {
                    check_bytes(*lba, buf.len(), dev_blocks).map(|_| Op::Read {
                        lba: *lba,
                        buf: AlignedBuf::new(buf.len()),
                    })
                }
                Req::Write { lba, buf, fua } => {
                    check_bytes(*lba, buf.len(), dev_blocks).map(|_| {
                        let mut copy = AlignedBuf::new(buf.len());
                        copy.copy_from_slice(buf);
                        Op::Write {
                            lba: *lba,
                            buf: copy,
                            fua: *fua,
                        }
                    })
                }
                Req::WriteZeroes { lba, blocks, fua } => check_blocks(*lba, *blocks, dev_blocks)
                    .map(|_| Op::WriteZeroes {
                        lba: *lba,
                        blocks: *blocks,
                        fua: *fua,
                    }),
                Req::Trim { lba, blocks } => {
                    check_blocks(*lba, *blocks, dev_blocks).map(|_| Op::Trim {
                        lba: *lba,
                        blocks: *blocks,
                    })
                }
                Req::Flush => Ok(Op::Flush),
            };
            match checked {
                Ok(op) => {
                    ops.push(op);
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let n = ops.len();
        let (ops, results) = if n > 0 {
            self.run(ops, true, &format!("batch of {n}"))
        } else {
            (Vec::new(), Vec::new())
        };
        let mut ops = ops.into_iter();
        let mut results = results.into_iter();
        let mut final_results = Vec::with_capacity(reqs.len());
        for (r, o) in reqs.iter_mut().zip(out) {
            if let Some(e) = o {
                final_results.push(e);
                continue;
            }
            let op = ops.next().expect("one op per request");
            let res = results.next().expect("one result per request");
            if res.is_ok()
                && let (Req::Read { buf, .. }, Op::Read { buf: data, .. }) = (r, op)
            {
                buf.copy_from_slice(&data);
            }
            final_results.push(res);
        }
        final_results
    }
}
