//! The wire protocol (NBD project's `doc/proto.md`): constants, the socket, and the fixed
//! newstyle handshake with `NBD_OPT_GO` (falling back to `NBD_OPT_EXPORT_NAME`).

use super::uri::Target;
use std::io::{self, IoSlice, Read};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub(crate) const REQUEST_MAGIC: u32 = 0x2560_9513;
pub(crate) const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub(crate) const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
const FLAG_C_NO_ZEROES: u32 = 1 << 1;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;

const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR: u32 = 1 << 31;
const REP_ERR_UNSUP: u32 = REP_ERR | 1;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags (`NBD_FLAG_*`).
pub(crate) mod tflag {
    /// The export is read-only.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_FUA` is supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// The medium is rotational.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_CMD_TRIM` is supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_CMD_WRITE_ZEROES` is supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// Several connections share one cache: flush and FUA act across them.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Commands (`NBD_CMD_*`).
pub(crate) mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const WRITE_ZEROES: u16 = 6;
    /// Command flag: force unit access.
    pub const FLAG_FUA: u16 = 1 << 0;

    /// The command's name for messages.
    pub fn name(c: u16) -> &'static str {
        match c {
            READ => "READ",
            WRITE => "WRITE",
            DISC => "DISC",
            FLUSH => "FLUSH",
            WRITE_ZEROES => "WRITE_ZEROES",
            _ => "command",
        }
    }
}

/// Largest option reply accepted during the handshake (replies are tiny; this stops a
/// misbehaving server from making us allocate gigabytes).
const MAX_OPT_REPLY: u32 = 1 << 20;

/// What the server told us about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Export {
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Minimum block size (1 when not advertised).
    pub min_block: u32,
    /// Preferred block size (4096 when not advertised).
    pub pref_block: u32,
    /// Maximum block size for READ/WRITE payloads (32 MiB when not advertised).
    pub max_block: u32,
    /// Negotiated with `NBD_OPT_GO` (else `NBD_OPT_EXPORT_NAME`).
    pub go: bool,
}

/// A connected stream socket, unix or TCP.
#[derive(Debug)]
pub(crate) enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    /// Connects to `target`; TCP tries every address `host` resolves to, each within `timeout`.
    /// The error keeps the OS error's kind and says what was tried.
    pub fn connect(target: &Target, timeout: Duration) -> io::Result<Sock> {
        let ctx = |what: String, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        match target {
            Target::Unix(p) => UnixStream::connect(p)
                .map(Sock::Unix)
                .map_err(|e| ctx(format!("connect to unix socket {}", p.display()), e)),
            Target::Tcp { host, port } => {
                let addrs = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|e| ctx(format!("resolve {host}:{port}"), e))?;
                let mut last = io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("resolve {host}:{port}: no addresses"),
                );
                for a in addrs {
                    match TcpStream::connect_timeout(&a, timeout) {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            return Ok(Sock::Tcp(s));
                        }
                        Err(e) => last = ctx(format!("connect to {a}"), e),
                    }
                }
                Err(last)
            }
        }
    }

    /// A second handle on the same socket (for the reader thread).
    pub fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Unix(s) => Sock::Unix(s.try_clone()?),
            Sock::Tcp(s) => Sock::Tcp(s.try_clone()?),
        })
    }

    /// Shuts both directions down: blocked and later reads and writes on any handle fail.
    pub fn shutdown(&self) {
        let _ = match self {
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Sets the read and write timeouts (`None`: block for ever).
    pub fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Sock::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    /// Sets the write timeout only.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Sock::Unix(s) => s.set_write_timeout(t),
            Sock::Tcp(s) => s.set_write_timeout(t),
        }
    }

    /// Sends all of `parts` in order (gathered, never raising `SIGPIPE`).
    pub fn send_all(&self, parts: &[&[u8]]) -> io::Result<()> {
        send_all(self.as_raw_fd(), parts)
    }
}

impl AsRawFd for Sock {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Sock::Unix(s) => s.as_raw_fd(),
            Sock::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(buf),
            Sock::Tcp(s) => s.read(buf),
        }
    }
}

/// `sendmsg` with `MSG_NOSIGNAL` until every byte of `parts` is sent: a peer that went away
/// gives `EPIPE` instead of killing the process with `SIGPIPE` (std's `UnixStream` writes
/// with plain `write`).
fn send_all(fd: RawFd, parts: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = rest.len().min(64);
        // SAFETY: msghdr is a plain C struct for which all-zero bytes are a valid value (null
        // pointers, zero lengths); the fields we need are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is guaranteed ABI-compatible with `struct iovec` on unix.
        msg.msg_iov = rest.as_mut_ptr().cast::<libc::iovec>();
        msg.msg_iovlen = n as _;
        // SAFETY: `fd` is an open socket borrowed from a live Sock for this call; msg_iov points
        // to `n` initialised iovecs describing slices borrowed for this call, which sendmsg only
        // reads; no control data or address is passed.
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, r as usize);
    }
    Ok(())
}

fn rd_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn rd_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn rd_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// A handshake failure: the kind to report and a one-line reason.
pub(crate) type HsErr = (io::ErrorKind, String);

/// A protocol violation (or not an NBD server at all).
fn invalid(msg: impl Into<String>) -> HsErr {
    (io::ErrorKind::InvalidData, msg.into())
}

/// Describes a handshake IO error.
fn hs_err(what: &str, e: io::Error) -> HsErr {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => (
            io::ErrorKind::ConnectionAborted,
            format!("server closed the connection during {what}"),
        ),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => (
            io::ErrorKind::TimedOut,
            format!("no answer from the server during {what} (timed out)"),
        ),
        k => (k, format!("{what}: {e}")),
    }
}

fn option(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + data.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn rep_err(t: u32) -> (io::ErrorKind, &'static str) {
    use io::ErrorKind as K;
    match t & !REP_ERR {
        1 => (K::Unsupported, "unsupported option"),
        2 => (K::PermissionDenied, "refused by server policy"),
        3 => (K::InvalidInput, "invalid option"),
        4 => (K::Unsupported, "unsupported on the server's platform"),
        5 => (
            K::PermissionDenied,
            "TLS required (not supported by this client)",
        ),
        6 => (K::NotFound, "unknown export"),
        7 => (K::ConnectionAborted, "server is shutting down"),
        8 => (K::Unsupported, "block size negotiation required"),
        9 => (K::InvalidInput, "request too big"),
        _ => (K::Other, "unknown error"),
    }
}

/// Runs the handshake on a fresh connection and selects `export`.
pub(crate) fn handshake(s: &mut Sock, export: &str) -> Result<Export, HsErr> {
    let magic = rd_u64(s).map_err(|e| hs_err("the greeting", e))?;
    if magic != NBDMAGIC {
        return Err(invalid(format!(
            "not an NBD server (greeting {magic:#018x})"
        )));
    }
    let style = rd_u64(s).map_err(|e| hs_err("the greeting", e))?;
    if style == OLDSTYLE_MAGIC {
        return Err((
            io::ErrorKind::Unsupported,
            "server uses oldstyle negotiation, which is not supported".into(),
        ));
    }
    if style != IHAVEOPT {
        return Err(invalid(format!(
            "not an NBD newstyle server (magic {style:#018x})"
        )));
    }
    let hflags = rd_u16(s).map_err(|e| hs_err("the greeting", e))?;
    let fixed = hflags & FLAG_FIXED_NEWSTYLE != 0;
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    let mut cflags = 0;
    if fixed {
        cflags |= FLAG_C_FIXED_NEWSTYLE;
    }
    if no_zeroes {
        cflags |= FLAG_C_NO_ZEROES;
    }
    s.send_all(&[&cflags.to_be_bytes()])
        .map_err(|e| hs_err("sending client flags", e))?;
    if fixed {
        if let Some(x) = opt_go(s, export)? {
            return Ok(x);
        }
    }
    // Non-fixed newstyle, or a server without NBD_OPT_GO.
    s.send_all(&[&option(OPT_EXPORT_NAME, export.as_bytes())])
        .map_err(|e| hs_err("NBD_OPT_EXPORT_NAME", e))?;
    let what = format!("NBD_OPT_EXPORT_NAME (is export '{export}' known to the server?)");
    let size = rd_u64(s).map_err(|e| hs_err(&what, e))?;
    let flags = rd_u16(s).map_err(|e| hs_err(&what, e))?;
    if !no_zeroes {
        let mut z = [0; 124];
        s.read_exact(&mut z).map_err(|e| hs_err(&what, e))?;
    }
    Ok(Export {
        size,
        flags,
        min_block: 1,
        pref_block: 4096,
        max_block: 32 << 20,
        go: false,
    })
}

/// `NBD_OPT_GO` asking for block sizes. `Ok(None)` when the server does not know the option.
fn opt_go(s: &mut Sock, export: &str) -> Result<Option<Export>, HsErr> {
    let mut data = Vec::new();
    data.extend_from_slice(&(export.len() as u32).to_be_bytes());
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    s.send_all(&[&option(OPT_GO, &data)])
        .map_err(|e| hs_err("NBD_OPT_GO", e))?;
    let mut size_flags = None;
    let mut sizes = None;
    loop {
        let err = |e| hs_err("the reply to NBD_OPT_GO", e);
        let magic = rd_u64(s).map_err(err)?;
        let opt = rd_u32(s).map_err(err)?;
        let typ = rd_u32(s).map_err(err)?;
        let len = rd_u32(s).map_err(err)?;
        if magic != OPT_REPLY_MAGIC || opt != OPT_GO {
            return Err(invalid(format!(
                "protocol error: bad option reply (magic {magic:#x}, option {opt})"
            )));
        }
        if len > MAX_OPT_REPLY {
            return Err(invalid(format!(
                "protocol error: option reply of {len} bytes"
            )));
        }
        let mut d = vec![0; len as usize];
        s.read_exact(&mut d).map_err(err)?;
        match typ {
            REP_ACK => break,
            REP_INFO if d.len() >= 2 => {
                let info = u16::from_be_bytes([d[0], d[1]]);
                let be32 = |i: usize| u32::from_be_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
                match info {
                    INFO_EXPORT if d.len() >= 12 => {
                        let size = u64::from_be_bytes(d[2..10].try_into().unwrap_or([0; 8]));
                        size_flags = Some((size, u16::from_be_bytes([d[10], d[11]])));
                    }
                    INFO_BLOCK_SIZE if d.len() >= 14 => sizes = Some((be32(2), be32(6), be32(10))),
                    INFO_EXPORT | INFO_BLOCK_SIZE => {
                        return Err(invalid(format!(
                            "protocol error: short NBD_INFO {info} reply"
                        )));
                    }
                    _ => {}
                }
            }
            REP_ERR_UNSUP => return Ok(None),
            t if t & REP_ERR != 0 => {
                let msg = String::from_utf8_lossy(&d).replace(['\n', '\r'], " ");
                let msg = msg.trim();
                let sep = if msg.is_empty() { "" } else { ": " };
                let (kind, name) = rep_err(t);
                return Err((
                    kind,
                    format!("server refused export '{export}': {name}{sep}{msg}"),
                ));
            }
            _ => {} // unknown non-error replies are ignored
        }
    }
    let Some((size, flags)) = size_flags else {
        return Err(invalid(
            "protocol error: NBD_OPT_GO acknowledged without NBD_INFO_EXPORT",
        ));
    };
    let (min_block, pref_block, max_block) = sizes.unwrap_or((1, 4096, 32 << 20));
    let pow2 = |v: u32| v.is_power_of_two();
    if !pow2(min_block) || min_block > 65536 || max_block < min_block || max_block % min_block != 0
    {
        return Err(invalid(format!(
            "server advertised impossible block sizes (min {min_block}, preferred \
             {pref_block}, max {max_block})"
        )));
    }
    Ok(Some(Export {
        size,
        flags,
        min_block,
        pref_block,
        max_block,
        go: true,
    }))
}

/// The 28-byte request header.
pub(crate) fn request(flags: u16, command: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&command.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&len.to_be_bytes());
    h
}

/// The `io::ErrorKind` and name of an NBD error value (`NBD_E*`, errno numbers on Linux).
pub(crate) fn errno(e: u32) -> (io::ErrorKind, &'static str) {
    use io::ErrorKind as K;
    match e {
        1 => (K::PermissionDenied, "EPERM"),
        5 => (K::Other, "EIO"),
        12 => (K::OutOfMemory, "ENOMEM"),
        22 => (K::InvalidInput, "EINVAL"),
        28 => (K::StorageFull, "ENOSPC"),
        75 => (K::InvalidInput, "EOVERFLOW"),
        95 => (K::Unsupported, "ENOTSUP"),
        108 => (K::ConnectionAborted, "ESHUTDOWN"),
        _ => (K::Other, "unknown NBD error"),
    }
}
