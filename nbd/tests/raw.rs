//! The server against a hand-written client on raw sockets: malformed handshakes, oversized
//! and unknown options, bad requests, clients that vanish mid-request, many requests in
//! flight, listeners (socket mode, stale sockets, TCP on loopback only) and shutdown.

mod common;

use common::wire::*;
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_io::RamBackend;
use tiercache_nbd::proto::{self, cmd, errno, info, opt, rep};
use tiercache_nbd::{BackendExport, BoundAddr, ExportMap, ListenAddr, Server, ServerConfig};

#[test]
fn malformed_handshakes_are_refused_and_others_still_served() {
    let (srv, sock, _d) = plain_server("malformed", ServerConfig::default());
    // No fixed newstyle.
    let mut c = Client::hello(connect(&sock), 0);
    assert!(c.closed());
    // Unknown client flags.
    let mut c = Client::hello(connect(&sock), 0x80 | proto::FLAG_C_FIXED_NEWSTYLE);
    assert!(c.closed());
    // A wrong option magic.
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    c.s.write_all(&[0xffu8; 16]).unwrap();
    assert!(c.closed());
    // Garbage right away, and a client that leaves in the middle of an option.
    let mut s = connect(&sock);
    let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
    drop(s);
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    c.s.write_all(&proto::IHAVEOPT.to_be_bytes()).unwrap();
    c.s.write_all(&opt::GO.to_be_bytes()).unwrap();
    c.s.write_all(&100u32.to_be_bytes()).unwrap();
    c.s.write_all(&[0u8; 10]).unwrap();
    drop(c);
    // Malformed GO data is an error reply, not the end.
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    let r = c.opt(opt::GO, &[0, 0, 0, 200, b'x']);
    assert_eq!(r[0].1, rep::ERR_INVALID);
    let r = c.opt(opt::INFO, &[0, 0, 0, 0, 0, 5, 0, 1]); // says 5 infos, has 1
    assert_eq!(r[0].1, rep::ERR_INVALID);
    let r = c.opt(opt::LIST, b"junk");
    assert_eq!(r[0].1, rep::ERR_INVALID);
    let r = c.opt(opt::STRUCTURED_REPLY, b"junk");
    assert_eq!(r[0].1, rep::ERR_INVALID);
    assert_eq!(c.go("plain"), 8 << 20);
    still_serves(&sock);
    wait_open(&srv, 1);
    drop(c);
    wait_open(&srv, 0);
    assert!(srv.stats().handshake_ended >= 5, "{:?}", srv.stats());
    srv.shutdown();
}

#[test]
fn oversized_option_ends_the_connection_without_reading_it() {
    let (srv, sock, _d) = plain_server("oversized", ServerConfig::default());
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    let mut m = proto::IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&opt::GO.to_be_bytes());
    m.extend_from_slice(&u32::MAX.to_be_bytes());
    c.s.write_all(&m).unwrap();
    let r = c.read_opt_reply().unwrap();
    assert_eq!(r.1, rep::ERR_TOO_BIG);
    assert!(c.closed());
    still_serves(&sock);
    srv.shutdown();
}

#[test]
fn options_unknown_tls_list_info_and_export_name() {
    let (srv, sock, _d) = plain_server("options", ServerConfig::default());
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    // Unknown options: ERR_UNSUP, and the handshake goes on.
    let r = c.opt(99, b"some data");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, rep::ERR_UNSUP);
    let r = c.opt(opt::STARTTLS, &[]);
    assert_eq!(r[0].1, rep::ERR_POLICY);
    assert!(String::from_utf8_lossy(&r[0].2).contains("TLS"));
    // LIST: both exports with descriptions.
    let r = c.opt(opt::LIST, &[]);
    let names: Vec<String> = r
        .iter()
        .filter(|x| x.1 == rep::SERVER)
        .map(|x| {
            let n = be32(&x.2) as usize;
            String::from_utf8(x.2[4..4 + n].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, ["gone", "plain"]);
    assert_eq!(r.last().unwrap().1, rep::ACK);
    // INFO with name, description and block sizes.
    let r = c.opt(
        opt::INFO,
        &Client::<UnixStream>::info_data(
            "plain",
            &[info::NAME, info::DESCRIPTION, info::BLOCK_SIZE],
        ),
    );
    let find = |t: u16| {
        r.iter()
            .find(|x| x.1 == rep::INFO && x.2[..2] == t.to_be_bytes())
            .unwrap()
    };
    assert_eq!(&find(info::NAME).2[2..], b"plain");
    assert_eq!(&find(info::DESCRIPTION).2[2..], b"plain RAM");
    let bs = &find(info::BLOCK_SIZE).2[2..];
    assert_eq!(
        (be32(bs), be32(&bs[4..]), be32(&bs[8..])),
        (512, 4096, 32 << 20)
    );
    let e = &find(info::EXPORT).2[2..];
    assert_eq!(be64(e), 8 << 20);
    let flags = u16::from_be_bytes([e[8], e[9]]);
    assert_ne!(flags & proto::tflag::CAN_MULTI_CONN, 0);
    assert_ne!(flags & proto::tflag::SEND_FAST_ZERO, 0);
    assert_eq!(flags & proto::tflag::READ_ONLY, 0);
    // A refused export says why; a missing one too.
    let r = c.opt(opt::GO, &Client::<UnixStream>::info_data("gone", &[]));
    assert_eq!(r[0].1, rep::ERR_UNKNOWN);
    assert_eq!(
        String::from_utf8_lossy(&r[0].2),
        "cache device missing: not served"
    );
    let r = c.opt(opt::INFO, &Client::<UnixStream>::info_data("nope", &[]));
    assert_eq!(r[0].1, rep::ERR_UNKNOWN);
    // ABORT: ACK, then closed.
    let r = c.opt(opt::ABORT, &[]);
    assert_eq!(r[0].1, rep::ACK);
    assert!(c.closed());

    // EXPORT_NAME, with the 124 zero bytes and without.
    for no_zeroes in [false, true] {
        let f = proto::FLAG_C_FIXED_NEWSTYLE
            | if no_zeroes {
                proto::FLAG_C_NO_ZEROES
            } else {
                0
            };
        let mut c = Client::hello(connect(&sock), f);
        c.send_opt(opt::EXPORT_NAME, b"plain");
        let mut m = vec![0u8; if no_zeroes { 10 } else { 134 }];
        c.s.read_exact(&mut m).unwrap();
        assert_eq!(be64(&m), 8 << 20);
        assert!(m[10..].iter().all(|&b| b == 0));
        let (e, d) = c.call(cmd::READ, 0, 0, 512, &[]);
        assert_eq!((e, d.len()), (0, 512));
    }
    // EXPORT_NAME of a refused export: the connection ends (no way to say why).
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    c.send_opt(opt::EXPORT_NAME, b"gone");
    assert!(c.closed());
    srv.shutdown();
}

#[test]
fn bad_requests_get_errors_and_the_connection_keeps_working() {
    let (srv, sock, _d) = plain_server("badreq", ServerConfig::default());
    for structured in [true, false] {
        let (mut c, size) = ready(&sock, "plain", structured);
        let sz = size as u32;
        let cases: &[(u16, u16, u64, u32, u32)] = &[
            (cmd::READ, 0, size, 512, errno::EINVAL),
            (cmd::READ, 0, u64::MAX - 511, 512, errno::EINVAL),
            (cmd::READ, 0, 0, sz + 512, errno::EINVAL),
            (cmd::READ, 0, 100, 512, errno::EINVAL),
            (cmd::READ, 0, 0, 100, errno::EINVAL),
            (cmd::READ, 0, 0, (32 << 20) + 512, errno::EINVAL),
            (cmd::TRIM, 0, size - 512, 1024, errno::EINVAL),
            (cmd::CACHE, 0, size, 512, errno::EINVAL),
            (cmd::CACHE, 0, 0, (32 << 20) + 512, errno::EINVAL),
            (cmd::WRITE_ZEROES, 0, size - 512, 1024, errno::ENOSPC),
            (cmd::WRITE_ZEROES, 0, 3, 512, errno::EINVAL),
            (77, 0, 0, 0, errno::EINVAL),
            (7, 0, 0, 512, errno::EINVAL), // BLOCK_STATUS without a meta context
            (cmd::READ, 0x8000, 0, 512, errno::EINVAL), // unknown flag
        ];
        for &(t, f, off, len, want) in cases {
            let (e, msg) = c.call(t, f, off, len, &[]);
            assert_eq!(e, want, "cmd {t} flags {f:#x} at {off} len {len}");
            if structured {
                assert!(!msg.is_empty(), "structured errors carry a message");
            }
        }
        // Writes: the payload is consumed even when refused.
        let (e, _) = c.call(cmd::WRITE, 0, size - 512, 1024, &[1u8; 1024]);
        assert_eq!(e, errno::ENOSPC);
        let (e, _) = c.call(cmd::WRITE, 0, 100, 512, &[1u8; 512]);
        assert_eq!(e, errno::EINVAL);
        let big = vec![9u8; (32 << 20) + 4096];
        let (e, _) = c.call(cmd::WRITE, 0, 0, big.len() as u32, &big);
        assert_eq!(e, errno::EINVAL);
        // Zero-length requests succeed and do nothing.
        assert_eq!(c.call(cmd::READ, 0, 0, 0, &[]).0, 0);
        assert_eq!(c.call(cmd::WRITE, 0, 0, 0, &[]).0, 0);
        // Still in sync and working.
        let (e, _) = c.call(cmd::WRITE, cmd::FLAG_FUA, 8192, 1024, &[3u8; 1024]);
        assert_eq!(e, 0);
        assert_eq!(c.call(cmd::READ, 0, 8192, 1024, &[]), (0, vec![3u8; 1024]));
        assert_eq!(c.call(cmd::FLUSH, 0, 0, 0, &[]).0, 0);
        assert_eq!(c.call(cmd::TRIM, cmd::FLAG_FUA, 8192, 512, &[]).0, 0);
        assert_eq!(c.call(cmd::READ, 0, 8192, 1024, &[]).1[..512], [0u8; 512]);
        assert_eq!(
            c.call(cmd::WRITE_ZEROES, cmd::FLAG_FAST_ZERO, 8192, 1024, &[])
                .0,
            0
        );
        assert_eq!(c.call(cmd::READ, 0, 8192, 1024, &[]), (0, vec![0u8; 1024]));
        assert_eq!(c.call(cmd::CACHE, 0, 0, sz, &[]).0, 0);
        // A bad magic ends the connection.
        c.s.write_all(&[0u8; 28]).unwrap();
        assert!(c.closed());
    }
    still_serves(&sock);
    srv.shutdown();
}

#[test]
fn many_requests_in_flight_out_of_order_and_bounded() {
    let cfg = ServerConfig {
        workers: 4,
        max_in_flight: 8,
        ..ServerConfig::default()
    };
    let (srv, sock, _d) = plain_server("inflight", cfg);
    let (mut c, _) = ready(&sock, "plain", true);
    let n = 2000u64;
    // Write a pattern, one block per request, all pipelined; a reader thread collects.
    let mut rd = c.s.try_clone().unwrap();
    let collect = |rd: &mut UnixStream, n: u64, len: usize| {
        let mut cl = Client {
            s: rd.try_clone().unwrap(),
            structured: true,
        };
        let mut seen = vec![false; n as usize];
        for _ in 0..n {
            let (cookie, e, d) = cl.reply(|_| 0);
            assert_eq!(e, 0);
            assert!(d.is_empty() || d.len() == len);
            if !d.is_empty() {
                assert!(
                    d.iter().all(|&b| b == (cookie % 251) as u8),
                    "data of request {cookie}"
                );
            }
            assert!(!seen[cookie as usize], "two replies for {cookie}");
            seen[cookie as usize] = true;
        }
        let _ = rd;
    };
    let t = std::thread::spawn(move || collect(&mut rd, n, 0));
    for i in 0..n {
        let data = vec![(i % 251) as u8; 4096];
        c.send_req(cmd::WRITE, 0, i, i * 4096, 4096, &data);
    }
    t.join().unwrap();
    let mut rd = c.s.try_clone().unwrap();
    let t = std::thread::spawn(move || collect(&mut rd, n, 4096));
    for i in 0..n {
        c.send_req(cmd::READ, 0, i, i * 4096, 4096, &[]);
    }
    t.join().unwrap();
    drop(c);
    wait_open(&srv, 0);
    let st = srv.stats();
    assert!(st.in_flight_max <= 8, "{st:?}");
    assert!(st.in_flight_max > 1, "requests were not pipelined: {st:?}");
    srv.shutdown();
}

#[test]
fn clients_vanishing_mid_request_do_not_hurt_the_server() {
    let (srv, sock, _d) = plain_server("vanish", ServerConfig::default());
    // Half a request header.
    let (mut c, _) = ready(&sock, "plain", true);
    c.s.write_all(&proto::REQUEST_MAGIC.to_be_bytes()).unwrap();
    drop(c);
    // A write whose payload never fully arrives.
    let (mut c, _) = ready(&sock, "plain", true);
    let mut m = request(cmd::WRITE, 0, 1, 0, 1 << 20);
    m.extend_from_slice(&[5u8; 1000]);
    c.s.write_all(&m).unwrap();
    drop(c);
    // Many reads in flight whose replies nobody reads.
    let (mut c, _) = ready(&sock, "plain", false);
    for i in 0..200 {
        c.send_req(cmd::READ, 0, i, 0, 1 << 20, &[]);
    }
    drop(c);
    // Shut down in the middle of the handshake.
    let c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    drop(c);
    still_serves(&sock);
    wait_open(&srv, 0);
    srv.shutdown();
}

#[test]
fn unix_socket_is_0600_stale_replaced_live_refused() {
    let dir = TmpDir::new("sockperm");
    let sock = dir.path("nbd.sock");
    // A stale socket (nothing listens) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(
        std::fs::symlink_metadata(&sock)
            .unwrap()
            .file_type()
            .is_socket()
    );
    let srv = Server::new(Arc::new(ExportMap::new()), ServerConfig::default());
    let b = srv.listen(&ListenAddr::Unix(sock.clone())).unwrap();
    assert_eq!(b, BoundAddr::Unix(sock.clone()));
    let m = std::fs::symlink_metadata(&sock).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
    // Nothing but the socket is left in the directory.
    let names: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    // A live socket is not taken over.
    let other = Server::new(Arc::new(ExportMap::new()), ServerConfig::default());
    let e = other.listen(&ListenAddr::Unix(sock.clone())).unwrap_err();
    assert!(e.contains("in use"), "{e}");
    // A regular file is not replaced.
    let f = dir.path("file");
    std::fs::write(&f, b"x").unwrap();
    let e = other.listen(&ListenAddr::Unix(f.clone())).unwrap_err();
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&f).unwrap(), b"x");
    // Shutdown removes the socket file.
    srv.shutdown();
    assert!(!sock.exists());
    other.shutdown();
    // 0660 with a group.
    use std::os::unix::fs::MetadataExt;
    let gid = std::fs::metadata(&dir.0).unwrap().gid();
    let g = Server::new(
        Arc::new(ExportMap::new()),
        ServerConfig {
            socket_mode: 0o660,
            socket_group: Some(gid),
            ..ServerConfig::default()
        },
    );
    let gs = dir.path("group.sock");
    g.listen(&ListenAddr::Unix(gs.clone())).unwrap();
    let m = std::fs::symlink_metadata(&gs).unwrap();
    assert_eq!((m.permissions().mode() & 0o777, m.gid()), (0o660, gid));
}

#[test]
fn tcp_loopback_only_and_listen_address_parsing() {
    let ex = Arc::new(ExportMap::new());
    ex.insert(
        "plain",
        "",
        Arc::new(BackendExport::new(Arc::new(RamBackend::new(8 << 11)))),
    );
    let srv = Server::new(ex, ServerConfig::default());
    for a in ["0.0.0.0:0", "[::]:0", "8.8.8.8:10809"] {
        let e = srv.listen(&ListenAddr::Tcp(a.into())).unwrap_err();
        assert!(e.contains("TLS"), "{a}: {e}");
    }
    let BoundAddr::Tcp(addr) = srv
        .listen(&ListenAddr::parse("tcp:127.0.0.1:0").unwrap())
        .unwrap()
    else {
        panic!("not TCP")
    };
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = Client::hello(s, proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES);
    assert_eq!(c.go("plain"), 8 << 20);
    assert_eq!(c.call(cmd::WRITE, 0, 0, 512, &[4u8; 512]).0, 0);
    assert_eq!(c.call(cmd::READ, 0, 0, 512, &[]), (0, vec![4u8; 512]));
    assert_eq!(
        ListenAddr::parse("unix:/run/x.sock").unwrap(),
        ListenAddr::Unix("/run/x.sock".into())
    );
    assert!(ListenAddr::parse("udp:1").is_err());
    assert!(ListenAddr::parse("tcp:nohost").is_err());
    assert!(ListenAddr::parse("unix:").is_err());
    // Shutdown with a connection open and one idle in the handshake returns promptly.
    let idle = TcpStream::connect(addr).unwrap();
    let t = Instant::now();
    srv.shutdown();
    assert!(t.elapsed() < Duration::from_secs(5));
    drop(idle);
    assert!(c.closed());
}

#[test]
fn served_stream_and_engine_export_over_a_socket_pair() {
    let s = Setup::new("pair", 8, 2);
    let (a, b) = UnixStream::pair().unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.server().serve_stream(Box::new(b));
    let mut c = Client::hello(a, proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES);
    c.structured = true;
    assert_eq!(c.opt(opt::STRUCTURED_REPLY, &[])[0].1, rep::ACK);
    assert_eq!(c.go("disk"), 8 << 20);
    // Past the end of an engine export: the engine's own checks agree with the server's.
    assert_eq!(
        c.call(cmd::WRITE, 0, (8 << 20) - 512, 1024, &[1u8; 1024]).0,
        errno::ENOSPC
    );
    assert_eq!(c.call(cmd::READ, 0, 8 << 20, 512, &[]).0, errno::EINVAL);
    // A long trim and zeroing are split into engine-sized requests.
    assert_eq!(c.call(cmd::WRITE, 0, 4096, 4096, &[8u8; 4096]).0, 0);
    assert_eq!(c.call(cmd::TRIM, 0, 0, 8 << 20, &[]).0, 0);
    assert_eq!(c.call(cmd::READ, 0, 4096, 4096, &[]), (0, vec![0u8; 4096]));
    assert_eq!(c.call(cmd::CACHE, 0, 0, 8 << 20, &[]).0, 0);
    let f0 = flushes(&s.engine);
    assert_eq!(c.call(cmd::FLUSH, 0, 0, 0, &[]).0, 0);
    assert!(flushes(&s.engine) > f0);
}

#[test]
fn device_errors_are_eio_and_the_connection_survives() {
    use tiercache_core::units::CoreId;
    use tiercache_engine::Device;
    use tiercache_io::{FaultBackend, FaultConfig, OpKind};
    let core = Arc::new(FaultBackend::new(
        RamBackend::new(8 << 11),
        FaultConfig {
            track_power_cut: false,
            ..FaultConfig::default()
        }
        .with_error_rate(OpKind::Read, 1.0),
    ));
    core.set_faults(false);
    let engine = engine_on(
        Arc::new(RamBackend::new(256 * 8)),
        core.clone() as Device,
        2,
    );
    let ex = Arc::new(ExportMap::new());
    ex.insert(
        "f",
        "",
        Arc::new(tiercache_nbd::EngineExport::new(engine, CoreId(0))),
    );
    let srv = Server::new(ex, ServerConfig::default());
    let dir = TmpDir::new("eio");
    let sock = dir.path("s");
    srv.listen(&ListenAddr::Unix(sock.clone())).unwrap();
    for structured in [true, false] {
        let (mut c, _) = ready(&sock, "f", structured);
        core.set_faults(true);
        // A block not read before (a read that worked is cached afterwards).
        let off = if structured { 1 << 20 } else { 2 << 20 };
        let (e, msg) = c.call(cmd::READ, 0, off, 4096, &[]);
        assert_eq!(e, errno::EIO, "structured {structured}");
        if structured {
            assert!(
                String::from_utf8_lossy(&msg).contains("IO error"),
                "{msg:?}"
            );
        }
        core.set_faults(false);
        assert_eq!(c.call(cmd::READ, 0, off, 4096, &[]), (0, vec![0u8; 4096]));
        assert_eq!(c.call(cmd::WRITE, 0, 0, 4096, &[1u8; 4096]).0, 0);
    }
    srv.shutdown();
}

/// An export whose reads panic.
struct Panicky;

impl tiercache_nbd::Export for Panicky {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn block_sizes(&self) -> tiercache_nbd::BlockSizes {
        tiercache_nbd::BlockSizes::default()
    }
    fn read(&self, _: u64, _: &mut [u8]) -> Result<(), tiercache_nbd::ExportError> {
        panic!("planted panic in an export (expected by the test)")
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), tiercache_nbd::ExportError> {
        Ok(())
    }
    fn flush(&self) -> Result<(), tiercache_nbd::ExportError> {
        Ok(())
    }
    fn trim(&self, _: u64, _: u64) -> Result<(), tiercache_nbd::ExportError> {
        Err(tiercache_nbd::ExportError::NotSupported)
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> Result<(), tiercache_nbd::ExportError> {
        Ok(())
    }
    fn cache(&self, _: u64, _: u64) -> Result<(), tiercache_nbd::ExportError> {
        Ok(())
    }
    fn read_only(&self) -> bool {
        true
    }
}

#[test]
fn panicking_export_answers_eio_and_read_only_refuses_writes() {
    let ex = Arc::new(ExportMap::new());
    ex.insert("p", "", Arc::new(Panicky));
    let srv = Server::new(ex, ServerConfig::default());
    let dir = TmpDir::new("panic");
    let sock = dir.path("s");
    srv.listen(&ListenAddr::Unix(sock.clone())).unwrap();
    let (mut c, _) = ready(&sock, "p", true);
    assert_eq!(c.call(cmd::READ, 0, 0, 512, &[]).0, errno::EIO);
    assert_eq!(c.call(cmd::WRITE, 0, 0, 512, &[0u8; 512]).0, errno::EPERM);
    assert_eq!(c.call(cmd::WRITE_ZEROES, 0, 0, 512, &[]).0, errno::EPERM);
    assert_eq!(c.call(cmd::TRIM, 0, 0, 512, &[]).0, errno::EPERM);
    assert_eq!(c.call(cmd::READ, 0, 0, 512, &[]).0, errno::EIO);
    assert_eq!(c.call(cmd::FLUSH, 0, 0, 0, &[]).0, 0);
    srv.shutdown();
}

#[test]
fn idle_handshake_times_out() {
    let cfg = ServerConfig {
        handshake_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let (srv, sock, _d) = plain_server("idle", cfg);
    let mut c = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    let t = Instant::now();
    assert!(c.closed());
    assert!(t.elapsed() < Duration::from_secs(4));
    still_serves(&sock);
    srv.shutdown();
}

/// Seeded loop of random requests (valid magic, random type, flags, offset, length) on many
/// connections, cut at random points (SPEC R5): the server answers or closes, never panics or
/// hangs, and keeps serving.
#[test]
fn random_requests_never_break_the_server() {
    let (srv, sock, _d) = plain_server("random", ServerConfig::default());
    let mut x = tiercache_testkit::rng::XorShift(0x2545_f491_4f6c_dd1d);
    let mut rnd = move || x.next();
    let size = 8u64 << 20;
    for round in 0..150 {
        let (mut c, _) = ready(&sock, "plain", round % 2 == 0);
        let mut drain = c.s.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            let mut b = vec![0u8; 1 << 16];
            while matches!(drain.read(&mut b), Ok(n) if n > 0) {}
        });
        for i in 0..rnd() % 40 {
            let typ = (rnd() % 10) as u16;
            let flags = [0, cmd::FLAG_FUA, cmd::FLAG_FAST_ZERO, rnd() as u16][(rnd() % 4) as usize];
            let offset = [
                0,
                size - 512,
                size,
                rnd() % size,
                rnd(),
                (rnd() % size) & !511,
            ][(rnd() % 6) as usize];
            let len = [
                0u32,
                512,
                4096,
                100,
                (32 << 20) + 512,
                rnd() as u32 % (1 << 20),
            ][(rnd() % 6) as usize];
            let payload = if typ == cmd::WRITE && len <= 1 << 20 {
                vec![i as u8; len as usize]
            } else {
                vec![]
            };
            if c.try_send_req(typ, flags, i, offset, len, &payload)
                .is_err()
            {
                break; // closed by the server (DISC was among the random commands)
            }
            if typ == cmd::WRITE && len > 1 << 20 {
                break; // the server waits for a payload that never comes: hang up
            }
        }
        if rnd() % 2 == 0 {
            let _ = c.try_send_req(cmd::DISC, 0, 0, 0, 0, &[]);
        }
        let _ = c.s.shutdown(std::net::Shutdown::Write);
        t.join().unwrap();
    }
    wait_open(&srv, 0);
    still_serves(&sock);
    srv.shutdown();
}

#[test]
fn disconnect_export_closes_only_its_connections() {
    let (srv, sock, _d) = plain_server("disconnect", ServerConfig::default());
    let (mut a, _) = ready(&sock, "plain", true);
    let (mut b, _) = ready(&sock, "plain", false);
    let idle = Client::hello(connect(&sock), proto::FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(srv.disconnect_export("other"), 0);
    assert_eq!(srv.disconnect_export("plain"), 2);
    assert!(a.closed());
    assert!(b.closed());
    wait_open(&srv, 1);
    drop(idle);
    wait_open(&srv, 0);
    still_serves(&sock);
    // Shutdown twice (and then drop) is fine.
    srv.shutdown();
    srv.shutdown();
}

#[test]
fn reads_answered_by_the_reader_never_stop_it_reading() {
    // Hits in a RAM cache are answered by the connection's reader itself. A client that sends
    // many reads (far more reply bytes than the socket holds) and then a large WRITE before it
    // reads any reply must still get its WRITE read: replies the socket has no room for go to
    // a worker. If the reader wrote them itself it would block, never read the WRITE, and the
    // client's write below would time out.
    let s = Setup::new("late", 16, 16);
    let (mut c, _) = ready(&s.sock, "disk", true);
    const LEN: u32 = 32 << 10;
    const READS: u64 = 60; // 1.9 MiB of replies, under the 64 requests in flight
    for i in 0..READS {
        let data = vec![(i % 251) as u8; LEN as usize];
        assert_eq!(c.call(cmd::WRITE, 0, i * LEN as u64, LEN, &data).0, 0);
    }
    let hits_before = s.engine.with_cache(|k| {
        k.core_counters(tiercache_core::units::CoreId(0))
            .map_or(0, |x| x.read.full_hit)
    });
    c.s.set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    c.s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for i in 0..READS {
        c.send_req(cmd::READ, 0, i, i * LEN as u64, LEN, &[]);
    }
    let big = vec![7u8; 1 << 20];
    c.try_send_req(cmd::WRITE, 0, 1000, 4 << 20, 1 << 20, &big)
        .expect("the server stopped reading while its replies waited for the client");
    let mut seen = 0;
    for _ in 0..=READS {
        let (cookie, e, d) = c.reply(|_| LEN as usize);
        assert_eq!(e, 0, "request {cookie}");
        if cookie == 1000 {
            assert!(d.is_empty());
        } else {
            assert_eq!(d.len(), LEN as usize);
            assert!(
                d.iter().all(|&b| b == (cookie % 251) as u8),
                "data of {cookie}"
            );
            seen += 1;
        }
    }
    assert_eq!(seen, READS);
    let hits = s.engine.with_cache(|k| {
        k.core_counters(tiercache_core::units::CoreId(0))
            .map_or(0, |x| x.read.full_hit)
    }) - hits_before;
    assert_eq!(hits, READS, "the reads were not all cache hits");
}
