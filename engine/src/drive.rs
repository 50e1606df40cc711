//! Driving the core: an event in, its actions out, each executed — inline on a memory
//! device, or as an IO for the IO threads, a caller's ring or an asynchronous device
//! (`completion.rs`). Contiguous writes to one device become one IO.

use super::*;
use tiercache_core::units::BLOCK_BYTES;
use tiercache_io::BLOCK;

impl Shared {
    pub(crate) fn now(&self) -> Nanos {
        let n = self.epoch.elapsed().as_nanos() as u64;
        // Monotonic across threads even if two read the clock out of order.
        let prev = self.last_now.fetch_max(n, Ordering::Relaxed);
        Nanos(n.max(prev))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `ev` and everything it leads to that can run inline.
    pub(crate) fn drive(&self, g: &mut Inner, ev: Event) {
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
                let s = &reqs[&req];
                s.crc
                    .unwrap_or_else(|| tiercache_format::crc::crc32c(&s.buf))
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
        if g.m.take_deadline_moved()
            && let Some(t) = self.ticker.get()
        {
            t.unpark();
        }
        if g.waiting > 0 {
            self.done_cv.notify_all();
        }
    }

    /// Waits on `done_cv` (at most `timeout`), counted so `drive` knows to notify.
    pub(crate) fn wait_done<'a>(
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

    pub(crate) fn device(g: &Inner, dev: Dev) -> Device {
        Self::device_ref(g, dev).clone()
    }

    pub(crate) fn device_ref(g: &Inner, dev: Dev) -> &Device {
        device_in(&g.cache_dev, &g.cores, dev)
    }

    pub(crate) fn execute(&self, g: &mut Inner, a: Action, events: &mut VecDeque<Event>) {
        match a.clone() {
            Action::Complete { req, result } => {
                let mut slot = g.reqs.remove(&req).expect("completion of a live request");
                g.stats.requests += 1;
                if result.is_ok() {
                    slot.data(); // a read nothing wrote into reads zeros
                }
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
    pub(crate) fn write_run(&self, g: &Inner, acts: &[Action]) -> usize {
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
                    && (total + *b as u64) * BLOCK_BYTES <= MERGE_MAX_BYTES =>
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
    pub(crate) fn execute_run(&self, g: &mut Inner, acts: &[Action]) {
        let Some(&Action::Write { dev, lba, fua, .. }) = acts.first() else {
            unreachable!("a run of writes")
        };
        let total: usize = acts
            .iter()
            .map(|a| match a {
                Action::Write { blocks, .. } => *blocks as usize * BLOCK,
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
                let len = *blocks as usize * BLOCK;
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
    pub(crate) fn simple(
        &self,
        g: &mut Inner,
        io: IoId,
        dev: Dev,
        op: JobOp,
        events: &mut VecDeque<Event>,
    ) {
        let d = Self::device(g, dev);
        if d.inline() {
            g.stats.inline_ios += 1;
            events.push_back(done(io, run(&*d, op).1));
        } else {
            self.submit(g, io, d, op);
        }
    }
}

/// The device `dev` names.
pub(crate) fn device_in<'a>(
    cache_dev: &'a Device,
    cores: &'a [Option<Device>],
    dev: Dev,
) -> &'a Device {
    match dev {
        Dev::Cache => cache_dev,
        Dev::Core(c) => cores[c.0 as usize]
            .as_ref()
            .expect("the core names only attached cores"),
    }
}
