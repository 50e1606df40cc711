//! Completions: an IO handed to an IO thread or an asynchronous device, run, and its
//! result applied to the core — by the thread that ran it, which then runs the first IO
//! that completion started (no thread hop on a chain of IOs).

use super::*;
use tiercache_io::BLOCK;

pub(crate) fn io_error(e: &IoErr) -> IoError {
    match e {
        IoErr::Io { kind, .. } if *kind == std::io::ErrorKind::StorageFull => IoError::NoSpace,
        IoErr::Io { kind, .. } if *kind == std::io::ErrorKind::TimedOut => IoError::TimedOut,
        _ => IoError::Io,
    }
}

impl Shared {
    pub(crate) fn submit(&self, g: &mut Inner, io: IoId, dev: Device, op: JobOp) {
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
    pub(crate) fn submit_job(&self, g: &mut Inner, mut job: Job) {
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
    pub(crate) fn hand_over(&self, jobs: impl IntoIterator<Item = Job>) {
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
    pub(crate) fn drive_capture(&self, g: &mut Inner, ev: Event) -> Option<Job> {
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
    pub(crate) fn finished_also(g: &mut Inner, also: &[IoId], r: &Result<(), IoErr>) {
        for &io in also {
            g.events.push_back(Event::IoDone {
                io,
                result: r.as_ref().map(|_| ()).map_err(io_error),
            });
        }
    }

    /// The event for a finished IO (a read's data copied to where the core wants it, or the
    /// IO buffer given to the request when it is all of the request's data: no copy).
    pub(crate) fn finished(
        g: &mut Inner,
        io: IoId,
        buf: Option<AlignedBuf>,
        r: Result<(), IoErr>,
    ) -> Event {
        g.stats.in_flight -= 1;
        if let Some(dst) = g.reads.remove(&io)
            && let Some(b) = buf
            && r.is_ok()
        {
            let blocks = (b.len() / BLOCK) as u32;
            if let Err(b) = Self::lend(g, dst, b) {
                buf_mut(g, dst, blocks).copy_from_slice(&b);
            }
        }
        done(io, r)
    }

    /// Gives the IO buffer `b` to the read request whose whole buffer `dst` is, if that
    /// request has none yet (a reactor submits reads without one). The buffer then goes out
    /// with the reply and back to the pool when the reply is sent, so it is only lent while
    /// the pool is at most half in use: replies that a slow client does not read cannot take
    /// the buffers other IOs need. Gives `b` back otherwise.
    fn lend(g: &mut Inner, dst: BufRef, b: AlignedBuf) -> Result<(), AlignedBuf> {
        let BufRef::Req { req, offset: 0 } = dst else {
            return Err(b);
        };
        let Inner { reqs, bufs, .. } = g;
        let Some(slot) = reqs.get_mut(&req) else {
            return Err(b);
        };
        if !slot.buf.is_empty() || slot.want != b.len() || (b.pooled() && !bufs.mostly_free()) {
            return Err(b);
        }
        slot.buf = b;
        Ok(())
    }

    /// An IO thread: run jobs, report their completions.
    pub(crate) fn io_thread(&self) {
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
    pub(crate) fn run_job(&self, job: Job) -> (MutexGuard<'_, Inner>, Option<Job>) {
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
    pub(crate) fn run_chain(&self, g: MutexGuard<'_, Inner>, mut job: Option<Job>) {
        drop(g);
        while let Some(j) = job.take() {
            job = self.run_job(j).1;
        }
    }
}

pub(crate) fn done(io: IoId, r: Result<(), IoErr>) -> Event {
    Event::IoDone {
        io,
        result: r.map_err(|e| io_error(&e)),
    }
}

/// Runs one IO; returns a read's buffer.
pub(crate) fn run(dev: &dyn Backend, op: JobOp) -> (Option<AlignedBuf>, Result<(), IoErr>) {
    tiercache_io::run_sync(dev, op)
}
