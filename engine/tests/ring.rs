//! Requests submitted without a waiting thread (`Engine::submit`), their file IOs run on the
//! caller's io_uring (`tiercache_io::Ring`) and given back with `Engine::complete`: the path an
//! NBD connection's reactor takes. Data is checked against a model in every mode; a ring that
//! fails or transfers short falls back to the device's calls; errors reach the reply; stop
//! waits for IOs still on a ring.

use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tiercache_core::ReqError;
use tiercache_core::mode::CacheMode;
use tiercache_core::units::{CoreId, LineSize};
use tiercache_engine::{
    CoreSpec, Device, Engine, EngineConfig, EngineIo, IoTicket, ReplySink, ReplyTo, ReqOp,
};
use tiercache_io::{AlignedBuf, Backend, FileBackend, IoErr, Ring, RingDone, Slab};

mod common;
use common::*;

type Reply = (u64, Result<(), ReqError>, AlignedBuf);

/// Collects replies.
#[derive(Default)]
struct Replies(Mutex<Vec<Reply>>);

impl ReplySink for Replies {
    fn reply(&self, tag: u64, result: Result<(), ReqError>, buf: AlignedBuf) {
        self.0.lock().unwrap().push((tag, result, buf));
    }
}

/// A file device whose ring descriptor is another one (a read-only descriptor of the same
/// file: ring writes fail; or none that is open: every ring IO fails), and whose own calls can
/// be made to fail: what the ring path does when the ring does not do the IO.
struct Odd {
    file: FileBackend,
    ring_fd: RawFd,
    fail: std::sync::atomic::AtomicBool,
}

impl Odd {
    fn check(&self) -> Result<(), IoErr> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(IoErr::io(
                "injected",
                &std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        Ok(())
    }
}

impl Backend for Odd {
    fn name(&self) -> String {
        "odd".into()
    }
    fn blocks(&self) -> u64 {
        self.file.blocks()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        self.check()?;
        self.file.read(lba, buf)
    }
    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        self.check()?;
        self.file.write(lba, buf, fua)
    }
    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        self.check()?;
        self.file.write_zeroes(lba, blocks, fua)
    }
    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        self.check()?;
        self.file.trim(lba, blocks)
    }
    fn flush(&self) -> Result<(), IoErr> {
        self.check()?;
        self.file.flush()
    }
    fn ring_fd(&self) -> Option<RawFd> {
        Some(self.ring_fd)
    }
}

fn tmp(tag: &str, bytes: u64) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("tc-ring-{tag}-{}", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(bytes).unwrap();
    p
}

/// A single-threaded driver: the ring, the IOs it holds, and the replies.
struct Driver {
    ring: Ring,
    tickets: Slab<IoTicket>,
    ios: Vec<EngineIo>,
    done: Vec<RingDone>,
    replies: Arc<Replies>,
    ring_ios: u64,
    /// Read replies whose buffer the engine lent from its IO pool.
    lent: u64,
}

impl Driver {
    fn new() -> Driver {
        Driver {
            ring: Ring::new(32).unwrap(),
            tickets: Slab::new(),
            ios: Vec::new(),
            done: Vec::new(),
            replies: Arc::new(Replies::default()),
            ring_ios: 0,
            lent: 0,
        }
    }

    fn submit(&mut self, e: &Engine, op: ReqOp, lba: u64, blocks: u32, buf: AlignedBuf, tag: u64) {
        let reply = ReplyTo {
            sink: self.replies.clone(),
            tag,
        };
        e.submit(op, CoreId(0), lba, blocks, buf, reply, &mut self.ios);
    }

    /// Puts the IOs the engine gave on the ring.
    fn start(&mut self) {
        for io in std::mem::take(&mut self.ios) {
            let (op, t) = io.into_ring();
            let token = self.tickets.insert(t) as u64;
            self.ring.push(op, token, &mut self.done).unwrap();
            self.ring_ios += 1;
        }
    }

    /// Runs the ring until `n` replies are in (IOs other threads finish count too).
    fn until_replies(&mut self, e: &Engine, n: usize) -> Vec<Reply> {
        let t0 = std::time::Instant::now();
        loop {
            if t0.elapsed() > Duration::from_secs(5) {
                panic!(
                    "{} of {n} replies after 5 s; {} IOs on the ring; engine {:?}",
                    self.replies.0.lock().unwrap().len(),
                    self.ring.in_flight(),
                    e.stats()
                );
            }
            self.start();
            if self.replies.0.lock().unwrap().len() >= n {
                return std::mem::take(&mut *self.replies.0.lock().unwrap());
            }
            self.step(e);
        }
    }

    /// Runs the IOs the engine still gave this ring until there are none (a caller must run
    /// every IO it is given: requests answered before their journal record leave the record's
    /// IOs here after their replies).
    fn idle(&mut self, e: &Engine) {
        let t0 = std::time::Instant::now();
        while !self.ios.is_empty() || self.ring.in_flight() > 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "IOs still on the ring after 5 s"
            );
            self.step(e);
        }
    }

    /// Waits (20 ms at most) for ring completions and gives them to the engine.
    fn step(&mut self, e: &Engine) {
        self.start();
        let mut done = std::mem::take(&mut self.done);
        self.ring
            .wait(1, Duration::from_millis(20), &mut done)
            .unwrap();
        for d in done.drain(..) {
            let t = self.tickets.take(d.token as usize).expect("live ticket");
            e.complete(t, d.buf, d.res, Some(&mut self.ios));
        }
        self.done = done;
    }
}

fn file_engine(mode: CacheMode, cache: Device, core: Device) -> Engine {
    engine_with(mode, cache, core, EngineConfig::threads(2))
}

fn engine_with(mode: CacheMode, cache: Device, core: Device, ec: EngineConfig) -> Engine {
    let cfg = persistent(cache.blocks() * 512, LineSize::K4, mode, 3);
    Engine::create(
        cfg,
        cache,
        vec![CoreSpec {
            id: CoreId(0),
            dev: core,
            record: record(0),
        }],
        ec,
    )
    .expect("create")
}

/// Random reads, writes, zeroing, trims and flushes, 16 in flight at once on disjoint
/// stripes, checked block by block against a model.
fn model_run(e: &Engine, d: &mut Driver, seed: u64, rounds: u64) {
    const STRIPE: u64 = 256; // blocks per in-flight slot
    let mut rng = Rng(seed);
    let mut versions = vec![0u64; (16 * STRIPE) as usize];
    let mut n = 0u64;
    for _ in 0..rounds {
        // One request per stripe, all in flight together.
        let mut reads = Vec::new();
        for s in 0..16u64 {
            n += 1;
            let b = s * STRIPE + rng.below(STRIPE - 16);
            let len = 1 + rng.below(16);
            match rng.below(10) {
                0..=3 => {
                    let mut buf = AlignedBuf::new(len as usize * BS);
                    for i in 0..len {
                        let at = (i as usize) * BS;
                        fill(&mut buf[at..at + BS], b + i, n);
                        versions[(b + i) as usize] = n;
                    }
                    let fua = rng.below(4) == 0;
                    d.submit(e, ReqOp::Write { fua }, b, 0, buf, s);
                }
                4 => {
                    for i in 0..len {
                        versions[(b + i) as usize] = 0;
                    }
                    let op = if rng.below(2) == 0 {
                        ReqOp::Trim
                    } else {
                        ReqOp::WriteZeroes { fua: false }
                    };
                    d.submit(e, op, b, len as u32, AlignedBuf::new(0), s);
                }
                5 => d.submit(e, ReqOp::Flush, 0, 0, AlignedBuf::new(0), s),
                _ => {
                    reads.push((s, b, len));
                    if n.is_multiple_of(2) {
                        d.submit(e, ReqOp::Read, b, 0, AlignedBuf::new(len as usize * BS), s);
                    } else {
                        // No buffer: the engine gives one (lent from its IO pool on a hit).
                        d.submit(e, ReqOp::Read, b, len as u32, AlignedBuf::new(0), s);
                    }
                }
            }
        }
        let got = d.until_replies(e, 16);
        assert_eq!(got.len(), 16);
        for (tag, r, buf) in got {
            r.unwrap_or_else(|err| panic!("request {tag}: {err:?}"));
            if let Some(&(_, b, len)) = reads.iter().find(|(s, _, _)| *s == tag) {
                assert_eq!(buf.len(), len as usize * BS, "request {tag}: reply length");
                d.lent += buf.pooled() as u64;
                for (i, blk) in buf.chunks(BS).enumerate() {
                    let block = b + i as u64;
                    assert_eq!(
                        decode(blk, block),
                        Some(versions[block as usize]),
                        "block {block}: stale or wrong data after a ring read"
                    );
                }
            }
        }
    }
    d.idle(e);
}

#[test]
fn requests_on_a_ring_read_back_in_every_mode() {
    for (i, mode) in [CacheMode::Wt, CacheMode::Wb, CacheMode::Wa, CacheMode::Wo]
        .into_iter()
        .enumerate()
    {
        let (cp, kp) = (
            tmp(&format!("c{i}"), 8 << 20),
            tmp(&format!("k{i}"), 32 << 20),
        );
        let cache: Device = Arc::new(FileBackend::open(&cp).unwrap());
        let core: Device = Arc::new(FileBackend::open(&kp).unwrap());
        assert!(cache.ring_fd().is_some(), "io_uring works on this machine");
        let e = file_engine(mode, cache, core);
        let mut d = Driver::new();
        model_run(&e, &mut d, 0x5eed + i as u64, 60);
        assert!(d.ring_ios > 0, "{mode:?}: no IO ran on the ring");
        assert!(d.lent > 0, "{mode:?}: no read took its IO buffer");
        assert!(e.stats().ring_ios > 0);
        e.stop().expect("stop");
        let _ = std::fs::remove_file(cp);
        let _ = std::fs::remove_file(kp);
    }
}

#[test]
fn reads_without_a_buffer_take_the_io_buffer_while_the_pool_is_mostly_free() {
    // A 64 KiB IO pool (16 pages) and 4 KiB hits whose replies nobody sends yet: the first
    // take their IO buffer (no copy) until half the pool is lent, the rest are copied into
    // buffers of their own; every reply has the right data, and the pool gets it all back.
    let (cp, kp) = (tmp("lc", 8 << 20), tmp("lk", 32 << 20));
    let cache: Device = Arc::new(FileBackend::open(&cp).unwrap());
    let core: Device = Arc::new(FileBackend::open(&kp).unwrap());
    let ec = EngineConfig {
        io_threads: 2,
        io_buffer_bytes: 64 << 10,
    };
    let e = engine_with(CacheMode::Wt, cache, core, ec);
    let mut d = Driver::new();
    const LINES: u64 = 24;
    for l in 0..LINES {
        let mut buf = AlignedBuf::new(4096);
        for i in 0..8 {
            fill(&mut buf[i * BS..(i + 1) * BS], l * 8 + i as u64, 7);
        }
        d.submit(&e, ReqOp::Write { fua: false }, l * 8, 0, buf, l);
        d.until_replies(&e, 1);
    }
    let mut held = Vec::new();
    for l in 0..LINES {
        d.submit(&e, ReqOp::Read, l * 8, 8, AlignedBuf::new(0), l);
        held.extend(d.until_replies(&e, 1));
    }
    let lent = held.iter().filter(|(_, _, b)| b.pooled()).count();
    assert_eq!(lent, 8, "half of the 16-page pool is lent, no more");
    for (tag, r, buf) in &held {
        r.as_ref().unwrap();
        assert_eq!(buf.len(), 4096);
        for (i, blk) in buf.chunks(BS).enumerate() {
            let block = tag * 8 + i as u64;
            assert_eq!(decode(blk, block), Some(7), "block {block}");
        }
    }
    assert_eq!(e.stats().buffer_waits, 0, "no IO waited for a buffer");
    drop(held);
    d.idle(&e);
    e.stop().expect("stop");
    let _ = std::fs::remove_file(cp);
    let _ = std::fs::remove_file(kp);
}

#[test]
fn ring_failures_and_short_transfers_fall_back_to_the_device_calls() {
    // The cache's ring descriptor is read-only (ring writes fail with EBADF), the core's is
    // not open at all (every ring IO fails): the data must still be right.
    for (i, mode) in [CacheMode::Wt, CacheMode::Wb].into_iter().enumerate() {
        let (cp, kp) = (
            tmp(&format!("fc{i}"), 8 << 20),
            tmp(&format!("fk{i}"), 32 << 20),
        );
        let ro = std::fs::File::open(&cp).unwrap();
        let cache: Device = Arc::new(Odd {
            file: FileBackend::open(&cp).unwrap(),
            ring_fd: ro.as_raw_fd(),
            fail: false.into(),
        });
        let core: Device = Arc::new(Odd {
            file: FileBackend::open(&kp).unwrap(),
            ring_fd: -1,
            fail: false.into(),
        });
        let e = file_engine(mode, cache, core);
        let mut d = Driver::new();
        model_run(&e, &mut d, 0xfa11, 30);
        assert!(d.ring_ios > 0);
        e.stop().expect("stop");
        drop(ro);
        let _ = std::fs::remove_file(cp);
        let _ = std::fs::remove_file(kp);
    }
}

#[test]
fn device_errors_reach_the_reply_and_the_engine_goes_on() {
    let (cp, kp) = (tmp("ec", 8 << 20), tmp("ek", 32 << 20));
    let core = Arc::new(Odd {
        file: FileBackend::open(&kp).unwrap(),
        ring_fd: -1,
        fail: false.into(),
    });
    let cache: Device = Arc::new(FileBackend::open(&cp).unwrap());
    let e = file_engine(CacheMode::Wt, cache, core.clone());
    let mut d = Driver::new();
    core.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    // Read misses go to the failing core: each reply says so, none is lost.
    for s in 0..8u64 {
        d.submit(&e, ReqOp::Read, s * 64, 0, AlignedBuf::new(4096), s);
    }
    let got = d.until_replies(&e, 8);
    assert_eq!(got.len(), 8);
    assert!(
        got.iter()
            .all(|(_, r, _)| matches!(r, Err(ReqError::Io(_)))),
        "{:?}",
        got.iter().map(|g| &g.1).collect::<Vec<_>>()
    );
    core.fail.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut buf = AlignedBuf::new(4096);
    fill(&mut buf[..BS], 0, 7);
    d.submit(&e, ReqOp::Write { fua: true }, 0, 0, buf, 100);
    let got = d.until_replies(&e, 1);
    assert!(got[0].1.is_ok(), "{:?}", got[0].1);
    d.submit(&e, ReqOp::Read, 0, 0, AlignedBuf::new(BS), 101);
    let got = d.until_replies(&e, 1);
    assert_eq!(decode(&got[0].2, 0), Some(7));
    e.stop().expect("stop");
    let _ = std::fs::remove_file(cp);
    let _ = std::fs::remove_file(kp);
}

#[test]
fn stop_waits_for_ios_still_on_a_ring() {
    let (cp, kp) = (tmp("sc", 8 << 20), tmp("sk", 32 << 20));
    let cache: Device = Arc::new(FileBackend::open(&cp).unwrap());
    let core: Device = Arc::new(FileBackend::open(&kp).unwrap());
    let e = Arc::new(file_engine(CacheMode::Wb, cache, core));
    let mut d = Driver::new();
    for s in 0..8u64 {
        let mut buf = AlignedBuf::new(4096);
        fill(&mut buf[..BS], s * 64, 1);
        d.submit(&e, ReqOp::Write { fua: false }, s * 64, 0, buf, s);
    }
    assert!(!d.ios.is_empty(), "the writes wait for IOs the caller runs");
    // The IOs are handed out but not run: stop must wait for them.
    let e2 = e.clone();
    let stopper = std::thread::spawn(move || e2.stop_shared());
    std::thread::sleep(Duration::from_millis(200));
    assert!(!stopper.is_finished(), "stop returned with IOs still out");
    let got = d.until_replies(&e, 8);
    assert!(got.iter().all(|(_, r, _)| r.is_ok()));
    // The final checkpoint's IOs may have started from this ring's completions: they are the
    // ring's to run (the caller runs every IO it is given) until stop returns.
    while !stopper.is_finished() {
        d.step(&e);
    }
    stopper.join().unwrap().expect("stop");
    let _ = std::fs::remove_file(cp);
    let _ = std::fs::remove_file(kp);
}

/// SPEC R2 on the ring path: both devices are power-cut overlays (`OverlayBackend`), whose ring
/// descriptor is their current content and whose log learns of each ring write and flush from
/// `Backend::ring_completed`. Writes (some FUA) and flushes run on the ring; the last batch is
/// submitted to the kernel and never reaped when the engine is killed; then the power cut
/// (kept, dropped, torn), recovery, and every block must hold its newest flushed write or a
/// later one.
#[test]
fn a_power_cut_with_ios_on_the_ring_loses_no_flushed_write() {
    use tiercache_io::{OverlayBackend, PowerCutPattern};
    const REGION: u64 = 16 * 256;
    let mut rng = Rng(0x7215);
    let (mut reverted, mut unreaped) = (0u64, 0usize);
    let patterns = [
        PowerCutPattern::KeepAll,
        PowerCutPattern::DropAll,
        PowerCutPattern::Torn(7),
        PowerCutPattern::Torn(8),
    ];
    for (round, pattern) in patterns.into_iter().enumerate() {
        let (cp, kp) = (
            tmp(&format!("pcc{round}"), 0),
            tmp(&format!("pck{round}"), 0),
        );
        let open = |p: &std::path::Path| -> Arc<OverlayBackend> {
            Arc::new(OverlayBackend::open(p).expect("open overlay"))
        };
        drop(OverlayBackend::create(&cp, (8 << 20) / 512).unwrap());
        drop(OverlayBackend::create(&kp, (32 << 20) / 512).unwrap());
        let (cache, core) = (open(&cp), open(&kp));
        assert!(cache.ring_fd().is_some() && core.ring_fd().is_some());
        let e = file_engine(CacheMode::Wb, cache.clone(), core.clone());
        let mut d = Driver::new();
        let mut w = Window::new(REGION as usize);
        let mut n = 0u64;
        // One write per 256-block stripe at a time, so no two writes in flight overlap.
        let mut batch = |d: &mut Driver, w: &mut Window, rng: &mut Rng| -> Vec<(u64, u64, u64)> {
            let mut fuas = Vec::new();
            for s in 0..16u64 {
                n += 1;
                let (b, len) = (s * 256 + rng.below(240), 1 + rng.below(16));
                let mut buf = AlignedBuf::new(len as usize * BS);
                for i in 0..len {
                    let at = i as usize * BS;
                    fill(&mut buf[at..at + BS], b + i, n);
                    w.wrote((b + i) as usize, n);
                }
                let fua = rng.below(8) == 0;
                if fua {
                    fuas.push((b, len, n));
                }
                d.submit(&e, ReqOp::Write { fua }, b, 0, buf, s);
            }
            fuas
        };
        for k in 0..12 {
            let fuas = batch(&mut d, &mut w, &mut rng);
            let got = d.until_replies(&e, 16);
            assert!(got.iter().all(|(_, r, _)| r.is_ok()), "a write failed");
            // An acknowledged FUA write is durable (not the writes before it).
            for (b, len, v) in fuas {
                for i in b..b + len {
                    w.since_flush[i as usize] = vec![v];
                }
            }
            if k % 4 == 1 {
                d.submit(&e, ReqOp::Flush, 0, 0, AlignedBuf::new(0), 99);
                let got = d.until_replies(&e, 1);
                got[0].1.expect("flush");
                w.flushed();
            }
        }
        // The last batch: on the ring, submitted to the kernel, never reaped.
        batch(&mut d, &mut w, &mut rng);
        d.start();
        unreaped += d.ring.in_flight();
        let mut done = Vec::new();
        d.ring.wait(0, Duration::ZERO, &mut done).unwrap();
        e.kill();
        drop((d, done, cache, core));
        for p in [&cp, &kp] {
            reverted += OverlayBackend::power_cut(p, pattern)
                .expect("power cut")
                .reverted;
        }
        let (cache, core) = (open(&cp), open(&kp));
        let cfg = persistent(cache.blocks() * 512, LineSize::K4, CacheMode::Wb, 3);
        let (e, _) = Engine::open(
            &cfg,
            cache,
            vec![(CoreId(0), core as Device)],
            EngineConfig::threads(2),
        )
        .unwrap_or_else(|err| panic!("round {round} ({pattern:?}): recovery failed: {err}"));
        check_windows(&e, &[w], REGION, &format!("round {round} ({pattern:?})"));
        e.stop().expect("stop");
        for p in [&cp, &kp] {
            for q in [
                p.clone(),
                OverlayBackend::log_path(p),
                OverlayBackend::cur_path(p),
            ] {
                let _ = std::fs::remove_file(q);
            }
        }
    }
    // How many un-flushed blocks the cuts reverted depends on timing (the journal's own device
    // flushes may have covered every acknowledged write by the kill): printed, not asserted.
    println!("ring power cut: {unreaped} IOs unreaped at the kills, {reverted} blocks reverted");
    assert!(unreaped > 0, "coverage: no IO was on the ring at a kill");
}
