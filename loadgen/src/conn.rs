//! An NBD client connection: the fixed-newstyle handshake (`NBD_OPT_GO`, falling back to
//! `NBD_OPT_EXPORT_NAME`) and simple (unstructured) replies.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::{Error, Target};
use tiercache_nbd_proto::{SimpleReply, client};

pub(crate) use tiercache_nbd_proto::{SIMPLE_REPLY_MAGIC, cmd, request as encode_request};

/// Transmission flags the server advertises (`NBD_FLAG_*`).
pub mod flags {
    pub use tiercache_nbd_proto::tflag::*;
}

pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(crate) fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(nb),
            Stream::Tcp(s) => s.set_nonblocking(nb),
        }
    }
    fn set_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t).and(s.set_write_timeout(t)),
            Stream::Tcp(s) => s.set_read_timeout(t).and(s.set_write_timeout(t)),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One NBD connection in transmission phase, with blocking one-at-a-time calls (the load
/// generator itself pipelines; this is for setup, checks and tests).
pub struct Connection {
    pub(crate) stream: Stream,
    size: u64,
    flags: u16,
    next_handle: u64,
}

impl Connection {
    /// Connects and negotiates the target's export.
    pub fn connect(target: &Target) -> Result<Connection, Error> {
        let stream = match target {
            Target::Unix { socket, .. } => Stream::Unix(UnixStream::connect(socket)?),
            Target::Tcp { host, port, .. } => {
                let s = TcpStream::connect((host.as_str(), *port))?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        };
        let mut c = Connection {
            stream,
            size: 0,
            flags: 0,
            next_handle: 1,
        };
        c.handshake(target.export())?;
        Ok(c)
    }

    /// The handshake (`tiercache-nbd-proto`'s): fixed newstyle only, `NBD_OPT_GO` asking for no
    /// block sizes (so that any alignment is served), `NBD_OPT_EXPORT_NAME` for a server
    /// without it.
    fn handshake(&mut self, export: &str) -> Result<(), Error> {
        let wants = client::Wants {
            block_sizes: false,
            fixed_newstyle: true,
        };
        let x = client::handshake(&mut self.stream, export, wants).map_err(|e| {
            if e.socket {
                Error::Io(io::Error::new(e.kind, e.msg))
            } else {
                Error::Protocol(e.msg)
            }
        })?;
        self.size = x.size;
        self.flags = x.flags;
        Ok(())
    }

    /// The export's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The transmission flags (see [`flags`]).
    pub fn flags(&self) -> u16 {
        self.flags
    }

    fn call(&mut self, cmd: u16, fl: u16, offset: u64, len: u32, data: &[u8]) -> Result<(), Error> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let hdr = encode_request(cmd, fl, handle, offset, len);
        self.stream.write_all(&hdr)?;
        self.stream.write_all(data)?;
        Ok(())
    }

    fn reply(&mut self) -> Result<u32, Error> {
        let mut r = [0u8; 16];
        self.stream.read_exact(&mut r)?;
        let r = SimpleReply::decode(&r);
        if r.magic != SIMPLE_REPLY_MAGIC {
            return Err(Error::Protocol("bad reply magic".into()));
        }
        let handle = r.cookie;
        if handle != self.next_handle - 1 {
            return Err(Error::Protocol(format!(
                "reply for unknown handle {handle}"
            )));
        }
        Ok(r.error)
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.call(cmd::READ, 0, offset, buf.len() as u32, &[])?;
        match self.reply()? {
            0 => {
                self.stream.read_exact(buf)?;
                Ok(())
            }
            e => Err(Error::Nbd(e)),
        }
    }

    /// Writes `data` at `offset`, with `NBD_cmd::FLAG_FUA` when `fua`.
    pub fn write_at(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), Error> {
        let fl = if fua { cmd::FLAG_FUA } else { 0 };
        self.call(cmd::WRITE, fl, offset, data.len() as u32, data)?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// Sends `NBD_cmd::FLUSH`.
    pub fn flush(&mut self) -> Result<(), Error> {
        self.call(cmd::FLUSH, 0, 0, 0, &[])?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// Sends `NBD_cmd::TRIM` for `len` bytes at `offset`.
    pub fn trim(&mut self, offset: u64, len: u32) -> Result<(), Error> {
        self.call(cmd::TRIM, 0, offset, len, &[])?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// Sends `NBD_cmd::WRITE_ZEROES` for `len` bytes at `offset`, with `NBD_cmd::FLAG_FUA` when
    /// `fua`.
    pub fn write_zeroes(&mut self, offset: u64, len: u32, fua: bool) -> Result<(), Error> {
        let fl = if fua { cmd::FLAG_FUA } else { 0 };
        self.call(cmd::WRITE_ZEROES, fl, offset, len, &[])?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// A limit for each send and each wait for a reply (`None`: wait for ever, the default). A
    /// call that exceeds it fails with an [`Error::Io`] of kind `WouldBlock` or `TimedOut`, and
    /// the connection is then out of step: close it.
    pub fn set_timeout(&self, t: Option<std::time::Duration>) -> Result<(), Error> {
        Ok(self.stream.set_timeout(t)?)
    }

    /// Sends `NBD_cmd::CACHE` (a prefetch hint, e.g. to warm a cache) for `len` bytes at
    /// `offset`.
    pub fn cache(&mut self, offset: u64, len: u32) -> Result<(), Error> {
        self.call(cmd::CACHE, 0, offset, len, &[])?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// Sends `NBD_cmd::DISC` and closes the connection.
    pub fn close(mut self) {
        self.disconnect();
    }

    pub(crate) fn disconnect(&mut self) {
        let _ = self.stream.set_nonblocking(false);
        let hdr = encode_request(cmd::DISC, 0, 0, 0, 0);
        let _ = self.stream.write_all(&hdr);
        self.stream.shutdown();
    }
}
