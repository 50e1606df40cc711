//! Requests at any byte offset and length, from clients that did not negotiate block sizes
//! (`NBD_OPT_EXPORT_NAME`, or `NBD_OPT_GO` without `NBD_INFO_BLOCK_SIZE`): the protocol says
//! such a client cannot know the server's minimum, so a server should accept any alignment.
//!
//! ## What is done
//!
//! The export's minimum block (its `unit`, 512 bytes unless the export says more) stays the
//! unit of every device operation. A READ reads the units covering it and answers with the
//! requested bytes; `CACHE` and `BLOCK_STATUS` widen to the covering units. A WRITE is a
//! read-modify-write: the partly covered units at either end are read, the payload merged in
//! a private buffer, and the covering units written in one export write (two when they pass the
//! maximum block size). A TRIM or WRITE_ZEROES zeroes the partly covered units the same way
//! (written zeros: a part of a unit cannot be discarded) and trims or zeroes the whole units
//! between.
//!
//! ## Atomicity
//!
//! A merge must not lose a write that lands between its read and its write. Every write-type
//! request (WRITE, TRIM, WRITE_ZEROES) therefore runs under a range lock of its export
//! ([`Gate`], shared by every connection to the same bytes, found by [`Export::data_key`]):
//! merges exclusive, other writes shared (they may overlap each other, as they always could).
//! Reads take no lock: a merge is one write of whole units built in private memory, so a read
//! sees each unit before or after it, as with any write.
//!
//! The lock costs only while some connection on the export has sent an unaligned request
//! (it has *turned*; it stays counted until it closes): with none, a write is admitted to the
//! fast path as before, counted in its connection's `fast` counter (one uncontended atomic
//! add, one load of the export's count, one atomic sub when it completes); reads of
//! negotiating connections do nothing new. A connection that turns raises the count, and its
//! first merge waits until every write admitted before that has completed (the *drain*:
//! every connection's `fast` counter at zero once; after that none is admitted while the count
//! stays above zero, since an admission adds to its counter before it reads the count and the
//! turning connection raises the count before it reads the counters).

use crate::export::{BlockSizes, Export, ExportError};
use crate::proto::{Request, cmd};
use crate::server::lock;
use crate::transmission::{Conn, InFlight, answer, answer_read};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};
use tiercache_io::AlignedBuf;

/// How long a first merge waits for writes admitted before it (a device that never completes
/// one: the merge then fails with `EIO` rather than run unprotected).
const DRAIN_MAX: Duration = Duration::from_secs(30);

/// The block sizes a connection's requests are checked against: any alignment for a client
/// that did not negotiate (`liberal`), the export's own otherwise.
pub(crate) fn accepted(sizes: BlockSizes, liberal: bool) -> BlockSizes {
    if liberal {
        BlockSizes { min: 1, ..sizes }
    } else {
        sizes
    }
}

/// Whether a command changes data (and so may race with a merge).
fn writes(typ: u16) -> bool {
    matches!(typ, cmd::WRITE | cmd::TRIM | cmd::WRITE_ZEROES)
}

/// Which bytes an export serves ([`Export::data_key`]).
type Key = (usize, u64);

/// The range locks of one export's bytes and the count of connections that turned.
pub(crate) struct Gate {
    /// Connections on these bytes that have sent an unaligned request and are still open.
    turned: AtomicUsize,
    st: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Every write admitted to the fast path before the last turn has completed.
    drained: bool,
    next_ticket: u64,
    /// Ranges held or waited for, in ticket order.
    ranges: Vec<Range>,
    /// Each connection's count of fast-path writes in flight.
    fast: Vec<Weak<AtomicUsize>>,
}

/// A byte range locked (or waited for): granted once no range with a smaller ticket that
/// overlaps it conflicts (exclusive on either side), so waiters are served in order.
struct Range {
    ticket: u64,
    lo: u64,
    hi: u64,
    exclusive: bool,
}

/// A held range; released when dropped.
struct Held<'a> {
    gate: &'a Gate,
    ticket: u64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.gate.st);
        st.ranges.retain(|r| r.ticket != self.ticket);
        drop(st);
        self.gate.cv.notify_all();
    }
}

impl Gate {
    /// The gate of the bytes `key` names (made on first use; gone with its last connection).
    fn of(key: Key) -> Arc<Gate> {
        static GATES: OnceLock<Mutex<HashMap<Key, Weak<Gate>>>> = OnceLock::new();
        let mut m = lock(GATES.get_or_init(Default::default));
        if let Some(g) = m.get(&key).and_then(Weak::upgrade) {
            return g;
        }
        m.retain(|_, g| g.strong_count() > 0);
        let g = Arc::new(Gate {
            turned: AtomicUsize::new(0),
            st: Mutex::new(GateState::default()),
            cv: Condvar::new(),
        });
        m.insert(key, Arc::downgrade(&g));
        g
    }

    /// Locks `[lo, hi)`, exclusively for a merge (which first waits for the drain).
    fn lock(&self, lo: u64, hi: u64, exclusive: bool) -> Result<Held<'_>, ExportError> {
        if exclusive {
            self.drain()?;
        }
        let mut st = lock(&self.st);
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.ranges.push(Range {
            ticket,
            lo,
            hi,
            exclusive,
        });
        let blocked = |st: &GateState| {
            st.ranges
                .iter()
                .any(|r| r.ticket < ticket && r.lo < hi && lo < r.hi && (r.exclusive || exclusive))
        };
        while blocked(&st) {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        Ok(Held { gate: self, ticket })
    }

    /// Waits until no write admitted to the fast path is in flight (once per turn: none is
    /// admitted after it while a connection stays turned).
    fn drain(&self) -> Result<(), ExportError> {
        let until = Instant::now() + DRAIN_MAX;
        loop {
            let mut st = lock(&self.st);
            if st.drained {
                return Ok(());
            }
            st.fast.retain(|w| w.strong_count() > 0);
            let busy = st
                .fast
                .iter()
                .filter_map(Weak::upgrade)
                .any(|n| n.load(Ordering::SeqCst) != 0);
            if !busy {
                st.drained = true;
                return Ok(());
            }
            drop(st);
            if Instant::now() > until {
                return Err(ExportError::Io(
                    "writes of other connections did not complete; unaligned write refused".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// A connection's part: whether it may send unaligned requests, whether it has, and its
/// count of fast-path writes in flight.
pub(crate) struct Rmw {
    gate: Arc<Gate>,
    fast: Arc<AtomicUsize>,
    /// The client did not negotiate block sizes.
    liberal: bool,
    /// It has sent an unaligned request (counted in the gate until the connection closes).
    turned: AtomicBool,
    /// The export's minimum block: the unit of every device operation.
    unit: u64,
    /// The export's maximum block: the longest single read or write made.
    max: u64,
}

impl Rmw {
    /// The part of a connection to `export` (`liberal`: the client did not negotiate block
    /// sizes).
    pub(crate) fn new(export: &dyn Export, liberal: bool) -> Rmw {
        let gate = Gate::of(export.data_key());
        let fast = Arc::new(AtomicUsize::new(0));
        {
            let mut st = lock(&gate.st);
            st.fast.retain(|w| w.strong_count() > 0);
            st.fast.push(Arc::downgrade(&fast));
        }
        let sizes = export.block_sizes();
        let unit = u64::from(sizes.min.max(512));
        Rmw {
            gate,
            fast,
            liberal,
            turned: AtomicBool::new(false),
            unit,
            max: (u64::from(sizes.max) / unit * unit).max(unit),
        }
    }

    /// Whether `r` is aligned to the export's unit (always, for a connection that negotiated:
    /// its requests were checked against it; and a FLUSH, whose offset and length mean
    /// nothing).
    #[inline]
    pub(crate) fn aligned(&self, r: &Request) -> bool {
        !self.liberal
            || r.typ == cmd::FLUSH
            || (r.offset | u64::from(r.len)).is_multiple_of(self.unit)
    }

    /// Whether `r` runs as it always did (counted in flight if it writes: [`Rmw::done`] when it
    /// completes); `false`: it goes to [`execute`] here.
    #[inline]
    pub(crate) fn admit(&self, r: &Request) -> bool {
        if !self.aligned(r) {
            self.turn();
            return false;
        }
        if !writes(r.typ) {
            return true;
        }
        // Added before the count is read; the turning side raises the count before it reads
        // the counters (both SeqCst): one of the two sees the other.
        self.fast.fetch_add(1, Ordering::SeqCst);
        if self.gate.turned.load(Ordering::SeqCst) == 0 {
            return true;
        }
        self.fast.fetch_sub(1, Ordering::Release);
        false
    }

    /// A request [`Rmw::admit`] let through has completed.
    #[inline]
    pub(crate) fn done(&self, typ: u16) {
        if writes(typ) {
            self.fast.fetch_sub(1, Ordering::Release);
        }
    }

    /// [`Rmw::admit`] with the [`Rmw::done`] made when the result is dropped.
    #[inline]
    pub(crate) fn admitted(&self, r: &Request) -> Option<Admitted<'_>> {
        // Not `then_some`: its argument is made (and dropped, counting `done`) either way.
        self.admit(r).then(|| Admitted(self, r.typ))
    }

    fn turn(&self) {
        if !self.turned.swap(true, Ordering::AcqRel) {
            let _st = lock(&self.gate.st);
            self.gate.turned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Rmw {
    fn drop(&mut self) {
        if self.turned.load(Ordering::Acquire) {
            let mut st = lock(&self.gate.st);
            if self.gate.turned.fetch_sub(1, Ordering::SeqCst) == 1 {
                st.drained = false; // the next turn drains again
            }
        }
    }
}

/// An admitted request: [`Rmw::done`] when dropped.
pub(crate) struct Admitted<'a>(&'a Rmw, u16);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.0.done(self.1);
    }
}

/// Runs `req` through [`execute`] on a worker (from the reactor, whose engine path takes only
/// admitted requests). `buf`: a WRITE's payload (a READ's buffer is not used).
pub(crate) fn spawn(c: &Arc<Conn>, req: Request, buf: AlignedBuf) {
    let guard = InFlight::new(c, &req);
    let c2 = c.clone();
    c.inner
        .pool
        .submit(Box::new(move || execute(&c2, req, Some(buf), guard)));
}

/// The units covering `len` bytes at `off`: `[lo, hi)` (checked requests end inside the
/// export; saturating all the same).
fn cover(off: u64, len: u64, unit: u64) -> (u64, u64) {
    let end = off.saturating_add(len).div_ceil(unit);
    (off / unit * unit, end.saturating_mul(unit))
}

/// Runs `f(offset, range in the buffer)` over `n` bytes at `lo` in pieces of at most `max`.
fn pieces(
    lo: u64,
    n: usize,
    max: u64,
    mut f: impl FnMut(u64, std::ops::Range<usize>) -> Result<(), ExportError>,
) -> Result<(), ExportError> {
    let mut at = 0;
    while at < n {
        let k = (n - at).min(max as usize);
        f(lo + at as u64, at..at + k)?;
        at += k;
    }
    Ok(())
}

/// Runs a request the fast path did not admit (a worker's job) and answers it.
pub(crate) fn execute(
    c: &Arc<Conn>,
    req: Request,
    payload: Option<AlignedBuf>,
    mut guard: InFlight,
) {
    let (m, e) = (&c.rmw, &*c.export);
    let (off, len) = (req.offset, u64::from(req.len));
    let (lo, hi) = cover(off, len, m.unit);
    let fua = req.flags & cmd::FLAG_FUA != 0;
    let r = match req.typ {
        cmd::READ => return answer_read(c, &req, read(m, e, off, len), guard, false),
        cmd::CACHE => e.cache(lo, hi - lo),
        cmd::BLOCK_STATUS => match e.extents(lo, hi - lo) {
            Ok(ext) => {
                let one = req.flags & cmd::FLAG_REQ_ONE != 0;
                let slot = guard.reply(true);
                return c.send(c.block_status_reply(req.cookie, &ext, off - lo, len, one, slot));
            }
            Err(e) => Err(e),
        },
        t if writes(t) => match m.gate.lock(lo, hi, lo != off || hi != off + len) {
            Ok(_held) if t == cmd::WRITE => match &payload {
                Some(data) if data.len() as u64 == len => write(m, e, off, data, fua),
                _ => Err(ExportError::Invalid),
            },
            Ok(_held) => zero(m, e, off, len, t == cmd::TRIM, fua),
            Err(x) => Err(x),
        },
        cmd::FLUSH => e.flush(),
        _ => Err(ExportError::Invalid),
    };
    answer(c, &req, r, guard);
}

/// Reads `len` bytes at `off` through the units covering them.
fn read(m: &Rmw, e: &dyn Export, off: u64, len: u64) -> crate::export::ReadReply {
    let (lo, hi) = cover(off, len, m.unit);
    let mut whole = AlignedBuf::new((hi - lo) as usize);
    let n = whole.len();
    if let Err(x) = pieces(lo, n, m.max, |o, r| e.read(o, &mut whole[r])) {
        return (Err(x), AlignedBuf::new(0));
    }
    let mut out = AlignedBuf::new(len as usize);
    let at = (off - lo) as usize;
    out.copy_from_slice(&whole[at..at + len as usize]);
    (Ok(()), out)
}

/// Writes `data` at `off`: the covering units, with the bytes of partly covered ones that are
/// outside the request read first (the caller holds the range).
fn write(m: &Rmw, e: &dyn Export, off: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
    let (lo, hi) = cover(off, data.len() as u64, m.unit);
    if lo == off && hi == off + data.len() as u64 {
        return pieces(lo, data.len(), m.max, |o, r| e.write(o, &data[r], fua));
    }
    let mut buf = AlignedBuf::new((hi - lo) as usize);
    let (u, n) = (m.unit as usize, buf.len());
    if off != lo {
        e.read(lo, &mut buf[..u])?;
    }
    if off + data.len() as u64 != hi && !(off != lo && n == u) {
        e.read(hi - m.unit, &mut buf[n - u..])?;
    }
    let at = (off - lo) as usize;
    buf[at..at + data.len()].copy_from_slice(data);
    pieces(lo, n, m.max, |o, r| e.write(o, &buf[r], fua))
}

/// Zeroes (`trim`: discards) `len` bytes at `off`: partly covered units get zeros written
/// into their covered bytes, whole units are trimmed or zeroed (the caller holds the range).
fn zero(
    m: &Rmw,
    e: &dyn Export,
    off: u64,
    len: u64,
    trim: bool,
    fua: bool,
) -> Result<(), ExportError> {
    let (unit, end) = (m.unit, off + len);
    let (lo, hi) = cover(off, len, unit);
    let edge = |u0: u64| -> Result<(), ExportError> {
        let mut b = AlignedBuf::new(unit as usize);
        e.read(u0, &mut b)?;
        b[(off.max(u0) - u0) as usize..(end.min(u0 + unit) - u0) as usize].fill(0);
        e.write(u0, &b, fua)
    };
    if off != lo {
        edge(lo)?;
    }
    if end != hi && !(off != lo && hi - lo == unit) {
        edge(hi - unit)?;
    }
    let (a, b) = (off.next_multiple_of(unit), end / unit * unit);
    if b > a {
        if trim {
            e.trim(a, b - a)?;
        } else {
            e.write_zeroes(a, b - a, fua)?;
        }
    }
    if trim && fua {
        e.flush()?;
    }
    Ok(())
}
