//! The NBD part of the bad-input catalogue (docs/BAD_INPUT.md, SPEC R6/R7): handshakes cut at
//! every byte, client flags with unknown bits, option lengths at and past the limit, unknown
//! options and exports, endless option haggling; requests out of range, unaligned, oversized,
//! of unknown type or with unknown flags on an engine export advertising 4 KiB blocks and a
//! 1 MiB maximum; connections dropped at every byte of a write. Each case checks the exact
//! answer (reply type or errno, and its message), that a refused request changed no byte, and
//! that afterwards the server still serves a new connection the data written before.
//!
//! Cases already covered by raw.rs (malformed GO/INFO/LIST data, u32::MAX option length,
//! the 512-byte export's errno table, bad request magic, idle handshakes, random requests) are
//! listed in the catalogue and not repeated here.

mod common;

use common::wire::*;
use common::*;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tiercache_core::units::CoreId;
use tiercache_nbd::proto::{self, cmd, errno, opt, rep};
use tiercache_nbd::{BlockSizes, EngineExport, ExportMap, ListenAddr, Server, ServerConfig};

/// 4 KiB identifying `tag`.
fn pattern(tag: u8) -> Vec<u8> {
    (0..4096u32)
        .map(|i| tag.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

/// Reads until the server closes the connection; the bytes it sent first. A connection still
/// open after 5 s is a failure (not counted as closed, unlike `Client::closed`).
fn until_eof(s: &mut UnixStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the server kept the connection open: {e} (after {got:?})"),
        }
    }
}

/// Connects and reads the 18-byte greeting.
fn greeted(sock: &Path) -> UnixStream {
    let mut s = connect(sock);
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(be64(&g), proto::NBDMAGIC);
    s
}

/// An option as a client sends it.
fn option(o: u32, data: &[u8]) -> Vec<u8> {
    proto::option_request(o, data)
}

/// Writes `data` at `off` on a new connection to `name`, then checks it reads back.
fn put(sock: &Path, name: &str, off: u64, data: &[u8]) {
    let (mut c, _) = ready(sock, name, true);
    assert_eq!(c.call(cmd::WRITE, 0, off, data.len() as u32, data).0, 0);
    assert_eq!(c.call(cmd::FLUSH, 0, 0, 0, &[]).0, 0);
    c.send_req(cmd::DISC, 0, 0, 0, 0, &[]);
}

/// A new connection to `name` reads `want` at `off` (the server still serves, and what was
/// written before the bad input is intact).
fn still_reads(sock: &Path, name: &str, off: u64, want: &[u8]) {
    let (mut c, _) = ready(sock, name, false);
    let (e, d) = c.call(cmd::READ, 0, off, want.len() as u32, &[]);
    assert_eq!(e, 0, "read at {off}");
    assert!(d == want, "the data at {off} changed");
    c.send_req(cmd::DISC, 0, 0, 0, 0, &[]);
}

/// A server with the plain 8 MiB RAM export and known data at 1 MiB.
fn plain_with_data(tag: &str) -> (Server, std::path::PathBuf, TmpDir) {
    let (srv, sock, d) = plain_server(tag, ServerConfig::default());
    put(&sock, "plain", 1 << 20, &pattern(1));
    (srv, sock, d)
}

#[test]
fn handshake_cut_at_every_byte_ends_only_that_connection() {
    let (srv, sock, _d) = plain_with_data("cut-hs");
    // A complete handshake: client flags, STRUCTURED_REPLY, LIST, INFO and GO.
    let mut script = (proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    script.extend(option(opt::STRUCTURED_REPLY, &[]));
    script.extend(option(opt::LIST, &[]));
    script.extend(option(
        opt::INFO,
        &Client::<UnixStream>::info_data("plain", &[3]),
    ));
    script.extend(option(
        opt::GO,
        &Client::<UnixStream>::info_data("plain", &[3]),
    ));
    let before = srv.stats().handshake_ended;
    for k in 0..script.len() {
        let mut s = greeted(&sock);
        s.write_all(&script[..k]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let got = until_eof(&mut s);
        // Whatever was answered is whole option replies (never a partial or garbled one).
        let mut rest = &got[..];
        while !rest.is_empty() {
            assert!(rest.len() >= 20, "cut at {k}: a partial reply {rest:?}");
            assert_eq!(be64(rest), proto::OPT_REPLY_MAGIC, "cut at {k}");
            let n = 20 + be32(&rest[16..]) as usize;
            rest = &rest[n..];
        }
    }
    wait_open(&srv, 0);
    let st = srv.stats();
    assert_eq!(st.handshake_ended - before, script.len() as u64, "{st:?}");
    still_reads(&sock, "plain", 1 << 20, &pattern(1));
    srv.shutdown();
}

#[test]
fn unknown_client_flag_bits_end_the_connection_before_any_reply() {
    let (srv, sock, _d) = plain_with_data("cflags");
    for bit in 2..32 {
        let mut s = greeted(&sock);
        let f = proto::FLAG_C_FIXED_NEWSTYLE | 1u32 << bit;
        s.write_all(&f.to_be_bytes()).unwrap();
        // Options after the flags are not read: nothing is answered.
        let _ = s.write_all(&option(opt::LIST, &[]));
        assert_eq!(until_eof(&mut s), Vec::<u8>::new(), "flag bit {bit}");
    }
    // Not fixed newstyle (the old newstyle): also refused.
    let mut s = greeted(&sock);
    s.write_all(&proto::FLAG_C_NO_ZEROES.to_be_bytes()).unwrap();
    assert_eq!(until_eof(&mut s), Vec::<u8>::new());
    // A wrong option magic (one bit off) ends the haggling without a reply.
    let mut s = greeted(&sock);
    s.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
        .unwrap();
    let mut m = option(opt::LIST, &[]);
    m[7] ^= 1;
    s.write_all(&m).unwrap();
    assert_eq!(until_eof(&mut s), Vec::<u8>::new());
    wait_open(&srv, 0);
    still_reads(&sock, "plain", 1 << 20, &pattern(1));
    srv.shutdown();
}

#[test]
fn option_lengths_unknown_options_and_unknown_exports() {
    let (srv, sock, _d) = plain_with_data("opts");
    // One byte over the limit: NBD_REP_ERR_TOO_BIG and the end, without reading the data.
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    let mut m = proto::IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&opt::LIST.to_be_bytes());
    m.extend_from_slice(&(proto::MAX_OPTION_LEN + 1).to_be_bytes());
    c.s.write_all(&m).unwrap();
    let r = c.read_opt_reply().unwrap();
    assert_eq!((r.0, r.1), (opt::LIST, rep::ERR_TOO_BIG));
    assert!(String::from_utf8_lossy(&r.2).contains("too long"), "{r:?}");
    assert!(until_eof(&mut c.s).is_empty());

    // At the limit: read whole and answered; the handshake goes on.
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    let big = vec![0x41u8; proto::MAX_OPTION_LEN as usize];
    let r = c.opt(opt::LIST, &big);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, rep::ERR_INVALID);
    assert_eq!(
        String::from_utf8_lossy(&r[0].2),
        "NBD_OPT_LIST takes no data"
    );
    // Unknown options, with and without data: NBD_REP_ERR_UNSUP each, and on.
    for (o, data) in [
        (0u32, &b""[..]),
        (4, b"peek"), // NBD_OPT_PEEK_EXPORT (withdrawn)
        (11, b""),    // NBD_OPT_EXTENDED_HEADERS
        (0x7fff_ffff, b"x"),
        (u32::MAX, &big[..1000]),
    ] {
        let r = c.opt(o, data);
        assert_eq!(r.len(), 1, "option {o}");
        assert_eq!((r[0].0, r[0].1), (o, rep::ERR_UNSUP), "option {o}");
        assert_eq!(String::from_utf8_lossy(&r[0].2), "option not supported");
    }
    // Unknown exports: NBD_REP_ERR_UNKNOWN naming it, for INFO and GO, and on.
    for name in ["nope", "", "PLAIN", "plain/"] {
        for o in [opt::INFO, opt::GO] {
            let r = c.opt(o, &Client::<UnixStream>::info_data(name, &[]));
            assert_eq!(r.len(), 1);
            assert_eq!(r[0].1, rep::ERR_UNKNOWN, "{name:?}");
            assert_eq!(
                String::from_utf8_lossy(&r[0].2),
                format!("no export named {name:?}")
            );
        }
    }
    // An invalid UTF-8 name is malformed data, not an unknown export.
    let r = c.opt(opt::GO, &[0, 0, 0, 2, 0xff, 0xfe, 0, 0]);
    assert_eq!(r[0].1, rep::ERR_INVALID);
    // The same connection still reaches transmission and reads the known data.
    c.structured = true;
    assert_eq!(c.opt(opt::STRUCTURED_REPLY, &[])[0].1, rep::ACK);
    assert_eq!(c.go("plain"), 8 << 20);
    assert_eq!(c.call(cmd::READ, 0, 1 << 20, 4096, &[]), (0, pattern(1)));
    drop(c);

    // Endless haggling: after 1024 options the server ends the connection.
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    let mut m = Vec::new();
    for _ in 0..1100 {
        m.extend(option(99, &[]));
    }
    let w = {
        let mut s = c.s.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = s.write_all(&m);
        })
    };
    let got = until_eof(&mut c.s);
    w.join().unwrap();
    let reply = proto::option_reply(99, rep::ERR_UNSUP, b"option not supported");
    assert_eq!(got.len(), 1024 * reply.len());
    assert!(got.chunks(reply.len()).all(|r| r == reply));
    wait_open(&srv, 0);
    still_reads(&sock, "plain", 1 << 20, &pattern(1));
    srv.shutdown();
}

/// A server with an engine export `disk4k` (8 MiB core through a RAM cache) advertising a
/// 4 KiB minimum block size and a 1 MiB maximum, as a 4Kn device would.
fn engine_server(tag: &str) -> (Server, std::path::PathBuf, TmpDir) {
    let dir = TmpDir::new(tag);
    let ex = Arc::new(ExportMap::new());
    let sizes = BlockSizes {
        min: 4096,
        preferred: 4096,
        max: 1 << 20,
    };
    ex.insert(
        "disk4k",
        "4Kn engine export",
        Arc::new(
            EngineExport::new(engine(8, 2), CoreId(0))
                .with_block_sizes(sizes)
                .unwrap(),
        ),
    );
    let srv = Server::new(ex, ServerConfig::default());
    let sock = dir.path("s.sock");
    srv.listen(&ListenAddr::Unix(sock.clone())).unwrap();
    (srv, sock, dir)
}

#[test]
fn out_of_range_unaligned_oversized_and_unknown_requests_change_nothing() {
    let (srv, sock, _d) = engine_server("req4k");
    let size = 8u64 << 20;
    let last = size - 4096;
    put(&sock, "disk4k", 0, &pattern(1));
    put(&sock, "disk4k", last, &pattern(2));
    let over = (1u32 << 20) + 4096;
    // (type, flags, offset, length, payload sent, errno, words of the message)
    let cases: Vec<(u16, u16, u64, u32, bool, u32, &str)> = vec![
        // Past the end: EINVAL for reads, trims and prefetches, ENOSPC for writes (R7).
        (
            cmd::READ,
            0,
            size,
            4096,
            false,
            errno::EINVAL,
            "past the end",
        ),
        (
            cmd::READ,
            0,
            last,
            8192,
            false,
            errno::EINVAL,
            "past the end",
        ),
        (
            cmd::READ,
            0,
            u64::MAX - 4095,
            4096,
            false,
            errno::EINVAL,
            "past the end",
        ),
        (
            cmd::TRIM,
            0,
            last,
            8192,
            false,
            errno::EINVAL,
            "past the end",
        ),
        (
            cmd::TRIM,
            0,
            0,
            !4095u32,
            false,
            errno::EINVAL,
            "past the end",
        ),
        (
            cmd::CACHE,
            0,
            size,
            4096,
            false,
            errno::EINVAL,
            "past the end",
        ),
        (
            cmd::WRITE,
            0,
            last,
            8192,
            true,
            errno::ENOSPC,
            "past the end",
        ),
        (
            cmd::WRITE,
            0,
            size,
            4096,
            true,
            errno::ENOSPC,
            "past the end",
        ),
        (
            cmd::WRITE,
            cmd::FLAG_FUA,
            u64::MAX - 4095,
            4096,
            true,
            errno::ENOSPC,
            "past the end",
        ),
        (
            cmd::WRITE_ZEROES,
            0,
            last,
            8192,
            false,
            errno::ENOSPC,
            "past the end",
        ),
        // Not multiples of the advertised minimum block size (4096).
        (
            cmd::READ,
            0,
            0,
            512,
            false,
            errno::EINVAL,
            "minimum block size 4096",
        ),
        (
            cmd::READ,
            0,
            512,
            4096,
            false,
            errno::EINVAL,
            "minimum block size 4096",
        ),
        (
            cmd::WRITE,
            0,
            0,
            512,
            true,
            errno::EINVAL,
            "minimum block size 4096",
        ),
        (
            cmd::WRITE,
            0,
            2048,
            4096,
            true,
            errno::EINVAL,
            "minimum block size 4096",
        ),
        (
            cmd::TRIM,
            0,
            0,
            512,
            false,
            errno::EINVAL,
            "minimum block size 4096",
        ),
        (
            cmd::WRITE_ZEROES,
            0,
            4096 - 512,
            4096,
            false,
            errno::EINVAL,
            "minimum block size",
        ),
        // Above the advertised maximum (1 MiB) for the commands it bounds.
        (
            cmd::READ,
            0,
            0,
            over,
            false,
            errno::EINVAL,
            "maximum block size 1048576",
        ),
        (
            cmd::WRITE,
            0,
            0,
            over,
            true,
            errno::EINVAL,
            "maximum block size 1048576",
        ),
        (
            cmd::CACHE,
            0,
            0,
            over,
            false,
            errno::EINVAL,
            "maximum block size 1048576",
        ),
        // Unknown command types (BLOCK_STATUS is not offered: no meta context).
        (7, 0, 0, 4096, false, errno::EINVAL, "unknown command 7"),
        (11, 0, 0, 0, false, errno::EINVAL, "unknown command 11"),
        (77, 0, 0, 4096, false, errno::EINVAL, "unknown command 77"),
        (
            u16::MAX,
            0,
            0,
            0,
            false,
            errno::EINVAL,
            "unknown command 65535",
        ),
        // Unknown command flags, on every command (a write's payload is still consumed).
        (
            cmd::READ,
            1 << 5,
            0,
            4096,
            false,
            errno::EINVAL,
            "unknown command flags 0x20",
        ),
        (
            cmd::WRITE,
            1 << 15,
            0,
            4096,
            true,
            errno::EINVAL,
            "unknown command flags 0x8000",
        ),
        (
            cmd::FLUSH,
            1 << 9,
            0,
            0,
            false,
            errno::EINVAL,
            "unknown command flags 0x200",
        ),
        (
            cmd::TRIM,
            0xffe0,
            0,
            4096,
            false,
            errno::EINVAL,
            "unknown command flags 0xffe0",
        ),
        (
            cmd::WRITE_ZEROES,
            1 << 6,
            0,
            4096,
            false,
            errno::EINVAL,
            "unknown command flags",
        ),
    ];
    for structured in [true, false] {
        let (mut c, sz) = ready(&sock, "disk4k", structured);
        assert_eq!(sz, size);
        for &(t, f, off, len, payload, want, words) in &cases {
            let data = if payload {
                vec![0xeeu8; len as usize]
            } else {
                vec![]
            };
            let (e, msg) = c.call(t, f, off, len, &data);
            let what = format!("cmd {t} flags {f:#x} at {off} len {len} (structured {structured})");
            assert_eq!(e, want, "{what}");
            if structured {
                let msg = String::from_utf8_lossy(&msg);
                assert!(msg.contains(words), "{what}: message {msg:?}");
            }
            // Still in sync, and nothing changed where a refused request pointed.
            assert_eq!(
                c.call(cmd::READ, 0, 0, 4096, &[]),
                (0, pattern(1)),
                "{what}"
            );
            assert_eq!(
                c.call(cmd::READ, 0, last, 4096, &[]),
                (0, pattern(2)),
                "{what}"
            );
        }
        // A long trim has no payload and no maximum: accepted, as the protocol allows.
        assert_eq!(c.call(cmd::TRIM, 0, 4096, 2 << 20, &[]).0, 0);
        assert_eq!(c.call(cmd::READ, 0, 0, 4096, &[]), (0, pattern(1)));
        // A bad request magic ends the connection (the stream cannot be trusted).
        let mut h = proto::Request {
            flags: 0,
            typ: cmd::READ,
            cookie: 1,
            offset: 0,
            len: 4096,
        }
        .encode();
        h[0] ^= 0x80;
        c.s.write_all(&h).unwrap();
        assert!(until_eof(&mut c.s).is_empty());
    }
    wait_open(&srv, 0);
    let st = srv.stats();
    assert_eq!(st.request_errors, 2 * cases.len() as u64, "{st:?}");
    still_reads(&sock, "disk4k", 0, &pattern(1));
    still_reads(&sock, "disk4k", last, &pattern(2));
    srv.shutdown();
}

#[test]
fn connections_dropped_at_every_byte_of_a_write_leave_the_data_whole() {
    let (srv, sock, _d) = engine_server("drop");
    let off = 64u64 << 10;
    put(&sock, "disk4k", off, &pattern(1));
    // WRITE of pattern 9 over pattern 1, cut after k bytes: the header at every byte, the
    // payload at a few points. The write never happened: the block is still pattern 1.
    let mut req = proto::Request {
        flags: cmd::FLAG_FUA,
        typ: cmd::WRITE,
        cookie: 5,
        offset: off,
        len: 4096,
    }
    .encode()
    .to_vec();
    req.extend(pattern(9));
    let cuts: Vec<usize> = (0..=proto::REQUEST_LEN)
        .chain([29, 512, 2048, 4095, proto::REQUEST_LEN + 4095])
        .collect();
    for &k in &cuts {
        for structured in [true, false] {
            let (mut c, _) = ready(&sock, "disk4k", structured);
            c.s.write_all(&req[..k]).unwrap();
            drop(c);
            still_reads(&sock, "disk4k", off, &pattern(1));
        }
    }
    // A read whose reply is never collected, and many requests in flight, then gone.
    let (mut c, _) = ready(&sock, "disk4k", true);
    for i in 0..64 {
        c.send_req(cmd::READ, 0, i, 0, 1 << 20, &[]);
    }
    c.send_req(cmd::WRITE, 0, 99, off, 4096, &pattern(9)[..2048]);
    drop(c);
    wait_open(&srv, 0);
    still_reads(&sock, "disk4k", off, &pattern(1));
    // The whole write does land.
    put(&sock, "disk4k", off, &pattern(9));
    still_reads(&sock, "disk4k", off, &pattern(9));
    srv.shutdown();
}
