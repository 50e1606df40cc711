//! The per-connection pipelined worker: requests kept in flight, replies matched, latencies
//! and verification recorded; merged into a job's results.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::conn::{Connection, SIMPLE_REPLY_MAGIC, cmd, encode_request};
use crate::hist::{self, Histogram};
use crate::job::*;
use crate::pattern::{self, Rng, Zipf};
use crate::{Error, Target, errno_name};
use tiercache_nbd_proto::SimpleReply;

#[derive(Default)]
#[repr(align(64))]
pub(crate) struct ConnShared {
    pub(crate) ops: AtomicU64,
    pub(crate) bytes: AtomicU64,
}

#[derive(Default, Clone, Copy)]
pub(crate) struct Bucket {
    ops: u64,
    reads: u64,
    writes: u64,
    errors: u64,
    bytes: u64,
    lat_sum_ns: u64,
    lat_max_ns: u64,
}

pub(crate) struct WorkerResult {
    read: Histogram,
    write: Histogram,
    flush: Histogram,
    reads: u64,
    writes: u64,
    flushes: u64,
    bytes_read: u64,
    bytes_written: u64,
    read_errors: u64,
    write_errors: u64,
    flush_errors: u64,
    error_messages: Vec<String>,
    buckets: Vec<Bucket>,
    last_completion: Option<Instant>,
    verify: Option<VerifyStats>,
    failure: Option<String>,
    stopped: bool,
    cpu_ns: u64,
}

pub(crate) const NEVER: u64 = 0;
pub(crate) const AMBIGUOUS: u64 = u64::MAX;
pub(crate) const MAX_MESSAGES: usize = 10;

/// Per-block bookkeeping of the verifier (indices relative to the connection's region).
pub(crate) struct Tracker {
    /// Seq of the last completed write (NEVER, AMBIGUOUS).
    last: Vec<u64>,
    /// Writes in flight.
    inflight_writes: Vec<u16>,
    /// Incremented at every write submission.
    epoch: Vec<u32>,
    next_seq: u64,
    stats: VerifyStats,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
    Flush,
}

#[derive(Clone, Copy)]
pub(crate) struct Slot {
    busy: bool,
    op: Op,
    offset: u64,
    len: u32,
    submit: Instant,
    /// Block index in the region (verify).
    block: u64,
    /// Write: its seq. Read: the seq expected (NEVER/AMBIGUOUS too).
    seq: u64,
    epoch: u32,
    /// Read: not checkable. Write: issued while another write to the block was in flight.
    unsure: bool,
    measured: bool,
}

pub(crate) enum Payload {
    None,
    /// `wbuf[..len]`.
    Shared(usize),
    Owned(Vec<u8>),
}

pub(crate) struct Out {
    hdr: [u8; 28],
    payload: Payload,
    sent: usize,
}

impl Out {
    fn total(&self) -> usize {
        28 + match &self.payload {
            Payload::None => 0,
            Payload::Shared(n) => *n,
            Payload::Owned(v) => v.len(),
        }
    }
}

pub(crate) struct WorkerSetup<'a> {
    pub(crate) conn: Connection,
    pub(crate) spec: &'a JobSpec,
    pub(crate) index: u64,
    pub(crate) region_start: u64,
    pub(crate) blocks: u64,
    pub(crate) zipf: Option<Zipf>,
    pub(crate) tag: u64,
    pub(crate) t0: Instant,
    pub(crate) measure_start: Instant,
    pub(crate) deadline: Option<Instant>,
    pub(crate) budget: Option<u64>,
    pub(crate) stop: &'a AtomicBool,
    pub(crate) shared: &'a ConnShared,
}

pub(crate) struct Worker<'a> {
    s: WorkerSetup<'a>,
    rng: Rng,
    seq_cursor: u64,
    slots: Vec<Slot>,
    free: Vec<u32>,
    out: VecDeque<Out>,
    wbuf: Vec<u8>,
    pool: Vec<Vec<u8>>,
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    issued_measured: u64,
    writes_since_flush: u64,
    tracker: Option<Tracker>,
    interval_ns: u64,
    r: WorkerResult,
}

impl<'a> Worker<'a> {
    pub(crate) fn new(s: WorkerSetup<'a>) -> Worker<'a> {
        let spec = s.spec;
        let qd = spec.queue_depth as usize;
        let bs = spec.block_size as usize;
        let mut rng = Rng::new(pattern::mix64(spec.seed) ^ pattern::mix64(s.index + 1));
        let mut wbuf = vec![0u8; bs];
        for w in wbuf.chunks_exact_mut(8) {
            w.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        let tracker = spec.verify.then(|| Tracker {
            last: vec![NEVER; s.blocks as usize],
            inflight_writes: vec![0; s.blocks as usize],
            epoch: vec![0; s.blocks as usize],
            next_seq: 1,
            stats: VerifyStats::default(),
        });
        let slot = Slot {
            busy: false,
            op: Op::Read,
            offset: 0,
            len: 0,
            submit: s.t0,
            block: 0,
            seq: 0,
            epoch: 0,
            unsure: false,
            measured: false,
        };
        Worker {
            rng,
            seq_cursor: 0,
            slots: vec![slot; qd],
            free: (0..qd as u32).rev().collect(),
            out: VecDeque::with_capacity(qd),
            wbuf,
            pool: Vec::new(),
            inbuf: vec![0u8; (256 << 10).max(2 * (bs + 16))],
            in_start: 0,
            in_end: 0,
            issued_measured: 0,
            writes_since_flush: 0,
            tracker,
            interval_ns: spec.sample_interval.as_nanos() as u64,
            r: WorkerResult {
                read: Histogram::new(),
                write: Histogram::new(),
                flush: Histogram::new(),
                reads: 0,
                writes: 0,
                flushes: 0,
                bytes_read: 0,
                bytes_written: 0,
                read_errors: 0,
                write_errors: 0,
                flush_errors: 0,
                error_messages: Vec::new(),
                buckets: Vec::new(),
                last_completion: None,
                verify: None,
                failure: None,
                stopped: false,
                cpu_ns: 0,
            },
            s,
        }
    }

    pub(crate) fn run(mut self) -> WorkerResult {
        let cpus = &self.s.spec.cpus;
        if !cpus.is_empty() {
            pin_to(cpus[self.s.index as usize % cpus.len()]);
        }
        let cpu0 = thread_cpu_ns();
        if let Err(e) = self.run_loop() {
            self.r.failure = Some(format!("connection {}: {e}", self.s.index));
        }
        if self.r.failure.is_none() {
            self.s.conn.disconnect();
        }
        self.r.cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
        self.r.verify = self.tracker.take().map(|t| t.stats);
        self.r
    }

    fn may_issue(&mut self, now: Instant) -> bool {
        if self.s.stop.load(Ordering::Relaxed) {
            self.r.stopped = true;
            return false;
        }
        if self.s.deadline.is_some_and(|d| now >= d) {
            return false;
        }
        self.s.budget.is_none_or(|b| self.issued_measured < b)
    }

    fn run_loop(&mut self) -> Result<(), Error> {
        self.s.conn.stream.set_nonblocking(true)?;
        let fd = self.s.conn.stream.as_raw_fd();
        let mut drain_deadline: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let issuing = self.may_issue(now);
            if issuing {
                while self.s.budget.is_none_or(|b| self.issued_measured < b)
                    && let Some(slot) = self.free.pop()
                {
                    self.issue(slot, now);
                }
            } else if self.free.len() == self.slots.len() {
                return Ok(());
            } else if drain_deadline.is_none() {
                drain_deadline = Some(now + Duration::from_secs(10));
            } else if drain_deadline.is_some_and(|d| now >= d) {
                let n = self.slots.len() - self.free.len();
                return Err(Error::Protocol(format!(
                    "{n} requests unanswered after 10 s"
                )));
            }
            if !self.out.is_empty() {
                self.send()?;
            }
            let mut timeout = Duration::from_millis(100);
            if issuing && let Some(d) = self.s.deadline {
                timeout = timeout.min(d.saturating_duration_since(now));
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN
                    | if self.out.is_empty() {
                        0
                    } else {
                        libc::POLLOUT
                    },
                revents: 0,
            };
            let ms = timeout.as_millis().max(1) as i32;
            // SAFETY: `pfd` is a valid pollfd and we pass a count of 1.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                self.receive()?;
            }
        }
    }

    fn pick_block(&mut self) -> u64 {
        match self.s.spec.access {
            Access::Sequential => {
                let b = self.seq_cursor;
                self.seq_cursor = (self.seq_cursor + 1) % self.s.blocks;
                b
            }
            Access::Random => match &self.s.zipf {
                Some(z) => z.next(&mut self.rng) % self.s.blocks,
                None => self.rng.below(self.s.blocks),
            },
        }
    }

    fn issue(&mut self, slot_ix: u32, now: Instant) {
        let spec = self.s.spec;
        let bs = spec.block_size;
        let measured = now >= self.s.measure_start;
        if spec.flush_every > 0 && self.writes_since_flush >= spec.flush_every {
            self.writes_since_flush = 0;
            self.slots[slot_ix as usize] = Slot {
                busy: true,
                op: Op::Flush,
                offset: 0,
                len: 0,
                submit: now,
                block: 0,
                seq: 0,
                epoch: 0,
                unsure: false,
                measured,
            };
            let hdr = encode_request(cmd::FLUSH, 0, slot_ix as u64, 0, 0);
            self.out.push_back(Out {
                hdr,
                payload: Payload::None,
                sent: 0,
            });
            return;
        }
        let is_read = self.rng.percent(spec.read_pct);
        let mut block = self.pick_block();
        if self.tracker.is_some() && spec.access == Access::Random {
            // Avoid racing a write in flight to the same block (a few redraws).
            for _ in 0..8 {
                let busy = self
                    .tracker
                    .as_ref()
                    .is_some_and(|t| t.inflight_writes[block as usize] > 0);
                if !busy {
                    break;
                }
                block = self.pick_block();
            }
        }
        let offset = self.s.region_start + block * bs as u64;
        if measured {
            self.issued_measured += 1;
        }
        let mut slot = Slot {
            busy: true,
            op: if is_read { Op::Read } else { Op::Write },
            offset,
            len: bs,
            submit: now,
            block,
            seq: 0,
            epoch: 0,
            unsure: false,
            measured,
        };
        let (hdr, payload) = if is_read {
            if let Some(t) = &self.tracker {
                let b = block as usize;
                slot.unsure = t.inflight_writes[b] > 0;
                slot.seq = t.last[b];
                slot.epoch = t.epoch[b];
            }
            (
                encode_request(cmd::READ, 0, slot_ix as u64, offset, bs),
                Payload::None,
            )
        } else {
            self.writes_since_flush += 1;
            let fua = self.rng.percent(spec.fua_pct);
            let fl = if fua { cmd::FLAG_FUA } else { 0 };
            let payload = if let Some(t) = &mut self.tracker {
                let b = block as usize;
                slot.unsure = t.inflight_writes[b] > 0;
                t.inflight_writes[b] += 1;
                t.epoch[b] = t.epoch[b].wrapping_add(1);
                slot.epoch = t.epoch[b];
                slot.seq = t.next_seq;
                t.next_seq += 1;
                if slot.unsure {
                    t.last[b] = AMBIGUOUS;
                }
                let mut buf = self.pool.pop().unwrap_or_else(|| vec![0u8; bs as usize]);
                pattern::fill(&mut buf, slot.seq, offset, self.s.tag);
                Payload::Owned(buf)
            } else {
                Payload::Shared(bs as usize)
            };
            (
                encode_request(cmd::WRITE, fl, slot_ix as u64, offset, bs),
                payload,
            )
        };
        self.slots[slot_ix as usize] = slot;
        self.out.push_back(Out {
            hdr,
            payload,
            sent: 0,
        });
    }

    fn send(&mut self) -> Result<(), Error> {
        const MAX_IOV: usize = 64;
        while !self.out.is_empty() {
            let mut iov: [libc::iovec; MAX_IOV] = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; MAX_IOV];
            let mut n = 0;
            for o in self.out.iter() {
                if n + 2 > MAX_IOV {
                    break;
                }
                let data: &[u8] = match &o.payload {
                    Payload::None => &[],
                    Payload::Shared(len) => &self.wbuf[..*len],
                    Payload::Owned(v) => v,
                };
                if o.sent < 28 {
                    iov[n] = libc::iovec {
                        iov_base: o.hdr[o.sent..].as_ptr() as *mut libc::c_void,
                        iov_len: 28 - o.sent,
                    };
                    n += 1;
                }
                let from = o.sent.saturating_sub(28);
                if from < data.len() {
                    iov[n] = libc::iovec {
                        iov_base: data[from..].as_ptr() as *mut libc::c_void,
                        iov_len: data.len() - from,
                    };
                    n += 1;
                }
            }
            // SAFETY: an all-zero msghdr is valid; we then point it at `n` initialized iovecs
            // that borrow buffers alive for the duration of the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = n as _;
            // SAFETY: fd is our open socket; msg is valid as above.
            let rc = unsafe {
                libc::sendmsg(
                    self.s.conn.stream.as_raw_fd(),
                    &msg,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e.into()),
                }
            }
            let mut left = rc as usize;
            while left > 0 {
                let o = self.out.front_mut().expect("sent more than queued");
                let rest = o.total() - o.sent;
                if left >= rest {
                    left -= rest;
                    let o = self.out.pop_front().unwrap();
                    if let Payload::Owned(v) = o.payload {
                        self.pool.push(v);
                    }
                } else {
                    o.sent += left;
                    left = 0;
                }
            }
        }
        Ok(())
    }

    fn receive(&mut self) -> Result<(), Error> {
        let mut inbuf = std::mem::take(&mut self.inbuf);
        let res = self.receive_into(&mut inbuf);
        self.inbuf = inbuf;
        res
    }

    fn receive_into(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        let n = match self.s.conn.stream.read(&mut buf[self.in_end..]) {
            Ok(0) => return Err(Error::Protocol("server closed the connection".into())),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        self.in_end += n;
        let now = Instant::now();
        loop {
            let avail = self.in_end - self.in_start;
            if avail < 16 {
                break;
            }
            let h = &buf[self.in_start..self.in_start + 16];
            let r = SimpleReply::decode(h.try_into().expect("16 bytes"));
            let (magic, err, handle) = (r.magic, r.error, r.cookie);
            if magic != SIMPLE_REPLY_MAGIC {
                return Err(Error::Protocol(format!("bad reply magic {magic:#x}")));
            }
            let slot = match self.slots.get(handle as usize) {
                Some(s) if s.busy => *s,
                _ => {
                    return Err(Error::Protocol(format!(
                        "reply for unknown handle {handle}"
                    )));
                }
            };
            let need = 16
                + if slot.op == Op::Read && err == 0 {
                    slot.len as usize
                } else {
                    0
                };
            if avail < need {
                break;
            }
            let data = &buf[self.in_start + 16..self.in_start + need];
            self.complete(handle as u32, slot, err, data, now);
            self.in_start += need;
        }
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
        } else if self.in_start > 0 && buf.len() - self.in_end < buf.len() / 2 {
            buf.copy_within(self.in_start..self.in_end, 0);
            self.in_end -= self.in_start;
            self.in_start = 0;
        }
        Ok(())
    }

    fn complete(&mut self, slot_ix: u32, slot: Slot, err: u32, data: &[u8], now: Instant) {
        self.slots[slot_ix as usize].busy = false;
        self.free.push(slot_ix);
        let lat = now.saturating_duration_since(slot.submit).as_nanos() as u64;
        let bytes = if err == 0 && slot.op != Op::Flush {
            slot.len as u64
        } else {
            0
        };
        if slot.op != Op::Flush {
            self.s.shared.ops.fetch_add(1, Ordering::Relaxed);
            self.s.shared.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        // Verifier bookkeeping (ramp included: the data is real either way).
        if let Some(t) = &mut self.tracker {
            let b = slot.block as usize;
            match slot.op {
                Op::Write => {
                    t.inflight_writes[b] -= 1;
                    t.last[b] = if err == 0 && !slot.unsure && t.epoch[b] == slot.epoch {
                        slot.seq
                    } else {
                        AMBIGUOUS
                    };
                }
                Op::Read if err == 0 => {
                    let st = &mut t.stats;
                    let res = if slot.unsure || t.epoch[b] != slot.epoch || slot.seq == NEVER {
                        st.skipped += 1;
                        Ok(())
                    } else if slot.seq == AMBIGUOUS {
                        st.checked_any += 1;
                        pattern::check_any(data, slot.offset, self.s.tag)
                    } else {
                        st.checked += 1;
                        pattern::check(data, slot.seq, slot.offset, self.s.tag)
                    };
                    if let Err(m) = res {
                        st.failures += 1;
                        if st.first_failures.len() < MAX_MESSAGES {
                            st.first_failures
                                .push(format!("connection {}: {m}", self.s.index));
                        }
                    }
                }
                _ => {}
            }
        }
        if !slot.measured {
            return;
        }
        if err != 0 {
            match slot.op {
                Op::Read => self.r.read_errors += 1,
                Op::Write => self.r.write_errors += 1,
                Op::Flush => self.r.flush_errors += 1,
            }
            if self.r.error_messages.len() < MAX_MESSAGES {
                let what = match slot.op {
                    Op::Read => "read",
                    Op::Write => "write",
                    Op::Flush => "flush",
                };
                self.r.error_messages.push(format!(
                    "connection {}: {what} of {} bytes at {}: NBD error {err} ({})",
                    self.s.index,
                    slot.len,
                    slot.offset,
                    errno_name(err)
                ));
            }
        }
        let bi = (now
            .saturating_duration_since(self.s.measure_start)
            .as_nanos() as u64
            / self.interval_ns) as usize;
        if self.r.buckets.len() <= bi {
            self.r.buckets.resize(bi + 1, Bucket::default());
        }
        let bk = &mut self.r.buckets[bi];
        if err != 0 {
            bk.errors += 1;
            return;
        }
        match slot.op {
            Op::Flush => {
                self.r.flush.record(lat);
                self.r.flushes += 1;
                return;
            }
            Op::Read => {
                self.r.read.record(lat);
                self.r.reads += 1;
                self.r.bytes_read += bytes;
                bk.reads += 1;
            }
            Op::Write => {
                self.r.write.record(lat);
                self.r.writes += 1;
                self.r.bytes_written += bytes;
                bk.writes += 1;
            }
        }
        bk.ops += 1;
        bk.bytes += bytes;
        bk.lat_sum_ns += lat;
        bk.lat_max_ns = bk.lat_max_ns.max(lat);
        self.r.last_completion = Some(now);
    }
}

pub(crate) fn pin_to(cpu: usize) {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; CPU_SET stays in bounds because
    // validate() refused CPU numbers ≥ CPU_SETSIZE; sched_setaffinity(0) targets this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) fn merge(
    target: &Target,
    spec: &JobSpec,
    export_size: u64,
    measure_start: Instant,
    end: Instant,
    all_ops: u64,
    results: Vec<WorkerResult>,
) -> RunResult {
    let mut read = Histogram::new();
    let mut write = Histogram::new();
    let mut flush = Histogram::new();
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut last: Option<Instant> = None;
    let mut verify: Option<VerifyStats> = None;
    let (mut reads, mut writes, mut flushes, mut br, mut bw) = (0, 0, 0, 0, 0);
    let (mut re, mut we, mut fe, mut cpu) = (0, 0, 0, 0);
    let mut error_messages = Vec::new();
    let mut connection_failures = Vec::new();
    let mut stopped = false;
    for r in results {
        stopped |= r.stopped;
        read.merge(&r.read);
        write.merge(&r.write);
        flush.merge(&r.flush);
        reads += r.reads;
        writes += r.writes;
        flushes += r.flushes;
        br += r.bytes_read;
        bw += r.bytes_written;
        re += r.read_errors;
        we += r.write_errors;
        fe += r.flush_errors;
        cpu += r.cpu_ns;
        for m in r.error_messages {
            if error_messages.len() < MAX_MESSAGES {
                error_messages.push(m);
            }
        }
        connection_failures.extend(r.failure);
        if buckets.len() < r.buckets.len() {
            buckets.resize(r.buckets.len(), Bucket::default());
        }
        for (a, b) in buckets.iter_mut().zip(&r.buckets) {
            a.ops += b.ops;
            a.reads += b.reads;
            a.writes += b.writes;
            a.errors += b.errors;
            a.bytes += b.bytes;
            a.lat_sum_ns += b.lat_sum_ns;
            a.lat_max_ns = a.lat_max_ns.max(b.lat_max_ns);
        }
        last = match (last, r.last_completion) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        if let Some(v) = r.verify {
            let m = verify.get_or_insert_with(VerifyStats::default);
            m.checked += v.checked;
            m.checked_any += v.checked_any;
            m.skipped += v.skipped;
            m.failures += v.failures;
            for f in v.first_failures {
                if m.first_failures.len() < MAX_MESSAGES {
                    m.first_failures.push(f);
                }
            }
        }
    }
    let elapsed = last
        .unwrap_or(end)
        .saturating_duration_since(measure_start)
        .as_secs_f64();
    let per_s = |x: u64| {
        if elapsed > 0.0 {
            x as f64 / elapsed
        } else {
            0.0
        }
    };
    let interval = spec.sample_interval.as_secs_f64();
    let samples: Vec<Sample> = buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let t = i as f64 * interval;
            let d = (elapsed - t).min(interval).max(1e-9);
            Sample {
                t_s: t,
                duration_s: d,
                partial: d < interval * 0.999,
                ops: b.ops,
                reads: b.reads,
                writes: b.writes,
                errors: b.errors,
                iops: b.ops as f64 / d,
                mb_s: b.bytes as f64 / d / 1e6,
                lat_mean_us: if b.ops > 0 {
                    b.lat_sum_ns as f64 / b.ops as f64 / 1e3
                } else {
                    0.0
                },
                lat_max_us: b.lat_max_ns as f64 / 1e3,
            }
        })
        .collect();
    let worst_sample = samples
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.partial)
        .min_by(|a, b| a.1.iops.total_cmp(&b.1.iops))
        .map(|(i, _)| i);
    let mut all = read.clone();
    all.merge(&write);
    let ops = reads + writes;
    RunResult {
        spec: spec.clone(),
        target: target.to_string(),
        export_size,
        elapsed_s: elapsed,
        ops,
        reads,
        writes,
        flushes,
        bytes_read: br,
        bytes_written: bw,
        iops: per_s(ops),
        read_iops: per_s(reads),
        write_iops: per_s(writes),
        bw_mbps: per_s(br + bw) / 1e6,
        bw_mibps: per_s(br + bw) / (1024.0 * 1024.0),
        lat: hist::summary(&all),
        read_lat: hist::summary(&read),
        write_lat: hist::summary(&write),
        flush_lat: hist::summary(&flush),
        lat_cdf: hist::cdf(&all, 200),
        samples,
        worst_sample,
        errors: re + we + fe,
        read_errors: re,
        write_errors: we,
        flush_errors: fe,
        error_messages,
        verify,
        connection_failures,
        stopped,
        client_cpu_us_per_io: if all_ops > 0 {
            cpu as f64 / 1e3 / all_ops as f64
        } else {
            0.0
        },
        histogram: all,
    }
}
