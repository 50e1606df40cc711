//! The transmission phase on threads (TLS, and plain sockets without a ring): a connection's
//! reader, its replies, the in-flight bounds, and running requests on an export. The
//! reactor (`reactor.rs`) shares `Conn` and the reply encoding.

use crate::export::{BlockSizes, Export, ExportError, ReadReply, ReadStart};
use crate::handshake::cap_str;
use crate::proto::{self, Request, RequestChecks, cmd, errno, reply};
use crate::server::*;
use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use tiercache_io::{AlignedBuf, Extent};

/// One connection in transmission.
pub(crate) struct Conn {
    pub(crate) export: Arc<dyn Export>,
    /// Unaligned requests and what makes them atomic (`unaligned.rs`).
    pub(crate) rmw: crate::unaligned::Rmw,
    pub(crate) size: u64,
    pub(crate) sizes: BlockSizes,
    pub(crate) read_only: bool,
    pub(crate) structured: bool,
    pub(crate) block_status: bool,
    pub(crate) writer: Mutex<Box<dyn Write + Send>>,
    /// Replies waiting for the writer.
    pub(crate) replies: Mutex<VecDeque<Reply>>,
    /// Whether the socket has room now (see [`NbdStream::room_probe`]).
    pub(crate) room: Option<RoomProbe>,
    /// A write failed: replies are dropped, requests not yet started are skipped.
    pub(crate) dead: AtomicBool,
    pub(crate) closer: Closer,
    /// (requests, payload bytes) in flight, and whether a thread waits on `flight_cv`.
    pub(crate) flight: Mutex<Flight>,
    pub(crate) flight_cv: Condvar,
    pub(crate) max_in_flight: usize,
    pub(crate) max_in_flight_bytes: usize,
    pub(crate) inner: Arc<Inner>,
    /// Set when the connection runs on a reactor (`reactor.rs`): the reactor alone writes
    /// the socket and counts what is in flight, so [`Conn::send`] and [`Conn::release`] only
    /// queue for it and wake it.
    pub(crate) wake: Option<Arc<crate::reactor::Waker>>,
}

/// Writes every byte of `parts` (gathered).
pub(crate) fn write_all_vectored(w: &mut (impl Write + ?Sized), parts: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut s = &mut slices[..];
    while !s.is_empty() {
        match w.write_vectored(s) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut s, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Requests and payload bytes in flight on a connection, and threads waiting for them to drop.
#[derive(Default)]
pub(crate) struct Flight {
    requests: usize,
    bytes: usize,
    waiters: usize,
}

/// A reply waiting to be written: its header (and error message), the read data, and the
/// in-flight slot (payload bytes) it releases once written.
pub(crate) struct Reply {
    pub(crate) head: Vec<u8>,
    pub(crate) data: Option<AlignedBuf>,
    pub(crate) slot: Option<usize>,
}

impl Conn {
    /// Queues `r` and writes queued replies unless another thread is writing (that thread
    /// then writes this one too): a worker never waits behind another's socket write, so a
    /// client that reads slowly holds at most one worker.
    pub(crate) fn send(&self, r: Reply) {
        lock(&self.replies).push_back(r);
        if let Some(w) = &self.wake {
            return w.wake();
        }
        self.send_queued();
    }

    /// Sends a reply from the connection's reader: written right here if it is small and the
    /// socket has room now, else queued for a worker to write. The reader must not block on a
    /// client that does not read its replies: it would stop reading that client's requests
    /// (a client writing a large WRITE before it reads would then never finish).
    fn send_from_reader(self: &Arc<Self>, r: Reply) {
        let len = r.head.len() + r.data.as_ref().map_or(0, |d| d.len());
        if len <= READER_REPLY_MAX && self.room.as_ref().is_some_and(|room| room()) {
            return self.send(r);
        }
        lock(&self.replies).push_back(r);
        let c = self.clone();
        self.inner.pool.submit(Box::new(move || c.send_queued()));
    }

    /// Writes queued replies unless another thread is writing them.
    fn send_queued(&self) {
        loop {
            let mut w = match self.writer.try_lock() {
                Ok(w) => w,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            self.write_queued(&mut **w);
            drop(w);
            // A reply queued after the last pop but before the unlock is ours to write.
            if lock(&self.replies).is_empty() {
                return;
            }
        }
    }

    /// Writes every queued reply (the caller holds the writer) and releases their slots.
    fn write_queued(&self, w: &mut (dyn Write + Send)) {
        loop {
            let Some(r) = lock(&self.replies).pop_front() else {
                return;
            };
            if !self.dead.load(Ordering::Acquire) {
                let data: &[u8] = r.data.as_deref().unwrap_or(&[]);
                let res = write_all_vectored(w, &[&r.head, data]).and_then(|_| w.flush());
                if res.is_err() {
                    self.dead.store(true, Ordering::Release);
                    (self.closer)(); // the reader wakes up and ends the connection
                }
            }
            if let Some(b) = r.slot {
                self.release(b);
            }
        }
    }

    pub(crate) fn reply_ok(&self, cookie: u64, slot: Option<usize>) {
        self.send(self.ok_reply(cookie, slot));
    }

    /// The reply to a request that succeeded without data.
    pub(crate) fn ok_reply(&self, cookie: u64, slot: Option<usize>) -> Reply {
        let head = if self.structured {
            proto::structured_header(reply::FLAG_DONE, reply::TYPE_NONE, cookie, 0).to_vec()
        } else {
            proto::simple_reply(0, cookie).to_vec()
        };
        Reply {
            head,
            data: None,
            slot,
        }
    }

    fn reply_err(&self, cookie: u64, err: u32, msg: &str, slot: Option<usize>) {
        self.send(self.err_reply(cookie, err, msg, slot));
    }

    /// The reply to a failed request.
    pub(crate) fn err_reply(&self, cookie: u64, err: u32, msg: &str, slot: Option<usize>) -> Reply {
        self.inner
            .stats
            .request_errors
            .fetch_add(1, Ordering::Relaxed);
        let head = if self.structured {
            let msg = cap_str(msg).as_bytes();
            let mut h = proto::structured_header(
                reply::FLAG_DONE,
                reply::TYPE_ERROR,
                cookie,
                6 + msg.len() as u32,
            )
            .to_vec();
            h.extend_from_slice(&err.to_be_bytes());
            h.extend_from_slice(&(msg.len() as u16).to_be_bytes());
            h.extend_from_slice(msg);
            h
        } else {
            proto::simple_reply(err, cookie).to_vec()
        };
        Reply {
            head,
            data: None,
            slot,
        }
    }

    /// The reply to a read, with its data.
    pub(crate) fn data_reply(
        &self,
        cookie: u64,
        offset: u64,
        data: AlignedBuf,
        slot: Option<usize>,
    ) -> Reply {
        let head = if self.structured {
            let sh = proto::structured_header(
                reply::FLAG_DONE,
                reply::TYPE_OFFSET_DATA,
                cookie,
                8 + data.len() as u32,
            );
            let mut h = Vec::with_capacity(sh.len() + 8);
            h.extend_from_slice(&sh);
            h.extend_from_slice(&offset.to_be_bytes());
            h
        } else {
            proto::simple_reply(0, cookie).to_vec()
        };
        Reply {
            head,
            data: Some(data),
            slot,
        }
    }

    /// The reply to `NBD_CMD_BLOCK_STATUS` of `len` bytes: one `base:allocation` chunk whose
    /// descriptors follow `ext` (runs of 512-byte blocks from `skip` bytes before the request's
    /// offset: 0 unless the offset is unaligned), cut at `len` bytes, at most 2^20 of them (the
    /// protocol's bound), only the first with `one` (`NBD_CMD_FLAG_REQ_ONE`). Holes are
    /// `HOLE | ZERO`, the rest 0 (allocated).
    pub(crate) fn block_status_reply(
        &self,
        cookie: u64,
        ext: &[Extent],
        mut skip: u64,
        len: u64,
        one: bool,
        slot: Option<usize>,
    ) -> Reply {
        let mut d = proto::BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        let mut left = len;
        for e in ext {
            let run = e.blocks.saturating_mul(512);
            let before = skip.min(run);
            skip -= before;
            if before == run && run > 0 {
                continue; // wholly before the request's offset
            }
            let n = (run - before).min(left);
            if n == 0 {
                break;
            }
            let flags = if e.hole {
                proto::state::HOLE | proto::state::ZERO
            } else {
                0
            };
            d.extend_from_slice(&(n as u32).to_be_bytes());
            d.extend_from_slice(&flags.to_be_bytes());
            left -= n;
            if one || d.len() >= 4 + 8 * (1 << 20) {
                break;
            }
        }
        if d.len() == 4 {
            // Nothing known (an export that said nothing): all allocated.
            d.extend_from_slice(&(len as u32).to_be_bytes());
            d.extend_from_slice(&0u32.to_be_bytes());
        }
        let mut head = proto::structured_header(
            reply::FLAG_DONE,
            reply::TYPE_BLOCK_STATUS,
            cookie,
            d.len() as u32,
        )
        .to_vec();
        head.extend_from_slice(&d);
        Reply {
            head,
            data: None,
            slot,
        }
    }

    /// Takes an in-flight slot for a request with `bytes` of payload, waiting while the
    /// connection is at its bounds.
    fn acquire(&self, bytes: usize) {
        let mut g = lock(&self.flight);
        while g.requests >= self.max_in_flight
            || (g.bytes > 0 && g.bytes.saturating_add(bytes) > self.max_in_flight_bytes)
        {
            g = self.wait_flight(g);
        }
        g.requests += 1;
        g.bytes += bytes;
        let n = g.requests as u64;
        drop(g);
        self.inner
            .stats
            .in_flight_max
            .fetch_max(n, Ordering::Relaxed);
    }

    pub(crate) fn release(&self, bytes: usize) {
        if self.wake.is_some() {
            // The reactor counts: an empty reply carrying the slot gives it back.
            return self.send(Reply {
                head: Vec::new(),
                data: None,
                slot: Some(bytes),
            });
        }
        let mut g = lock(&self.flight);
        g.requests -= 1;
        g.bytes -= bytes;
        // A notify is a system call: only when the reader (or `drain`) waits.
        let wake = g.waiters > 0;
        drop(g);
        if wake {
            self.flight_cv.notify_all();
        }
    }

    /// Waits on `flight_cv`, counted so `release` knows to notify.
    fn wait_flight<'a>(&self, mut g: MutexGuard<'a, Flight>) -> MutexGuard<'a, Flight> {
        g.waiters += 1;
        let mut g = self.flight_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        g.waiters -= 1;
        g
    }

    /// Waits until every request in flight has been answered and every queued reply written.
    pub(crate) fn drain(&self) {
        let mut g = lock(&self.flight);
        while g.requests > 0 {
            g = self.wait_flight(g);
        }
        drop(g);
        // Replies without a slot (errors and empty replies the reader sends itself) may still be
        // queued behind a worker that is writing (found by the `nbd_session` fuzz target: the
        // socket was shut with the reply to a refused request still queued). Taking the writer
        // waits for that worker; whatever it left is written here.
        let mut w = lock(&self.writer);
        self.write_queued(&mut **w);
    }

    /// Checks a request against the export; `Err((errno, message))` to answer it with.
    pub(crate) fn check(&self, r: &Request) -> Result<(), (u32, String)> {
        r.check_on(self.size, self.sizes, self.read_only, self.block_status)
    }
}

/// A request in flight: its slot goes with its reply; if it is dropped unanswered (a
/// panicking export) it answers EIO.
pub(crate) struct InFlight {
    pub(crate) conn: Arc<Conn>,
    pub(crate) cookie: u64,
    pub(crate) slot: Option<usize>,
    /// The request's command and length, and when it was received (`latency.rs`).
    pub(crate) typ: u16,
    pub(crate) len: u32,
    pub(crate) start: std::time::Instant,
}

impl InFlight {
    /// The guard of `req` on `conn`, its slot the request's data bytes, received now.
    pub(crate) fn new(conn: &Arc<Conn>, req: &Request) -> InFlight {
        InFlight {
            conn: conn.clone(),
            cookie: req.cookie,
            slot: Some(req.data_bytes()),
            typ: req.typ,
            len: req.len,
            start: std::time::Instant::now(),
        }
    }

    /// Takes the slot, to be released by the reply that carries it.
    fn take(&mut self) -> Option<usize> {
        self.slot.take()
    }

    /// Takes the slot for the reply being made (`ok`: not an error), counting the request.
    pub(crate) fn reply(&mut self, ok: bool) -> Option<usize> {
        crate::latency::record(&self.conn, self.typ, self.len.into(), self.start, ok);
        self.take()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(b) = self.slot.take() {
            self.conn.reply_err(
                self.cookie,
                errno::EIO,
                "internal error in the server",
                Some(b),
            );
        }
    }
}

/// Reads and discards `n` bytes (the payload of a refused write).
pub(crate) fn discard(r: &mut impl Read, mut n: u64) -> io::Result<()> {
    let mut buf = [0u8; 16 << 10];
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        r.read_exact(&mut buf[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// The reader side of a connection: parses requests, answers bad ones itself, hands good
/// ones to the workers. Returns at `NBD_CMD_DISC`, end of stream, a read error or a bad magic.
pub(crate) fn transmission(conn: &Arc<Conn>, r: &mut impl Read) -> io::Result<()> {
    let inner = &conn.inner;
    loop {
        let mut h = [0u8; proto::REQUEST_LEN];
        r.read_exact(&mut h)?;
        let Some(req) = Request::decode(&h) else {
            return Ok(()); // not a request: the stream is out of sync, close
        };
        if req.typ == cmd::DISC {
            return Ok(());
        }
        inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        if let Err((e, msg)) = conn.check(&req) {
            if req.typ == cmd::WRITE {
                discard(r, req.len as u64)?;
            }
            conn.reply_err(req.cookie, e, &msg, None);
            continue;
        }
        if req.len == 0 && req.typ != cmd::FLUSH {
            conn.reply_ok(req.cookie, None);
            continue;
        }
        let bytes = req.data_bytes();
        conn.acquire(bytes);
        let mut guard = InFlight::new(conn, &req);
        // A READ's buffer, when the export left the read to a worker.
        let mut read_buf = None;
        if req.typ == cmd::READ && conn.rmw.aligned(&req) && !conn.dead.load(Ordering::Acquire) {
            // A read that needs no waiting (a hit in a RAM cache) is answered from here: no
            // hand-off to a worker and back. One that waits for a device goes to a worker.
            match conn.export.read_start(req.offset, AlignedBuf::new(bytes)) {
                ReadStart::Done(reply) => {
                    answer_read(conn, &req, reply, guard, true);
                    continue;
                }
                ReadStart::Pending(finish) => {
                    let c = conn.clone();
                    inner.pool.submit(Box::new(move || {
                        let reply = finish();
                        answer_read(&c, &req, reply, guard, false);
                    }));
                    continue;
                }
                ReadStart::NotStarted(buf) => read_buf = Some(buf),
            }
        }
        let payload = if req.typ == cmd::WRITE {
            let mut buf = AlignedBuf::new(bytes);
            if let Err(e) = r.read_exact(&mut buf) {
                // The client is gone; nobody to answer.
                if let Some(b) = guard.take() {
                    conn.release(b);
                }
                return Err(e);
            }
            guard.start = std::time::Instant::now();
            Some(buf)
        } else {
            read_buf
        };
        let c = conn.clone();
        inner
            .pool
            .submit(Box::new(move || execute(&c, req, payload, guard)));
    }
}

/// Answers a read with its data or its error, from the connection's reader or a worker.
pub(crate) fn answer_read(
    c: &Arc<Conn>,
    req: &Request,
    reply: ReadReply,
    mut guard: InFlight,
    from_reader: bool,
) {
    let r = match reply {
        (Ok(()), buf) => c.data_reply(req.cookie, req.offset, buf, guard.reply(true)),
        (Err(err), _) => c.err_reply(
            req.cookie,
            err.errno(),
            &err.to_string(),
            guard.reply(false),
        ),
    };
    if from_reader {
        c.send_from_reader(r);
    } else {
        c.send(r);
    }
}

/// Runs one request on a worker and answers it. `payload`: a WRITE's data, or a READ's buffer
/// if the reader made one.
pub(crate) fn execute(
    c: &Arc<Conn>,
    req: Request,
    payload: Option<AlignedBuf>,
    mut guard: InFlight,
) {
    if c.dead.load(Ordering::Acquire) && req.typ != cmd::WRITE {
        // Nobody will read the answer.
        if let Some(b) = guard.take() {
            c.release(b);
        }
        return;
    }
    let Some(admitted) = c.rmw.admitted(&req) else {
        return crate::unaligned::execute(c, req, payload, guard);
    };
    let e = &c.export;
    let fua = req.flags & cmd::FLAG_FUA != 0;
    let len = req.len as u64;
    let r = match req.typ {
        cmd::READ => {
            let buf = payload.unwrap_or_else(|| AlignedBuf::new(req.len as usize));
            return answer_read(c, &req, e.read_owned(req.offset, buf), guard, false);
        }
        cmd::WRITE => {
            let buf = payload.unwrap_or_else(|| AlignedBuf::new(req.len as usize));
            e.write_owned(req.offset, buf, fua).0
        }
        cmd::FLUSH => e.flush(),
        cmd::TRIM => e
            .trim(req.offset, len)
            .and_then(|_| if fua { e.flush() } else { Ok(()) }),
        // NO_HOLE needs nothing (zeros are written either way) and FAST_ZERO is honoured
        // because zeroing is always fast here.
        cmd::WRITE_ZEROES => e.write_zeroes(req.offset, len, fua),
        cmd::CACHE => e.cache(req.offset, len),
        cmd::BLOCK_STATUS => match e.extents(req.offset, len) {
            Ok(ext) => {
                let one = req.flags & cmd::FLAG_REQ_ONE != 0;
                return c.send(c.block_status_reply(
                    req.cookie,
                    &ext,
                    0,
                    len,
                    one,
                    guard.reply(true),
                ));
            }
            Err(e) => Err(e),
        },
        _ => Err(ExportError::Invalid),
    };
    drop(admitted);
    answer(c, &req, r, guard);
}

/// Answers a request without data with its result.
pub(crate) fn answer(c: &Conn, req: &Request, r: Result<(), ExportError>, mut guard: InFlight) {
    match r {
        Ok(()) => c.reply_ok(req.cookie, guard.reply(true)),
        Err(err) => c.reply_err(
            req.cookie,
            err.errno(),
            &err.to_string(),
            guard.reply(false),
        ),
    }
}
