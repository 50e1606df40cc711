//! An NBD client as a [`Backend`] (SPEC C2: a core device served by another NBD server);
//! see [`NbdBackend`]. The wire protocol is in `proto`, URIs in `uri`, connections in `conn`.

mod conn;
mod proto;
mod uri;

use crate::{BLOCK, Backend, IoErr, Req, check_blocks, check_bytes};
use conn::{Conn, Ticket};
use proto::{Export, Sock, cmd, tflag};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
}

impl Default for NbdOptions {
    fn default() -> Self {
        NbdOptions {
            connections: 4,
            connect_timeout: Duration::from_secs(10),
            request_timeout: None,
        }
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
///   [`NbdOptions::request_timeout`]). There is no reconnection: open a new backend.
/// - Dropping the backend sends `NBD_CMD_DISC` on each connection.
pub struct NbdBackend {
    /// The URI without the `nbd:` prefix.
    uri: String,
    info: NbdExportInfo,
    conns: Vec<Arc<Conn>>,
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
}

impl InFlight<'_> {
    fn done(r: Result<(), IoErr>) -> Self {
        InFlight {
            early: r,
            parts: Vec::new(),
            flush_after: false,
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
    m.lock().unwrap_or_else(|e| e.into_inner())
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

        let mut socks = vec![sock];
        if info.multi_conn {
            for _ in 1..opts.connections {
                // A server that cannot take more connections only costs us parallelism.
                match open_one(&parsed.target, &parsed.export, timeout) {
                    Ok((s, y)) if y == x => socks.push(s),
                    Ok((s, _)) => {
                        let _ = s.send_all(&[&proto::request(0, cmd::DISC, 0, 0, 0)]);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        let mut conns: Vec<Arc<Conn>> = Vec::with_capacity(socks.len());
        for s in socks {
            match Conn::start(label.clone(), s, opts.request_timeout) {
                Ok(c) => conns.push(c),
                Err(msg) => {
                    for c in &conns {
                        c.close();
                    }
                    return Err(with_label(IoErr::Io {
                        kind: ErrorKind::Other,
                        msg,
                    }));
                }
            }
        }
        let usable = x.size - x.size % align;
        Ok(NbdBackend {
            uri: uri.to_string(),
            info,
            conns,
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
        self.conns.len()
    }

    /// False once every connection has failed or been closed; requests then fail at once.
    pub fn is_connected(&self) -> bool {
        self.conns.iter().any(|c| !c.is_dead())
    }

    /// The next live connection, in turn (a dead one when all are dead: it fails the request).
    fn conn(&self) -> &Arc<Conn> {
        let n = self.conns.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|i| &self.conns[(start + i) % n])
            .find(|c| !c.is_dead())
            .unwrap_or(&self.conns[start % n])
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
        let flags = self.fua_flag(fua);
        for (i, d) in buf.chunks(self.chunk as usize).enumerate() {
            let o = off + i as u64 * self.chunk;
            let t = self.conn().send(cmd::WRITE, flags, o, d.len() as u32, d);
            f.parts.push((t, None));
        }
        f.flush_after = self.flush_after(fua);
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
        parts.push(match self.conns.len() {
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
        self.conn().send(cmd::FLUSH, 0, 0, 0, &[]).wait().map(drop)
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
        for c in &self.conns {
            c.close();
        }
    }
}
