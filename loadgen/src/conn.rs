//! An NBD client connection: the fixed-newstyle handshake (`NBD_OPT_GO`, falling back to
//! `NBD_OPT_EXPORT_NAME`) and simple (unstructured) replies.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::{Error, Target};

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub(crate) const REQUEST_MAGIC: u32 = 0x2560_9513;
pub(crate) const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
const INFO_EXPORT: u16 = 0;

/// `NBD_CMD_READ`.
pub(crate) const CMD_READ: u16 = 0;
/// `NBD_CMD_WRITE`.
pub(crate) const CMD_WRITE: u16 = 1;
/// `NBD_CMD_DISC`.
pub(crate) const CMD_DISC: u16 = 2;
/// `NBD_CMD_FLUSH`.
pub(crate) const CMD_FLUSH: u16 = 3;
/// `NBD_CMD_TRIM`.
const CMD_TRIM: u16 = 4;
/// `NBD_CMD_CACHE`.
const CMD_CACHE: u16 = 5;
/// `NBD_CMD_WRITE_ZEROES`.
const CMD_WRITE_ZEROES: u16 = 6;
/// `NBD_CMD_FLAG_FUA`.
pub(crate) const CMD_FLAG_FUA: u16 = 1;

/// Transmission flags the server advertises (`NBD_FLAG_*`).
pub mod flags {
    /// The server sent transmission flags.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// The export is read-only.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is supported.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_FUA` is supported.
    pub const SEND_FUA: u16 = 1 << 3;
    /// `NBD_CMD_TRIM` is supported.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_CMD_WRITE_ZEROES` is supported.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// Several connections see each other's writes (`NBD_FLAG_CAN_MULTI_CONN`).
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_CMD_CACHE` is supported.
    pub const SEND_CACHE: u16 = 1 << 10;
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

fn read_u16(s: &mut impl Read) -> io::Result<u16> {
    let mut b = [0; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(s: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Encodes a 28-byte transmission request header.
pub(crate) fn encode_request(cmd: u16, flags: u16, handle: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&cmd.to_be_bytes());
    h[8..16].copy_from_slice(&handle.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&len.to_be_bytes());
    h
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

    fn handshake(&mut self, export: &str) -> Result<(), Error> {
        let s = &mut self.stream;
        if read_u64(s)? != NBDMAGIC {
            return Err(Error::Protocol("not an NBD server (no NBDMAGIC)".into()));
        }
        if read_u64(s)? != IHAVEOPT {
            return Err(Error::Protocol(
                "server does not speak newstyle (no IHAVEOPT)".into(),
            ));
        }
        let hflags = read_u16(s)?;
        if hflags & 1 == 0 {
            return Err(Error::Protocol(
                "server does not speak fixed newstyle".into(),
            ));
        }
        let no_zeroes = hflags & 2 != 0;
        let cflags: u32 = 1 | if no_zeroes { 2 } else { 0 };
        s.write_all(&cflags.to_be_bytes())?;

        // NBD_OPT_GO: u32 name length, name, u16 number of info requests (0).
        let name = export.as_bytes();
        let mut msg = Vec::with_capacity(16 + 6 + name.len());
        msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&OPT_GO.to_be_bytes());
        msg.extend_from_slice(&(4 + name.len() as u32 + 2).to_be_bytes());
        msg.extend_from_slice(&(name.len() as u32).to_be_bytes());
        msg.extend_from_slice(name);
        msg.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&msg)?;
        let mut got_export = false;
        loop {
            if read_u64(s)? != OPT_REPLY_MAGIC {
                return Err(Error::Protocol("bad option reply magic".into()));
            }
            let _opt = read_u32(s)?;
            let rtype = read_u32(s)?;
            let len = read_u32(s)? as usize;
            if len > 1 << 20 {
                return Err(Error::Protocol(format!("option reply of {len} bytes")));
            }
            let mut data = vec![0u8; len];
            s.read_exact(&mut data)?;
            match rtype {
                REP_ACK => break,
                REP_INFO if len >= 12 && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT => {
                    self.size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                    self.flags = u16::from_be_bytes([data[10], data[11]]);
                    got_export = true;
                }
                REP_ERR_UNSUP => {
                    // An old server: fall back to NBD_OPT_EXPORT_NAME.
                    let mut msg = Vec::new();
                    msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
                    msg.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
                    msg.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    msg.extend_from_slice(name);
                    s.write_all(&msg)?;
                    self.size = read_u64(s)?;
                    self.flags = read_u16(s)?;
                    if !no_zeroes {
                        let mut z = [0u8; 124];
                        s.read_exact(&mut z)?;
                    }
                    return Ok(());
                }
                t if t & (1 << 31) != 0 => {
                    let msg = String::from_utf8_lossy(&data).into_owned();
                    return Err(Error::Protocol(format!(
                        "server refused export {export:?} (reply type {:#x}): {msg}",
                        t
                    )));
                }
                _ => {}
            }
        }
        if !got_export {
            return Err(Error::Protocol(
                "NBD_OPT_GO acknowledged without NBD_INFO_EXPORT".into(),
            ));
        }
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
        if u32::from_be_bytes(r[0..4].try_into().unwrap()) != SIMPLE_REPLY_MAGIC {
            return Err(Error::Protocol("bad reply magic".into()));
        }
        let handle = u64::from_be_bytes(r[8..16].try_into().unwrap());
        if handle != self.next_handle - 1 {
            return Err(Error::Protocol(format!(
                "reply for unknown handle {handle}"
            )));
        }
        Ok(u32::from_be_bytes(r[4..8].try_into().unwrap()))
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.call(CMD_READ, 0, offset, buf.len() as u32, &[])?;
        match self.reply()? {
            0 => {
                self.stream.read_exact(buf)?;
                Ok(())
            }
            e => Err(Error::Nbd(e)),
        }
    }

    /// Writes `data` at `offset`, with `NBD_CMD_FLAG_FUA` when `fua`.
    pub fn write_at(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), Error> {
        let fl = if fua { CMD_FLAG_FUA } else { 0 };
        self.call(CMD_WRITE, fl, offset, data.len() as u32, data)?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// Sends `NBD_CMD_FLUSH`.
    pub fn flush(&mut self) -> Result<(), Error> {
        self.call(CMD_FLUSH, 0, 0, 0, &[])?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// Sends `NBD_CMD_TRIM` for `len` bytes at `offset`.
    pub fn trim(&mut self, offset: u64, len: u32) -> Result<(), Error> {
        self.call(CMD_TRIM, 0, offset, len, &[])?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// Sends `NBD_CMD_WRITE_ZEROES` for `len` bytes at `offset`, with `NBD_CMD_FLAG_FUA` when
    /// `fua`.
    pub fn write_zeroes(&mut self, offset: u64, len: u32, fua: bool) -> Result<(), Error> {
        let fl = if fua { CMD_FLAG_FUA } else { 0 };
        self.call(CMD_WRITE_ZEROES, fl, offset, len, &[])?;
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

    /// Sends `NBD_CMD_CACHE` (a prefetch hint, e.g. to warm a cache) for `len` bytes at
    /// `offset`.
    pub fn cache(&mut self, offset: u64, len: u32) -> Result<(), Error> {
        self.call(CMD_CACHE, 0, offset, len, &[])?;
        match self.reply()? {
            0 => Ok(()),
            e => Err(Error::Nbd(e)),
        }
    }

    /// Sends `NBD_CMD_DISC` and closes the connection.
    pub fn close(mut self) {
        self.disconnect();
    }

    pub(crate) fn disconnect(&mut self) {
        let _ = self.stream.set_nonblocking(false);
        let hdr = encode_request(CMD_DISC, 0, 0, 0, 0);
        let _ = self.stream.write_all(&hdr);
        self.stream.shutdown();
    }
}
