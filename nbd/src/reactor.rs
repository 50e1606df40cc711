//! An NBD connection's reactor: one thread and one io_uring per connection on a plain socket
//! to an engine export ([`EngineExport`]).
//!
//! The reactor reads the socket without blocking, parses every request it got, submits each
//! to the engine ([`tiercache_engine::Engine::submit`]), runs the file IOs the engine hands
//! back on its ring, and when they complete gives them back to the engine
//! ([`tiercache_engine::Engine::complete`]), whose replies land in the connection's
//! [`Sink`]. The replies ready go out together in one `writev` (every few requests or IOs,
//! [`HAND_OFF`], and at the end of a wake-up). It then sleeps in one
//! `io_uring_enter` that submits everything the wake-up produced and waits for the first of:
//! a completed IO, the socket readable (or writable, when a reply did not fit), or the
//! [`Waker`] (a reply completed on another thread: an IO thread, a slow core's completion, a
//! worker running a request the reactor does not run itself). A cache hit on a file cache is
//! thus one `recv`, one engine call, one ring read and one `writev`, on one thread, with no
//! other thread involved.
//!
//! The reactor never blocks on the client: a reply that does not fit in the socket waits for
//! `POLLOUT` while requests keep being read, up to the connection's in-flight bounds
//! ([`crate::ServerConfig::max_in_flight`] and `max_in_flight_bytes`), where it stops reading
//! until replies drain. A client that reads nothing for the write timeout is dropped.
//!
//! Requests the engine does not take whole (`NBD_CMD_CACHE`, trims and zeroing longer than
//! one engine request, a trim with FUA) go to the server's worker pool as on the threaded
//! path; their replies come back through the connection's queue and the waker.

use crate::export::{EngineExport, ExportError};
use crate::proto::{self, Request, cmd};
use crate::server::{ServerConfig, lock};
use crate::transmission::{Conn, InFlight, Reply, execute};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};
use tiercache_core::ReqError;
use tiercache_core::config::REQUEST_BLOCKS_MAX;
use tiercache_engine::{EngineIo, IoTicket, ReplySink, ReplyTo, ReqOp};
use tiercache_io::{AlignedBuf, BufPool, Ring, RingDone, RingOp, Slab};

/// Ring tokens of the reactor's socket and waker operations (IO tokens are ticket indexes,
/// far below).
const RECV: u64 = u64::MAX - 1;
const SOCK_OUT: u64 = u64::MAX - 2;
const WAKE: u64 = u64::MAX - 3;

/// Bytes the reactor reads from the socket at once.
const READ_BUF: usize = 256 << 10;
/// Replies gathered into one `writev`.
const WRITEV_REPLIES: usize = 64;

/// Requests parsed, or device IOs completed, between two hand-offs ([`State::hand_off`]): the
/// device IOs of the last few requests go to the kernel and their replies to the socket
/// without waiting for the rest of the wake-up. A client at queue depth 16 sends its requests
/// together and a virtio disk completes reads together, so handing off only once per wake-up
/// moved each burst through the server as one convoy while the device (or the client) sat
/// idle; every 4 keeps both busy for a few more system calls (measured: docs/BENCHMARKS.md,
/// "Bursts through the reactor").
const HAND_OFF: usize = 4;

/// Bytes at the front of the engine's IO buffer pool registered with a connection's ring
/// (fixed buffers: the IOs of hits and small writes skip the kernel's page pinning). Small
/// enough to stay under the default `RLIMIT_MEMLOCK` (8 MiB) of an unprivileged daemon with
/// one connection; where the kernel refuses, IOs go unregistered.
const FIXED_BYTES: usize = 4 << 20;

/// Bytes of a connection's pool of WRITE payload buffers (address space reserved, pages
/// touched as used). A payload that finds no room gets a buffer of its own.
const PAYLOAD_POOL: usize = 8 << 20;

/// Wakes a reactor from another thread: an eventfd its ring polls. Waking a reactor that was
/// woken and has not run yet costs nothing (no system call).
pub(crate) struct Waker {
    fd: OwnedFd,
    signalled: AtomicBool,
}

impl Waker {
    fn new() -> io::Result<Waker> {
        // SAFETY: plain syscall; no memory is passed.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waker {
            // SAFETY: `fd` is a new descriptor that nothing else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            signalled: AtomicBool::new(false),
        })
    }

    /// Wakes the reactor (it then takes what was queued for it).
    pub(crate) fn wake(&self) {
        if !self.signalled.swap(true, Ordering::AcqRel) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live local array to an eventfd we own.
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }

    /// Called by the reactor before it takes what was queued: later wakes signal again.
    fn reset(&self) {
        let mut b = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live local array from an eventfd we own.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        self.signalled.store(false, Ordering::Release);
    }
}

/// A completed request: its tag, result and buffer.
type Completed = (u64, Result<(), ReqError>, AlignedBuf);

/// Where the engine puts this connection's replies (see [`ReplySink`]).
struct Sink {
    q: Mutex<Vec<Completed>>,
    waker: Arc<Waker>,
    /// The reactor's thread: replies completed there need no wake-up.
    owner: ThreadId,
}

impl ReplySink for Sink {
    fn reply(&self, tag: u64, result: Result<(), ReqError>, buf: AlignedBuf) {
        lock(&self.q).push((tag, result, buf));
        if std::thread::current().id() != self.owner {
            self.waker.wake();
        }
    }
}

/// A request submitted to the engine, until its reply.
struct Submitted {
    cookie: u64,
    typ: u16,
    offset: u64,
    bytes: usize,
    len: u32,
    start: Instant,
}

/// A connection's reactor before it runs: made before the connection so that the connection
/// can hold its [`Waker`].
pub(crate) struct Reactor {
    fd: RawFd,
    ring: Ring,
    waker: Arc<Waker>,
    write_timeout: Duration,
}

impl Reactor {
    /// A reactor for the socket `fd` (which the caller keeps open while it runs); fails when
    /// the kernel gives no ring (the connection then runs on threads).
    pub(crate) fn new(fd: RawFd, cfg: &ServerConfig) -> io::Result<Reactor> {
        Ok(Reactor {
            fd,
            ring: Ring::new(cfg.ring_entries.max(1))?,
            waker: Arc::new(Waker::new()?),
            write_timeout: cfg.write_timeout,
        })
    }

    /// Its waker (for [`Conn::wake`]).
    pub(crate) fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    /// Serves the connection until the client disconnects (or breaks the protocol, or the
    /// socket fails), then until every request in flight is answered and every IO on the ring
    /// has completed.
    pub(crate) fn run(self, conn: &Arc<Conn>) -> io::Result<()> {
        let Some(exp) = conn.export.as_engine() else {
            return Err(io::Error::other("the reactor serves engine exports only"));
        };
        set_nonblocking(self.fd)?;
        let mut ring = self.ring;
        let _ = ring.register_pool(&exp.engine().io_pool(), FIXED_BYTES);
        let sink = Arc::new(Sink {
            q: Mutex::new(Vec::new()),
            waker: self.waker.clone(),
            owner: std::thread::current().id(),
        });
        let mut st = State {
            conn,
            exp,
            fd: self.fd,
            ring,
            waker: self.waker,
            sink,
            inbuf: Some(AlignedBuf::new(READ_BUF)),
            payloads: BufPool::new(PAYLOAD_POOL),
            lo: 0,
            hi: 0,
            payload: None,
            skip: 0,
            ending: None,
            reqs: Slab::new(),
            tickets: Slab::new(),
            ios: Vec::new(),
            done: Vec::new(),
            out: VecDeque::new(),
            iov: Vec::with_capacity(2 * WRITEV_REPLIES),
            got: Vec::new(),
            out_off: 0,
            out_blocked: false,
            stalled: None,
            in_flight: 0,
            in_bytes: 0,
            armed_out: false,
            armed_wake: false,
            write_timeout: self.write_timeout,
            parsed: 0,
        };
        st.run()
    }
}

struct State<'a> {
    conn: &'a Arc<Conn>,
    exp: &'a EngineExport,
    fd: RawFd,
    ring: Ring,
    waker: Arc<Waker>,
    sink: Arc<Sink>,
    /// Bytes received and not yet parsed: `inbuf[lo..hi]`. `None` while a receive into it
    /// is on the ring.
    inbuf: Option<AlignedBuf>,
    lo: usize,
    hi: usize,
    /// A WRITE whose payload is arriving: the request, its buffer, bytes filled.
    payload: Option<(Request, AlignedBuf, usize)>,
    /// Where payload buffers come from: no allocation and no zeroing per WRITE (a pool
    /// buffer holds its last user's bytes until the payload fills all of it, and only a
    /// whole payload goes to the engine).
    payloads: BufPool,
    /// Payload bytes of a refused WRITE still to be read and dropped.
    skip: u64,
    /// Why reading stopped: the stream's end (`Ok`) or an error; in-flight requests still
    /// complete.
    ending: Option<io::Result<()>>,
    reqs: Slab<Submitted>,
    tickets: Slab<IoTicket>,
    ios: Vec<EngineIo>,
    done: Vec<RingDone>,
    /// Replies to write, and how much of the first is written.
    out: VecDeque<Reply>,
    /// Room for the iovecs of one `writev` (empty between calls).
    iov: Vec<libc::iovec>,
    /// Room for the replies taken from the sink (empty between wake-ups).
    got: Vec<(u64, Result<(), ReqError>, AlignedBuf)>,
    out_off: usize,
    /// The last write said `EAGAIN`: wait for `POLLOUT`.
    out_blocked: bool,
    /// Since when replies have waited for a client that does not read.
    stalled: Option<Instant>,
    in_flight: usize,
    in_bytes: usize,
    armed_out: bool,
    armed_wake: bool,
    write_timeout: Duration,
    /// Requests parsed (counts to [`HAND_OFF`]).
    parsed: usize,
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller keeps open; no memory is passed.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl State<'_> {
    fn run(&mut self) -> io::Result<()> {
        loop {
            self.parse();
            self.start_ios();
            self.collect();
            self.write_out();
            if self.parsable() {
                continue; // replies made room for requests already received
            }
            if self.ending.is_some() && self.in_flight == 0 && self.tickets.is_empty() {
                break;
            }
            if self.ending.is_some() && self.exp.engine().is_dead() {
                // A killed engine completes nothing more: what is in flight stays unanswered.
                break;
            }
            self.arm()?;
            self.wait()?;
            self.check_stall();
        }
        // IOs of other requests may still be on the ring (none of ours: they are answered).
        self.drain_ring();
        self.ending.take().unwrap_or(Ok(()))
    }

    /// Whether another request may be read (the in-flight bounds).
    fn room(&self) -> bool {
        self.in_flight < self.conn.max_in_flight && self.in_bytes < self.conn.max_in_flight_bytes
    }

    /// Whether [`State::parse`] can take something now.
    fn parsable(&self) -> bool {
        let have = self.hi - self.lo;
        self.ending.is_none()
            && self.inbuf.is_some()
            && have > 0
            && (self.skip > 0
                || self.payload.is_some()
                || (have >= proto::REQUEST_LEN && self.room()))
    }

    /// A receive finished (`res`: bytes, 0 at the end of the stream, or `-errno`).
    fn received(&mut self, buf: AlignedBuf, res: i32) {
        self.inbuf = Some(buf);
        match res {
            n if n > 0 => self.hi += n as usize,
            0 => self.end(Ok(())),
            e if e == -libc::EAGAIN || e == -libc::EINTR => {}
            e => self.end(Err(io::Error::from_raw_os_error(-e))),
        }
    }

    /// Reading stops (the stream ended, broke the protocol, or failed); what is in flight
    /// still completes. A WRITE whose payload was cut short has nobody to answer.
    fn end(&mut self, why: io::Result<()>) {
        if self.ending.is_none() {
            self.ending = Some(why);
        }
        if let Some((req, _, _)) = self.payload.take() {
            self.in_flight -= 1;
            self.in_bytes -= req.len as usize;
        }
    }

    /// Takes complete requests (and payload bytes) from the receive buffer.
    fn parse(&mut self) {
        let Some(inbuf) = self.inbuf.take() else {
            return; // a receive is on the ring
        };
        self.parse_in(&inbuf);
        self.inbuf = Some(inbuf);
    }

    fn parse_in(&mut self, inbuf: &[u8]) {
        loop {
            if self.ending.is_some() {
                return;
            }
            if self.skip > 0 {
                let n = (self.hi - self.lo).min(self.skip as usize);
                self.lo += n;
                self.skip -= n as u64;
                if self.skip > 0 {
                    return;
                }
            }
            if let Some((_, buf, filled)) = &mut self.payload {
                let n = (self.hi - self.lo).min(buf.len() - *filled);
                buf[*filled..*filled + n].copy_from_slice(&inbuf[self.lo..self.lo + n]);
                self.lo += n;
                *filled += n;
                if *filled < buf.len() {
                    return;
                }
                let (req, buf, _) = self.payload.take().expect("checked above");
                let fua = req.flags & cmd::FLAG_FUA != 0;
                self.submit(&req, ReqOp::Write { fua }, 0, buf);
            }
            if !self.room() || self.hi - self.lo < proto::REQUEST_LEN {
                return;
            }
            let h: &[u8; proto::REQUEST_LEN] = inbuf[self.lo..self.lo + proto::REQUEST_LEN]
                .try_into()
                .expect("REQUEST_LEN bytes");
            let req = Request::decode(h);
            self.lo += proto::REQUEST_LEN;
            match req {
                // Not a request: the stream is out of sync; close.
                None => self.end(Ok(())),
                Some(r) if r.typ == cmd::DISC => self.end(Ok(())),
                Some(r) => {
                    self.dispatch(r);
                    self.parsed += 1;
                    if self.parsed.is_multiple_of(HAND_OFF) {
                        self.hand_off();
                    }
                }
            }
        }
    }

    /// Starts one request.
    fn dispatch(&mut self, req: Request) {
        let c = self.conn;
        c.inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        if let Err((e, msg)) = c.check(&req) {
            if req.typ == cmd::WRITE {
                self.skip = req.len as u64;
            }
            self.out.push_back(c.err_reply(req.cookie, e, &msg, None));
            return;
        }
        if req.len == 0 && req.typ != cmd::FLUSH {
            self.out.push_back(c.ok_reply(req.cookie, None));
            return;
        }
        let bytes = req.data_bytes();
        self.in_flight += 1;
        self.in_bytes += bytes;
        c.inner
            .stats
            .in_flight_max
            .fetch_max(self.in_flight as u64, Ordering::Relaxed);
        let fua = req.flags & cmd::FLAG_FUA != 0;
        let blocks = (req.len / 512) as u64;
        let whole = blocks <= REQUEST_BLOCKS_MAX as u64;
        match req.typ {
            // The engine gives a read its buffer (its IO buffer on a device hit: no copy).
            cmd::READ => self.submit(&req, ReqOp::Read, (bytes / 512) as u32, AlignedBuf::new(0)),
            cmd::WRITE => {
                let buf = (self.payloads.try_get(bytes)).unwrap_or_else(|| AlignedBuf::new(bytes));
                self.payload = Some((req, buf, 0));
            }
            cmd::FLUSH => self.submit(&req, ReqOp::Flush, 0, AlignedBuf::new(0)),
            cmd::TRIM if whole && !fua => {
                self.submit(&req, ReqOp::Trim, blocks as u32, AlignedBuf::new(0))
            }
            cmd::WRITE_ZEROES if whole => self.submit(
                &req,
                ReqOp::WriteZeroes { fua },
                blocks as u32,
                AlignedBuf::new(0),
            ),
            _ => {
                // On a worker, as on the threaded path; the reply comes back through the
                // connection's queue with its slot.
                let guard = InFlight {
                    conn: c.clone(),
                    cookie: req.cookie,
                    slot: Some(bytes),
                    typ: req.typ,
                    len: req.len,
                    start: Instant::now(),
                };
                let c2 = c.clone();
                c.inner
                    .pool
                    .submit(Box::new(move || execute(&c2, req, None, guard)));
            }
        }
        // A WRITE's payload follows its header: the next round of `parse` takes it.
    }

    /// Submits a request to the engine (its reply comes to the sink).
    fn submit(&mut self, req: &Request, op: ReqOp, blocks: u32, buf: AlignedBuf) {
        let bytes = req.data_bytes();
        if !self.conn.rmw.admit(req) {
            // Unaligned, or writing while a client sends unaligned requests (`unaligned.rs`).
            let buf = match op {
                ReqOp::Read => AlignedBuf::new(bytes),
                _ => buf,
            };
            return crate::unaligned::spawn(self.conn, *req, buf);
        }
        let lba = match EngineExport::lba(req.offset, req.len as u64) {
            Ok(l) => l,
            Err(e) => {
                self.conn.rmw.done(req.typ); // admitted, answered here
                let r = self
                    .conn
                    .err_reply(req.cookie, e.errno(), &e.to_string(), Some(bytes));
                self.out.push_back(r);
                return;
            }
        };
        let tag = self.reqs.insert(Submitted {
            cookie: req.cookie,
            typ: req.typ,
            offset: req.offset,
            bytes,
            len: req.len,
            start: Instant::now(),
        }) as u64;
        let reply = ReplyTo {
            sink: self.sink.clone(),
            tag,
        };
        let core = self.exp.core();
        self.exp
            .engine()
            .submit(op, core, lba, blocks, buf, reply, &mut self.ios);
    }

    /// Mid-wake-up: the device IOs queued so far go to the kernel (without waiting), and the
    /// replies ready so far to the socket (see [`HAND_OFF`]).
    fn hand_off(&mut self) {
        if !self.ios.is_empty() {
            self.start_ios();
            // An error of the kernel's shows again at the next wait, which reports it.
            let _ = self.ring.submit();
        }
        self.collect();
        self.write_out();
    }

    /// Puts the IOs the engine handed back on the ring.
    fn start_ios(&mut self) {
        if self.ios.is_empty() {
            return;
        }
        let fixed = self.ring.fixed_ios();
        let mut ios = std::mem::take(&mut self.ios);
        for io in ios.drain(..) {
            let (op, t) = io.into_ring();
            let token = self.tickets.insert(t) as u64;
            if let Err(e) = self.ring.push(op, token, &mut self.done) {
                // Unreachable in practice (the ring only refuses when the kernel fails).
                eprintln!("tiercache-nbd: io_uring refused an IO: {e}");
                std::process::abort();
            }
        }
        self.ios = ios; // its room, for the next wake-up
        let fixed = self.ring.fixed_ios() - fixed;
        if fixed > 0 {
            (self.conn.inner.stats.fixed_ios).fetch_add(fixed, Ordering::Relaxed);
        }
    }

    /// A ring completion: one of the reactor's polls, or an IO for the engine.
    fn completed(&mut self, d: RingDone) {
        match d.token {
            RECV => match d.buf {
                Some(buf) => self.received(buf, d.res),
                None => unreachable!("a receive comes back with its buffer"),
            },
            SOCK_OUT => {
                self.armed_out = false;
                self.out_blocked = false;
            }
            WAKE => {
                self.armed_wake = false;
                self.waker.reset();
            }
            t => {
                let Some(ticket) = self.tickets.take(t as usize) else {
                    return;
                };
                let ios = if self.ending.is_some() && self.in_flight == 0 {
                    None // closing: what this starts goes to the engine's IO threads
                } else {
                    Some(&mut self.ios)
                };
                self.exp.engine().complete(ticket, d.buf, d.res, ios);
            }
        }
    }

    /// Takes the replies other threads (and the engine) queued for this connection.
    fn collect(&mut self) {
        // Swapped with the sink's queue, so that both keep their room (no allocation per
        // wake-up).
        let mut got = std::mem::take(&mut self.got);
        std::mem::swap(&mut *lock(&self.sink.q), &mut got);
        for (tag, result, buf) in got.drain(..) {
            let Some(s) = self.reqs.take(tag as usize) else {
                continue;
            };
            let c = self.conn;
            c.rmw.done(s.typ);
            crate::latency::record(c, s.typ, s.len.into(), s.start, result.is_ok());
            let r = match result {
                Ok(()) if s.typ == cmd::READ => {
                    c.data_reply(s.cookie, s.offset, buf, Some(s.bytes))
                }
                Ok(()) => c.ok_reply(s.cookie, Some(s.bytes)),
                Err(e) => {
                    let e = ExportError::from(e);
                    c.err_reply(s.cookie, e.errno(), &e.to_string(), Some(s.bytes))
                }
            };
            self.out.push_back(r);
        }
        self.got = got;
        let mut q = lock(&self.conn.replies);
        self.out.extend(q.drain(..));
    }

    /// Writes queued replies, several per `writev`, until done or the socket is full.
    fn write_out(&mut self) {
        while !self.out.is_empty() && !self.out_blocked {
            if self.conn.dead.load(Ordering::Acquire) {
                // The socket failed: nobody reads replies; their slots still come back.
                while let Some(r) = self.out.pop_front() {
                    self.release(&r);
                }
                self.out_off = 0;
                return;
            }
            self.iov.clear();
            let mut skip = self.out_off;
            for r in self.out.iter().take(WRITEV_REPLIES) {
                for part in [&r.head[..], r.data.as_deref().unwrap_or(&[])] {
                    if skip >= part.len() {
                        skip -= part.len();
                        continue;
                    }
                    let p = &part[skip..];
                    skip = 0;
                    self.iov.push(libc::iovec {
                        iov_base: p.as_ptr() as *mut libc::c_void,
                        iov_len: p.len(),
                    });
                }
            }
            let n = if self.iov.is_empty() {
                0
            } else {
                let (v, k) = (self.iov.as_ptr(), self.iov.len() as libc::c_int);
                // SAFETY: every iovec points into a reply held by `self.out`, unchanged during
                // the call; the count matches the array.
                let n = unsafe { libc::writev(self.fd, v, k) };
                self.iov.clear(); // no pointer kept past the call
                (self.conn.inner.stats.reply_writes).fetch_add(1, Ordering::Relaxed);
                if n < 0 {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        io::ErrorKind::WouldBlock => {
                            self.out_blocked = true;
                            self.stalled.get_or_insert_with(Instant::now);
                            return;
                        }
                        io::ErrorKind::Interrupted => continue,
                        _ => {
                            self.fail();
                            continue;
                        }
                    }
                }
                n as usize
            };
            self.stalled = None;
            self.advance(n);
        }
    }

    /// Drops the first `n` written bytes from the queue, giving back the slots of replies
    /// written whole.
    fn advance(&mut self, mut n: usize) {
        while let Some(r) = self.out.front() {
            let len = r.head.len() + r.data.as_ref().map_or(0, |d| d.len());
            let left = len - self.out_off;
            if n < left {
                self.out_off += n;
                return;
            }
            n -= left;
            self.out_off = 0;
            let r = self.out.pop_front().expect("front exists");
            self.release(&r);
        }
    }

    fn release(&mut self, r: &Reply) {
        if let Some(b) = r.slot {
            self.in_flight -= 1;
            self.in_bytes -= b;
        }
    }

    /// The socket failed: stop reading, drop replies, shut it for the other threads.
    fn fail(&mut self) {
        self.conn.dead.store(true, Ordering::Release);
        (self.conn.closer)();
        if self.ending.is_none() {
            self.ending = Some(Err(io::Error::other("writing a reply failed")));
        }
    }

    /// A client that has read nothing for the write timeout is dropped.
    fn check_stall(&mut self) {
        if let Some(t) = self.stalled
            && t.elapsed() > self.write_timeout
        {
            self.stalled = None;
            self.fail();
        }
    }

    /// Arms the polls the next wait needs.
    fn arm(&mut self) -> io::Result<()> {
        let fd = self.fd;
        if !self.armed_wake {
            let op = RingOp::Poll {
                fd: self.waker.fd.as_raw_fd(),
                events: libc::POLLIN as u32,
            };
            self.ring.push(op, WAKE, &mut self.done)?;
            self.armed_wake = true;
        }
        if self.ending.is_none()
            && self.room()
            && let Some(mut buf) = self.inbuf.take()
        {
            // Unparsed bytes (part of a request) move to the front; the receive appends.
            if self.lo > 0 {
                buf.copy_within(self.lo..self.hi, 0);
                self.hi -= self.lo;
                self.lo = 0;
            }
            let op = RingOp::Recv {
                fd,
                buf,
                at: self.hi,
            };
            self.ring.push(op, RECV, &mut self.done)?;
        }
        if self.out_blocked && !self.armed_out {
            let op = RingOp::Poll {
                fd,
                events: libc::POLLOUT as u32,
            };
            self.ring.push(op, SOCK_OUT, &mut self.done)?;
            self.armed_out = true;
        }
        Ok(())
    }

    /// Waits (100 ms at most) for the ring and takes what completed.
    fn wait(&mut self) -> io::Result<()> {
        let mut done = std::mem::take(&mut self.done);
        let r = self.ring.wait(1, Duration::from_millis(100), &mut done);
        let mut n = 0usize;
        while !done.is_empty() {
            for d in done.drain(..) {
                let io = d.token < WAKE;
                self.completed(d);
                if io {
                    n += 1;
                    if n.is_multiple_of(HAND_OFF) {
                        self.hand_off();
                    }
                }
            }
            // A hand-off that found the submission queue full reaped completions into
            // `self.done` (`Ring::push`): they are taken here, not dropped.
            std::mem::swap(&mut done, &mut self.done);
        }
        self.done = done;
        r
    }

    /// Completes the IOs still on the ring (of other requests, or writeback): reading has
    /// ended and nothing is in flight, so what they start goes to the engine's IO threads
    /// (see [`State::completed`]).
    fn drain_ring(&mut self) {
        while !self.tickets.is_empty() {
            let _ = self.wait();
        }
    }
}
