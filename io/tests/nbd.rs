//! The NBD client backend against real servers started (and stopped) by each test: nbdkit
//! (memory plugin, with filters for the fallbacks and faults) and qemu-nbd (a raw file), over
//! unix sockets and loopback TCP. A test whose server is not installed prints
//! "skipped: … not installed" and passes.

mod common;
use common::TempDir;
use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};
use tiercache_io::conformance::{self, pattern};
use tiercache_io::{BLOCK, Backend, IoErr, NbdBackend, NbdOptions, Req};
use tiercache_nbd_proto as proto;
use tiercache_testkit::{Proc, free_port, installed};

/// Export size used throughout (64 MiB).
const SIZE_MIB: u64 = 64;
const SIZE_BLOCKS: u64 = SIZE_MIB << 11;

/// A server process started by a test; killed (exactly this child) and reaped on drop, so
/// also when the test fails.
struct Server {
    child: Proc,
    what: String,
    uri: String,
    log: PathBuf,
    _dir: TempDir,
}

impl Server {
    fn kill(&mut self) {
        self.child.kill();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn connect(&self) -> NbdBackend {
        NbdBackend::connect(&self.uri)
            .unwrap_or_else(|e| panic!("{}: connect {}: {e}\n{}", self.what, self.uri, self.log()))
    }

    fn connect_with(&self, opts: &NbdOptions) -> NbdBackend {
        NbdBackend::connect_with(&self.uri, opts)
            .unwrap_or_else(|e| panic!("{}: connect {}: {e}\n{}", self.what, self.uri, self.log()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether something accepts connections where `uri` points (a plain socket connect: the
/// server may refuse the NBD handshake on purpose).
fn listening(uri: &str) -> bool {
    if let Some((_, path)) = uri.split_once("?socket=") {
        std::os::unix::net::UnixStream::connect(path).is_ok()
    } else {
        let hostport = uri.trim_start_matches("nbd://").split('/').next().unwrap();
        std::net::TcpStream::connect(hostport).is_ok()
    }
}

/// Starts `cmd` (its stderr to a log in `dir`) and waits until it listens where `uri` points.
/// `None` when the process exits first (e.g. the port was taken).
fn start(what: &str, mut cmd: Command, dir: TempDir, uri: String) -> Option<Server> {
    let log = dir.0.join("server.log");
    let f = std::fs::File::create(&log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f);
    let child = Proc::spawn(what, &mut cmd);
    let mut s = Server {
        child,
        what: what.into(),
        uri,
        log,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = s.child.exited() {
            println!("{what} exited early ({status}): {}", s.log());
            return None;
        }
        if listening(&s.uri) {
            return Some(s);
        }
        assert!(
            Instant::now() < deadline,
            "{what} not listening at {}\n{}",
            s.uri,
            s.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn socket_dir() -> TempDir {
    // Unix socket paths are limited to 108 bytes: keep them short.
    TempDir::fresh("nbd")
}

/// nbdkit with `args` (filters, plugin and parameters) on a unix socket; `None` (after printing
/// "skipped") when nbdkit is not installed.
fn nbdkit(args: &[&str]) -> Option<Server> {
    if !installed("nbdkit") {
        println!("skipped: nbdkit not installed");
        return None;
    }
    let dir = socket_dir();
    let sock = dir.0.join("s");
    let mut cmd = Command::new("nbdkit");
    cmd.arg("-U")
        .arg(&sock)
        .args(["-f", "--exit-with-parent"])
        .args(args);
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    Some(start("nbdkit", cmd, dir, uri).expect("nbdkit failed to start"))
}

/// nbdkit's memory plugin (64 MiB) behind `filters` (`--filter=…` and their parameters).
fn nbdkit_memory(pre: &[&str], params: &[&str]) -> Option<Server> {
    let size = format!("{SIZE_MIB}M");
    let mut args: Vec<&str> = pre.to_vec();
    args.extend(["memory", &size]);
    args.extend(params);
    nbdkit(&args)
}

enum Listen {
    Unix,
    Tcp { export: &'static str },
}

/// qemu-nbd serving a fresh 64 MiB raw file with `--cache=none`; `None` (after printing
/// "skipped") when qemu-nbd is not installed. Returns the image path too.
fn qemu_nbd(listen: Listen) -> Option<(Server, PathBuf)> {
    if !installed("qemu-nbd") {
        println!("skipped: qemu-nbd not installed");
        return None;
    }
    for _attempt in 0..5 {
        let dir = socket_dir();
        // The image in the target dir: a disk file system there, where O_DIRECT works.
        let img_dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let img = img_dir.join(format!(
            "{}.img",
            dir.0.file_name().unwrap().to_string_lossy()
        ));
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(SIZE_MIB << 20).unwrap();
        let mut cmd = Command::new("qemu-nbd");
        cmd.args([
            "-f",
            "raw",
            "--cache=none",
            "--discard=unmap",
            "-t",
            "-e",
            "8",
        ]);
        let uri = match &listen {
            Listen::Unix => {
                let sock = dir.0.join("s");
                cmd.arg("-k").arg(&sock);
                format!("nbd+unix:///?socket={}", sock.display())
            }
            Listen::Tcp { export } => {
                let port = free_port();
                cmd.args(["-b", "127.0.0.1", "-p", &port.to_string(), "-x", export]);
                format!("nbd://127.0.0.1:{port}/{export}")
            }
        };
        cmd.arg(&img);
        if let Some(s) = start("qemu-nbd", cmd, dir, uri) {
            return Some((s, img));
        }
        let _ = std::fs::remove_file(&img); // port taken in between: try another
    }
    panic!("qemu-nbd did not start");
}

/// Removes the qemu-nbd image when the test ends.
struct RmOnDrop(PathBuf);

impl Drop for RmOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run_conformance(srv: &Server, b: &NbdBackend) {
    println!("conformance on {}: {}", srv.what, b.name());
    assert_eq!(b.blocks(), SIZE_BLOCKS, "{}", b.name());
    conformance::conformance(b);
}

#[test]
fn nbdkit_memory_conformance() {
    let Some(srv) = nbdkit_memory(&[], &[]) else {
        return;
    };
    let b = srv.connect();
    let name = b.name();
    assert!(name.starts_with("nbd:nbd+unix:///?socket="), "{name}");
    assert!(name.contains("export 64 MiB"), "{name}");
    assert!(b.info().multi_conn && b.connections() == 4, "{name}");
    assert!(
        name.contains("multi-conn x4") && name.contains("fua"),
        "{name}"
    );
    assert!(b.info().negotiated_with_go, "{name}");
    run_conformance(&srv, &b);
    drop(b);
    // The memory plugin keeps its data across connections; the device prefix is accepted.
    let b = NbdBackend::connect(&format!("nbd:{}", srv.uri)).unwrap();
    conformance::verify_persisted(&b);
}

#[test]
fn qemu_nbd_unix_conformance_and_persistence() {
    let Some((mut srv, img)) = qemu_nbd(Listen::Unix) else {
        return;
    };
    let _rm = RmOnDrop(img.clone());
    let b = srv.connect();
    run_conformance(&srv, &b);
    drop(b);
    let b = srv.connect();
    conformance::verify_persisted(&b);
    drop(b);
    srv.kill();
    // What was flushed is in the file itself.
    let data = std::fs::read(&img).unwrap();
    let lba = SIZE_BLOCKS - conformance::PERSIST_BLOCKS;
    let tail = &data[lba as usize * BLOCK..];
    let reread = tiercache_io::RamBackend::new(SIZE_BLOCKS);
    reread.write(lba, tail, false).unwrap();
    conformance::verify_persisted(&reread);
}

#[test]
fn qemu_nbd_tcp_conformance_and_export_names() {
    let Some((srv, img)) = qemu_nbd(Listen::Tcp { export: "disk1" }) else {
        return;
    };
    let _rm = RmOnDrop(img);
    let b = srv.connect();
    assert!(b.name().starts_with("nbd:nbd://127.0.0.1:"), "{}", b.name());
    run_conformance(&srv, &b);
    // A wrong export name is refused with the server's reason, in one line.
    let wrong = srv.uri.replace("/disk1", "/nope");
    let e = NbdBackend::connect(&wrong).unwrap_err().to_string();
    println!("wrong export: {e}");
    assert!(e.contains("nope") && !e.contains('\n'), "{e}");
    // The same export through the `nbd:` device prefix.
    let b2 = NbdBackend::connect(&format!("nbd:{}", srv.uri)).unwrap();
    let mut buf = vec![0u8; BLOCK];
    b2.read(0, &mut buf).unwrap();
    let mut want = vec![0u8; BLOCK];
    b.read(0, &mut want).unwrap();
    assert_eq!(buf, want);
}

#[test]
fn nbdkit_without_fua_write_zeroes_or_multi_conn() {
    let Some(srv) = nbdkit_memory(
        &["--filter=nozero", "--filter=fua", "--filter=multi-conn"],
        &["zeromode=none", "multi-conn-mode=disable"],
    ) else {
        return;
    };
    let b = srv.connect();
    let name = b.name();
    assert!(!b.info().fua && !b.info().write_zeroes, "{name}");
    assert_eq!(b.connections(), 1, "{name}");
    for s in ["1 connection", "fua as write+flush", "zeroes written"] {
        assert!(name.contains(s), "{name}: want {s}");
    }
    run_conformance(&srv, &b);
    // (The fua filter advertises no FUA by default.) A zeroing larger than the zero buffer.
    b.write(100, &pattern(5, 100, 64 * BLOCK), false).unwrap();
    b.write_zeroes(0, 20_000, true).unwrap();
    let mut v = vec![1u8; 20_000 * BLOCK];
    b.read(0, &mut v).unwrap();
    assert!(v.iter().all(|&x| x == 0));
}

#[test]
fn nbdkit_min_and_max_block_sizes_are_obeyed() {
    // The server refuses (EINVAL) any request not aligned to 4 KiB or longer than 64 KiB.
    let Some(srv) = nbdkit_memory(
        &["--filter=blocksize-policy"],
        &[
            "blocksize-minimum=4096",
            "blocksize-preferred=4096",
            "blocksize-maximum=65536",
            "blocksize-error-policy=error",
        ],
    ) else {
        return;
    };
    let b = srv.connect();
    let name = b.name();
    assert_eq!(
        (b.info().min_block, b.info().max_block),
        (4096, 65536),
        "{name}"
    );
    assert!(
        name.contains("min block 4096 (read-modify-write)"),
        "{name}"
    );
    run_conformance(&srv, &b);
    // Large unaligned requests: split, and read-modify-write at both ends.
    let (lba, n) = (3u64, 3001u64);
    let data = pattern(11, lba, n as usize * BLOCK);
    b.write(lba, &data, true).unwrap();
    let mut got = vec![0u8; n as usize * BLOCK];
    b.read(lba, &mut got).unwrap();
    assert!(got == data, "large unaligned round trip");
    b.trim(lba + 1, n - 2).unwrap();
    b.read(lba, &mut got).unwrap();
    assert!(
        got[..BLOCK] == data[..BLOCK] && got[got.len() - BLOCK..] == data[data.len() - BLOCK..]
    );
    assert!(got[BLOCK..got.len() - BLOCK].iter().all(|&x| x == 0));
    // Eight threads each own one 512-byte block of the same 4 KiB blocks: the read-modify-write
    // locks must keep every write.
    let base = 10_000u64;
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let b = &b;
            s.spawn(move || {
                for round in 0..40u64 {
                    let lba = base + (round % 4) * 8 + t;
                    let tag = 100 + round * 8 + t;
                    b.write(lba, &pattern(tag, lba, BLOCK), round % 5 == 0)
                        .unwrap();
                }
            });
        }
    });
    for t in 0..8u64 {
        for k in 0..4u64 {
            let lba = base + k * 8 + t;
            let last = (0..40).filter(|r| r % 4 == k).max().unwrap();
            let mut v = vec![0u8; BLOCK];
            b.read(lba, &mut v).unwrap();
            assert!(
                v == pattern(100 + last * 8 + t, lba, BLOCK),
                "neighbouring write lost at {lba}"
            );
        }
    }
}

#[test]
fn nbdkit_export_name_negotiation_without_go() {
    // Handshake flags masked to 0: not fixed newstyle, so only NBD_OPT_EXPORT_NAME.
    let Some(srv) = nbdkit_memory(&["--mask-handshake=0"], &[]) else {
        return;
    };
    let b = srv.connect();
    assert!(!b.info().negotiated_with_go, "{}", b.name());
    assert!(b.name().contains("NBD_OPT_EXPORT_NAME"), "{}", b.name());
    run_conformance(&srv, &b);
}

#[test]
fn many_threads_share_connections() {
    let Some(srv) = nbdkit_memory(&[], &[]) else {
        return;
    };
    for conns in [1usize, 4] {
        let b = srv.connect_with(&NbdOptions {
            connections: conns,
            ..NbdOptions::default()
        });
        assert_eq!(b.connections(), conns);
        const THREADS: u64 = 16;
        const SPAN: u64 = 2048;
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let b = &b;
                s.spawn(move || {
                    let start = t * SPAN;
                    let mut lba = start;
                    let mut k = 0u64;
                    while lba < start + SPAN {
                        let len = (1 + (k * 7 + t) % 64).min(start + SPAN - lba);
                        let tag = 2000 + t;
                        b.write(lba, &pattern(tag, lba, len as usize * BLOCK), k % 9 == 0)
                            .unwrap();
                        let mut r = vec![0u8; len as usize * BLOCK];
                        b.read(lba, &mut r).unwrap();
                        assert!(r == pattern(tag, lba, r.len()), "thread {t} at {lba}");
                        if k % 11 == 0 {
                            b.flush().unwrap();
                        }
                        lba += len;
                        k += 1;
                    }
                });
            }
        });
        println!(
            "{THREADS} threads, {conns} connection(s): {:?}",
            t0.elapsed()
        );
        let mut all = vec![0u8; (THREADS * SPAN) as usize * BLOCK];
        b.read(0, &mut all).unwrap();
        for t in 0..THREADS {
            let r = (t * SPAN) as usize * BLOCK..((t + 1) * SPAN) as usize * BLOCK;
            assert!(all[r] == pattern(2000 + t, t * SPAN, SPAN as usize * BLOCK));
        }
        // A batch of many requests is sent before any reply is awaited.
        let bufs: Vec<Vec<u8>> = (0..100u64)
            .map(|i| pattern(3000, i * 8, 8 * BLOCK))
            .collect();
        let mut reqs: Vec<Req<'_>> = bufs
            .iter()
            .enumerate()
            .map(|(i, v)| Req::Write {
                lba: i as u64 * 8,
                buf: v,
                fua: false,
            })
            .collect();
        reqs.push(Req::Flush);
        assert!(b.submit_batch(&mut reqs).iter().all(|r| r.is_ok()));
        let mut r = vec![0u8; 800 * BLOCK];
        b.read(0, &mut r).unwrap();
        assert!(r == pattern(3000, 0, 800 * BLOCK));
    }
}

#[test]
fn replies_out_of_order_on_one_connection() {
    // Writes take 1.5 s on the server, reads none: reads sent after a write, on the same
    // connection, are answered first.
    let Some(srv) = nbdkit_memory(
        &["--filter=multi-conn", "--filter=delay"],
        &["multi-conn-mode=disable", "delay-write=1500ms"],
    ) else {
        return;
    };
    let b = srv.connect();
    assert_eq!(b.connections(), 1);
    let write_done = AtomicBool::new(false);
    let started = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            started.wait();
            b.write(0, &pattern(1, 0, 8 * BLOCK), false).unwrap();
            write_done.store(true, Ordering::SeqCst);
        });
        started.wait();
        std::thread::sleep(Duration::from_millis(100)); // let the write go out first
        let mut buf = vec![0u8; BLOCK];
        for i in 0..20 {
            b.read(1000 + i, &mut buf).unwrap();
        }
        assert!(
            !write_done.load(Ordering::SeqCst),
            "20 reads should complete while the slow write is in flight"
        );
    });
    assert!(write_done.load(Ordering::SeqCst));
    let mut buf = vec![0u8; 8 * BLOCK];
    b.read(0, &mut buf).unwrap();
    assert!(buf == pattern(1, 0, 8 * BLOCK));
}

/// Kills the server while threads are busy: every thread must get an error (within a generous
/// watchdog, so a hang fails the test instead of blocking it), and later requests fail at once.
fn killed_mid_run(mut srv: Server) {
    let b = Arc::new(srv.connect());
    println!("killing the server under: {}", b.name());
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU32::new(0));
    let (tx, rx) = mpsc::channel();
    for t in 0..8u64 {
        let (b, stop, ops, tx) = (b.clone(), stop.clone(), ops.clone(), tx.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * BLOCK];
            let data = pattern(t, 0, 16 * BLOCK);
            let mut i = 0u64;
            let err = loop {
                let lba = t * 4096 + (i % 200) * 16;
                let r = match i % 4 {
                    0 => b.write(lba, &data, i % 8 == 0),
                    1 => b.read(lba, &mut buf),
                    2 => b.write_zeroes(lba, 16, false),
                    _ => b.flush(),
                };
                ops.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = r {
                    break Some(e);
                }
                if stop.load(Ordering::Relaxed) {
                    break None;
                }
                i += 1;
            };
            let _ = tx.send((t, err));
        });
    }
    drop(tx);
    while ops.load(Ordering::Relaxed) < 500 {
        std::thread::sleep(Duration::from_millis(5));
    }
    srv.kill();
    let mut errors = Vec::new();
    for _ in 0..8 {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok((t, Some(e))) => errors.push((t, e)),
            Ok((t, None)) => panic!("thread {t} stopped without an error"),
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                panic!("a thread hung after the server was killed");
            }
        }
    }
    let e = &errors[0].1;
    println!("first error after the kill: {e}");
    for (t, e) in &errors {
        let msg = e.to_string();
        assert!(
            matches!(e, IoErr::Io { .. }) && !msg.contains('\n'),
            "thread {t}: {msg}"
        );
    }
    // Every connection notices the death (each by its own receiver, so not necessarily by the
    // time the threads above saw their errors); later requests then fail at once, and the name
    // says so.
    let t = Instant::now();
    while b.is_connected() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "a connection never noticed the server's death"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(b.name().contains("DISCONNECTED"), "{}", b.name());
    let mut buf = vec![0u8; BLOCK];
    for r in [
        b.read(0, &mut buf),
        b.write(0, &buf, true),
        b.write_zeroes(0, 1, false),
        b.trim(0, 1),
        b.flush(),
    ] {
        match r {
            Err(IoErr::Io { kind, msg }) => {
                assert_eq!(kind, ErrorKind::ConnectionAborted, "{msg}");
                assert!(msg.contains("connection lost"), "{msg}");
            }
            other => panic!("after the kill: {other:?}"),
        }
    }
    drop(b); // the Drop of a dead backend returns too
}

#[test]
fn nbdkit_killed_mid_run_gives_errors_not_hangs() {
    if let Some(srv) = nbdkit_memory(&[], &[]) {
        killed_mid_run(srv);
    }
}

#[test]
fn qemu_nbd_killed_mid_run_gives_errors_not_hangs() {
    if let Some((srv, img)) = qemu_nbd(Listen::Unix) {
        let _rm = RmOnDrop(img);
        killed_mid_run(srv);
    }
}

#[test]
fn request_timeout_fails_a_silent_server() {
    let Some(srv) = nbdkit_memory(&["--filter=delay"], &["delay-read=30"]) else {
        return;
    };
    let b = srv.connect_with(&NbdOptions {
        connections: 1,
        request_timeout: Some(Duration::from_millis(300)),
        ..NbdOptions::default()
    });
    b.write(0, &pattern(1, 0, BLOCK), false).unwrap();
    let mut buf = vec![0u8; BLOCK];
    let e = b.read(0, &mut buf).unwrap_err().to_string();
    println!("timed out: {e}");
    assert!(e.contains("timeout"), "{e}");
    assert!(b.write(0, &buf, false).is_err());
    assert!(!b.is_connected());
}

#[test]
fn server_errors_map_to_io_errors() {
    if !installed("nbdkit") {
        println!("skipped: nbdkit not installed");
        return;
    }
    let dir = socket_dir();
    let (rd_trigger, wr_trigger) = (dir.0.join("rd"), dir.0.join("wr"));
    let rd_param = format!("error-pread-file={}", rd_trigger.display());
    let wr_param = format!("error-pwrite-file={}", wr_trigger.display());
    let Some(srv) = nbdkit_memory(
        &["--filter=error"],
        &[
            "error-pread=EIO",
            "error-pread-rate=1",
            &rd_param,
            "error-pwrite=ENOSPC",
            "error-pwrite-rate=1",
            &wr_param,
        ],
    ) else {
        return;
    };
    let b = srv.connect();
    let data = pattern(9, 8, 8 * BLOCK);
    b.write(8, &data, false).unwrap();
    let mut buf = vec![0u8; 8 * BLOCK];
    std::fs::write(&rd_trigger, b"").unwrap();
    match b.read(8, &mut buf) {
        Err(IoErr::Io { kind, msg }) => {
            println!("read error: {msg}");
            assert_eq!(kind, ErrorKind::Other);
            assert!(msg.contains("EIO") && msg.contains("READ"), "{msg}");
        }
        other => panic!("want EIO, got {other:?}"),
    }
    std::fs::write(&wr_trigger, b"").unwrap();
    match b.write(8, &pattern(10, 8, 8 * BLOCK), true) {
        Err(IoErr::Io { kind, msg }) => {
            println!("write error: {msg}");
            assert_eq!(kind, ErrorKind::StorageFull, "{msg}");
        }
        other => panic!("want ENOSPC, got {other:?}"),
    }
    // Errors leave the connection usable.
    std::fs::remove_file(&rd_trigger).unwrap();
    std::fs::remove_file(&wr_trigger).unwrap();
    assert!(b.is_connected());
    b.read(8, &mut buf).unwrap();
    assert!(buf == data);

    // A read-only export: writes are refused, reads work.
    let Some(ro) = nbdkit_memory(&["-r"], &[]) else {
        return;
    };
    let b = ro.connect();
    assert!(
        b.info().read_only && b.name().contains("read-only"),
        "{}",
        b.name()
    );
    b.read(0, &mut buf).unwrap();
    b.flush().unwrap();
    for r in [
        b.write(0, &buf, false),
        b.write_zeroes(0, 1, false),
        b.trim(0, 1),
    ] {
        assert!(
            matches!(
                r,
                Err(IoErr::Io {
                    kind: ErrorKind::PermissionDenied,
                    ..
                })
            ),
            "{r:?}"
        );
    }
}

fn one_line_err(uri: &str, opts: &NbdOptions) -> String {
    let e = match NbdBackend::connect_with(uri, opts) {
        Ok(b) => panic!("{uri}: connected: {}", b.name()),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(!msg.contains('\n') && !msg.is_empty(), "{uri}: {msg}");
    msg
}

#[test]
fn bad_uris_and_unreachable_servers() {
    let opts = NbdOptions::default();
    for uri in [
        "",
        "nbd:",
        "/dev/sda",
        "file:/tmp/x",
        "nbd:/tmp/x",
        "nbd://",
        "nbd://host:notaport/x",
        "nbd://host:70000/",
        "nbds://host/x",
        "nbd+unix:///x",
        "nbd+unix://host/x?socket=/s",
        "nbd+unix:///x?sockt=/s",
        "nbd://host/x?socket=/s",
        "nbd://host/%zz",
        "nbd://host/a b",
        "nbd://host/a\nb",
    ] {
        let msg = one_line_err(uri, &opts);
        println!("{uri:?}: {msg}");
        assert!(msg.contains("invalid NBD URI"), "{uri}: {msg}");
    }
    // Nothing listening.
    let dir = socket_dir();
    let missing = format!("nbd+unix:///?socket={}", dir.0.join("none").display());
    let msg = one_line_err(&missing, &opts);
    println!("{msg}");
    assert!(msg.contains("connect to unix socket"), "{msg}");
    let port = free_port();
    let msg = one_line_err(&format!("nbd://127.0.0.1:{port}/"), &opts);
    println!("{msg}");
    assert!(msg.contains("127.0.0.1"), "{msg}");

    // Something that is not an NBD server.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let junk = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = l.accept().unwrap();
        let _ = s.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n");
        // A second client that gets no greeting at all: the handshake times out.
        let (_s2, _) = l.accept().unwrap();
        let _ = done_rx.recv_timeout(Duration::from_secs(30));
    });
    let uri = format!("nbd://127.0.0.1:{port}/");
    let msg = one_line_err(&uri, &opts);
    println!("{msg}");
    assert!(msg.contains("not an NBD server"), "{msg}");
    let quick = NbdOptions {
        connect_timeout: Duration::from_millis(300),
        ..NbdOptions::default()
    };
    let msg = one_line_err(&uri, &quick);
    println!("{msg}");
    assert!(msg.contains("timed out"), "{msg}");
    drop(done_tx);
    junk.join().unwrap();

    // nbdkit refusing: an unknown export, and oldstyle negotiation.
    let Some(srv) = nbdkit_memory(
        &["--filter=exportname"],
        &["exportname=good", "exportname-strict=true"],
    ) else {
        return;
    };
    let good = srv.uri.replace(":///?", ":///good?");
    let b = NbdBackend::connect(&good).unwrap();
    assert_eq!(b.blocks(), SIZE_BLOCKS);
    let bad = srv.uri.replace(":///?", ":///bad?");
    let msg = one_line_err(&bad, &opts);
    println!("{msg}");
    assert!(msg.contains("'bad'"), "{msg}");
    assert!(matches!(
        NbdBackend::connect(&bad),
        Err(IoErr::Io {
            kind: ErrorKind::NotFound,
            ..
        })
    ));
    let Some(old) = nbdkit_memory(&["-o"], &[]) else {
        return;
    };
    let msg = one_line_err(&old.uri, &opts);
    println!("{msg}");
    assert!(msg.contains("oldstyle"), "{msg}");
}

/// A scripted server: fixed newstyle without NO_ZEROES, refuses NBD_OPT_GO as unsupported,
/// accepts NBD_OPT_EXPORT_NAME (with the 124 zero bytes), answers one READ, then answers the
/// next request with a cookie never sent.
fn fake_server(l: TcpListener) -> Vec<u8> {
    use std::io::{Read, Write};
    fn rd<const N: usize>(s: &mut impl Read) -> [u8; N] {
        let mut b = [0u8; N];
        s.read_exact(&mut b).unwrap();
        b
    }
    let (mut s, _) = l.accept().unwrap();
    s.write_all(&proto::greeting(proto::FLAG_FIXED_NEWSTYLE))
        .unwrap(); // FIXED_NEWSTYLE only
    assert_eq!(
        u32::from_be_bytes(rd(&mut s)),
        proto::FLAG_C_FIXED_NEWSTYLE,
        "client flags"
    );
    let names = loop {
        let (opt, len) = proto::parse_option_header(&rd(&mut s)).expect("IHAVEOPT");
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).unwrap();
        if opt == proto::opt::GO {
            s.write_all(&proto::option_reply(opt, proto::rep::ERR_UNSUP, &[]))
                .unwrap();
            continue;
        }
        assert_eq!(
            opt,
            proto::opt::EXPORT_NAME,
            "NBD_OPT_EXPORT_NAME after NBD_OPT_GO was refused"
        );
        s.write_all(&(1u64 << 20).to_be_bytes()).unwrap();
        let flags = proto::tflag::HAS_FLAGS | proto::tflag::SEND_FLUSH;
        s.write_all(&flags.to_be_bytes()).unwrap();
        s.write_all(&[0u8; 124]).unwrap();
        break data;
    };
    for bad in [false, true] {
        let req = proto::Request::decode(&rd(&mut s)).expect("request magic");
        assert_eq!(req.typ, proto::cmd::READ, "a READ");
        let mut cookie = req.cookie;
        if bad {
            cookie = cookie.wrapping_add(12345);
        }
        s.write_all(&proto::simple_reply(0, cookie)).unwrap();
        s.write_all(&vec![0xAB; req.len as usize]).unwrap();
    }
    names
}

#[test]
fn export_name_fallback_and_protocol_errors() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let srv = std::thread::spawn(move || fake_server(l));
    let b = NbdBackend::connect(&format!("nbd://127.0.0.1:{port}/my%20disk")).unwrap();
    let name = b.name();
    println!("fake server: {name}");
    assert_eq!(b.blocks(), 2048);
    assert_eq!(b.connections(), 1);
    assert!(!b.info().negotiated_with_go && !b.info().fua, "{name}");
    assert!(name.contains("NBD_OPT_EXPORT_NAME") && name.contains("export 1 MiB"));
    let mut buf = vec![0u8; 2 * BLOCK];
    b.read(4, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0xAB));
    match b.read(4, &mut buf) {
        Err(IoErr::Io { kind, msg }) => {
            println!("{msg}");
            assert_eq!(kind, ErrorKind::ConnectionAborted);
            assert!(msg.contains("protocol error"), "{msg}");
        }
        other => panic!("want a protocol error, got {other:?}"),
    }
    assert!(b.flush().is_err() && !b.is_connected());
    assert_eq!(srv.join().unwrap(), b"my disk");
}

/// nbdkit serving `args` (plugin and parameters) on the unix socket `sock`, which the caller
/// keeps across restarts; `None` when nbdkit is not installed.
fn nbdkit_at(sock: &Path, args: &[&str]) -> Option<Server> {
    if !installed("nbdkit") {
        println!("skipped: nbdkit not installed");
        return None;
    }
    // A killed nbdkit leaves its socket file behind.
    let _ = std::fs::remove_file(sock);
    let mut cmd = Command::new("nbdkit");
    cmd.arg("-U")
        .arg(sock)
        .args(["-f", "--exit-with-parent"])
        .args(args);
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    Some(start("nbdkit", cmd, socket_dir(), uri).expect("nbdkit failed to start"))
}

/// Waits (up to 15 s) until `f` holds.
fn wait_for(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "not within 15 s: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn reconnects_when_the_server_comes_back() {
    let dir = socket_dir();
    let sock = dir.0.join("s");
    let img = dir.0.join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(SIZE_MIB << 20)
        .unwrap();
    let file = format!("file={}", img.display());
    let Some(mut srv) = nbdkit_at(&sock, &["file", &file]) else {
        return;
    };
    let b = srv.connect();
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let events = events.clone();
        b.on_event(move |e| events.lock().unwrap().push(e.clone()));
    }
    let a = pattern(1, 0, 8 * BLOCK);
    b.write(0, &a, false).unwrap();
    b.flush().unwrap();
    // Acknowledged, not flushed when the server goes.
    b.write(64, &pattern(2, 0, 8 * BLOCK), false).unwrap();

    srv.kill();
    let mut buf = vec![0u8; 8 * BLOCK];
    wait_for("the backend notices", || !b.is_connected());
    // While the server is away requests fail at once, with one line.
    let t = Instant::now();
    match b.read(0, &mut buf) {
        Err(IoErr::Io { kind, msg }) => {
            assert_eq!(kind, ErrorKind::ConnectionAborted, "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        other => panic!("while the server is away: {other:?}"),
    }
    assert!(b.write(128, &a, false).is_err());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(700));

    // Another export on the socket (another size): not used.
    let other = nbdkit_at(&sock, &["memory", "1M"]).unwrap();
    wait_for("the other export is noticed", || {
        events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, tiercache_io::NbdEvent::Mismatch { .. }))
    });
    assert!(!b.is_connected());
    assert!(b.read(0, &mut buf).is_err());
    drop(other);

    // The same export again: the backend reconnects by itself.
    let srv2 = nbdkit_at(&sock, &["file", &file]).unwrap();
    wait_for("the backend reconnects", || b.is_connected());
    assert_eq!(b.reconnects(), 1);
    b.read(0, &mut buf).unwrap();
    assert_eq!(buf, a);
    let c = pattern(3, 0, 8 * BLOCK);
    b.write(256, &c, false).unwrap();
    // The first flush says the write acknowledged before the loss may not be durable; it
    // flushes the later ones all the same, and the next flush succeeds.
    let e = b.flush().unwrap_err().to_string();
    assert!(e.contains("may not be durable") && !e.contains('\n'), "{e}");
    b.flush().unwrap();
    b.read(256, &mut buf).unwrap();
    assert_eq!(buf, c);
    let ev = events.lock().unwrap().clone();
    println!("events: {ev:?}");
    assert!(
        matches!(ev[0], tiercache_io::NbdEvent::Lost { .. }),
        "{ev:?}"
    );
    assert!(
        matches!(ev.last(), Some(tiercache_io::NbdEvent::Reconnected { attempts, .. }) if *attempts > 1),
        "{ev:?}"
    );
    assert_eq!(ev.len(), 3, "one event each: {ev:?}");
    drop(b);
    drop(srv2);
    // On nbdkit's file: everything flushed after the reconnection.
    let f = std::fs::read(&img).unwrap();
    assert_eq!(&f[256 * BLOCK..][..8 * BLOCK], &c[..]);
}

#[test]
fn no_reconnection_when_turned_off() {
    let dir = socket_dir();
    let sock = dir.0.join("s");
    let Some(mut srv) = nbdkit_at(&sock, &["memory", "64M"]) else {
        return;
    };
    let b = srv.connect_with(&NbdOptions {
        reconnect_max: None,
        ..NbdOptions::default()
    });
    b.write(0, &pattern(1, 0, BLOCK), false).unwrap();
    srv.kill();
    wait_for("the backend notices", || !b.is_connected());
    let _srv2 = nbdkit_at(&sock, &["memory", "64M"]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!b.is_connected());
    assert_eq!(b.reconnects(), 0);
    assert!(b.flush().is_err());
}
