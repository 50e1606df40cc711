//! The NBD server (`tiercache-nbd`): option haggling, transmission requests, and both through
//! the real server over a socket pair.
//!
//! - `nbd_options`: the client's bytes of the fixed newstyle handshake fed to
//!   [`serve_handshake`] (the code every connection runs) on an in-memory stream. The server's
//!   answer is checked against the client's options: the greeting, then for each option in
//!   order a run of replies that echo it and end in `ACK` or an error (none for
//!   `NBD_OPT_EXPORT_NAME`, which answers with the export's size and flags), the export
//!   information right for the export named, and nothing after the end. `NBD_OPT_INFO`/`GO`
//!   data that parses re-encodes to the same bytes.
//! - `nbd_requests`: transmission bytes for one export geometry, parsed as the connection's
//!   reader does (28-byte headers, WRITE payloads, refused WRITE payloads skipped, `DISC`, a bad
//!   magic ends it). Every header re-encodes byte for byte, and [`Request::check`]'s verdict
//!   (`EINVAL`/`ENOSPC`/`EPERM` or accepted) must equal an evaluator written from the protocol
//!   rules in `nbd/src/lib.rs`.
//! - `nbd_session`: the whole client stream sent to a real [`Server`] over a unix socket pair
//!   (reader thread, worker pool, structured or simple replies). What comes back must be the
//!   in-memory handshake's bytes, then exactly one well-formed reply per request the reader
//!   model expects (any order), with the expected error or data length — and the connection
//!   must end (no hang) once the client stops sending.

use crate::mutate::{Field, Rng, Sample};
use crate::round_trip_checked;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tiercache_io::RamBackend;
use tiercache_nbd::proto::{
    self, IHAVEOPT, MAX_OPTION_LEN, MAX_STRING, MemStream, OPT_REPLY_MAGIC, OptionReplyHeader,
    REQUEST_LEN, Request, RequestChecks, SimpleReply, StructuredHeader, be32, be64, cmd, errno,
    info, opt, rep, reply,
};
use tiercache_nbd::{
    BackendExport, BlockSizes, Export, ExportError, ExportMap, Exports, ReadStart, Server,
    ServerConfig, serve_handshake,
};

// ===== the exports every NBD target sees =====

/// A RAM export with chosen block sizes and read-only flag.
struct Shaped {
    inner: BackendExport,
    sizes: BlockSizes,
    read_only: bool,
}

impl Export for Shaped {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_sizes(&self) -> BlockSizes {
        self.sizes
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.inner.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.inner.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        self.inner.write_zeroes(offset, len, fua)
    }
    fn cache(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        self.inner.cache(offset, len)
    }
    /// Every way a read can go, by offset: answered by the connection's reader, started there
    /// and finished by a worker, or left to a worker.
    fn read_start(&self, offset: u64, mut buf: tiercache_io::AlignedBuf) -> ReadStart {
        match (offset / 512) % 3 {
            0 => {
                let r = self.inner.read(offset, &mut buf);
                ReadStart::Done((r, buf))
            }
            1 => {
                let inner = BackendExport::new(self.inner.device().clone());
                ReadStart::Pending(Box::new(move || {
                    let r = inner.read(offset, &mut buf);
                    (r, buf)
                }))
            }
            _ => ReadStart::NotStarted(buf),
        }
    }
}

/// (name, blocks, block sizes, read-only) of the served exports.
const SERVED: [(&str, u64, BlockSizes, bool); 4] = [
    (
        "a",
        64,
        BlockSizes {
            min: 512,
            preferred: 4096,
            max: tiercache_nbd::MAX_BLOCK,
        },
        false,
    ),
    (
        "ro",
        16,
        BlockSizes {
            min: 512,
            preferred: 4096,
            max: tiercache_nbd::MAX_BLOCK,
        },
        true,
    ),
    (
        "big4k",
        256,
        BlockSizes {
            min: 4096,
            preferred: 4096,
            max: 65536,
        },
        false,
    ),
    (
        "",
        8,
        BlockSizes {
            min: 512,
            preferred: 512,
            max: 4096,
        },
        false,
    ),
];

/// A listed export that is not served.
const REFUSED: &str = "gone";

fn exports() -> &'static Arc<ExportMap> {
    static M: OnceLock<Arc<ExportMap>> = OnceLock::new();
    M.get_or_init(|| {
        let m = ExportMap::new();
        for (name, blocks, sizes, read_only) in SERVED {
            m.insert(
                name,
                &format!("export {name:?}"),
                Arc::new(Shaped {
                    inner: BackendExport::new(Arc::new(RamBackend::new(blocks))),
                    sizes,
                    read_only,
                }),
            );
        }
        m.refuse(
            REFUSED,
            "a core whose cache is missing",
            "cache device missing: not served",
        );
        Arc::new(m)
    })
}

fn served(name: &str) -> Option<(u64, BlockSizes, bool)> {
    SERVED
        .iter()
        .find(|e| e.0 == name)
        .map(|&(_, b, s, r)| (b * 512, s, r))
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

// ===== option haggling =====

/// The handshake as the server must answer it, checked against its output; returns whether
/// transmission began and the handshake's result.
struct HandshakeRun {
    out: Vec<u8>,
    consumed: usize,
    result: Option<tiercache_nbd::Handshake>,
}

fn run_handshake(data: &[u8]) -> HandshakeRun {
    let mut m = MemStream::new(data);
    let r = serve_handshake(&mut m, &**exports());
    let result = match r {
        Ok(x) => x,
        Err(e) => {
            // The only IO error an in-memory stream gives: the input ended.
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
            None
        }
    };
    let run = HandshakeRun {
        out: m.out,
        consumed: m.input.position() as usize,
        result,
    };
    check_handshake(data, &run);
    run
}

/// Replays the client's options against the server's output.
fn check_handshake(input: &[u8], run: &HandshakeRun) {
    let out = &run.out[..];
    let hello = proto::greeting(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES);
    assert_eq!(out.get(..18), Some(&hello[..]), "greeting");
    let mut o = 18; // position in the output
    let fail = |what: String| -> ! { panic!("NBD handshake: {what}") };
    let end = |o: usize, result_expected: bool| {
        assert_eq!(o, out.len(), "bytes after the end of the handshake");
        assert_eq!(run.result.is_some(), result_expected, "handshake result");
    };
    if input.len() < 4 {
        return end(o, false);
    }
    let cflags = be32(input);
    if cflags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0
        || cflags & proto::FLAG_C_FIXED_NEWSTYLE == 0
    {
        return end(o, false);
    }
    let no_zeroes = cflags & proto::FLAG_C_NO_ZEROES != 0;
    let mut structured = false;
    // The export `base:allocation` was selected for (NBD_OPT_SET_META_CONTEXT).
    let mut meta: Option<String> = None;
    let mut i = 4; // position in the input
    let replies = |o: &mut usize, code: u32| -> Vec<(u32, Vec<u8>)> {
        let mut v = Vec::new();
        loop {
            let Some(h) = out.get(*o..*o + 20) else {
                fail(format!("option {code}: reply truncated at output byte {o}"));
            };
            let h = OptionReplyHeader::decode(h.try_into().expect("20 bytes"));
            assert_eq!(h.magic, OPT_REPLY_MAGIC, "option reply magic");
            assert_eq!(h.option, code, "reply to another option");
            let (typ, len) = (h.typ, h.len as usize);
            let Some(d) = out.get(*o + 20..*o + 20 + len) else {
                fail(format!("option {code}: reply data truncated"));
            };
            *o += 20 + len;
            v.push((typ, d.to_vec()));
            if typ == rep::ACK || typ & rep::ERR != 0 {
                if typ & rep::ERR != 0 {
                    let msg = std::str::from_utf8(d).expect("error messages are UTF-8");
                    assert!(!msg.is_empty() && msg.len() <= MAX_STRING);
                }
                return v;
            }
        }
    };
    for _ in 0..1024 {
        let Some(h) = input.get(i..i + 16) else {
            return end(o, false); // the client stopped
        };
        if be64(h) != IHAVEOPT {
            return end(o, false);
        }
        let code = be32(&h[8..]);
        let len = be32(&h[12..]);
        if len > MAX_OPTION_LEN {
            let r = replies(&mut o, code);
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].0, rep::ERR_TOO_BIG);
            return end(o, false);
        }
        let Some(d) = input.get(i + 16..i + 16 + len as usize) else {
            return end(o, false);
        };
        i += 16 + len as usize;
        match code {
            opt::EXPORT_NAME => {
                let name = std::str::from_utf8(d).ok();
                let Some((size, _, ro)) = name.and_then(served) else {
                    return end(o, false);
                };
                let n = if no_zeroes { 10 } else { 134 };
                let Some(x) = out.get(o..o + n) else {
                    fail("EXPORT_NAME answer truncated".into());
                };
                assert_eq!(be64(x), size);
                assert_eq!(be16(&x[8..]) & 2 != 0, ro);
                assert!(x[10..].iter().all(|&b| b == 0));
                let h = run.result.as_ref().expect("EXPORT_NAME of a served export");
                assert_eq!(
                    (h.export.as_str(), h.structured, h.block_status, h.liberal),
                    (
                        name.unwrap(),
                        structured,
                        structured && meta.as_deref() == name,
                        true // no block sizes negotiated: any alignment served
                    )
                );
                return end(o + n, true);
            }
            opt::ABORT => {
                let r = replies(&mut o, code);
                assert_eq!(r, vec![(rep::ACK, vec![])]);
                return end(o, false);
            }
            opt::LIST => {
                let r = replies(&mut o, code);
                if len != 0 {
                    assert_eq!(r.len(), 1);
                    assert_eq!(r[0].0, rep::ERR_INVALID);
                } else {
                    assert_eq!(r.len(), SERVED.len() + 2, "one SERVER reply per export");
                    for (t, d) in &r[..r.len() - 1] {
                        assert_eq!(*t, rep::SERVER);
                        let n = be32(d) as usize;
                        assert!(4 + n <= d.len());
                    }
                }
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                let r = replies(&mut o, code);
                let set = code == opt::SET_META_CONTEXT;
                if set {
                    meta = None;
                }
                let last = r.last().expect("at least one reply").0;
                let parsed = proto::parse_meta_request(d);
                let want = match &parsed {
                    _ if !structured => rep::ERR_INVALID,
                    None => rep::ERR_INVALID,
                    Some((name, _)) if served(name).is_none() => rep::ERR_UNKNOWN,
                    Some(_) => rep::ACK,
                };
                assert_eq!(last, want, "meta context option {code}");
                if want != rep::ACK {
                    assert_eq!(r.len(), 1);
                    continue;
                }
                let (name, queries) = parsed.expect("parsed");
                let q = |x: &str| queries.iter().any(|y| y == x);
                let listed = if set {
                    q(proto::BASE_ALLOCATION)
                } else {
                    queries.is_empty() || q(proto::BASE_ALLOCATION) || q("base:")
                };
                assert_eq!(r.len(), 1 + listed as usize);
                if listed {
                    assert_eq!(r[0].0, rep::META_CONTEXT);
                    assert_eq!(&r[0].1[4..], proto::BASE_ALLOCATION.as_bytes());
                    if set {
                        meta = Some(name);
                    }
                }
            }
            opt::STRUCTURED_REPLY => {
                let r = replies(&mut o, code);
                assert_eq!(r.len(), 1);
                if len == 0 {
                    assert_eq!(r[0].0, rep::ACK);
                    structured = true;
                } else {
                    assert_eq!(r[0].0, rep::ERR_INVALID);
                }
            }
            opt::INFO | opt::GO => {
                let r = replies(&mut o, code);
                let last = r.last().expect("at least one reply").0;
                let Some((name, infos)) = proto::parse_info_request(d) else {
                    assert_eq!((r.len(), last), (1, rep::ERR_INVALID));
                    continue;
                };
                assert_eq!(
                    proto::encode_info_request(&name, &infos),
                    d,
                    "INFO/GO data re-encode"
                );
                round_trip_checked();
                let Some((size, sizes, ro)) = served(&name) else {
                    assert_eq!((r.len(), last), (1, rep::ERR_UNKNOWN), "{name:?}");
                    continue;
                };
                assert_eq!(last, rep::ACK);
                let infos_sent: Vec<(u16, &[u8])> = r[..r.len() - 1]
                    .iter()
                    .map(|(t, d)| {
                        assert_eq!(*t, rep::INFO);
                        (be16(d), &d[2..])
                    })
                    .collect();
                let get = |k: u16| infos_sent.iter().find(|x| x.0 == k).map(|x| x.1);
                let e = get(info::EXPORT).expect("NBD_INFO_EXPORT");
                assert_eq!((e.len(), be64(e), be16(&e[8..]) & 2 != 0), (10, size, ro));
                let b = get(info::BLOCK_SIZE).expect("NBD_INFO_BLOCK_SIZE");
                assert_eq!(
                    (be32(b), be32(&b[4..]), be32(&b[8..])),
                    (sizes.min, sizes.preferred, sizes.max)
                );
                assert_eq!(get(info::NAME).is_some(), infos.contains(&info::NAME));
                if let Some(n) = get(info::NAME) {
                    assert_eq!(n, name.as_bytes());
                }
                assert_eq!(
                    get(info::DESCRIPTION).is_some(),
                    infos.contains(&info::DESCRIPTION)
                );
                if code == opt::GO {
                    let h = run.result.as_ref().expect("GO to a served export");
                    assert_eq!(
                        (
                            h.export.as_str(),
                            h.size,
                            h.sizes,
                            h.read_only,
                            h.structured,
                            h.block_status,
                            h.liberal
                        ),
                        (
                            name.as_str(),
                            size,
                            sizes,
                            ro,
                            structured,
                            structured && meta.as_deref() == Some(name.as_str()),
                            !infos.contains(&info::BLOCK_SIZE)
                        )
                    );
                    return end(o, true);
                }
            }
            opt::STARTTLS => {
                let r = replies(&mut o, code);
                assert_eq!(r.len(), 1);
                assert_eq!(r[0].0, rep::ERR_POLICY);
            }
            _ => {
                let r = replies(&mut o, code);
                assert_eq!(r.len(), 1);
                assert_eq!(r[0].0, rep::ERR_UNSUP);
            }
        }
    }
    end(o, false) // 1024 options without choosing an export
}

const NAMES: [&str; 8] = ["a", "ro", "big4k", "", "gone", "nope", "é", "a\u{0}"];

/// Client handshake bytes: flags and options, usually ending by choosing an export. Returns the
/// bytes, their fields, and the export chosen if the options choose a served one.
fn gen_handshake(rng: &mut Rng, fields: &mut Vec<Field>) -> (Vec<u8>, Option<&'static str>) {
    let mut b = Vec::new();
    let cflags = match rng.below(16) {
        0 => rng.interesting(32) as u32,
        1..=7 => proto::FLAG_C_FIXED_NEWSTYLE,
        _ => proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES,
    };
    fields.push(Field::be(0, 4));
    b.extend_from_slice(&cflags.to_be_bytes());
    let mut chosen = None;
    let n = rng.below(6);
    for k in 0..=n {
        let last = k == n;
        let start = b.len();
        let (code, data) = match rng.below(if last { 3 } else { 10 }) {
            0 | 1 => {
                let name = *rng.pick(&NAMES);
                let infos: Vec<u16> = (0..rng.below(4))
                    .map(|_| {
                        if rng.one_in(8) {
                            rng.byte() as u16
                        } else {
                            rng.below(4) as u16
                        }
                    })
                    .collect();
                let d = proto::encode_info_request(name, &infos);
                assert_eq!(
                    proto::parse_info_request(&d),
                    Some((name.to_string(), infos)),
                    "INFO/GO data round trip"
                );
                round_trip_checked();
                fields.extend([
                    Field::be(start + 16, 4),
                    Field::be(start + 20 + name.len(), 2),
                ]);
                let go = rng.below(4) != 0;
                if go && served(name).is_some() {
                    chosen = Some(name);
                }
                (if go { opt::GO } else { opt::INFO }, d)
            }
            2 => {
                let name = *rng.pick(&NAMES);
                if served(name).is_some() {
                    chosen = Some(name);
                }
                (opt::EXPORT_NAME, name.as_bytes().to_vec())
            }
            3 => (opt::LIST, vec![]),
            4 => (opt::STRUCTURED_REPLY, vec![]),
            5 => (opt::STARTTLS, vec![]),
            6 => (*rng.pick(&[opt::LIST, opt::STRUCTURED_REPLY]), rng.bytes(3)),
            7 => {
                let n = rng.below(8) as usize;
                (rng.interesting(32) as u32, rng.bytes(n))
            }
            8 => (opt::ABORT, vec![]),
            _ => (opt::INFO, proto::encode_info_request("a", &[info::NAME])),
        };
        b.extend_from_slice(&proto::option_request(code, &data));
        fields.extend([
            Field::be(start, 8),
            Field::be(start + 8, 4),
            Field::be(start + 12, 4),
        ]);
        if chosen.is_some() || code == opt::ABORT || code == opt::EXPORT_NAME {
            break;
        }
    }
    (b, chosen)
}

/// A client's handshake bytes.
pub fn gen_options(rng: &mut Rng) -> Sample {
    let mut fields = Vec::new();
    let (bytes, _) = gen_handshake(rng, &mut fields);
    Sample {
        bytes,
        fields,
        ..Sample::default()
    }
}

/// Fuzz target: the client's side of the fixed newstyle handshake. Accepted when it reaches
/// transmission.
pub fn nbd_options(data: &[u8]) -> bool {
    run_handshake(data).result.is_some()
}

// ===== transmission =====

/// What the protocol rules (nbd/src/lib.rs, "Errors") say a request gets: 0 or an errno.
fn rule_errno(r: &Request, size: u64, s: BlockSizes, ro: bool) -> u32 {
    if r.flags & !cmd::FLAGS_KNOWN != 0 {
        return errno::EINVAL;
    }
    let writes = matches!(r.typ, cmd::WRITE | cmd::WRITE_ZEROES | cmd::TRIM);
    match r.typ {
        cmd::FLUSH => return 0,
        cmd::READ | cmd::WRITE | cmd::TRIM | cmd::CACHE | cmd::WRITE_ZEROES => {}
        _ => return errno::EINVAL,
    }
    if writes && ro {
        return errno::EPERM;
    }
    if matches!(r.typ, cmd::READ | cmd::WRITE | cmd::CACHE) && r.len > s.max {
        return errno::EINVAL;
    }
    if !r.offset.is_multiple_of(s.min as u64) || !(r.len as u64).is_multiple_of(s.min as u64) {
        return errno::EINVAL;
    }
    let end = r.offset as u128 + r.len as u128;
    if end > size as u128 {
        return if matches!(r.typ, cmd::WRITE | cmd::WRITE_ZEROES) {
            errno::ENOSPC
        } else {
            errno::EINVAL
        };
    }
    0
}

/// One request the reader model expects a reply to.
#[derive(Clone, Debug)]
struct Expect {
    req: Request,
    errno: u32,
    /// Data bytes of a successful READ reply.
    data: u32,
}

/// How a transmission stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// `NBD_CMD_DISC`.
    Disc,
    /// Input ended at a request boundary.
    Eof,
    /// Input ended inside a header or a WRITE payload.
    Truncated,
    /// A header with a bad magic.
    BadMagic,
}

/// Parses transmission bytes as the connection's reader does.
fn model_transmission(s: &[u8], size: u64, sizes: BlockSizes, ro: bool) -> (Vec<Expect>, End) {
    let mut pos = 0;
    let mut v = Vec::new();
    loop {
        if pos == s.len() {
            return (v, End::Eof);
        }
        let Some(h) = s.get(pos..pos + REQUEST_LEN) else {
            return (v, End::Truncated);
        };
        let h: &[u8; REQUEST_LEN] = h.try_into().expect("28 bytes");
        pos += REQUEST_LEN;
        let Some(req) = Request::decode(h) else {
            return (v, End::BadMagic);
        };
        assert_eq!(&req.encode(), h, "request header re-encode");
        assert_eq!(Request::decode(&req.encode()), Some(req));
        round_trip_checked();
        if req.typ == cmd::DISC {
            return (v, End::Disc);
        }
        let verdict = req.check(size, sizes, ro);
        let e = match &verdict {
            Ok(()) => 0,
            Err((e, msg)) => {
                assert!(!msg.is_empty() && msg.len() <= MAX_STRING);
                *e
            }
        };
        assert_eq!(
            e,
            rule_errno(&req, size, sizes, ro),
            "check of {req:?} on a {size}-byte export {sizes:?} ro={ro}: {verdict:?}"
        );
        if req.typ == cmd::WRITE {
            // Accepted: the payload; refused: skipped. Either way the bytes must be there.
            if s.len() - pos < req.len as usize {
                return (v, End::Truncated);
            }
            pos += req.len as usize;
        }
        let data = if e == 0 && req.typ == cmd::READ {
            req.len
        } else {
            0
        };
        v.push(Expect {
            req,
            errno: e,
            data,
        });
    }
}

/// Geometries of `nbd_requests`: the served exports, and one as large as the protocol allows
/// (offset + length overflow).
fn geometry(i: u8) -> (u64, BlockSizes, bool) {
    match i as usize % (SERVED.len() + 1) {
        k if k < SERVED.len() => {
            let (_, blocks, s, ro) = SERVED[k];
            (blocks * 512, s, ro)
        }
        _ => (!511, BlockSizes::default(), false),
    }
}

/// Transmission bytes for an export of `size` bytes with `sizes`: mostly valid requests, some
/// out of range, misaligned, too long, with unknown flags or commands; unique cookies.
fn gen_transmission(
    rng: &mut Rng,
    size: u64,
    s: BlockSizes,
    base: usize,
    b: &mut Vec<u8>,
    fields: &mut Vec<Field>,
) {
    let n = rng.range(1, 8);
    let cookie0 = rng.next_u64();
    for k in 0..n {
        let typ = *rng.pick(&[
            cmd::READ,
            cmd::READ,
            cmd::WRITE,
            cmd::WRITE,
            cmd::FLUSH,
            cmd::TRIM,
            cmd::CACHE,
            cmd::WRITE_ZEROES,
        ]);
        let flags = match typ {
            cmd::WRITE => cmd::FLAG_FUA * rng.below(2) as u16,
            cmd::WRITE_ZEROES => {
                (cmd::FLAG_FUA | cmd::FLAG_NO_HOLE | cmd::FLAG_FAST_ZERO) & rng.byte() as u16
            }
            cmd::TRIM => cmd::FLAG_FUA * rng.below(2) as u16,
            _ => cmd::FLAG_DF * rng.below(2) as u16,
        };
        let min = s.min as u64;
        let cap = if matches!(typ, cmd::READ | cmd::WRITE | cmd::CACHE) {
            size.min(s.max as u64).min(64 << 10)
        } else {
            size.min(1 << 30)
        };
        let len = rng.below(cap / min + 1) * min;
        let off = rng.below((size - len) / min + 1) * min;
        let mut r = Request {
            flags,
            typ,
            cookie: cookie0.wrapping_add(k),
            offset: off,
            len: len as u32,
        };
        match rng.below(16) {
            0 => r.offset = (size - len).wrapping_add(min * rng.range(1, 3)), // past the end
            1 => r.offset = r.offset.wrapping_add(1 + rng.below(min - 1)),    // misaligned
            2 => r.len = s.max + min as u32,                                  // too long (R/W/C)
            3 => r.flags |= 1 << rng.range(5, 15),                            // unknown flag
            4 => r.typ = rng.range(7, 40) as u16,                             // unknown command
            _ => {}
        }
        let start = base + b.len();
        b.extend_from_slice(&r.encode());
        fields.extend([
            Field::be(start, 4),
            Field::be(start + 4, 2),
            Field::be(start + 6, 2),
            Field::be(start + 16, 8),
            Field::be(start + 24, 4),
        ]);
        if r.typ == cmd::WRITE && r.len <= 1 << 20 {
            let fill = rng.byte();
            b.extend(std::iter::repeat_n(fill, r.len as usize));
        }
    }
    if rng.one_in(2) {
        let disc = Request {
            flags: 0,
            typ: cmd::DISC,
            cookie: 0,
            offset: 0,
            len: 0,
        };
        b.extend_from_slice(&disc.encode());
    }
}

/// Transmission bytes: a geometry byte, then requests.
pub fn gen_requests(rng: &mut Rng) -> Sample {
    let g = rng.byte();
    let (size, s, _) = geometry(g);
    let mut b = vec![g];
    let mut fields = vec![Field::be(0, 1)];
    let mut t = Vec::new();
    gen_transmission(rng, size, s, 1, &mut t, &mut fields);
    b.extend(t);
    Sample {
        bytes: b,
        fields,
        ..Sample::default()
    }
}

/// Fuzz target: transmission requests for one export (the first byte picks its geometry).
/// Accepted when the whole stream parses in step (ends at `DISC` or between requests) and at
/// least one request passes the checks.
pub fn nbd_requests(data: &[u8]) -> bool {
    let Some((&g, rest)) = data.split_first() else {
        return false;
    };
    let (size, s, ro) = geometry(g);
    let (v, end) = model_transmission(rest, size, s, ro);
    matches!(end, End::Disc | End::Eof) && v.iter().any(|e| e.errno == 0)
}

// ===== the real server =====

/// Panics on the server's own threads: the server catches them (a panicking export answers
/// `EIO`, a panicking connection ends), so they are counted here to be reported as findings.
static SERVER_PANICS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("nbd-"))
            {
                SERVER_PANICS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            prev(info)
        }));
        let exports: Arc<dyn Exports> = exports().clone();
        Server::new(
            exports,
            ServerConfig {
                workers: 4,
                handshake_timeout: Duration::from_secs(20),
                write_timeout: Duration::from_secs(20),
                ..ServerConfig::default()
            },
        )
    })
}

/// Sends `input` to a new connection of the real server and returns everything it answers
/// until it closes the connection.
fn over_socket(input: &[u8]) -> Vec<u8> {
    let (mut client, theirs) = UnixStream::pair().expect("a socket pair");
    server().serve_stream(Box::new(theirs));
    client.set_nonblocking(true).expect("nonblocking");
    let fd = client.as_raw_fd();
    let mut sent = 0;
    let mut writing = true;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut progress = false;
        if writing && sent < input.len() {
            let rest = &input[sent..];
            // SAFETY: `rest` is a valid buffer of `rest.len()` bytes for the call; `fd` is open.
            let n = unsafe {
                libc::send(
                    fd,
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                sent += n as usize;
                progress = true;
            } else {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::Interrupted
                {
                    writing = false; // the server closed: it read all it wanted
                }
            }
        }
        if writing && sent == input.len() {
            let _ = client.shutdown(std::net::Shutdown::Write);
            writing = false;
        }
        match client.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                progress = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // The server closed with some of our bytes unread: what it sent was delivered.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading from the NBD server: {e}"),
        }
        if !progress {
            assert!(
                Instant::now() < deadline,
                "the NBD server neither answered nor closed the connection within 30 s \
                 ({sent} of {} bytes sent, {} received)",
                input.len(),
                out.len()
            );
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN | if writing { libc::POLLOUT } else { 0 },
                revents: 0,
            };
            // SAFETY: `p` is a valid pollfd for the call and the count is 1.
            unsafe { libc::poll(&mut p, 1, 100) };
        }
    }
    out
}

/// Checks the transmission replies against the reader model's expectations.
fn check_replies(out: &[u8], exp: &[Expect], structured: bool) {
    let mut cookies: Vec<u64> = exp.iter().map(|e| e.req.cookie).collect();
    cookies.sort_unstable();
    cookies.dedup();
    if cookies.len() != exp.len() {
        return; // repeated cookies: replies cannot be told apart
    }
    let mut left: std::collections::HashMap<u64, &Expect> =
        exp.iter().map(|e| (e.req.cookie, e)).collect();
    let mut o = 0;
    while o < out.len() {
        if structured {
            let h = out
                .get(o..o + 20)
                .expect("structured reply header truncated");
            let h = StructuredHeader::decode(h.try_into().expect("20 bytes"));
            assert_eq!(h.magic, proto::STRUCTURED_REPLY_MAGIC, "reply magic");
            assert_eq!(h.flags, reply::FLAG_DONE, "one chunk per reply");
            let (typ, cookie, len) = (h.typ, h.cookie, h.len as usize);
            let p = out
                .get(o + 20..o + 20 + len)
                .expect("reply payload truncated");
            o += 20 + len;
            let e = left
                .remove(&cookie)
                .unwrap_or_else(|| panic!("reply to unknown or answered cookie {cookie:#x}"));
            match typ {
                reply::TYPE_NONE => assert_eq!((e.errno, e.data, len), (0, 0, 0), "{e:?}"),
                reply::TYPE_OFFSET_DATA => {
                    assert_eq!((e.errno, len), (0, 8 + e.data as usize), "{e:?}");
                    assert!(e.data > 0);
                    assert_eq!(be64(p), e.req.offset);
                }
                reply::TYPE_ERROR => {
                    assert_eq!(be32(p), e.errno, "{e:?}");
                    let n = be16(&p[4..]) as usize;
                    assert_eq!(len, 6 + n);
                    assert!(std::str::from_utf8(&p[6..]).is_ok());
                }
                t => panic!("reply chunk type {t}"),
            }
        } else {
            let h = out.get(o..o + 16).expect("simple reply truncated");
            let h = SimpleReply::decode(h.try_into().expect("16 bytes"));
            assert_eq!(h.magic, proto::SIMPLE_REPLY_MAGIC, "reply magic");
            let (err, cookie) = (h.error, h.cookie);
            let e = left
                .remove(&cookie)
                .unwrap_or_else(|| panic!("reply to unknown or answered cookie {cookie:#x}"));
            assert_eq!(err, e.errno, "{e:?}");
            o += 16 + e.data as usize;
            assert!(o <= out.len(), "read data truncated");
        }
    }
    assert!(
        left.is_empty(),
        "requests without a reply: {:?}",
        left.values()
    );
}

/// Client bytes for a whole connection: a handshake, then requests for the export it chose.
pub fn gen_session(rng: &mut Rng) -> Sample {
    let mut fields = Vec::new();
    let (mut b, chosen) = gen_handshake(rng, &mut fields);
    let (size, s, _) = served(chosen.unwrap_or("a")).expect("served");
    let base = b.len();
    let mut t = Vec::new();
    gen_transmission(rng, size, s, base, &mut t, &mut fields);
    b.extend(t);
    Sample {
        bytes: b,
        fields,
        ..Sample::default()
    }
}

/// Fuzz target: a whole client connection to the real server over a unix socket pair.
/// Accepted when it reaches transmission.
pub fn nbd_session(data: &[u8]) -> bool {
    let hs = run_handshake(data);
    let panics = SERVER_PANICS.load(std::sync::atomic::Ordering::Relaxed);
    let out = over_socket(data);
    assert_eq!(
        SERVER_PANICS.load(std::sync::atomic::Ordering::Relaxed),
        panics,
        "a thread of the NBD server panicked (see above)"
    );
    assert!(
        out.starts_with(&hs.out),
        "the server's handshake over a socket differs from the same code in memory"
    );
    let Some(h) = hs.result else {
        assert_eq!(out.len(), hs.out.len(), "bytes after a failed handshake");
        return false;
    };
    if h.block_status {
        // The request model knows no NBD_CMD_BLOCK_STATUS (its replies are checked by
        // cli/tests/block_status.rs and the server's unit tests): not modelled.
        return false;
    }
    // A client that did not ask for block sizes may send any alignment (nbd/src/unaligned.rs).
    let sizes = if h.liberal {
        BlockSizes { min: 1, ..h.sizes }
    } else {
        h.sizes
    };
    let (exp, end) = model_transmission(&data[hs.consumed..], h.size, sizes, h.read_only);
    if std::env::var_os("TIERCACHE_TRACE").is_some() {
        eprintln!(
            "handshake: {h:?}, {} input bytes, {} output bytes",
            hs.consumed,
            hs.out.len()
        );
        eprintln!("transmission expected ({end:?}): {exp:#?}");
        let hex: String = out[hs.out.len()..]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        eprintln!("transmission output: {hex}");
    }
    check_replies(&out[hs.out.len()..], &exp, h.structured);
    true
}
