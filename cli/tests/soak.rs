//! The soak (issue 8 item 5): the real `tiercache daemon` under a verifying load from many
//! connections for a bounded time, while faults are injected and the daemon is restarted.
//!
//! One daemon, reassembled from its config file at every start, serves four exports of three
//! caches; every cache device and every file core is a `powercut:` device (un-flushed writes
//! live in a side log until a device flush, so a SIGKILL can be followed by a power cut):
//!
//! - cache 1, `wb` (4 KiB lines, `acp` cleaning, sequential cutoff at 128 KiB), two cores in
//!   one pool, exports `wb-a` (5 connections) and `wb-b` (2), the cache smaller than its cores;
//! - cache 2, `wt` at first (16 KiB lines) over an `nbd:` core served by `nbdkit
//!   --filter=error` (error rate 25% while the error file exists), export `wt` (4 connections);
//! - cache 3, `wl`, export `wl` (3 connections).
//!
//! Each connection owns every n-th 256 KiB region of its export and runs a seeded mix of 4 KiB
//! random reads and writes, unaligned small writes, sequential writes of 64–256 KiB, FUA
//! writes, flushes, TRIMs, WRITE_ZEROES (some FUA) and larger reads; every read is checked
//! against the per-512-byte-block oracle of `common/oracle.rs` (the newest acknowledged data;
//! after a write that failed, the old or the new data, and then always the same).
//!
//! The load runs in rounds of 2–8 s. During a round an admin thread switches the modes of
//! caches 1 (`wb`, `wt`, `wa`, `wi`, `pt`, `wo`) and 2 (`wt`, `wa`, `wi`, `pt`, `wb`) and runs
//! `writeback` on every cache, and an error thread turns the core errors of cache 2 on and off
//! (clients of `wt` may then see EIO on what reaches the core: those are expected errors,
//! counted; the oracle takes a failed write as "may or may not have happened" and a failed read
//! as no information; in `wb` the writeback to that core fails and is retried; a command on
//! cache 2 that fails while its core fails is counted as refused, not as an error). The error
//! file is removed before each kill or shutdown. A round ends with a SIGKILL of the daemon followed by a power cut of
//! every `powercut:` device (un-flushed writes kept, dropped or torn at 512 bytes, seeded) or
//! with a clean `shutdown` (which must keep every acknowledged write); the daemon is started
//! again from the config, every block of every export is read and checked against the oracle
//! (a flushed write is never lost, nothing older than the floor, never a mix inside a block),
//! and on some rounds a `writeback` and a second read must agree (no flip-flop). The value a
//! block settled on must then survive every later crash until it is written again.
//!
//! At the end one line of figures: operations, bytes, client errors (expected and not), faults
//! injected, restarts, verification reads and failures, daemon panics (`panicked` in its log)
//! and hangs (an operation, command or restart over 60 s). The test asserts 0 verification
//! failures, 0 unexpected errors, 0 panics, 0 hangs. Nothing about speed is asserted.
//!
//! `TIERCACHE_SOAK_SECS` sets the load time (120 by default, the CI bound; the test takes a
//! little longer for the last round's verification), `TIERCACHE_SEED` the seed:
//! `TIERCACHE_SOAK_SECS=3600 cargo test --release -p tiercache --test soak -- --nocapture`.
//! Skipped (with a message) when nbdkit is not installed.

mod common;
#[path = "common/oracle.rs"]
mod oracle;

use common::{BIN, Daemon, Dir, Opts, env_u64, have};
use oracle::{Rng, SECTOR, Sector, decode, fill};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiercache_io::{OverlayBackend, PowerCutPattern};
use tiercache_loadgen::{Connection, Error, Target};

/// Sectors per region (256 KiB): a region belongs to one connection.
const REGION: usize = 512;
/// An operation, command or restart that takes longer is a hang.
const DEADLINE: Duration = Duration::from_secs(60);

/// An export the soak loads.
struct Spec {
    name: &'static str,
    bytes: u64,
    conns: usize,
    /// Served through the core that fails while errors are on.
    errors: bool,
}

const EXPORTS: [Spec; 4] = [
    Spec {
        name: "wb-a",
        bytes: 48 << 20,
        conns: 5,
        errors: false,
    },
    Spec {
        name: "wb-b",
        bytes: 16 << 20,
        conns: 2,
        errors: false,
    },
    Spec {
        name: "wt",
        bytes: 32 << 20,
        conns: 4,
        errors: true,
    },
    Spec {
        name: "wl",
        bytes: 32 << 20,
        conns: 3,
        errors: false,
    },
];

/// An export's oracle, one lock per region (each region has one writer, so no contention).
struct Vol {
    spec: &'static Spec,
    regions: Vec<Mutex<Vec<Sector>>>,
}

impl Vol {
    fn new(spec: &'static Spec) -> Vol {
        let n = spec.bytes as usize / SECTOR / REGION;
        Vol {
            spec,
            regions: (0..n)
                .map(|_| Mutex::new(vec![Sector::default(); REGION]))
                .collect(),
        }
    }
}

/// Operation kinds, for the counts.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Op {
    Read,
    Write,
    Flush,
    Trim,
    Zero,
}

const OPS: [Op; 5] = [Op::Read, Op::Write, Op::Flush, Op::Trim, Op::Zero];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "reads",
            Op::Write => "writes",
            Op::Flush => "flushes",
            Op::Trim => "trims",
            Op::Zero => "write-zeroes",
        }
    }
}

/// What the workers and the admin thread count.
#[derive(Default)]
struct Counts {
    ops: BTreeMap<Op, u64>,
    fua: u64,
    seq: u64,
    bytes_read: u64,
    bytes_written: u64,
    /// Reads checked against the oracle while running, and the sectors they covered.
    verified_reads: u64,
    verified_sectors: u64,
    /// Expected core errors seen by clients, by operation.
    core_errors: BTreeMap<Op, u64>,
    /// NBD error values of those.
    errnos: BTreeMap<u32, u64>,
    /// Requests cut by a kill or a shutdown.
    disconnects: u64,
    unexpected: Vec<String>,
    failures: Vec<String>,
    hangs: Vec<String>,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        for (k, v) in o.ops {
            *self.ops.entry(k).or_default() += v;
        }
        for (k, v) in o.core_errors {
            *self.core_errors.entry(k).or_default() += v;
        }
        for (k, v) in o.errnos {
            *self.errnos.entry(k).or_default() += v;
        }
        self.fua += o.fua;
        self.seq += o.seq;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.verified_reads += o.verified_reads;
        self.verified_sectors += o.verified_sectors;
        self.disconnects += o.disconnects;
        self.unexpected.extend(o.unexpected);
        self.failures.extend(o.failures);
        self.hangs.extend(o.hangs);
    }
}

/// What every thread of a round shares.
struct Ctx {
    dir: PathBuf,
    /// Set before a kill or shutdown: from then on a lost connection is expected.
    fault: AtomicBool,
    /// Set after the kill or shutdown: the workers stop.
    stop: AtomicBool,
    /// When the core errors were on: (on, off).
    windows: Mutex<Vec<(Instant, Option<Instant>)>>,
    round: usize,
    /// Per-round version base, so versions never repeat.
    version: AtomicU64,
}

impl Ctx {
    /// Whether core errors were on at some moment between `from` and `to`.
    fn errors_during(&self, from: Instant, to: Instant) -> bool {
        self.windows
            .lock()
            .unwrap()
            .iter()
            .any(|&(on, off)| on <= to && off.is_none_or(|o| o >= from))
    }
}

/// A child process this test started (nbdkit); dropping it kills exactly that process.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn target(dir: &Path, export: &str) -> Target {
    Target::Unix {
        socket: dir.join("nbd.sock"),
        export: export.into(),
    }
}

fn connect(dir: &Path, export: &str) -> Result<Connection, String> {
    let t = Instant::now();
    loop {
        match Connection::connect(&target(dir, export)) {
            Ok(c) => {
                c.set_timeout(Some(DEADLINE)).unwrap();
                return Ok(c);
            }
            Err(e) if t.elapsed() > Duration::from_secs(30) => {
                return Err(format!("export {export} not served: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn timed_out(e: &Error) -> bool {
    matches!(e, Error::Io(io) if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

/// One connection's load until `ctx.stop` or its connection is lost.
fn worker(ctx: &Ctx, vol: &Vol, w: usize, seed: u64) -> Counts {
    let mut n = Counts::default();
    let spec = vol.spec;
    let name = spec.name;
    let round = ctx.round;
    let mut c = match connect(&ctx.dir, name) {
        Ok(c) => c,
        Err(e) => {
            n.failures
                .push(format!("RECOVERY FAILED at round {round}: {e}"));
            return n;
        }
    };
    if c.size() != spec.bytes {
        n.failures.push(format!(
            "export {name} has {} bytes, want {}",
            c.size(),
            spec.bytes
        ));
        return n;
    }
    let mut rng = Rng(seed);
    let owned: Vec<usize> = (0..vol.regions.len())
        .filter(|r| r % spec.conns == w)
        .collect();
    let mut buf = vec![0u8; 2 * REGION * SECTOR];
    let mut touched: Vec<(usize, usize)> = Vec::new(); // (region, sector in region) since the last flush
    let mut cursor = (rng.below(owned.len() as u64) as usize, 0usize);
    while !ctx.stop.load(Ordering::Relaxed) {
        let p = rng.below(100);
        // (op, region, first sector in the region, sectors, fua)
        let (op, region, off, len, fua) = if !(25..92).contains(&p) {
            let region = owned[rng.below(owned.len() as u64) as usize];
            let (off, len) = if p < 15 {
                (rng.below(REGION as u64 / 8) as usize * 8, 8)
            } else if p < 25 {
                let len = rng.range(1, 64) as usize;
                (rng.below((REGION - len) as u64 + 1) as usize, len)
            } else {
                let len = rng.range(4, 32) as usize * 8;
                (rng.below(((REGION - len) / 8) as u64 + 1) as usize * 8, len)
            };
            (Op::Read, region, off, len, false)
        } else if p < 72 {
            let region = owned[rng.below(owned.len() as u64) as usize];
            if p < 50 {
                (
                    Op::Write,
                    region,
                    rng.below(REGION as u64 / 8) as usize * 8,
                    8,
                    false,
                )
            } else if p < 58 {
                let len = rng.range(1, 32) as usize;
                let off = rng.below((REGION - len) as u64 + 1) as usize;
                (Op::Write, region, off, len, false)
            } else if p < 66 {
                // Sequential: the next 64-256 KiB of this connection's regions, in order.
                let len = (rng.range(1, 4) as usize * 128).min(REGION - cursor.1);
                let (ri, off) = cursor;
                cursor = if off + len >= REGION {
                    ((ri + 1) % owned.len(), 0)
                } else {
                    (ri, off + len)
                };
                n.seq += 1;
                (Op::Write, owned[ri], off, len, false)
            } else {
                let len = rng.range(1, 4) as usize * 8;
                let off = rng.below(((REGION - len) / 8) as u64 + 1) as usize * 8;
                (Op::Write, region, off, len, true)
            }
        } else if p < 80 {
            (Op::Flush, 0, 0, 0, false)
        } else {
            let region = owned[rng.below(owned.len() as u64) as usize];
            let len = rng.range(1, 16) as usize * 8;
            let off = rng.below(((REGION - len) / 8) as u64 + 1) as usize * 8;
            if p < 86 {
                (Op::Trim, region, off, len, false)
            } else {
                (Op::Zero, region, off, len, rng.below(4) == 0)
            }
        };
        let first = region * REGION + off; // sector number in the export
        let at = (first * SECTOR) as u64;
        let bytes = len * SECTOR;
        // Writes: the version, in flight from here on.
        let v = match op {
            Op::Write => ctx.version.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        if matches!(op, Op::Write | Op::Trim | Op::Zero) {
            let mut o = vol.regions[region].lock().unwrap();
            let what = match (op, fua) {
                (Op::Write, false) => "write",
                (Op::Write, true) => "fua",
                (Op::Trim, _) => "trim",
                (_, false) => "zero",
                (_, true) => "zero-fua",
            };
            for i in 0..len {
                o[off + i].issue(v);
                o[off + i].note(round, what, v);
                if op == Op::Write {
                    fill(first + i, v, &mut buf[i * SECTOR..(i + 1) * SECTOR]);
                }
                touched.push((region, off + i));
            }
        }
        let t = Instant::now();
        let r = match op {
            Op::Read => c.read_at(at, &mut buf[..bytes]),
            Op::Write => c.write_at(at, &buf[..bytes], fua),
            Op::Flush => c.flush(),
            Op::Trim => c.trim(at, bytes as u32),
            Op::Zero => c.write_zeroes(at, bytes as u32, fua),
        };
        let took = t.elapsed();
        if took > DEADLINE {
            n.hangs.push(format!(
                "round {round}: {op:?} of {bytes} B at {at} on {name} took {took:?}"
            ));
            break;
        }
        match r {
            Ok(()) => {
                *n.ops.entry(op).or_default() += 1;
                n.fua += fua as u64;
                match op {
                    Op::Read => {
                        n.bytes_read += bytes as u64;
                        n.verified_reads += 1;
                        n.verified_sectors += len as u64;
                        let mut o = vol.regions[region].lock().unwrap();
                        for i in 0..len {
                            let s = first + i;
                            let got = decode(s, &buf[i * SECTOR..(i + 1) * SECTOR]);
                            if let Err(e) = o[off + i].check_read(s, got) {
                                n.failures.push(format!(
                                    "STALE READ while running at round {round} on {name} (connection {w}): {e}"
                                ));
                                return n;
                            }
                        }
                    }
                    Op::Flush => {
                        for (r, s) in touched.drain(..) {
                            let mut o = vol.regions[r].lock().unwrap();
                            if o[s].unflushed() {
                                o[s].flushed();
                                let f = o[s].floor;
                                o[s].note(round, "flushed", f);
                            }
                        }
                    }
                    _ => {
                        n.bytes_written += bytes as u64;
                        let mut o = vol.regions[region].lock().unwrap();
                        for i in 0..len {
                            o[off + i].acked(v, fua);
                        }
                    }
                }
            }
            Err(e) => {
                let failed_write = |n: &mut Counts| {
                    if matches!(op, Op::Write | Op::Trim | Op::Zero) {
                        let mut o = vol.regions[region].lock().unwrap();
                        for i in 0..len {
                            o[off + i].failed(v);
                            o[off + i].note(round, "failed", v);
                        }
                    }
                    *n.ops.entry(op).or_default() += 1;
                };
                match e {
                    Error::Nbd(errno) if spec.errors && ctx.errors_during(t, Instant::now()) => {
                        failed_write(&mut n);
                        *n.core_errors.entry(op).or_default() += 1;
                        *n.errnos.entry(errno).or_default() += 1;
                    }
                    Error::Nbd(errno) => {
                        failed_write(&mut n);
                        n.unexpected.push(format!(
                            "round {round}: {op:?} of {bytes} B at {at} on {name} failed with NBD error {errno}"
                        ));
                    }
                    e if timed_out(&e) => {
                        n.hangs.push(format!(
                            "round {round}: {op:?} of {bytes} B at {at} on {name}: no reply within {DEADLINE:?}"
                        ));
                        break;
                    }
                    _ if ctx.fault.load(Ordering::Relaxed) => {
                        // Cut by the kill or shutdown: a write stays in flight.
                        n.disconnects += 1;
                        break;
                    }
                    e => {
                        n.unexpected.push(format!(
                            "round {round}: {op:?} of {bytes} B at {at} on {name}: connection lost: {e}"
                        ));
                        break;
                    }
                }
            }
        }
    }
    n
}

/// Admin commands run by the soak.
#[derive(Default)]
struct Admin {
    set_mode: u64,
    writeback: u64,
    /// Commands cut by a kill or a shutdown.
    interrupted: u64,
    /// Commands on cache 2 that failed while its core failed (expected).
    refused: Vec<String>,
    unexpected: Vec<String>,
    hangs: Vec<String>,
    error_windows: u64,
}

/// `tiercache ARGS` against the daemon at `socket`: (success, stderr, time). A command over 90
/// s is killed (counted as a hang by the caller).
fn tc(socket: &str, args: &[&str]) -> (bool, String, Duration) {
    let t = Instant::now();
    let r = std::panic::catch_unwind(|| {
        common::run(
            Command::new(BIN).args(args).env("TIERCACHE_SOCKET", socket),
            90,
        )
    });
    match r {
        Ok((ok, _, err)) => (ok, err, t.elapsed()),
        Err(_) => (false, "killed after 90 s".into(), t.elapsed()),
    }
}

/// The admin thread of a round: mode switches and writebacks at random moments.
fn admin(ctx: &Ctx, socket: &str, seed: u64) -> Admin {
    let mut a = Admin::default();
    let mut rng = Rng(seed);
    let round = ctx.round;
    loop {
        let pause = Instant::now() + Duration::from_millis(rng.range(200, 1500));
        while Instant::now() < pause {
            if ctx.fault.load(Ordering::Relaxed) {
                return a;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let args: Vec<String> = match rng.below(10) {
            0..=3 => {
                let m = ["wb", "wt", "wa", "wi", "pt", "wo"][rng.below(6) as usize];
                vec![
                    "set-mode".into(),
                    "--cache-id".into(),
                    "1".into(),
                    "--mode".into(),
                    m.into(),
                ]
            }
            4..=6 => {
                let m = ["wt", "wa", "wi", "pt", "wb"][rng.below(5) as usize];
                vec![
                    "set-mode".into(),
                    "--cache-id".into(),
                    "2".into(),
                    "--mode".into(),
                    m.into(),
                ]
            }
            7 => vec!["writeback".into(), "--cache-id".into(), "1".into()],
            8 => vec![
                "writeback".into(),
                "--cache-id".into(),
                "1".into(),
                "--core-id".into(),
                rng.below(2).to_string(),
            ],
            9 if rng.below(2) == 0 => vec!["writeback".into(), "--cache-id".into(), "2".into()],
            _ => vec!["writeback".into(), "--cache-id".into(), "3".into()],
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let t = Instant::now();
        let (ok, err, took) = tc(socket, &args);
        if took > DEADLINE {
            a.hangs.push(format!(
                "round {round}: tiercache {args:?} took {took:?}: {err}"
            ));
        }
        if ok {
            if args[0] == "set-mode" {
                a.set_mode += 1;
            } else {
                a.writeback += 1;
            }
        } else if ctx.fault.load(Ordering::Relaxed) {
            a.interrupted += 1;
            return a;
        } else if args[2] == "2" && ctx.errors_during(t, Instant::now()) {
            // Cache 2's core failed meanwhile: a writeback may say so.
            a.refused
                .push(err.trim().lines().last().unwrap_or("").to_string());
        } else {
            a.unexpected.push(format!(
                "round {round}: tiercache {args:?} failed: {}",
                err.trim()
            ));
        }
    }
}

/// The error thread of a round: the core of cache 2 fails (at nbdkit's error rate) while the
/// error file exists; it is removed when the round ends.
fn errors(ctx: &Ctx, file: &Path, seed: u64) -> u64 {
    let mut rng = Rng(seed);
    let mut windows = 0;
    let wait = |ms: u64| {
        let until = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < until {
            if ctx.fault.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    };
    loop {
        if !wait(rng.range(300, 2500)) {
            return windows;
        }
        ctx.windows.lock().unwrap().push((Instant::now(), None));
        std::fs::write(file, b"").unwrap();
        windows += 1;
        let more = wait(rng.range(200, 1500));
        std::fs::remove_file(file).unwrap();
        ctx.windows.lock().unwrap().last_mut().unwrap().1 = Some(Instant::now());
        if !more {
            return windows;
        }
    }
}

/// Reads every block of every export and checks it against the oracle; what each holds.
fn verify(dir: &Path, vols: &[Vol], round: usize, failures: &mut Vec<String>) -> Vec<Vec<u64>> {
    let mut all = Vec::new();
    for vol in vols {
        let name = vol.spec.name;
        let mut got = vec![0u64; vol.spec.bytes as usize / SECTOR];
        let mut c = match connect(dir, name) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("RECOVERY FAILED at round {round}: {e}"));
                all.push(got);
                continue;
            }
        };
        let mut buf = vec![0u8; REGION * SECTOR];
        'regions: for (r, reg) in vol.regions.iter().enumerate() {
            if let Err(e) = c.read_at((r * REGION * SECTOR) as u64, &mut buf) {
                failures.push(format!(
                    "RECOVERY FAILED at round {round}: reading {name} region {r}: {e}"
                ));
                break;
            }
            let o = reg.lock().unwrap();
            for i in 0..REGION {
                let s = r * REGION + i;
                match o[i].check_crash(s, decode(s, &buf[i * SECTOR..(i + 1) * SECTOR])) {
                    Ok(v) => got[s] = v,
                    Err(e) => {
                        failures.push(format!("CRASH at round {round} on {name}: {e}"));
                        if failures.len() > 20 {
                            break 'regions;
                        }
                    }
                }
            }
        }
        c.close();
        all.push(got);
    }
    all
}

#[test]
fn soak() {
    if !have("nbdkit") {
        return;
    }
    let secs = env_u64("TIERCACHE_SOAK_SECS", 120);
    let seed = env_u64("TIERCACHE_SEED", 0x50a4);
    let d = Dir::new("soak");
    let dir = d.0.clone();
    let sizes = [
        ("cache1.img", 24u64 << 20),
        ("core1a.img", EXPORTS[0].bytes),
        ("core1b.img", EXPORTS[1].bytes),
        ("cache2.img", 8 << 20),
        ("core2.img", EXPORTS[2].bytes),
        ("cache3.img", 16 << 20),
        ("core3.img", EXPORTS[3].bytes),
    ];
    for (f, b) in sizes {
        d.sparse(f, b);
    }
    // The powercut: devices (core2.img is nbdkit's).
    let cut: Vec<String> = [
        "cache1.img",
        "core1a.img",
        "core1b.img",
        "cache2.img",
        "cache3.img",
        "core3.img",
    ]
    .iter()
    .map(|f| d.path(f))
    .collect();
    let errfile = dir.join("core2.errors");
    let nbdkit_sock = d.path("core2.sock");
    let nbdkit = Proc(
        Command::new("nbdkit")
            .args([
                "-f",
                "--exit-with-parent",
                "-U",
                &nbdkit_sock,
                "--filter=error",
                "file",
            ])
            .arg(format!("file={}", d.path("core2.img")))
            .args(["error=EIO", "error-rate=25%"])
            .arg(format!("error-file={}", errfile.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.path("nbdkit.log")).unwrap())
            .spawn()
            .expect("spawn nbdkit"),
    );
    let t = Instant::now();
    while !Path::new(&nbdkit_sock).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "nbdkit did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let cfg = d.path("tc.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[[cache]]
id = 1
device = "powercut:{c1}"
mode = "wb"
line_size = "4k"
[cache.params]
cleaning = {{ policy = "acp" }}
seq-cutoff = {{ policy = "always", threshold = "128k" }}
[[cache.core]]
id = 0
device = "powercut:{k1a}"
export = "wb-a"
[[cache.core]]
id = 1
device = "powercut:{k1b}"
export = "wb-b"

[[cache]]
id = 2
device = "powercut:{c2}"
mode = "wt"
line_size = "16k"
[[cache.core]]
id = 0
device = "nbd:nbd+unix:///?socket={nbdkit_sock}"
export = "wt"

[[cache]]
id = 3
device = "powercut:{c3}"
mode = "wl"
[[cache.core]]
id = 0
device = "powercut:{k3}"
export = "wl"
"#,
            c1 = cut[0],
            k1a = cut[1],
            k1b = cut[2],
            c2 = cut[3],
            c3 = cut[4],
            k3 = cut[5],
        ),
    )
    .unwrap();
    let conns: usize = EXPORTS.iter().map(|s| s.conns).sum();
    println!(
        "soak: {secs} s of load, seed {seed:#x}; 3 caches (wb with 2 cores, wt over nbdkit with errors, wl), 4 exports, {conns} connections"
    );

    let vols: Arc<Vec<Vol>> = Arc::new(EXPORTS.iter().map(Vol::new).collect());
    let mut rng = Rng(seed);
    let mut total = Counts::default();
    let mut adm = Admin::default();
    let (mut kills, mut clean, mut rounds, mut flipchecks) = (0u64, 0u64, 0usize, 0u64);
    let mut patterns = [0u64; 3];
    let (mut reverted, mut clean_reverted) = (0u64, 0u64);
    let mut verified_after = 0u64;
    let mut restarts_slowest = Duration::ZERO;
    let mut failures: Vec<String> = Vec::new();
    let mut hangs: Vec<String> = Vec::new();
    let opts = || Opts::new(&d).config(&cfg).ready_within(DEADLINE);
    let mut dm = Some(Daemon::start(opts()));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs)
        && failures.is_empty()
        && hangs.is_empty()
        && total.failures.is_empty()
    {
        rounds += 1;
        let round = rounds;
        let left = Duration::from_secs(secs).saturating_sub(t0.elapsed());
        let run =
            Duration::from_millis(rng.range(2000, 8000)).min(left.max(Duration::from_secs(1)));
        let ctx = Arc::new(Ctx {
            dir: dir.clone(),
            fault: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            windows: Mutex::new(Vec::new()),
            round,
            version: AtomicU64::new((round as u64) << 40 | 1),
        });
        let mut workers = Vec::new();
        for (e, spec) in EXPORTS.iter().enumerate() {
            for w in 0..spec.conns {
                let (ctx, vols) = (ctx.clone(), vols.clone());
                let s = rng.next();
                workers.push(std::thread::spawn(move || worker(&ctx, &vols[e], w, s)));
            }
        }
        let socket = dm.as_ref().unwrap().socket.clone();
        let admin_t = {
            let (ctx, s) = (ctx.clone(), rng.next());
            std::thread::spawn(move || admin(&ctx, &socket, s))
        };
        let errors_t = {
            let (ctx, s, f) = (ctx.clone(), rng.next(), errfile.clone());
            std::thread::spawn(move || errors(&ctx, &f, s))
        };
        std::thread::sleep(run);

        // The fault: SIGKILL + power cut (2 rounds in 3), or a clean shutdown.
        let kill = rng.below(3) != 0;
        ctx.fault.store(true, Ordering::Relaxed);
        adm.error_windows += errors_t.join().expect("the error thread");
        let mut dead = dm.take().unwrap();
        if kill {
            dead.kill();
            kills += 1;
        } else {
            let t = Instant::now();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dead.shutdown()));
            if r.is_err() || t.elapsed() > DEADLINE {
                hangs.push(format!(
                    "round {round}: the clean shutdown took {:?} (or failed)",
                    t.elapsed()
                ));
            }
            clean += 1;
        }
        ctx.stop.store(true, Ordering::Relaxed);
        let a = admin_t.join().expect("the admin thread");
        adm.set_mode += a.set_mode;
        adm.writeback += a.writeback;
        adm.interrupted += a.interrupted;
        adm.refused.extend(a.refused);
        adm.unexpected.extend(a.unexpected);
        adm.hangs.extend(a.hangs);
        for h in workers {
            total.add(h.join().expect("a worker panicked"));
        }
        // The power cut (after a clean shutdown nothing may be un-flushed: drop everything).
        let k = if kill { rng.below(3) as usize } else { 1 };
        if kill {
            patterns[k] += 1;
        }
        for (i, dev) in cut.iter().enumerate() {
            let p = match k {
                0 => PowerCutPattern::KeepAll,
                1 => PowerCutPattern::DropAll,
                _ => PowerCutPattern::Torn(rng.next() ^ i as u64),
            };
            let r = OverlayBackend::power_cut(Path::new(dev), p).expect("power cut");
            if kill {
                reverted += r.reverted;
            } else {
                clean_reverted += r.reverted;
            }
        }
        if !kill {
            // A clean stop makes every acknowledged write durable.
            for vol in vols.iter() {
                for reg in &vol.regions {
                    reg.lock().unwrap().iter_mut().for_each(Sector::flushed);
                }
            }
        }
        println!(
            "  round {round}: {:?} of load, then {}",
            run,
            if kill {
                [
                    "SIGKILL + power cut (keep)",
                    "SIGKILL + power cut (drop)",
                    "SIGKILL + power cut (torn)",
                ][k]
            } else {
                "clean shutdown"
            }
        );

        // Restart from the config, check every block, settle.
        let t = Instant::now();
        match Daemon::try_start(opts()) {
            Ok(x) => dm = Some(x),
            Err(e) => {
                if e.contains("not ready within") {
                    hangs.push(format!("round {round}: restart: {e}"));
                } else {
                    failures.push(format!("RECOVERY FAILED at round {round}: {e}"));
                }
                break;
            }
        }
        restarts_slowest = restarts_slowest.max(t.elapsed());
        let dmr = dm.as_ref().unwrap();
        let l = dmr.json(&["list"]);
        for c in l.as_array().unwrap() {
            if c["state"] != "running" {
                failures.push(format!(
                    "RECOVERY FAILED at round {round}: cache {} is {}: {c}",
                    c["cache_id"], c["state"]
                ));
            }
        }
        let first = verify(&dir, &vols, round, &mut failures);
        verified_after += vols
            .iter()
            .map(|v| v.spec.bytes / SECTOR as u64)
            .sum::<u64>();
        if round % 3 == 0 && failures.is_empty() {
            for id in ["1", "3"] {
                let (ok, err, took) = tc(&dmr.socket, &["writeback", "--cache-id", id]);
                if took > DEADLINE {
                    hangs.push(format!(
                        "round {round}: writeback of cache {id} took {took:?}"
                    ));
                }
                if !ok {
                    adm.unexpected.push(format!(
                        "round {round}: writeback of cache {id} failed: {err}"
                    ));
                }
            }
            let again = verify(&dir, &vols, round, &mut failures);
            flipchecks += 1;
            for (e, vol) in vols.iter().enumerate() {
                if let Some(s) = (0..first[e].len()).find(|&s| first[e][s] != again[e][s]) {
                    failures.push(format!(
                        "FLIP-FLOP at round {round} on {}: sector {s} read version {} then {}",
                        vol.spec.name, first[e][s], again[e][s]
                    ));
                }
            }
        }
        if failures.is_empty() {
            for (e, vol) in vols.iter().enumerate() {
                for (r, reg) in vol.regions.iter().enumerate() {
                    let mut o = reg.lock().unwrap();
                    for (i, sec) in o.iter_mut().enumerate() {
                        sec.settle(round, first[e][r * REGION + i]);
                    }
                }
            }
        }
    }
    let elapsed = t0.elapsed();
    let mut log = String::new();
    if let Some(dm) = dm.take() {
        log = std::fs::read_to_string(&dm.log).unwrap_or_default();
        let t = Instant::now();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dm.shutdown())).is_err()
            || t.elapsed() > DEADLINE
        {
            hangs.push("the final shutdown failed or took over 60 s".into());
        }
    }
    drop(nbdkit);
    let panics = log.matches("panicked").count();
    // The daemon's own alarms (one log line when a device problem starts), by problem.
    let mut alarms: BTreeMap<String, u64> = BTreeMap::new();
    for l in log.lines().filter(|l| l.contains("msg=\"cache degraded\"")) {
        let p = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("problem="))
            .unwrap_or("?");
        *alarms.entry(p.trim_matches('"').to_string()).or_default() += 1;
    }
    let alarms: Vec<String> = alarms.iter().map(|(p, n)| format!("{n} {p}")).collect();
    failures.append(&mut total.failures);
    hangs.append(&mut total.hangs);
    hangs.append(&mut adm.hangs);
    let ops: Vec<String> = OPS
        .iter()
        .map(|o| format!("{} {}", total.ops.get(o).copied().unwrap_or(0), o.name()))
        .collect();
    let core_errs: Vec<String> = OPS
        .iter()
        .filter_map(|o| {
            total
                .core_errors
                .get(o)
                .map(|n| format!("{n} {}", o.name()))
        })
        .collect();
    let errnos: Vec<String> = total
        .errnos
        .iter()
        .map(|(e, n)| format!("{n}x {}", tiercache_loadgen::errno_name(*e)))
        .collect();
    let unexpected = total.unexpected.len() + adm.unexpected.len();
    println!(
        "SOAK SUMMARY: {:.0} s, {rounds} rounds, seed {seed:#x}, {conns} connections | ops: {} ({} FUA, {} sequential); {} MiB written, {} MiB read | client errors: {} expected core errors ({}; {}) in {} error windows, {} requests cut by restarts, {} admin commands cut by restarts, {} refused while the core failed, {unexpected} unexpected | faults: {kills} SIGKILL + power cut (keep/drop/torn {patterns:?}, {reverted} device blocks reverted), {} error windows on the wt core, {} set-mode, {} writeback; daemon alarms: [{}] | restarts: {clean} clean ({clean_reverted} blocks un-flushed after a clean stop), {kills} after SIGKILL, slowest {:.1} s | verification: {} reads ({} sectors) while running, {verified_after} sectors after restarts, {flipchecks} flip-flop checks, {} failures | panics: {panics} | hangs: {}",
        elapsed.as_secs_f64(),
        ops.join(", "),
        total.fua,
        total.seq,
        total.bytes_written >> 20,
        total.bytes_read >> 20,
        total.core_errors.values().sum::<u64>(),
        core_errs.join(", "),
        errnos.join(", "),
        adm.error_windows,
        total.disconnects,
        adm.interrupted,
        adm.refused.len(),
        adm.error_windows,
        adm.set_mode,
        adm.writeback,
        alarms.join(", "),
        restarts_slowest.as_secs_f64(),
        total.verified_reads,
        total.verified_sectors,
        failures.len(),
        hangs.len(),
    );
    for f in failures.iter().take(10) {
        println!("  FAILURE: {f}");
    }
    for h in hangs.iter().take(10) {
        println!("  HANG: {h}");
    }
    for u in total.unexpected.iter().chain(&adm.unexpected).take(20) {
        println!("  UNEXPECTED: {u}");
    }
    for r in adm.refused.iter().take(3) {
        println!("  refused while the core failed (expected): {r}");
    }
    if panics > 0 {
        for l in log.lines().filter(|l| l.contains("panicked")).take(5) {
            println!("  PANIC: {l}");
        }
    }
    assert!(
        failures.is_empty(),
        "{} verification failures",
        failures.len()
    );
    assert_eq!(panics, 0, "the daemon panicked");
    assert!(hangs.is_empty(), "{} hangs", hangs.len());
    assert_eq!(unexpected, 0, "unexpected errors");
    assert!(
        total.ops.get(&Op::Write).copied().unwrap_or(0) > 0 && total.verified_reads > 0,
        "coverage: no load ran"
    );
}

/// Found by the soak: a client that sends requests and closes its socket before reading the
/// replies killed the daemon (SIGPIPE at its default action; the caches were not stopped). The
/// daemon must lose only that connection, and a clean shutdown must still stop every cache.
#[test]
fn a_client_that_leaves_before_its_replies_costs_only_its_connection() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let d = Dir::new("soak-rude");
    let cache = d.sparse("cache.img", 16 << 20);
    let core = d.sparse("core.img", 32 << 20);
    let cfg = d.path("tc.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[cache]]\nid = 1\ndevice = \"{cache}\"\nmode = \"wb\"\n\
             [[cache.core]]\nid = 0\ndevice = \"{core}\"\nexport = \"vol\"\n"
        ),
    )
    .unwrap();
    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    for round in 0..5 {
        let mut s = UnixStream::connect(&dm.nbd).unwrap();
        let mut b = [0u8; 20];
        s.read_exact(&mut b[..18]).unwrap();
        s.write_all(&1u32.to_be_bytes()).unwrap(); // fixed newstyle
        let mut opt = Vec::new();
        opt.extend_from_slice(&0x4948_4156_454f_5054u64.to_be_bytes());
        opt.extend_from_slice(&7u32.to_be_bytes()); // NBD_OPT_GO
        opt.extend_from_slice(&(4 + 3 + 2u32).to_be_bytes());
        opt.extend_from_slice(&3u32.to_be_bytes());
        opt.extend_from_slice(b"vol");
        opt.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&opt).unwrap();
        loop {
            s.read_exact(&mut b).unwrap();
            let typ = u32::from_be_bytes(b[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(b[16..20].try_into().unwrap());
            std::io::copy(&mut (&s).take(len as u64), &mut std::io::sink()).unwrap();
            if typ == 1 {
                break; // NBD_REP_ACK
            }
        }
        // 64 reads of 1 MiB, then gone before the first reply is read.
        for i in 0..64u64 {
            let mut r = Vec::with_capacity(28);
            r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
            r.extend_from_slice(&0u16.to_be_bytes());
            r.extend_from_slice(&0u16.to_be_bytes()); // NBD_CMD_READ
            r.extend_from_slice(&i.to_be_bytes());
            r.extend_from_slice(&((i % 32) << 20).to_be_bytes());
            r.extend_from_slice(&(1u32 << 20).to_be_bytes());
            s.write_all(&r).unwrap();
        }
        drop(s);
        std::thread::sleep(Duration::from_millis(200));
        let l = dm.json(&["list"]);
        assert_eq!(l[0]["state"], "running", "round {round}: {l}");
    }
    let log = d.path("daemon.log");
    dm.shutdown();
    let l = std::fs::read_to_string(log).unwrap();
    assert!(l.contains("cache stopped"), "no clean stop: {l}");
    assert!(l.contains("daemon stopped"), "{l}");
}
