//! The NBD wire protocol (the NBD project's `doc/proto.md`), written once for every tiercache
//! component that speaks it: the server (`tiercache-nbd`), the `io` crate's NBD client, the load
//! generator, the fuzz targets and the tests.
//!
//! - this module: the wire constants, the request header, simple and structured reply headers,
//!   option request/reply headers and the `NBD_OPT_INFO`/`NBD_OPT_GO` and meta-context data, each
//!   with its encoder and its parser;
//! - [`client`]: the client side of the fixed newstyle handshake (`NBD_OPT_GO`, falling back to
//!   `NBD_OPT_EXPORT_NAME`) and the meaning of NBD error values;
//! - [`uri`]: NBD URIs (`nbd://`, `nbd+unix://`).
//!
//! No dependency on the rest of tiercache (nor on anything outside std). The small codecs the
//! server runs per request (request decode, reply headers) are `#[inline]`, as they were when
//! they lived in the server's crate.

pub mod client;
pub mod uri;

/// `NBDMAGIC`: the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: sent by the server after `NBDMAGIC`, and by the client before every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The oldstyle negotiation's magic (after `NBDMAGIC`), which no tiercache component speaks.
pub const OLDSTYLE_MAGIC: u64 = 0x0000_4202_8186_1253;
/// Magic of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: the server speaks fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle (required here).
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: omit the 124 zero bytes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Options (`NBD_OPT_*`).
pub mod opt {
    /// Choose an export and enter transmission (no error replies possible).
    pub const EXPORT_NAME: u32 = 1;
    /// End the handshake.
    pub const ABORT: u32 = 2;
    /// List the exports.
    pub const LIST: u32 = 3;
    /// Upgrade to TLS.
    pub const STARTTLS: u32 = 5;
    /// Describe an export.
    pub const INFO: u32 = 6;
    /// Describe an export and enter transmission.
    pub const GO: u32 = 7;
    /// Use structured replies in transmission.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List the metadata contexts of an export.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Select metadata contexts for `NBD_CMD_BLOCK_STATUS`.
    pub const SET_META_CONTEXT: u32 = 10;
}

/// The one metadata context served: holes and zeros (`NBD_CMD_BLOCK_STATUS`).
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Its context id (any value the server chooses; sent in `NBD_REP_META_CONTEXT`).
pub const BASE_ALLOCATION_ID: u32 = 1;

/// `base:allocation` status flags (`NBD_STATE_*`).
pub mod state {
    /// Not allocated.
    pub const HOLE: u32 = 1 << 0;
    /// Reads as zeros.
    pub const ZERO: u32 = 1 << 1;
}

/// Option reply types (`NBD_REP_*`).
pub mod rep {
    /// The option is done (or the list is complete).
    pub const ACK: u32 = 1;
    /// One export of `NBD_OPT_LIST`.
    pub const SERVER: u32 = 2;
    /// One piece of information of `NBD_OPT_INFO`/`NBD_OPT_GO`.
    pub const INFO: u32 = 3;
    /// One metadata context of `NBD_OPT_LIST_META_CONTEXT`/`NBD_OPT_SET_META_CONTEXT`.
    pub const META_CONTEXT: u32 = 4;
    /// Bit set in every error reply.
    pub const ERR: u32 = 1 << 31;
    /// Unknown option.
    pub const ERR_UNSUP: u32 = ERR | 1;
    /// Known option forbidden by policy.
    pub const ERR_POLICY: u32 = ERR | 2;
    /// Syntactically invalid option.
    pub const ERR_INVALID: u32 = ERR | 3;
    /// Unsupported on the server's platform.
    pub const ERR_PLATFORM: u32 = ERR | 4;
    /// TLS required first.
    pub const ERR_TLS_REQD: u32 = ERR | 5;
    /// The export is not available.
    pub const ERR_UNKNOWN: u32 = ERR | 6;
    /// The server is shutting down.
    pub const ERR_SHUTDOWN: u32 = ERR | 7;
    /// The server requires block size negotiation.
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERR | 8;
    /// The request or the reply is too large.
    pub const ERR_TOO_BIG: u32 = ERR | 9;
}

/// Information types of `NBD_REP_INFO` (`NBD_INFO_*`).
pub mod info {
    /// Size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// The export's name.
    pub const NAME: u16 = 1;
    /// A human-readable description.
    pub const DESCRIPTION: u16 = 2;
    /// Minimum, preferred and maximum block sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags (`NBD_FLAG_*`).
pub mod tflag {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
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
    /// `NBD_CMD_FLAG_DF` is honoured on reads (sent only with structured replies).
    pub const SEND_DF: u16 = 1 << 7;
    /// Flush and FUA act across every connection to the export.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_CMD_CACHE` is supported.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// `NBD_CMD_FLAG_FAST_ZERO` is supported.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Commands (`NBD_CMD_*`) and command flags.
pub mod cmd {
    /// Read.
    pub const READ: u16 = 0;
    /// Write (with a payload).
    pub const WRITE: u16 = 1;
    /// Disconnect (no reply).
    pub const DISC: u16 = 2;
    /// Flush.
    pub const FLUSH: u16 = 3;
    /// Discard.
    pub const TRIM: u16 = 4;
    /// Prefetch (a read whose data is not sent).
    pub const CACHE: u16 = 5;
    /// Write zeros.
    pub const WRITE_ZEROES: u16 = 6;
    /// Block status (holes and zeros) of a range, for the negotiated metadata context.
    pub const BLOCK_STATUS: u16 = 7;
    /// Command flag: force unit access.
    pub const FLAG_FUA: u16 = 1 << 0;
    /// Command flag: write zeros, do not punch a hole.
    pub const FLAG_NO_HOLE: u16 = 1 << 1;
    /// Command flag: do not fragment the reply.
    pub const FLAG_DF: u16 = 1 << 2;
    /// Command flag: one extent only (block status).
    pub const FLAG_REQ_ONE: u16 = 1 << 3;
    /// Command flag: fail with `ENOTSUP` unless the zeroing is fast.
    pub const FLAG_FAST_ZERO: u16 = 1 << 4;
    /// Every command flag the protocol defines (and tiercache's server knows).
    pub const FLAGS_KNOWN: u16 = FLAG_FUA | FLAG_NO_HOLE | FLAG_DF | FLAG_REQ_ONE | FLAG_FAST_ZERO;

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

/// Structured reply chunk types and flags.
pub mod reply {
    /// Chunk flag: the last chunk of the reply.
    pub const FLAG_DONE: u16 = 1 << 0;
    /// No payload.
    pub const TYPE_NONE: u16 = 0;
    /// Offset, then data.
    pub const TYPE_OFFSET_DATA: u16 = 1;
    /// Context id, then (length, status flags) descriptors.
    pub const TYPE_BLOCK_STATUS: u16 = 5;
    /// Error: errno, message length, message.
    pub const TYPE_ERROR: u16 = (1 << 15) | 1;
}

/// NBD error values (as sent on the wire; equal to Linux errno values).
pub mod errno {
    /// Operation not permitted (write to a read-only export).
    pub const EPERM: u32 = 1;
    /// Input/output error.
    pub const EIO: u32 = 5;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space left (write past the end).
    pub const ENOSPC: u32 = 28;
    /// Value too large.
    pub const EOVERFLOW: u32 = 75;
    /// Not supported.
    pub const ENOTSUP: u32 = 95;
    /// The server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// Size of a transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Largest option payload accepted during the handshake; a longer one ends the connection.
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// Longest string (export name, description, message) the protocol allows.
pub const MAX_STRING: usize = 4096;

/// An option reply header followed by `data`.
pub fn option_reply(option: u32, typ: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + data.len());
    v.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&typ.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// A simple reply header.
#[inline]
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h
}

/// A structured reply chunk header for a payload of `len` bytes.
#[inline]
pub fn structured_header(flags: u16, typ: u16, cookie: u64, len: u32) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&typ.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..20].copy_from_slice(&len.to_be_bytes());
    h
}

/// A parsed transmission request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Command flags.
    pub flags: u16,
    /// Command type.
    pub typ: u16,
    /// The client's cookie (handle), echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length.
    pub len: u32,
}

impl Request {
    /// Encodes the header a client sends for this request (the inverse of [`Request::decode`]).
    #[inline]
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut h = [0u8; REQUEST_LEN];
        h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&self.flags.to_be_bytes());
        h[6..8].copy_from_slice(&self.typ.to_be_bytes());
        h[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        h[16..24].copy_from_slice(&self.offset.to_be_bytes());
        h[24..28].copy_from_slice(&self.len.to_be_bytes());
        h
    }

    /// The data bytes the request moves (a READ's reply data, a WRITE's payload); 0 for the
    /// others. The in-flight byte bound counts these.
    #[inline]
    pub fn data_bytes(&self) -> usize {
        match self.typ {
            cmd::READ | cmd::WRITE => self.len as usize,
            _ => 0,
        }
    }

    /// Decodes a request header; `None` if the magic is wrong (the connection is then closed).
    #[inline]
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Option<Request> {
        let u32at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u16at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u64at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        if u32at(0) != REQUEST_MAGIC {
            return None;
        }
        Some(Request {
            flags: u16at(4),
            typ: u16at(6),
            cookie: u64at(8),
            offset: u64at(16),
            len: u32at(24),
        })
    }
}

/// The header a client sends for a request of command `typ` ([`Request::encode`] of these
/// fields).
#[inline]
pub fn request(typ: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> [u8; REQUEST_LEN] {
    let r = Request {
        flags,
        typ,
        cookie,
        offset,
        len,
    };
    r.encode()
}

/// Parses `NBD_OPT_INFO`/`NBD_OPT_GO` data: name length, name, count, info types. `None` if it
/// is malformed (the option is answered `NBD_REP_ERR_INVALID`).
pub fn parse_info_request(d: &[u8]) -> Option<(String, Vec<u16>)> {
    let nlen = u32::from_be_bytes(d.get(0..4)?.try_into().ok()?) as usize;
    if nlen > MAX_STRING {
        return None;
    }
    let name = std::str::from_utf8(d.get(4..4 + nlen)?).ok()?.to_string();
    let rest = &d[4 + nlen..];
    let n = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
    if rest.len() != 2 + 2 * n {
        return None;
    }
    let infos = rest[2..]
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Some((name, infos))
}

/// Encodes `NBD_OPT_INFO`/`NBD_OPT_GO` data as a client sends it (the inverse of
/// [`parse_info_request`] for a name of at most [`MAX_STRING`] bytes and at most 65535 types).
pub fn encode_info_request(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = Vec::with_capacity(6 + name.len() + 2 * infos.len());
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// Parses `NBD_OPT_LIST_META_CONTEXT`/`NBD_OPT_SET_META_CONTEXT` data: export name length,
/// name, query count, queries (each a length and a string). `None` if it is malformed (the
/// option is answered `NBD_REP_ERR_INVALID`).
pub fn parse_meta_request(d: &[u8]) -> Option<(String, Vec<String>)> {
    let string = |d: &[u8]| -> Option<(String, usize)> {
        let n = u32::from_be_bytes(d.get(0..4)?.try_into().ok()?) as usize;
        if n > MAX_STRING {
            return None;
        }
        let s = std::str::from_utf8(d.get(4..4 + n)?).ok()?.to_string();
        Some((s, 4 + n))
    };
    let (name, mut at) = string(d)?;
    let n = u32::from_be_bytes(d.get(at..at + 4)?.try_into().ok()?);
    at += 4;
    let mut queries = Vec::new();
    for _ in 0..n {
        let (q, used) = string(d.get(at..)?)?;
        queries.push(q);
        at += used;
    }
    (at == d.len()).then_some((name, queries))
}

/// Encodes `NBD_OPT_LIST_META_CONTEXT`/`NBD_OPT_SET_META_CONTEXT` data as a client sends it
/// (the inverse of [`parse_meta_request`]).
pub fn encode_meta_request(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// The server's greeting: `NBDMAGIC`, `IHAVEOPT` and the handshake flags `hflags`.
pub fn greeting(hflags: u16) -> [u8; 18] {
    let mut g = [0u8; 18];
    g[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    g[16..18].copy_from_slice(&hflags.to_be_bytes());
    g
}

/// An option request as a client sends it: `IHAVEOPT`, the option, the data's length, `data`.
pub fn option_request(option: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + data.len());
    v.extend_from_slice(&IHAVEOPT.to_be_bytes());
    v.extend_from_slice(&option.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// Decodes an option request header: `(option, data length)`; `None` if the magic is not
/// `IHAVEOPT` (the inverse of the first 16 bytes of [`option_request`]).
pub fn parse_option_header(h: &[u8; 16]) -> Option<(u32, u32)> {
    (be64(&h[0..8]) == IHAVEOPT).then(|| (be32(&h[8..12]), be32(&h[12..16])))
}

/// A decoded option reply header (the 20 bytes before its data, see [`option_reply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// Should be [`OPT_REPLY_MAGIC`].
    pub magic: u64,
    /// The option it answers.
    pub option: u32,
    /// The reply type (`NBD_REP_*`, [`rep`]).
    pub typ: u32,
    /// Length of the data that follows.
    pub len: u32,
}

impl OptionReplyHeader {
    /// Decodes the header (any magic: the caller checks it).
    #[inline]
    pub fn decode(h: &[u8; 20]) -> OptionReplyHeader {
        OptionReplyHeader {
            magic: be64(&h[0..8]),
            option: be32(&h[8..12]),
            typ: be32(&h[12..16]),
            len: be32(&h[16..20]),
        }
    }
}

/// A decoded simple reply header (see [`simple_reply`]); its first 4 bytes also tell a
/// structured reply chunk (magic [`STRUCTURED_REPLY_MAGIC`]) apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReply {
    /// Should be [`SIMPLE_REPLY_MAGIC`].
    pub magic: u32,
    /// The NBD error value (0: success).
    pub error: u32,
    /// The request's cookie.
    pub cookie: u64,
}

impl SimpleReply {
    /// Decodes the header (any magic: the caller checks it).
    #[inline]
    pub fn decode(h: &[u8; 16]) -> SimpleReply {
        SimpleReply {
            magic: be32(&h[0..4]),
            error: be32(&h[4..8]),
            cookie: be64(&h[8..16]),
        }
    }
}

/// A decoded structured reply chunk header (see [`structured_header`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StructuredHeader {
    /// Should be [`STRUCTURED_REPLY_MAGIC`].
    pub magic: u32,
    /// Chunk flags ([`reply::FLAG_DONE`]).
    pub flags: u16,
    /// Chunk type (`reply::TYPE_*`).
    pub typ: u16,
    /// The request's cookie.
    pub cookie: u64,
    /// Length of the payload that follows.
    pub len: u32,
}

impl StructuredHeader {
    /// Decodes the header (any magic: the caller checks it).
    #[inline]
    pub fn decode(h: &[u8; 20]) -> StructuredHeader {
        StructuredHeader {
            magic: be32(&h[0..4]),
            flags: u16::from_be_bytes([h[4], h[5]]),
            typ: u16::from_be_bytes([h[6], h[7]]),
            cookie: be64(&h[8..16]),
            len: be32(&h[16..20]),
        }
    }
}

/// `NBD_REP_INFO` data of `NBD_INFO_EXPORT`: the type, the export size, the transmission flags.
pub fn info_export(size: u64, flags: u16) -> [u8; 12] {
    let mut d = [0u8; 12];
    d[0..2].copy_from_slice(&info::EXPORT.to_be_bytes());
    d[2..10].copy_from_slice(&size.to_be_bytes());
    d[10..12].copy_from_slice(&flags.to_be_bytes());
    d
}

/// `NBD_REP_INFO` data of `NBD_INFO_BLOCK_SIZE`: the type, the minimum, preferred and maximum
/// block sizes.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> [u8; 14] {
    let mut d = [0u8; 14];
    d[0..2].copy_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    d[2..6].copy_from_slice(&min.to_be_bytes());
    d[6..10].copy_from_slice(&preferred.to_be_bytes());
    d[10..14].copy_from_slice(&max.to_be_bytes());
    d
}

/// An in-memory stream to run either side of a handshake on (the unit tests and the fuzz
/// targets): reads come from `input` (its position is what was consumed), writes collect in
/// `out`.
#[derive(Debug, Default)]
pub struct MemStream<B> {
    /// What the peer sent.
    pub input: std::io::Cursor<B>,
    /// What was written.
    pub out: Vec<u8>,
}

impl<B: AsRef<[u8]>> MemStream<B> {
    /// A stream that reads `input`.
    pub fn new(input: B) -> MemStream<B> {
        MemStream {
            input: std::io::Cursor::new(input),
            out: Vec::new(),
        }
    }
}

impl<B: AsRef<[u8]>> std::io::Read for MemStream<B> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(b)
    }
}

impl<B> std::io::Write for MemStream<B> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.out.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The big-endian `u32` at the start of `b` (which has at least 4 bytes).
#[inline]
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The big-endian `u64` at the start of `b` (which has at least 8 bytes).
#[inline]
pub fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request {
            flags: cmd::FLAG_FUA,
            typ: cmd::WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            len: 4096,
        };
        let h = r.encode();
        assert_eq!(be32(&h), REQUEST_MAGIC);
        assert_eq!(Request::decode(&h), Some(r));
        assert_eq!(r.data_bytes(), 4096);
        let mut bad = h;
        bad[0] ^= 1;
        assert_eq!(Request::decode(&bad), None);
    }

    #[test]
    fn reply_headers_round_trip() {
        let s = SimpleReply::decode(&simple_reply(errno::EIO, 77));
        assert_eq!(
            s,
            SimpleReply {
                magic: SIMPLE_REPLY_MAGIC,
                error: errno::EIO,
                cookie: 77
            }
        );
        let h = structured_header(reply::FLAG_DONE, reply::TYPE_OFFSET_DATA, 9, 520);
        assert_eq!(
            StructuredHeader::decode(&h),
            StructuredHeader {
                magic: STRUCTURED_REPLY_MAGIC,
                flags: reply::FLAG_DONE,
                typ: reply::TYPE_OFFSET_DATA,
                cookie: 9,
                len: 520
            }
        );
        let o = option_reply(opt::GO, rep::INFO, &info_export(1 << 20, tflag::HAS_FLAGS));
        let hdr = OptionReplyHeader::decode(o[..20].try_into().unwrap());
        assert_eq!(
            hdr,
            OptionReplyHeader {
                magic: OPT_REPLY_MAGIC,
                option: opt::GO,
                typ: rep::INFO,
                len: 12
            }
        );
        assert_eq!(be64(&o[22..]), 1 << 20);
    }

    #[test]
    fn option_requests_round_trip() {
        let m = option_request(opt::GO, &encode_info_request("disk", &[info::BLOCK_SIZE]));
        assert_eq!(
            parse_option_header(m[..16].try_into().unwrap()),
            Some((opt::GO, m.len() as u32 - 16))
        );
        assert_eq!(
            parse_info_request(&m[16..]),
            Some(("disk".into(), vec![info::BLOCK_SIZE]))
        );
        let mut bad: [u8; 16] = m[..16].try_into().unwrap();
        bad[7] ^= 1;
        assert_eq!(parse_option_header(&bad), None);
        let d = encode_meta_request("e", &[BASE_ALLOCATION, "qemu:"]);
        assert_eq!(
            parse_meta_request(&d),
            Some(("e".into(), vec![BASE_ALLOCATION.into(), "qemu:".into()]))
        );
        assert_eq!(parse_meta_request(&d[..d.len() - 1]), None);
        let g = greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        assert_eq!((be64(&g), be64(&g[8..])), (NBDMAGIC, IHAVEOPT));
        assert_eq!(
            info_block_size(512, 4096, 1 << 25)[..2],
            info::BLOCK_SIZE.to_be_bytes()
        );
    }

    #[test]
    fn info_request_parsing() {
        assert_eq!(
            parse_info_request(&[0, 0, 0, 1, b'a', 0, 1, 0, 3]),
            Some(("a".into(), vec![3]))
        );
        assert_eq!(
            parse_info_request(&[0, 0, 0, 0, 0, 0]),
            Some((String::new(), vec![]))
        );
        for bad in [
            &[][..],
            &[0, 0, 0, 5, b'a'],
            &[0, 0, 0, 1, b'a', 0, 2, 0, 3],
            &[0, 0, 0, 1, b'a', 0, 0, 9],
            &[0, 0, 0, 1, 0xff, 0, 0],
            &[0xff, 0xff, 0xff, 0xff, 0, 0],
        ] {
            assert_eq!(parse_info_request(bad), None, "{bad:?}");
        }
    }
}
