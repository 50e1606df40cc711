//! An NBD client as a [`Backend`] (SPEC C2: a core device served by another NBD server);
//! see [`NbdBackend`]. The wire protocol and URIs are `tiercache-nbd-proto`'s; the socket and
//! the handshake's use are in `proto`, connections in `conn`.

mod conn;
mod proto;

use tiercache_nbd_proto::uri;
pub use tiercache_nbd_proto::uri::endpoints as nbd_endpoints;

use crate::{BLOCK, Backend, IoErr, Req, check_blocks, check_bytes};
use conn::{Conn, OnDeath, Ticket};
use proto::{Export, Sock, cmd, tflag};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// Largest READ/WRITE sent, whatever larger maximum the server advertises (32 MiB).
const MAX_CHUNK: u64 = 32 << 20;
/// Largest WRITE_ZEROES sent (it carries no payload, so the block-size maximum does not apply).
const MAX_ZERO_CHUNK: u64 = 1 << 30;
/// Largest buffer of zeros written when the server has no WRITE_ZEROES.
const MAX_ZERO_BUF: u64 = 4 << 20;
/// Number of read-modify-write locks (minimum blocks hash onto them).
const RMW_STRIPES: usize = 64;

/// How [`NbdBackend::connect_with`] connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdOptions {
    /// Connections to open when the server advertises `NBD_FLAG_CAN_MULTI_CONN` (one otherwise;
    /// fewer when the server refuses more). Default 4.
    pub connections: usize,
    /// Limit for the TCP connect and for each step of the handshake. Default 10 s.
    pub connect_timeout: Duration,
    /// A request unanswered (or a send blocked) for this long kills its connection and fails.
    /// `None` (the default) waits for ever on a server that is up but silent; a server that
    /// goes away is detected either way.
    pub request_timeout: Option<Duration>,
    /// When the server has ended every connection (it was restarted, the network dropped), a
    /// background thread connects again: at once, then after 100 ms, doubling up to this
    /// bound, until it succeeds or the backend is dropped. `None`: never (requests fail for
    /// good). Default 5 s. Connections this side closed (a request timeout, a protocol error)
    /// are not replaced: the server may still carry out what was sent on them.
    pub reconnect_max: Option<Duration>,
}

impl Default for NbdOptions {
    fn default() -> Self {
        NbdOptions {
            connections: 4,
            connect_timeout: Duration::from_secs(10),
            request_timeout: None,
            reconnect_max: Some(Duration::from_secs(5)),
        }
    }
}

/// What an [`NbdBackend`] says about its connections ([`NbdBackend::on_event`]): one event
/// when every connection is lost, one when they are back, and one per outage when the server
/// that answers offers another export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdEvent {
    /// The server ended every connection; requests fail until a reconnection succeeds.
    Lost {
        /// Why the first connection ended.
        why: String,
    },
    /// A server answered a reconnection attempt but its export differs (size, flags or block
    /// sizes) from the one first connected to: it is not used, attempts go on.
    Mismatch {
        /// What differs.
        why: String,
    },
    /// Connected again; requests go to the new connections.
    Reconnected {
        /// How long no connection worked.
        down: Duration,
        /// Attempts it took.
        attempts: u32,
        /// Connections opened.
        connections: usize,
    },
}

type Hook = Arc<dyn Fn(&NbdEvent) + Send + Sync>;

/// The connections of a backend and what reconnects them (shared with the reconnection
/// thread and, weakly, with each connection's death notice).
struct Link {
    /// `nbd:URI`, for messages.
    label: String,
    target: uri::Target,
    export: String,
    opts: NbdOptions,
    /// The export as first negotiated: a reconnection must find the same.
    expect: Export,
    /// Connections to open (as many as the first connect got).
    want: usize,
    conns: RwLock<Vec<Arc<Conn>>>,
    st: Mutex<LinkState>,
    cv: Condvar,
    /// Writes without FUA the server acknowledged, and how many of them a completed flush
    /// covers.
    acked: AtomicU64,
    flushed: AtomicU64,
    /// Reconnected while acknowledged writes were not covered by a flush (the old server may
    /// have lost them with its volatile cache): the next flush reports it.
    unsure: AtomicBool,
    reconnects: AtomicU64,
    hook: Mutex<Option<Hook>>,
}

#[derive(Default)]
struct LinkState {
    /// The backend was dropped.
    closed: bool,
    /// A reconnection thread runs.
    reconnecting: bool,
}

fn rd<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn wr<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn lk<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a reconnection attempt did not give connections.
enum Reopen {
    Failed,
    Mismatch(String),
}

impl Link {
    fn emit(&self, ev: &NbdEvent) {
        let h = lk(&self.hook).clone();
        if let Some(h) = h {
            h(ev);
        }
    }

    /// The death notice each connection gets.
    fn notice(weak: Weak<Link>) -> OnDeath {
        Box::new(move || {
            if let Some(l) = weak.upgrade() {
                l.lost();
            }
        })
    }

    /// A connection died: when the server has ended every one, start reconnecting.
    fn lost(self: &Arc<Self>) {
        if self.opts.reconnect_max.is_none() {
            return;
        }
        let mut st = lk(&self.st);
        if st.closed || st.reconnecting {
            return;
        }
        let all_gone = {
            let conns = rd(&self.conns);
            !conns.is_empty() && conns.iter().all(|c| c.server_ended())
        };
        if !all_gone {
            return;
        }
        st.reconnecting = true;
        drop(st);
        let l = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nbd-reconnect".into())
            .spawn(move || l.reconnect());
        if spawned.is_err() {
            lk(&self.st).reconnecting = false;
        }
    }

    /// The reconnection thread: attempts with backoff until connections are back or the
    /// backend is dropped.
    fn reconnect(self: Arc<Self>) {
        let t0 = Instant::now();
        let why = rd(&self.conns)
            .iter()
            .find_map(|c| c.why_dead())
            .unwrap_or_default();
        self.emit(&NbdEvent::Lost { why });
        let max = self.opts.reconnect_max.unwrap_or(Duration::from_secs(5));
        let mut wait = Duration::from_millis(100).min(max);
        let mut attempts = 0u32;
        let mut told_mismatch = false;
        loop {
            attempts += 1;
            match self.reopen() {
                Ok(new) => {
                    let st = lk(&self.st);
                    if st.closed {
                        drop(st);
                        for c in new {
                            c.close();
                        }
                        return;
                    }
                    // Writes the old server acknowledged and no flush covered: counted before
                    // this point they are seen here, after it by `finish` (the epoch).
                    self.reconnects.fetch_add(1, Ordering::SeqCst);
                    if self.expect.flags & tflag::SEND_FLUSH != 0
                        && self.acked.load(Ordering::SeqCst) > self.flushed.load(Ordering::SeqCst)
                    {
                        self.unsure.store(true, Ordering::SeqCst);
                    }
                    let n = new.len();
                    let old = std::mem::replace(&mut *wr(&self.conns), new);
                    let mut st = st;
                    st.reconnecting = false;
                    drop(st);
                    for c in old {
                        c.close();
                    }
                    self.emit(&NbdEvent::Reconnected {
                        down: t0.elapsed(),
                        attempts,
                        connections: n,
                    });
                    return;
                }
                Err(Reopen::Mismatch(why)) if !told_mismatch => {
                    told_mismatch = true;
                    self.emit(&NbdEvent::Mismatch { why });
                }
                Err(_) => {}
            }
            let st = lk(&self.st);
            let (st, _) = self
                .cv
                .wait_timeout_while(st, wait, |s| !s.closed)
                .unwrap_or_else(|e| e.into_inner());
            if st.closed {
                return;
            }
            wait = (wait * 2).min(max);
        }
    }

    /// Opens as many connections as the backend had, to the same export.
    fn reopen(self: &Arc<Self>) -> Result<Vec<Arc<Conn>>, Reopen> {
        let timeout = self.opts.connect_timeout.max(Duration::from_millis(1));
        let (sock, x) =
            open_one(&self.target, &self.export, timeout).map_err(|_| Reopen::Failed)?;
        if x != self.expect {
            let _ = sock.send_all(&[&proto::request(cmd::DISC, 0, 0, 0, 0)]);
            let (a, b) = (&self.expect, &x);
            return Err(Reopen::Mismatch(format!(
                "the server now offers {} bytes, flags {:#06x}, block sizes {}/{}/{} (was {} bytes, {:#06x}, {}/{}/{}); not used",
                b.size,
                b.flags,
                b.min_block,
                b.pref_block,
                b.max_block,
                a.size,
                a.flags,
                a.min_block,
                a.pref_block,
                a.max_block
            )));
        }
        let socks = open_more(&self.target, &self.export, sock, &x, self.want, timeout);
        self.start(socks).map_err(|_| Reopen::Failed)
    }

    /// Starts a connection on each socket, each telling this link when it dies. On a failure
    /// the ones already started are closed.
    fn start(self: &Arc<Self>, socks: Vec<Sock>) -> Result<Vec<Arc<Conn>>, String> {
        let mut conns: Vec<Arc<Conn>> = Vec::with_capacity(socks.len());
        for s in socks {
            let notice = Link::notice(Arc::downgrade(self));
            match Conn::start(
                self.label.clone(),
                s,
                self.opts.request_timeout,
                Some(notice),
            ) {
                Ok(c) => conns.push(c),
                Err(msg) => {
                    for c in &conns {
                        c.close();
                    }
                    return Err(msg);
                }
            }
        }
        Ok(conns)
    }
}

/// What the server advertised for the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NbdExportInfo {
    /// Size in bytes (the device uses it rounded down to the minimum block size and 512).
    pub size: u64,
    /// `NBD_FLAG_READ_ONLY`: writes fail with `PermissionDenied`.
    pub read_only: bool,
    /// `NBD_FLAG_SEND_FLUSH`.
    pub flush: bool,
    /// `NBD_FLAG_SEND_FUA`.
    pub fua: bool,
    /// `NBD_FLAG_SEND_TRIM` (not used: see [`NbdBackend`] on trim).
    pub trim: bool,
    /// `NBD_FLAG_SEND_WRITE_ZEROES`.
    pub write_zeroes: bool,
    /// `NBD_FLAG_CAN_MULTI_CONN`.
    pub multi_conn: bool,
    /// `NBD_FLAG_ROTATIONAL`.
    pub rotational: bool,
    /// Minimum block size in bytes (1 when not advertised).
    pub min_block: u32,
    /// Preferred block size in bytes (4096 when not advertised).
    pub preferred_block: u32,
    /// Maximum READ/WRITE size in bytes (32 MiB when not advertised).
    pub max_block: u32,
    /// Negotiated with `NBD_OPT_GO` (else with the older `NBD_OPT_EXPORT_NAME`).
    pub negotiated_with_go: bool,
}

impl NbdExportInfo {
    fn from_export(x: &Export) -> Self {
        let f = |b: u16| x.flags & b != 0;
        NbdExportInfo {
            size: x.size,
            read_only: f(tflag::READ_ONLY),
            flush: f(tflag::SEND_FLUSH),
            fua: f(tflag::SEND_FUA),
            trim: f(tflag::SEND_TRIM),
            write_zeroes: f(tflag::SEND_WRITE_ZEROES),
            multi_conn: f(tflag::CAN_MULTI_CONN),
            rotational: f(tflag::ROTATIONAL),
            min_block: x.min_block,
            preferred_block: x.pref_block,
            max_block: x.max_block,
            negotiated_with_go: x.go,
        }
    }
}

/// An export of another NBD server (qemu-nbd, nbdkit, nbd-server, …) as a [`Backend`], named
/// `nbd:URI`.
///
/// - URIs: `nbd://HOST[:PORT][/EXPORT]` (TCP, port 10809 by default) and
///   `nbd+unix:///[EXPORT]?socket=PATH`, optionally behind the device prefix `nbd:`.
/// - Handshake: fixed newstyle, `NBD_OPT_GO` asking for `NBD_INFO_BLOCK_SIZE`, falling back to
///   `NBD_OPT_EXPORT_NAME` when the server does not know `NBD_OPT_GO`. Simple replies only.
/// - Transmission: many threads have requests in flight at once on one connection (callers send
///   under a mutex; one reader thread per connection matches replies, in any order, to the
///   waiting callers by cookie). When the server advertises `NBD_FLAG_CAN_MULTI_CONN`, up to
///   [`NbdOptions::connections`] connections are opened and used in turn.
/// - READ and WRITE are split at the server's maximum block size (at most 32 MiB); a request
///   not aligned to a minimum block size above 512 bytes is done by read-modify-write, with a
///   lock per minimum block so that concurrent writes to neighbouring 512-byte blocks both land.
/// - FUA is `NBD_CMD_FLAG_FUA` when the server supports it, else the write followed by a flush.
///   `write_zeroes` is `NBD_CMD_WRITE_ZEROES` (holes allowed) or, without it, writes of zeros.
///   `trim` is the same as `write_zeroes`: NBD's `NBD_CMD_TRIM` leaves the content undefined,
///   while [`Backend::trim`] promises zeros; `NBD_CMD_WRITE_ZEROES` without `NO_HOLE` still
///   lets the server deallocate. A server without `NBD_FLAG_SEND_FLUSH` has no volatile cache to
///   flush, so flush is then a no-op (and [`Backend::name`] says so).
/// - Errors: NBD error values become [`IoErr::Io`] with the matching `ErrorKind` (`EPERM` →
///   `PermissionDenied`, `ENOSPC` → `StorageFull`, `EINVAL`/`EOVERFLOW` → `InvalidInput`,
///   `ENOTSUP` → `Unsupported`, `ENOMEM` → `OutOfMemory`, `EIO` and others → `Other`). A
///   connection that drops fails every request waiting on it and every later one with
///   `ConnectionAborted` — never a hang (a server that is up but silent needs
///   [`NbdOptions::request_timeout`]).
/// - Reconnection ([`NbdOptions::reconnect_max`]): when the server has ended every connection
///   (killed and restarted, a network drop), a background thread connects again with bounded
///   backoff (at once, then 100 ms doubling to 5 s by default) to a server that offers the same
///   export (size, flags and block sizes; another one is not used); requests meanwhile fail at
///   once with `ConnectionAborted`, and requests after it go to the new connections.
///   [`NbdBackend::on_event`] hears of each loss and reconnection. Writes acknowledged before
///   the loss that no flush covered may be gone with the old server's volatile cache: the first
///   flush after a reconnection then fails (it still flushes), so a caller relying on them
///   knows, the way a later fsync reports an earlier writeback error.
/// - Dropping the backend sends `NBD_CMD_DISC` on each connection.
pub struct NbdBackend {
    /// The URI without the `nbd:` prefix.
    uri: String,
    info: NbdExportInfo,
    link: Arc<Link>,
    next: AtomicUsize,
    blocks: u64,
    /// Alignment of every request sent, in bytes: the minimum block size, at least 512.
    align: u64,
    /// Largest READ/WRITE sent, in bytes (a multiple of `align`).
    chunk: u64,
    /// Largest WRITE_ZEROES sent, in bytes (a multiple of `align`).
    zero_chunk: u64,
    /// Read-modify-write locks (empty when `align` is 512).
    stripes: Vec<Mutex<()>>,
}

impl std::fmt::Debug for NbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdBackend")
            .field("name", &self.name())
            .field("info", &self.info)
            .finish()
    }
}

/// A request sent (or finished at once) whose replies are still to be collected by
/// [`NbdBackend::finish`].
struct InFlight<'b> {
    /// Result known without waiting (a refused request, or a synchronous path's result).
    early: Result<(), IoErr>,
    /// Sent requests and, for reads, where their data goes.
    parts: Vec<(Ticket, Option<&'b mut [u8]>)>,
    /// Flush once the parts succeeded (FUA on a server without FUA).
    flush_after: bool,
    /// Writes sent without FUA: once acknowledged they wait for a flush to be durable.
    unflushed: bool,
    /// Reconnections before they were sent (a reply read after a reconnection came from the
    /// old server).
    epoch: u64,
}

impl InFlight<'_> {
    fn done(r: Result<(), IoErr>) -> Self {
        InFlight {
            early: r,
            parts: Vec::new(),
            flush_after: false,
            unflushed: false,
            epoch: 0,
        }
    }
}

fn human(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift {
            return format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{bytes} bytes")
}

fn lock(m: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    lk(m)
}

/// Opens connections after `first` (which offered `x`) until there are `want`, for servers
/// with `NBD_FLAG_CAN_MULTI_CONN`. A server that refuses one more, or offers something else
/// on it, only costs parallelism: what was opened is kept.
fn open_more(
    target: &uri::Target,
    export: &str,
    first: Sock,
    x: &Export,
    want: usize,
    timeout: Duration,
) -> Vec<Sock> {
    let mut socks = vec![first];
    while socks.len() < want {
        match open_one(target, export, timeout) {
            Ok((s, y)) if y == *x => socks.push(s),
            Ok((s, _)) => {
                let _ = s.send_all(&[&proto::request(cmd::DISC, 0, 0, 0, 0)]);
                break;
            }
            Err(_) => break,
        }
    }
    socks
}

/// Opens one connection and runs the handshake.
fn open_one(
    target: &uri::Target,
    export: &str,
    timeout: Duration,
) -> Result<(Sock, Export), IoErr> {
    let mut s = Sock::connect(target, timeout)?;
    s.set_timeouts(Some(timeout))?;
    let x = proto::handshake(&mut s, export).map_err(|(kind, msg)| IoErr::Io { kind, msg })?;
    Ok((s, x))
}

impl NbdBackend {
    /// Connects to `uri` (see [`NbdBackend`]) with [`NbdOptions::default`].
    ///
    /// A malformed URI gives [`IoErr::Io`] of kind `InvalidInput` with a one-line reason; a
    /// server that cannot be reached or refuses the export gives an [`IoErr::Io`] that says why.
    pub fn connect(uri: &str) -> Result<Self, IoErr> {
        Self::connect_with(uri, &NbdOptions::default())
    }

    /// Connects to `uri` with `opts`.
    pub fn connect_with(uri: &str, opts: &NbdOptions) -> Result<Self, IoErr> {
        let given = uri;
        let uri = match uri.strip_prefix("nbd:") {
            Some(rest) if rest.starts_with("nbd") => rest,
            _ => uri,
        };
        let parsed = uri::parse(uri).map_err(|why| IoErr::Io {
            kind: ErrorKind::InvalidInput,
            msg: format!("invalid NBD URI {given:?}: {why}"),
        })?;
        let label = format!("nbd:{uri}");
        let with_label = |e: IoErr| match e {
            IoErr::Io { kind, msg } => IoErr::Io {
                kind,
                msg: format!("{label}: {msg}"),
            },
            e => e,
        };
        let timeout = opts.connect_timeout.max(Duration::from_millis(1));
        let (sock, x) = open_one(&parsed.target, &parsed.export, timeout).map_err(with_label)?;
        let info = NbdExportInfo::from_export(&x);
        let align = u64::from(x.min_block).max(BLOCK as u64);
        if u64::from(x.max_block) < align {
            return Err(with_label(IoErr::Io {
                kind: ErrorKind::Unsupported,
                msg: format!("server's maximum block size {} is below 512", x.max_block),
            }));
        }
        let chunk = (u64::from(x.max_block).min(MAX_CHUNK) / align * align).max(align);
        let zero_chunk = MAX_ZERO_CHUNK / align * align;

        let want = if info.multi_conn { opts.connections } else { 1 };
        let socks = open_more(&parsed.target, &parsed.export, sock, &x, want, timeout);
        let link = Arc::new(Link {
            label: label.clone(),
            target: parsed.target.clone(),
            export: parsed.export.clone(),
            opts: opts.clone(),
            expect: x,
            want: socks.len(),
            conns: RwLock::new(Vec::new()),
            st: Mutex::new(LinkState::default()),
            cv: Condvar::new(),
            acked: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            unsure: AtomicBool::new(false),
            reconnects: AtomicU64::new(0),
            hook: Mutex::new(None),
        });
        let conns = link.start(socks).map_err(|msg| {
            lk(&link.st).closed = true;
            with_label(IoErr::Io {
                kind: ErrorKind::Other,
                msg,
            })
        })?;
        *wr(&link.conns) = conns;
        // A connection that died before it was listed (the server went at once) is noticed
        // here.
        link.lost();
        let usable = x.size - x.size % align;
        Ok(NbdBackend {
            uri: uri.to_string(),
            info,
            link,
            next: AtomicUsize::new(0),
            blocks: usable / BLOCK as u64,
            align,
            chunk,
            zero_chunk,
            stripes: if align > BLOCK as u64 {
                (0..RMW_STRIPES).map(|_| Mutex::new(())).collect()
            } else {
                Vec::new()
            },
        })
    }

    /// What the server advertised.
    pub fn info(&self) -> &NbdExportInfo {
        &self.info
    }

    /// Number of connections opened (more than one only with `NBD_FLAG_CAN_MULTI_CONN`).
    pub fn connections(&self) -> usize {
        rd(&self.link.conns).len()
    }

    /// False once every connection has failed or been closed (until a reconnection); requests
    /// then fail at once.
    pub fn is_connected(&self) -> bool {
        rd(&self.link.conns).iter().any(|c| !c.is_dead())
    }

    /// Reconnections so far.
    pub fn reconnects(&self) -> u64 {
        self.link.reconnects.load(Ordering::Relaxed)
    }

    /// Calls `f` on each [`NbdEvent`] (from the thread that notices it; keep it short).
    /// Replaces an earlier one.
    pub fn on_event(&self, f: impl Fn(&NbdEvent) + Send + Sync + 'static) {
        *lk(&self.link.hook) = Some(Arc::new(f));
    }

    /// The next live connection, in turn (a dead one when all are dead: it fails the request).
    fn conn(&self) -> Arc<Conn> {
        let conns = rd(&self.link.conns);
        let n = conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        Arc::clone(
            (0..n)
                .map(|i| &conns[(start + i) % n])
                .find(|c| !c.is_dead())
                .unwrap_or(&conns[start % n]),
        )
    }

    fn read_only_err(&self) -> IoErr {
        IoErr::Io {
            kind: ErrorKind::PermissionDenied,
            msg: format!("nbd:{}: export is read-only", self.uri),
        }
    }

    fn fua_flag(&self, fua: bool) -> u16 {
        if fua && self.info.fua {
            cmd::FLAG_FUA
        } else {
            0
        }
    }

    /// FUA emulated by a flush after the write completes.
    fn flush_after(&self, fua: bool) -> bool {
        fua && !self.info.fua && self.info.flush
    }

    fn is_aligned(&self, off: u64, len: u64) -> bool {
        off % self.align == 0 && len % self.align == 0
    }

    /// Waits for every part, copies read data, then flushes if asked. Always waits for every
    /// part; returns the first error.
    fn finish(&self, f: InFlight<'_>) -> Result<(), IoErr> {
        let mut res = f.early;
        for (ticket, dest) in f.parts {
            let r = ticket.wait().and_then(|data| match dest {
                Some(d) if d.len() == data.len() => {
                    d.copy_from_slice(&data);
                    Ok(())
                }
                Some(d) => Err(IoErr::Io {
                    kind: ErrorKind::InvalidData,
                    msg: format!(
                        "nbd:{}: read returned {} bytes, want {}",
                        self.uri,
                        data.len(),
                        d.len()
                    ),
                }),
                None => Ok(()),
            });
            if res.is_ok() {
                res = r;
            }
        }
        if res.is_ok() && f.unflushed {
            self.link.acked.fetch_add(1, Ordering::SeqCst);
            // Acknowledged by a server the backend has since reconnected away from: its
            // flush is not coming (the reconnection checks the writes counted before it).
            if self.link.reconnects.load(Ordering::SeqCst) != f.epoch {
                self.link.unsure.store(true, Ordering::SeqCst);
            }
        }
        if res.is_ok() && f.flush_after {
            res = self.flush();
        }
        res
    }

    /// Sends aligned reads of `buf.len()` bytes at byte offset `off`, split into chunks.
    fn read_aligned<'b>(&self, off: u64, buf: &'b mut [u8]) -> InFlight<'b> {
        let mut f = InFlight::done(Ok(()));
        for (i, d) in buf.chunks_mut(self.chunk as usize).enumerate() {
            let o = off + i as u64 * self.chunk;
            let t = self.conn().send(cmd::READ, 0, o, d.len() as u32, &[]);
            f.parts.push((t, Some(d)));
        }
        f
    }

    /// Sends aligned writes of `buf` at byte offset `off`, split into chunks.
    fn write_aligned(&self, off: u64, buf: &[u8], fua: bool) -> InFlight<'static> {
        let mut f = InFlight::done(Ok(()));
        f.epoch = self.link.reconnects.load(Ordering::SeqCst);
        let flags = self.fua_flag(fua);
        for (i, d) in buf.chunks(self.chunk as usize).enumerate() {
            let o = off + i as u64 * self.chunk;
            let t = self.conn().send(cmd::WRITE, flags, o, d.len() as u32, d);
            f.parts.push((t, None));
        }
        f.flush_after = self.flush_after(fua);
        f.unflushed = flags & cmd::FLAG_FUA == 0;
        f
    }

    /// The aligned range covering `off .. off + len`.
    fn widen(&self, off: u64, len: u64) -> (u64, u64) {
        let a0 = off / self.align * self.align;
        let a1 = (off + len).div_ceil(self.align) * self.align;
        (a0, a1)
    }

    fn read_unaligned(&self, off: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        let (a0, a1) = self.widen(off, buf.len() as u64);
        let mut tmp = vec![0u8; (a1 - a0) as usize];
        self.finish(self.read_aligned(a0, &mut tmp))?;
        let s = (off - a0) as usize;
        buf.copy_from_slice(&tmp[s..s + buf.len()]);
        Ok(())
    }

    /// Writes `data` at byte offset `off` (not aligned to the minimum block size) by reading the
    /// partial minimum blocks at either end, merging and writing the widened range, holding the
    /// locks of those end blocks throughout.
    fn write_rmw(&self, off: u64, data: &[u8], fua: bool) -> Result<(), IoErr> {
        let len = data.len() as u64;
        let (a0, a1) = self.widen(off, len);
        let al = self.align;
        let (head, tail) = (a0 / al, (a1 - al) / al);
        let mut idx = [
            (head % RMW_STRIPES as u64) as usize,
            (tail % RMW_STRIPES as u64) as usize,
        ];
        idx.sort_unstable();
        let _g0 = lock(&self.stripes[idx[0]]);
        let _g1 = (idx[1] != idx[0]).then(|| lock(&self.stripes[idx[1]]));
        let mut tmp = vec![0u8; (a1 - a0) as usize];
        let n = tmp.len();
        let head_partial = off != a0;
        let tail_partial = off + len != a1;
        if head_partial || (tail_partial && n as u64 == al) {
            self.finish(self.read_aligned(a0, &mut tmp[..al as usize]))?;
        }
        if tail_partial && n as u64 > al {
            self.finish(self.read_aligned(a1 - al, &mut tmp[n - al as usize..]))?;
        }
        let s = (off - a0) as usize;
        tmp[s..s + data.len()].copy_from_slice(data);
        self.finish(self.write_aligned(a0, &tmp, fua))
    }

    fn start_read<'b>(&self, lba: u64, buf: &'b mut [u8]) -> InFlight<'b> {
        if let Err(e) = check_bytes(lba, buf.len(), self.blocks) {
            return InFlight::done(Err(e));
        }
        if buf.is_empty() {
            return InFlight::done(Ok(()));
        }
        let off = lba * BLOCK as u64;
        if self.is_aligned(off, buf.len() as u64) {
            self.read_aligned(off, buf)
        } else {
            InFlight::done(self.read_unaligned(off, buf))
        }
    }

    fn start_write(&self, lba: u64, buf: &[u8], fua: bool) -> InFlight<'static> {
        if let Err(e) = check_bytes(lba, buf.len(), self.blocks) {
            return InFlight::done(Err(e));
        }
        if self.info.read_only {
            return InFlight::done(Err(self.read_only_err()));
        }
        if buf.is_empty() {
            return InFlight::done(Ok(()));
        }
        let off = lba * BLOCK as u64;
        if self.is_aligned(off, buf.len() as u64) {
            self.write_aligned(off, buf, fua)
        } else {
            InFlight::done(self.write_rmw(off, buf, fua))
        }
    }

    fn start_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> InFlight<'static> {
        if let Err(e) = check_blocks(lba, blocks, self.blocks) {
            return InFlight::done(Err(e));
        }
        if self.info.read_only {
            return InFlight::done(Err(self.read_only_err()));
        }
        if blocks == 0 {
            return InFlight::done(Ok(()));
        }
        let (off, end) = (lba * BLOCK as u64, (lba + blocks) * BLOCK as u64);
        let mid0 = off.div_ceil(self.align) * self.align;
        let mid1 = end / self.align * self.align;
        if mid0 >= mid1 {
            let zeros = vec![0u8; (end - off) as usize];
            return InFlight::done(self.write_rmw(off, &zeros, fua));
        }
        let mut f = InFlight::done(Ok(()));
        for (s, e) in [(off, mid0), (mid1, end)] {
            if s < e && f.early.is_ok() {
                f.early = self.write_rmw(s, &vec![0u8; (e - s) as usize], fua);
            }
        }
        if f.early.is_err() {
            return f;
        }
        let flags = self.fua_flag(fua);
        f.unflushed = flags & cmd::FLAG_FUA == 0;
        f.epoch = self.link.reconnects.load(Ordering::SeqCst);
        if self.info.write_zeroes {
            let mut o = mid0;
            while o < mid1 {
                let n = (mid1 - o).min(self.zero_chunk);
                let t = self.conn().send(cmd::WRITE_ZEROES, flags, o, n as u32, &[]);
                f.parts.push((t, None));
                o += n;
            }
        } else {
            let zeros = vec![0u8; (mid1 - mid0).min(self.chunk.min(MAX_ZERO_BUF)) as usize];
            let mut o = mid0;
            while o < mid1 {
                let n = (mid1 - o).min(zeros.len() as u64);
                let t = self
                    .conn()
                    .send(cmd::WRITE, flags, o, n as u32, &zeros[..n as usize]);
                f.parts.push((t, None));
                o += n;
            }
        }
        f.flush_after = self.flush_after(fua);
        f
    }
}

impl Backend for NbdBackend {
    fn name(&self) -> String {
        let i = &self.info;
        let mut parts = vec![format!("export {}", human(i.size))];
        parts.push(match self.connections() {
            1 if i.multi_conn => "multi-conn x1".to_string(),
            1 => "1 connection".to_string(),
            n => format!("multi-conn x{n}"),
        });
        if i.read_only {
            parts.push("read-only".into());
        }
        if !i.flush {
            parts.push("no flush (server has none)".into());
        } else if i.fua {
            parts.push("fua".into());
        } else {
            parts.push("fua as write+flush".into());
        }
        parts.push(if i.write_zeroes {
            "write-zeroes".into()
        } else {
            "zeroes written".into()
        });
        if self.align > BLOCK as u64 {
            parts.push(format!("min block {} (read-modify-write)", self.align));
        }
        if !i.negotiated_with_go {
            parts.push("NBD_OPT_EXPORT_NAME".into());
        }
        if !self.is_connected() {
            parts.push("DISCONNECTED".into());
        }
        format!("nbd:{} ({})", self.uri, parts.join(", "))
    }

    fn blocks(&self) -> u64 {
        self.blocks
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        self.finish(self.start_read(lba, buf))
    }

    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        self.finish(self.start_write(lba, buf, fua))
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        self.finish(self.start_zeroes(lba, blocks, fua))
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        self.finish(self.start_zeroes(lba, blocks, false))
    }

    fn flush(&self) -> Result<(), IoErr> {
        if !self.info.flush {
            return Ok(());
        }
        // One flush covers every connection: multi-conn promises it, and without multi-conn
        // there is one connection.
        let acked = self.link.acked.load(Ordering::SeqCst);
        self.conn().send(cmd::FLUSH, 0, 0, 0, &[]).wait()?;
        self.link.flushed.fetch_max(acked, Ordering::SeqCst);
        if self.link.unsure.swap(false, Ordering::SeqCst) {
            return Err(IoErr::Io {
                kind: ErrorKind::Other,
                msg: format!(
                    "nbd:{}: the connection to the server was lost and made again: writes it had acknowledged before that, which no flush covered, may not be durable (this flush covers the later ones)",
                    self.uri
                ),
            });
        }
        Ok(())
    }

    /// Sends every request of the batch before waiting for any (they do not overlap); a flush
    /// waits for the requests before it.
    fn submit_batch(&self, reqs: &mut [Req<'_>]) -> Vec<Result<(), IoErr>> {
        let mut results: Vec<Option<Result<(), IoErr>>> = (0..reqs.len()).map(|_| None).collect();
        let mut inflight: Vec<(usize, InFlight<'_>)> = Vec::new();
        for (i, r) in reqs.iter_mut().enumerate() {
            let f = match r {
                Req::Read { lba, buf } => self.start_read(*lba, buf),
                Req::Write { lba, buf, fua } => self.start_write(*lba, buf, *fua),
                Req::WriteZeroes { lba, blocks, fua } => self.start_zeroes(*lba, *blocks, *fua),
                Req::Trim { lba, blocks } => self.start_zeroes(*lba, *blocks, false),
                Req::Flush => {
                    for (j, f) in inflight.drain(..) {
                        results[j] = Some(self.finish(f));
                    }
                    results[i] = Some(self.flush());
                    continue;
                }
            };
            inflight.push((i, f));
        }
        for (j, f) in inflight {
            results[j] = Some(self.finish(f));
        }
        results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }
}

impl Drop for NbdBackend {
    fn drop(&mut self) {
        lk(&self.link.st).closed = true;
        self.link.cv.notify_all();
        let conns = std::mem::take(&mut *wr(&self.link.conns));
        for c in conns {
            c.close();
        }
    }
}
