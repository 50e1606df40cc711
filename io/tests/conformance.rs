//! Runs the conformance suite on every backend, and tests the fault wrapper.

mod common;
use common::TempDir;
use std::path::Path;
use std::time::{Duration, Instant};
use tiercache_io::conformance::{self, fill_pattern, pattern};
use tiercache_io::{
    BLOCK, Backend, FaultBackend, FaultConfig, FileBackend, FileOptions, IoErr, OpKind,
    PowerCutPattern, RamBackend, Req,
};

const DEV_BLOCKS: u64 = 4096;

fn file_conformance(base: &Path) {
    let dir = TempDir::fresh_in(base, "io-test");
    let path = dir.0.join("dev.img");
    let f = FileBackend::create(&path, DEV_BLOCKS, false).unwrap();
    println!("IO path in {}: {}", base.display(), f.name());
    assert_eq!(f.blocks(), DEV_BLOCKS);
    conformance::conformance(&f);
    drop(f);
    let f = FileBackend::open(&path).unwrap();
    conformance::verify_persisted(&f);
}

#[test]
fn file_conformance_in_tmp() {
    file_conformance(&std::env::temp_dir());
}

#[test]
fn file_conformance_in_target_dir() {
    // The crate's target dir: on this machine under /work.
    file_conformance(Path::new(env!("CARGO_TARGET_TMPDIR")));
}

#[test]
fn file_conformance_every_io_path() {
    // Each fallback forced in turn: O_DIRECT or buffered, io_uring or pread/pwrite.
    for direct in [true, false] {
        for io_uring in [true, false] {
            let dir = TempDir::fresh("io-test");
            let path = dir.0.join("dev.img");
            drop(FileBackend::create(&path, DEV_BLOCKS, false).unwrap());
            let f = FileBackend::open_with(&path, FileOptions { direct, io_uring }).unwrap();
            println!("IO path: {}", f.name());
            let p = f.io_path();
            assert!(!p.direct || direct, "O_DIRECT used though not asked for");
            assert!(
                !p.io_uring || io_uring,
                "io_uring used though not asked for"
            );
            assert!(f.name().contains(&p.to_string()));
            conformance::conformance(&f);
            drop(f);
            conformance::verify_persisted(&FileBackend::open(&path).unwrap());
        }
    }
}

fn big_batch(b: &dyn Backend) {
    // More requests than one ring holds, unaligned buffers, and a trim and flush in between.
    let n = 150u64;
    let mut store: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut v = vec![0u8; 2 * BLOCK + 1];
            let shift = (i % 2) as usize;
            fill_pattern(1000, i * 2, &mut v[shift..shift + 2 * BLOCK]);
            v
        })
        .collect();
    let mut oob = vec![0u8; BLOCK];
    let mut reqs: Vec<Req<'_>> = store
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let shift = i % 2;
            Req::Write {
                lba: i as u64 * 2,
                buf: &v[shift..shift + 2 * BLOCK],
                fua: i % 10 == 0,
            }
        })
        .collect();
    reqs.push(Req::Trim { lba: 10, blocks: 2 });
    reqs.push(Req::Flush);
    reqs.push(Req::Read {
        lba: b.blocks(),
        buf: &mut oob,
    });
    let res = b.submit_batch(&mut reqs);
    drop(reqs);
    assert!(res[..n as usize + 2].iter().all(|r| r.is_ok()), "{res:?}");
    assert!(matches!(res[n as usize + 2], Err(IoErr::OutOfRange { .. })));
    for v in store.iter_mut() {
        v.fill(0xEE);
    }
    let mut reqs: Vec<Req<'_>> = store
        .iter_mut()
        .enumerate()
        .map(|(i, v)| {
            let shift = (i + 1) % 2;
            Req::Read {
                lba: i as u64 * 2,
                buf: &mut v[shift..shift + 2 * BLOCK],
            }
        })
        .collect();
    let res = b.submit_batch(&mut reqs);
    drop(reqs);
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
    for (i, v) in store.iter().enumerate() {
        let shift = (i + 1) % 2;
        let got = &v[shift..shift + 2 * BLOCK];
        if i == 5 {
            assert!(got.iter().all(|&x| x == 0), "trimmed in batch");
        } else {
            assert_eq!(
                got,
                &pattern(1000, i as u64 * 2, 2 * BLOCK)[..],
                "batch block {i}"
            );
        }
    }
}

#[test]
fn batches_on_every_backend() {
    let dir = TempDir::fresh("io-test");
    let path = dir.0.join("dev.img");
    let f = FileBackend::create(&path, DEV_BLOCKS, false).unwrap();
    println!("IO path: {}", f.name());
    big_batch(&f);
    let f = FileBackend::open_with(
        &path,
        FileOptions {
            direct: false,
            io_uring: true,
        },
    )
    .unwrap();
    big_batch(&f);
    big_batch(&RamBackend::new(DEV_BLOCKS));
    big_batch(&FaultBackend::new(
        RamBackend::new(DEV_BLOCKS),
        FaultConfig::default(),
    ));
}

#[test]
fn ram_conformance() {
    let r = RamBackend::new(DEV_BLOCKS);
    println!("IO path: {}", r.name());
    conformance::conformance(&r);
    conformance::verify_persisted(&r);
}

#[test]
fn fault_conformance_faults_off() {
    let f = FaultBackend::new(RamBackend::new(DEV_BLOCKS), FaultConfig::default());
    println!("IO path: {}", f.name());
    conformance::conformance(&f);
    // "Reopen": cut the power dropping everything un-flushed, then revive.
    f.power_cut(PowerCutPattern::DropAll).unwrap();
    f.revive();
    conformance::verify_persisted(&f);
}

#[test]
fn fault_over_file_conformance_and_reopen() {
    let dir = TempDir::fresh("io-test");
    let path = dir.0.join("dev.img");
    let f = FaultBackend::new(
        FileBackend::create(&path, DEV_BLOCKS, false).unwrap(),
        FaultConfig::default(),
    );
    println!("IO path: {}", f.name());
    conformance::conformance(&f);
    // Un-flushed writes after the last flush are dropped by the power cut, even on reopen.
    f.write(0, &pattern(77, 0, 8 * BLOCK), false).unwrap();
    let rep = f.power_cut(PowerCutPattern::DropAll).unwrap();
    assert_eq!(rep.reverted, 8);
    drop(f);
    let f = FileBackend::open(&path).unwrap();
    conformance::verify_persisted(&f);
    let mut b = vec![0u8; 8 * BLOCK];
    f.read(0, &mut b).unwrap();
    assert_ne!(b, pattern(77, 0, 8 * BLOCK));
}

#[test]
fn file_create_refuses_non_empty_without_force() {
    let dir = TempDir::fresh("io-test");
    let path = dir.0.join("dev.img");
    std::fs::write(&path, b"precious").unwrap();
    let e = FileBackend::create(&path, 64, false).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("refusing to overwrite"), "{msg}");
    assert!(msg.contains("force"), "{msg}");
    assert!(matches!(
        e,
        IoErr::Io {
            kind: std::io::ErrorKind::AlreadyExists,
            ..
        }
    ));
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    // An empty existing file is fine, and force overwrites.
    let empty = dir.0.join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(FileBackend::create(&empty, 64, false).unwrap().blocks(), 64);
    let f = FileBackend::create(&path, 64, true).unwrap();
    assert_eq!(f.blocks(), 64);
    let mut b = vec![1u8; BLOCK];
    f.read(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    // Opening a file that does not exist is an error value.
    assert!(FileBackend::open(dir.0.join("missing")).is_err());
}

fn fault_ram(blocks: u64, cfg: FaultConfig) -> FaultBackend<RamBackend> {
    FaultBackend::new(RamBackend::new(blocks), cfg)
}

#[test]
fn injected_errors_at_configured_rate() {
    let cfg = FaultConfig::default()
        .with_seed(42)
        .with_error_rate(OpKind::Read, 0.3)
        .with_error_rate(OpKind::Write, 0.1)
        .with_error_rate(OpKind::Flush, 0.5);
    let f = fault_ram(256, cfg);
    let mut buf = vec![0u8; BLOCK];
    let (mut rerr, mut werr, mut ferr) = (0, 0, 0);
    const N: usize = 4000;
    for i in 0..N {
        match f.read((i % 256) as u64, &mut buf) {
            Ok(()) => {}
            Err(IoErr::Injected { op: OpKind::Read }) => rerr += 1,
            Err(e) => panic!("unexpected {e}"),
        }
        let lba = (i % 256) as u64;
        let data = pattern(i as u64, lba, BLOCK);
        match f.write(lba, &data, false) {
            Ok(()) => {}
            Err(e @ IoErr::Injected { op: OpKind::Write }) => {
                assert!(!e.to_string().contains('\n'));
                werr += 1;
                // A failed write changes nothing.
                let mut now = vec![0u8; BLOCK];
                f.inner().read(lba, &mut now).unwrap();
                assert_ne!(now, data);
            }
            Err(e) => panic!("unexpected {e}"),
        }
        if i % 4 == 0 {
            match f.flush() {
                Ok(()) => {}
                Err(IoErr::Injected { op: OpKind::Flush }) => ferr += 1,
                Err(e) => panic!("unexpected {e}"),
            }
        }
    }
    println!(
        "injected: read {rerr}/{N}, write {werr}/{N}, flush {ferr}/{}",
        N / 4
    );
    assert!((1000..1400).contains(&rerr), "read errors {rerr}");
    assert!((300..500).contains(&werr), "write errors {werr}");
    assert!((400..600).contains(&ferr), "flush errors {ferr}");
    // Faults off: no more errors.
    f.set_faults(false);
    for i in 0..500 {
        f.read(i % 256, &mut buf).unwrap();
    }
}

#[test]
fn injected_delays() {
    // Flushes are delayed, reads are not (the read's bound is the delay itself: generous for a
    // loaded machine, and still far below what a delayed read would take).
    let cfg = FaultConfig::default().with_delay(OpKind::Flush, Duration::from_millis(200));
    let f = fault_ram(64, cfg);
    let t = Instant::now();
    f.flush().unwrap();
    f.flush().unwrap();
    assert!(t.elapsed() >= Duration::from_millis(400));
    let t = Instant::now();
    f.read(0, &mut [0u8; BLOCK]).unwrap();
    assert!(t.elapsed() < Duration::from_millis(200));
}

const A: u64 = 1;
const B: u64 = 2;
const C: u64 = 3;

/// Flushed: A on 0..100. Un-flushed: B on 50..150, then C on 60..70 (second overwrite),
/// a FUA write of C on 200..210 and a trim of 20..30 (flushed A).
fn scenario() -> FaultBackend<RamBackend> {
    let f = fault_ram(256, FaultConfig::default());
    f.write(0, &pattern(A, 0, 100 * BLOCK), false).unwrap();
    f.flush().unwrap();
    f.write(50, &pattern(B, 50, 100 * BLOCK), false).unwrap();
    f.write(60, &pattern(C, 60, 10 * BLOCK), false).unwrap();
    f.write(200, &pattern(C, 200, 10 * BLOCK), true).unwrap();
    f.trim(20, 10).unwrap();
    assert_eq!(f.unflushed_blocks(), 100 + 10);
    f
}

fn block(b: &dyn Backend, lba: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK];
    b.read(lba, &mut v).unwrap();
    v
}

fn is(b: &dyn Backend, tag: u64, lba: u64) -> bool {
    block(b, lba) == pattern(tag, lba, BLOCK)
}

fn is_zero(b: &dyn Backend, lba: u64) -> bool {
    block(b, lba).iter().all(|&x| x == 0)
}

/// What survives any pattern: flushed, not-overwritten data and FUA writes.
fn check_flushed_survives(inner: &dyn Backend) {
    for lba in (0..20).chain(30..50) {
        assert!(is(inner, A, lba), "flushed block {lba} lost");
    }
    for lba in 200..210 {
        assert!(is(inner, C, lba), "FUA block {lba} lost");
    }
    for lba in (150..200).chain(210..256) {
        assert!(is_zero(inner, lba), "never-written block {lba} changed");
    }
}

/// The state of an un-flushed block after a cut: true when kept, false when reverted.
fn kept(inner: &dyn Backend, lba: u64) -> bool {
    let new_tag = if (60..70).contains(&lba) { C } else { B };
    let (new_ok, old_ok) = match lba {
        20..30 => (is_zero(inner, lba), is(inner, A, lba)),
        50..100 => (is(inner, new_tag, lba), is(inner, A, lba)),
        100..150 => (is(inner, new_tag, lba), is_zero(inner, lba)),
        _ => unreachable!(),
    };
    assert!(
        new_ok ^ old_ok,
        "block {lba} is neither its new nor its flushed content"
    );
    new_ok
}

fn unflushed() -> impl Iterator<Item = u64> {
    (20..30).chain(50..150)
}

#[test]
fn power_cut_drop_all_loses_exactly_unflushed() {
    let f = scenario();
    let rep = f.power_cut(PowerCutPattern::DropAll).unwrap();
    assert_eq!((rep.kept, rep.reverted), (0, 110));
    // Refuses all IO until revived.
    assert!(matches!(
        f.read(0, &mut [0u8; BLOCK]),
        Err(IoErr::PoweredOff)
    ));
    assert!(matches!(
        f.write(0, &[0u8; BLOCK], false),
        Err(IoErr::PoweredOff)
    ));
    assert!(matches!(f.flush(), Err(IoErr::PoweredOff)));
    assert!(matches!(f.trim(0, 1), Err(IoErr::PoweredOff)));
    assert!(matches!(f.write_zeroes(0, 1, true), Err(IoErr::PoweredOff)));
    assert!(f.is_powered_off());
    check_flushed_survives(f.inner());
    for lba in unflushed() {
        assert!(!kept(f.inner(), lba), "block {lba} kept under DropAll");
    }
    f.revive();
    assert!(
        is(&f, A, 60),
        "second overwrite reverted to the flushed content"
    );
    assert_eq!(f.unflushed_blocks(), 0);
}

#[test]
fn power_cut_keep_all_keeps_everything() {
    let f = scenario();
    let rep = f.power_cut(PowerCutPattern::KeepAll).unwrap();
    assert_eq!((rep.kept, rep.reverted), (110, 0));
    check_flushed_survives(f.inner());
    for lba in unflushed() {
        assert!(kept(f.inner(), lba), "block {lba} lost under KeepAll");
    }
    f.revive();
    f.read(0, &mut [0u8; BLOCK]).unwrap();
}

fn torn(seed: u64) -> Vec<bool> {
    let f = scenario();
    let rep = f.power_cut(PowerCutPattern::Torn(seed)).unwrap();
    check_flushed_survives(f.inner());
    let v: Vec<bool> = unflushed().map(|lba| kept(f.inner(), lba)).collect();
    assert_eq!(rep.kept, v.iter().filter(|&&k| k).count() as u64);
    assert_eq!(rep.kept + rep.reverted, 110);
    v
}

#[test]
fn power_cut_torn_is_a_seeded_block_subset() {
    let a = torn(7);
    let kept_n = a.iter().filter(|&&k| k).count();
    assert!((20..90).contains(&kept_n), "torn kept {kept_n} of 110");
    assert_eq!(a, torn(7), "same seed, same tear");
    let b = torn(8);
    assert_ne!(a, b, "another seed, another tear");
    // Tearing inside one multi-block write: within B's 100-block write, both outcomes occur.
    let in_write = &a[10..];
    assert!(in_write.iter().any(|&k| k) && in_write.iter().any(|&k| !k));
}

#[test]
fn power_cut_after_flush_changes_nothing() {
    for pattern_kind in [
        PowerCutPattern::KeepAll,
        PowerCutPattern::DropAll,
        PowerCutPattern::Torn(3),
    ] {
        let f = scenario();
        f.flush().unwrap();
        assert_eq!(f.unflushed_blocks(), 0);
        let rep = f.power_cut(pattern_kind).unwrap();
        assert_eq!((rep.kept, rep.reverted), (0, 0));
        for lba in unflushed() {
            assert!(
                kept(f.inner(), lba),
                "flushed block {lba} lost under {pattern_kind:?}"
            );
        }
        check_flushed_survives(f.inner());
    }
}

#[test]
fn power_cut_repeated_cycles() {
    // Several write/flush/cut/revive cycles: what a cut left (flushed data, or the torn
    // choice) is the durable state from then on and never changes again.
    let f = fault_ram(128, FaultConfig::default());
    let mut settled: Vec<Vec<u8>> = Vec::new();
    for cycle in 0..5u64 {
        let lba = cycle * 10;
        f.write(lba, &pattern(100 + cycle, lba, 10 * BLOCK), false)
            .unwrap();
        f.flush().unwrap();
        f.write(lba, &pattern(200 + cycle, lba, 10 * BLOCK), false)
            .unwrap();
        f.write(100, &pattern(300 + cycle, 100, 4 * BLOCK), false)
            .unwrap();
        f.power_cut(PowerCutPattern::Torn(cycle)).unwrap();
        f.revive();
        for b in lba..lba + 10 {
            assert!(
                is(&f, 100 + cycle, b) || is(&f, 200 + cycle, b),
                "cycle {cycle}: {b}"
            );
            settled.push(block(&f, b));
        }
        for (b, want) in settled.iter().enumerate() {
            assert_eq!(
                &block(&f, b as u64),
                want,
                "cycle {cycle}: settled block {b}"
            );
        }
        f.power_cut(PowerCutPattern::DropAll).unwrap();
        f.revive();
        for (b, want) in settled.iter().enumerate() {
            assert_eq!(
                &block(&f, b as u64),
                want,
                "cycle {cycle}: block {b} after 2nd cut"
            );
        }
    }
}

/// `Backend::extents` of a sparse file: holes from `SEEK_HOLE`/`SEEK_DATA` (issue 25 item 3),
/// partly-data blocks counted as data, every run reported as a hole reading as zeros, runs
/// covering exactly what was asked; the default (RAM) is one allocated run.
#[test]
fn file_extents_follow_the_holes() {
    use tiercache_io::Extent;
    let dir = TempDir::fresh("io-extents");
    let path = dir.0.join("sparse.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(2048 * 512)
        .unwrap();
    let f = FileBackend::open(&path).unwrap();
    let hole = |blocks| Extent { blocks, hole: true };
    let data = |blocks| Extent {
        blocks,
        hole: false,
    };
    // Block 0 may be data: opening rewrites it (the O_DIRECT probe). Looked at from block 8.
    assert_eq!(f.extents(8, 2040).unwrap(), vec![hole(2040)]);
    let mut buf = vec![0u8; 8 * BLOCK];
    fill_pattern(7, 256, &mut buf);
    f.write(256, &buf, false).unwrap();
    assert_eq!(
        f.extents(8, 2040).unwrap(),
        vec![hole(248), data(8), hole(1784)]
    );
    assert_eq!(f.extents(260, 10).unwrap(), vec![data(4), hole(6)]);
    assert_eq!(f.extents(250, 8).unwrap(), vec![hole(6), data(2)]);
    // Trimmed: a hole again. Zeroed (ZERO_RANGE): a hole or data, never anything else.
    f.trim(256, 8).unwrap();
    assert_eq!(f.extents(8, 2040).unwrap(), vec![hole(2040)]);
    f.write(1024, &buf, false).unwrap();
    f.write_zeroes(1024, 512, false).unwrap();
    let runs = f.extents(0, 2048).unwrap();
    assert_eq!(runs.iter().map(|e| e.blocks).sum::<u64>(), 2048);
    let mut lba = 0;
    for e in &runs {
        if e.hole {
            let mut b = vec![1u8; e.blocks as usize * BLOCK];
            f.read(lba, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == 0), "hole at {lba} reads as zeros");
        }
        lba += e.blocks;
    }
    println!("after write + write_zeroes: {runs:?}");
    assert!(f.extents(2000, 100).is_err(), "past the end");
    assert_eq!(f.extents(5, 0).unwrap(), vec![]);
    let r = RamBackend::new(64);
    assert_eq!(r.extents(0, 64).unwrap(), vec![data(64)]);
}
