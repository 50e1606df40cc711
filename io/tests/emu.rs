//! The emulated device backend: conformance, timing accuracy against the simulator's model, and
//! device-string parsing.

mod common;
use common::TempDir;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tiercache_core::units::Nanos;
use tiercache_devmodel::{self as device, DevIo, Device, IoKind};
use tiercache_io::conformance;
use tiercache_io::{BLOCK, Backend, EmuBackend, FileBackend, RamBackend, Req, open_emu, parse_emu};

/// Tests in this file measure wall-clock time: under `cargo test` (one process, tests on
/// threads) they take turns; under nextest each has its own process anyway.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const DEV_BLOCKS: u64 = 4096;

#[test]
fn conformance_over_ram() {
    let _s = serial();
    for preset in ["ram", "nvme-p4510"] {
        let e = EmuBackend::with_preset(RamBackend::new(DEV_BLOCKS), preset).unwrap();
        println!("IO path: {}", e.name());
        assert!(e.name().starts_with(&format!("emu:{preset} over ram:")));
        assert_eq!(e.blocks(), DEV_BLOCKS);
        conformance::conformance(&e);
        conformance::verify_persisted(&e);
        let s = e.stats();
        println!(
            "  {} IOs timed, returns late by {:.1} us on average, {:.1} us at most",
            s.ios,
            s.mean_late_us(),
            s.late_max_ns as f64 / 1e3
        );
        assert!(s.ios > 300, "{s:?}");
    }
}

#[test]
fn conformance_over_file_and_reopen() {
    let _s = serial();
    let dir = TempDir::fresh("emu-test");
    let path = dir.0.join("dev.img");
    drop(FileBackend::create(&path, DEV_BLOCKS, false).unwrap());
    let dev = format!("emu:nvme-p4510:{}", path.display());
    let e = open_emu(&dev).unwrap();
    println!("IO path: {}", e.name());
    assert!(
        e.name().starts_with("emu:nvme-p4510 over file:"),
        "{}",
        e.name()
    );
    assert!(e.name().contains(&e.inner().io_path().to_string()));
    assert_eq!(e.blocks(), DEV_BLOCKS);
    conformance::conformance(&e);
    drop(e);
    let e = open_emu(&dev).unwrap();
    conformance::verify_persisted(&e);
    // Boxed, as the product holds it.
    let boxed: Box<dyn Backend> = Box::new(FileBackend::open(&path).unwrap());
    let e = EmuBackend::new(boxed, &device::preset("sata-ssd").unwrap());
    assert!(
        e.name().starts_with("emu:sata-ssd over file:"),
        "{}",
        e.name()
    );
    conformance::verify_persisted(&e);
}

#[test]
fn parse_emu_accepts_good_and_refuses_bad_strings() {
    let t = parse_emu("emu:hdd-10k-sas:/var/lib/x.img").unwrap();
    assert_eq!(t.preset, "hdd-10k-sas");
    assert_eq!(t.path, PathBuf::from("/var/lib/x.img"));
    assert_eq!(t.spec, device::preset("hdd-10k-sas").unwrap());
    // The path may contain colons.
    let t = parse_emu("emu:ram:/dev/disk/by-path/pci-0000:00:1f.2").unwrap();
    assert_eq!(t.path, PathBuf::from("/dev/disk/by-path/pci-0000:00:1f.2"));
    let bad = [
        ("", "not an emulated device"),
        ("emu", "not an emulated device"),
        ("/var/lib/x.img", "not an emulated device"),
        ("ram:1g", "not an emulated device"),
        ("EMU:hdd-10k-sas:/x", "not an emulated device"),
        ("emu:", "no path"),
        ("emu:hdd-10k-sas", "no path"),
        ("emu:hdd-10k-sas:", "no path"),
        ("emu::/x.img", "no preset"),
        ("emu:hdd-15k:/x.img", "unknown device preset 'hdd-15k'"),
        ("emu:no\nsuch:/x", "unknown device preset"),
        (
            "emu:/nonexistent/dev.toml:/x",
            "cannot read /nonexistent/dev.toml",
        ),
    ];
    for (s, want) in bad {
        let e = parse_emu(s).unwrap_err();
        println!("{s:?}: {e}");
        assert!(e.contains(want), "{s:?}: {e}");
        assert!(!e.contains('\n'), "{s:?}: not one line: {e}");
        assert!(e.contains("emu:PRESET:PATH") || e.contains("known:") || e.contains(".toml"));
    }
    // A device TOML with a syntax error: the (multi-line) parser message becomes one line.
    let dir = TempDir::fresh("emu-test");
    let toml = dir.0.join("bad.toml");
    std::fs::write(&toml, "model = \"hdd\"\nrpm = = 3\n").unwrap();
    let e = parse_emu(&format!("emu:{}:/x", toml.display())).unwrap_err();
    println!("bad toml: {e}");
    assert!(!e.contains('\n'), "{e}");
    // Opening: a missing file is a one-line error, as is a bad preset.
    let e = open_emu(&format!("emu:ram:{}", dir.0.join("missing").display())).unwrap_err();
    println!("missing file: {e}");
    assert!(!e.contains('\n') && e.contains("missing"), "{e}");
    let e = EmuBackend::with_preset(RamBackend::new(8), "nope").unwrap_err();
    assert!(
        e.contains("unknown device preset 'nope'") && !e.contains('\n'),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Accuracy: the emulated hdd-10k-sas against the same model driven in simulated time.

/// A 64-bit LCG (Knuth's MMIX constants), as in the simulator's physics tests.
#[derive(Clone)]
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 16) % n.max(1)
    }
}

/// Device size of the accuracy runs: 512 MiB of RAM (pages are only touched when written, so
/// reads of it cost little memory). The model's full stroke spans it.
const ACC_BLOCKS: u64 = 1 << 20;
const PRESET: &str = "hdd-10k-sas";

/// A closed loop in simulated time: `qd` reads outstanding, a new one submitted as one
/// completes, `next()` giving each (lba, blocks). Returns the completion times (ns) of the first
/// `count` IOs with their sizes in blocks.
fn model_closed_loop(
    qd: usize,
    count: usize,
    mut next: impl FnMut() -> (u64, u32),
) -> Vec<(u64, u32)> {
    let mut dev: Box<dyn Device> = device::preset(PRESET).unwrap().build(ACC_BLOCKS);
    let mut sizes = Vec::new();
    let mut submit = |dev: &mut dyn Device, now: Nanos, sizes: &mut Vec<u32>| {
        let (lba, blocks) = next();
        let token = sizes.len() as u64;
        let kind = IoKind::Read;
        dev.submit(
            now,
            DevIo {
                token,
                kind,
                lba,
                blocks,
            },
        );
        sizes.push(blocks);
    };
    for _ in 0..qd {
        submit(dev.as_mut(), Nanos(0), &mut sizes);
    }
    let mut out = Vec::new();
    let mut done = Vec::new();
    while out.len() < count {
        let t = dev.next_completion().expect("IOs outstanding");
        done.clear();
        dev.complete_until(t, &mut done);
        for &tok in &done {
            out.push((t.0, sizes[tok as usize]));
            submit(dev.as_mut(), t, &mut sizes);
        }
    }
    out.truncate(count);
    out
}

/// The same closed loop on the emulator in real time: one thread per generator, each keeping
/// one read outstanding until `dur` has passed. Returns every completion (ns since the start,
/// blocks), in time order.
fn emu_closed_loop<G: FnMut() -> (u64, u32) + Send>(
    e: &EmuBackend<RamBackend>,
    dur: Duration,
    gens: Vec<G>,
) -> Vec<(u64, u32)> {
    let start = Instant::now();
    let mut all: Vec<(u64, u32)> = std::thread::scope(|s| {
        let handles: Vec<_> = gens
            .into_iter()
            .map(|mut next| {
                s.spawn(move || {
                    let mut buf = vec![0u8; 1 << 20];
                    let mut out = Vec::new();
                    while start.elapsed() < dur {
                        let (lba, blocks) = next();
                        e.read(lba, &mut buf[..blocks as usize * BLOCK]).unwrap();
                        out.push((start.elapsed().as_nanos() as u64, blocks));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    all.sort();
    all
}

/// IOPS and MB/s of the completions in `(from, to]` (ns).
fn rate(v: &[(u64, u32)], from: u64, to: u64) -> (f64, f64) {
    let inside = v.iter().filter(|(t, _)| *t > from && *t <= to);
    let (n, blocks) = inside.fold((0u64, 0u64), |(n, b), &(_, x)| (n + 1, b + x as u64));
    let secs = (to - from) as f64 / 1e9;
    (n as f64 / secs, (blocks * BLOCK as u64) as f64 / secs / 1e6)
}

/// IOPS and MB/s from the start to the last completion.
fn whole(v: &[(u64, u32)]) -> (f64, f64) {
    rate(v, 0, v.last().unwrap().0)
}

fn random_4k(seed: u64) -> impl FnMut() -> (u64, u32) + Send {
    let mut rng = Lcg(seed);
    move || (rng.below(ACC_BLOCKS / 8) * 8, 8)
}

fn sequential_512k() -> impl FnMut() -> (u64, u32) + Send {
    let mut lba = 0;
    move || {
        let io = (lba, 1024);
        lba = (lba + 1024) % ACC_BLOCKS;
        io
    }
}

fn report(what: &str, unit: &str, model: f64, emu: f64, e: &EmuBackend<RamBackend>) -> f64 {
    let s = e.stats();
    let ratio = emu / model;
    println!(
        "{PRESET} {what}: model {model:.1} {unit}, emulated {emu:.1} {unit}, ratio {ratio:.3} \
         ({} IOs; returns late by {:.1} us mean, {:.1} us max; spin margin {:.0} us)",
        s.ios,
        s.mean_late_us(),
        s.late_max_ns as f64 / 1e3,
        s.spin_margin_ns as f64 / 1e3
    );
    ratio
}

#[test]
fn accuracy_hdd_10k_sas() {
    let _s = serial();
    let t0 = Instant::now();
    let new = || EmuBackend::with_preset(RamBackend::new(ACC_BLOCKS), PRESET).unwrap();
    let mut failures = Vec::new();
    let mut check = |what: &str, ratio: f64| {
        if !(0.9..=1.1).contains(&ratio) {
            failures.push(format!("{what}: emulated / model = {ratio:.3}"));
        }
    };

    // (a) 4K random reads over the full span, QD1, for 2 s. The model's figure is a long run of
    // the same generator (its first IOs are the emulator's sequence), so that only the
    // emulator's sampling noise (~2%) remains; the model over exactly the emulator's IOs is
    // printed too.
    let (model_iops, _) = whole(&model_closed_loop(1, 5000, random_4k(7)));
    let e = new();
    let got = emu_closed_loop(&e, Duration::from_millis(2000), vec![random_4k(7)]);
    let (emu_iops, _) = whole(&got);
    let (same_iops, _) = whole(&model_closed_loop(1, got.len(), random_4k(7)));
    let what = "4K random read, full span, QD1";
    check("QD1", report(what, "IOPS", model_iops, emu_iops, &e));
    println!(
        "  (model over the same {} IOs: {same_iops:.1} IOPS, ratio {:.3})",
        got.len(),
        emu_iops / same_iops
    );
    check("QD1, same IOs", emu_iops / same_iops);

    // (b) 4K random reads, QD16: 16 threads, one read outstanding each, for 1.6 s. Steady state
    // after a warm-up on both sides (200 IOs in the model, 0.2 s on the emulator).
    let model = model_closed_loop(16, 8000, random_4k(11));
    let (model_iops, _) = rate(&model, model[200].0, model.last().unwrap().0);
    let e = new();
    let dur = Duration::from_millis(1600);
    let gens: Vec<_> = (0..16).map(|t| random_4k(100 + t)).collect();
    let got = emu_closed_loop(&e, dur, gens);
    let (emu_iops, _) = rate(&got, 200_000_000, dur.as_nanos() as u64);
    let what = "4K random read, full span, QD16 (16 threads)";
    check("QD16", report(what, "IOPS", model_iops, emu_iops, &e));

    // (c) Sequential 512K reads, QD1, from LBA 0: the same 500 IOs (~1.3 s) on both sides.
    let count = 500;
    let (_, model_mb_s) = whole(&model_closed_loop(1, count, sequential_512k()));
    let e = new();
    let mut next = sequential_512k();
    let mut buf = vec![0u8; 1024 * BLOCK];
    let start = Instant::now();
    for _ in 0..count {
        let (lba, blocks) = next();
        e.read(lba, &mut buf[..blocks as usize * BLOCK]).unwrap();
    }
    let emu_mb_s = (count * 1024 * BLOCK) as f64 / start.elapsed().as_secs_f64() / 1e6;
    let what = "512K sequential read, QD1";
    check("sequential", report(what, "MB/s", model_mb_s, emu_mb_s, &e));

    println!("accuracy runs took {:.2} s", t0.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "outside 10% of the model: {failures:?}"
    );
}

/// A batch goes into the model at once: 32 random reads in one `submit_batch` take what the
/// model says 32 reads queued together (NCQ) take, far less than 32 one after the other.
#[test]
fn batch_is_queued_at_once() {
    let _s = serial();
    let e = EmuBackend::with_preset(RamBackend::new(ACC_BLOCKS), PRESET).unwrap();
    let mut next = random_4k(5);
    let lbas: Vec<u64> = (0..32).map(|_| next().0).collect();
    let mut bufs = vec![vec![0u8; 8 * BLOCK]; 32];
    let mut reqs: Vec<Req<'_>> = lbas
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&lba, buf)| Req::Read { lba, buf })
        .collect();
    let at = e.elapsed();
    let res = e.submit_batch(&mut reqs);
    let took = e.elapsed().0 - at.0;
    assert!(res.iter().all(|r| r.is_ok()));
    // The same 32 reads submitted together to a fresh model at the same time.
    let mut dev = device::preset(PRESET).unwrap().build(ACC_BLOCKS);
    for (i, &lba) in lbas.iter().enumerate() {
        let io = DevIo {
            token: i as u64,
            kind: IoKind::Read,
            lba,
            blocks: 8,
        };
        dev.submit(at, io);
    }
    let mut last = at;
    let mut done = Vec::new();
    while let Some(t) = dev.next_completion() {
        dev.complete_until(t, &mut done);
        last = t;
    }
    assert_eq!(done.len(), 32);
    let model = last.0 - at.0;
    println!(
        "batch of 32 random 4K reads: model {:.2} ms, emulated {:.2} ms",
        model as f64 / 1e6,
        took as f64 / 1e6
    );
    // Never early; late only as far as the machine's scheduling makes it (printed, not
    // asserted: tests assert no upper wall-clock bound).
    let ratio = took as f64 / model as f64;
    assert!(ratio >= 0.9, "{took} vs {model}");
    if ratio > 1.1 {
        println!(
            "note: emulated {ratio:.2}x the model time (a loaded machine wakes sleepers late)"
        );
    }
    // Queued together they beat QD1 (~6.4 ms each) by far.
    assert!(model < 32 * 5_000_000, "{model}");
}

/// Each operation reaches the model as the right kind: a flash model with distinct, long
/// latencies per kind (lower bounds prove the mapping; no upper wall-clock bound is asserted), and
/// an HDD with its write cache on for FUA (a FUA write goes to the media, a plain one does not).
#[test]
fn operations_map_to_model_operations() {
    let _s = serial();
    let spec = device::parse_spec(
        "model = \"flash\"\nname = \"slow\"\ncapacity_gb = 1.0\nchannels = 1\n\
         read_latency_us = 5000.0\nwrite_latency_us = 40000.0\nchannel_mb_s = 1000.0\n\
         read_mb_s = 1000.0\nwrite_mb_s = 1000.0\nread_iops = 1000000.0\n\
         write_iops = 1000000.0\nflush_latency_us = 25000.0\ntrim_latency_us = 15000.0\n",
    )
    .unwrap();
    let e = EmuBackend::new(RamBackend::new(DEV_BLOCKS), &spec);
    assert_eq!(e.model_name(), "slow");
    // A pause longer than the lateness-credit lapse (10 ms) before each operation, so that no
    // operation is backdated by the previous one's lateness: the lower bounds are then exact.
    let time = |f: &dyn Fn()| {
        std::thread::sleep(Duration::from_millis(12));
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1e3
    };
    let buf = vec![0u8; 8 * BLOCK];
    let read = time(&|| e.read(0, &mut vec![0u8; 8 * BLOCK]).unwrap());
    let write = time(&|| e.write(0, &buf, false).unwrap());
    let fua = time(&|| e.write(8, &buf, true).unwrap());
    let flush = time(&|| e.flush().unwrap());
    let trim = time(&|| e.trim(0, 8).unwrap());
    let zeroes = time(&|| e.write_zeroes(0, 8, true).unwrap());
    let empty = time(&|| e.read(0, &mut []).unwrap());
    let bad = time(&|| assert!(e.read(DEV_BLOCKS, &mut vec![0u8; BLOCK]).is_err()));
    println!(
        "ms: read {read:.1}, write {write:.1}, FUA write {fua:.1}, flush {flush:.1}, trim \
         {trim:.1}, write_zeroes {zeroes:.1}, empty read {empty:.2}, rejected read {bad:.2}"
    );
    // Only lower bounds: a sleep never ends early, but a loaded machine may wake it late (tests
    // never assert an upper wall-clock bound).
    assert!(read >= 5.0, "read {read}");
    assert!(write >= 40.0, "write {write}");
    assert!(fua >= 40.0, "FUA write {fua}");
    assert!(flush >= 25.0, "flush {flush}");
    assert!(trim >= 15.0, "trim {trim}");
    assert!(zeroes >= 15.0, "write_zeroes {zeroes}");
    // The empty and the rejected read never reached the model (6 modelled operations).
    assert_eq!(e.stats().ios, 6);
    let mut back = vec![1u8; 8 * BLOCK];
    e.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "zeroed");

    // hdd-10k-sas with its volatile write cache on: plain writes are acknowledged from the
    // cache (microseconds), FUA writes wait for the media (a seek across the disk).
    let mut spec = device::preset(PRESET).unwrap();
    match &mut spec {
        device::DeviceSpec::Hdd(h) => h.write_cache = true,
        other => panic!("{other:?}"),
    }
    let e = EmuBackend::new(RamBackend::new(ACC_BLOCKS), &spec);
    let far = [ACC_BLOCKS - 8, 0, ACC_BLOCKS / 2, ACC_BLOCKS - 16];
    let cached = far
        .iter()
        .map(|&lba| time(&|| e.write(lba, &buf, false).unwrap()))
        .fold(f64::MAX, f64::min);
    // Each at least a quarter of the span from where the head is (a seek of 3+ ms), and none
    // continuing a previous write (which the model streams without positioning).
    let far_fua = [ACC_BLOCKS / 4 * 3, 4096, ACC_BLOCKS - 4096, ACC_BLOCKS / 4];
    let media = far_fua
        .iter()
        .map(|&lba| time(&|| e.write(lba, &buf, true).unwrap()))
        .fold(f64::MAX, f64::min);
    println!("hdd with write cache, ms (fastest of 4): write {cached:.2}, FUA write {media:.2}");
    assert!(media > 2.0, "FUA write {media}");
    assert!(cached < media, "cached write {cached} vs FUA write {media}");
}

/// Many threads with mixed operations and batches on a fast model: every call returns (no lost
/// wake-up when the leadership changes hands), never before its model completion, and the data
/// lands.
#[test]
fn many_threads_mixed_operations() {
    let _s = serial();
    for preset in ["nvme-p4510", "hdd-10k-sas"] {
        let e = EmuBackend::with_preset(RamBackend::new(DEV_BLOCKS), preset).unwrap();
        let threads = 24u64;
        let per = DEV_BLOCKS / threads;
        let ops = if preset == "nvme-p4510" { 300 } else { 20 };
        let t = Instant::now();
        std::thread::scope(|s| {
            for th in 0..threads {
                let e = &e;
                s.spawn(move || {
                    let base = th * per;
                    let mut rng = Lcg(th + 1);
                    for k in 0..ops {
                        let lba = base + rng.below(per - 8);
                        let data = conformance::pattern(th * 1000 + k, lba, 8 * BLOCK);
                        match k % 5 {
                            0 | 1 => e.write(lba, &data, k % 3 == 0).unwrap(),
                            2 => e.flush().unwrap(),
                            3 => e.trim(lba, 8).unwrap(),
                            _ => {
                                let mut back = vec![0u8; 8 * BLOCK];
                                let mut reqs = [
                                    Req::Write {
                                        lba,
                                        buf: &data,
                                        fua: false,
                                    },
                                    Req::Flush,
                                ];
                                assert!(e.submit_batch(&mut reqs).iter().all(|r| r.is_ok()));
                                e.read(lba, &mut back).unwrap();
                                assert!(back == data, "{preset}: thread {th} op {k}");
                            }
                        }
                    }
                });
            }
        });
        let s = e.stats();
        println!(
            "{preset}: {threads} threads, {} timed IOs in {:.2} s, returns late by {:.1} us mean",
            s.ios,
            t.elapsed().as_secs_f64(),
            s.mean_late_us()
        );
        // Per five operations: two writes, a flush, a trim, a batch of two and a read.
        assert_eq!(s.ios, threads * ops * 7 / 5);
    }
}
