//! The socket, and the wire protocol as this client uses it: the constants, codecs and the fixed
//! newstyle handshake (`NBD_OPT_GO` asking for block sizes, falling back to
//! `NBD_OPT_EXPORT_NAME`) come from `tiercache-nbd-proto`.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;
use tiercache_nbd_proto::client;
use tiercache_nbd_proto::uri::Target;

pub(crate) use tiercache_nbd_proto::client::{Export, errno};
pub(crate) use tiercache_nbd_proto::{
    SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC, cmd, request, tflag,
};

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

/// Writes go through [`Sock::send_all`] (whole, never raising `SIGPIPE`).
impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send_all(&[buf])?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

/// A handshake failure: the kind to report and a one-line reason.
pub(crate) type HsErr = (io::ErrorKind, String);

/// Runs the handshake on a fresh connection and selects `export`, asking for block sizes (and
/// going to `NBD_OPT_EXPORT_NAME` with a server that is not fixed newstyle).
pub(crate) fn handshake(s: &mut Sock, export: &str) -> Result<Export, HsErr> {
    let wants = client::Wants {
        block_sizes: true,
        fixed_newstyle: false,
    };
    client::handshake(s, export, wants).map_err(|e| (e.kind, e.msg))
}
