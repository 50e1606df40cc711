//! The timeout wrapper over real files, and the fault wrapper's error kinds, slow mode and hang
//! (docs/SAFETY.md, "Faults"). Times are generous lower bounds only where a test must wait for
//! a timeout; nothing asserts an upper bound on wall-clock time.

mod common;

use common::TempDir;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_io::conformance::{self, pattern};
use tiercache_io::{
    BLOCK, Backend, FaultBackend, FaultConfig, FileBackend, InjectedError, IoErr, OpKind, Req,
    TimeoutBackend,
};

const DEV_BLOCKS: u64 = 4096;

type Faulty = Arc<FaultBackend<FileBackend>>;

/// A file device in a fresh temp dir, behind a fault wrapper (no power-cut tracking) and a
/// timeout wrapper.
fn stack(timeout: Duration, threads: usize) -> (TempDir, Faulty, TimeoutBackend<Faulty>) {
    let dir = TempDir::fresh("timeout");
    let f = FileBackend::create(dir.0.join("dev.img"), DEV_BLOCKS, false).unwrap();
    let fault = Arc::new(FaultBackend::new(
        f,
        FaultConfig {
            track_power_cut: false,
            ..FaultConfig::default()
        },
    ));
    let t = TimeoutBackend::with_threads(fault.clone(), timeout, threads);
    (dir, fault, t)
}

fn read_block(b: &dyn Backend, lba: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK];
    b.read(lba, &mut v).unwrap();
    v
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn timeout_wrapper_passes_the_conformance_suite_on_a_file() {
    let dir = TempDir::fresh("timeout-conf");
    let path = dir.0.join("dev.img");
    let f = FileBackend::create(&path, DEV_BLOCKS, false).unwrap();
    let t = TimeoutBackend::new(f, Duration::from_secs(30));
    assert!(t.name().starts_with("timeout("), "{}", t.name());
    conformance::conformance(&t);
    let s = t.stats();
    assert_eq!(s.timed_out + s.timed_out_unissued, 0);
    drop(t);
    conformance::verify_persisted(&FileBackend::open(&path).unwrap());
}

#[test]
fn a_hung_write_times_out_and_lands_later_with_its_own_data() {
    let (_d, fault, t) = stack(Duration::from_millis(100), 8);
    fault.hang(&[OpKind::Write]);
    let mut buf = pattern(1, 10, 4 * BLOCK);
    let want = buf.clone();
    let t0 = Instant::now();
    let e = t.write(10, &buf, false).unwrap_err();
    assert!(t0.elapsed() >= Duration::from_millis(100));
    assert!(e.is_timed_out(), "{e}");
    assert_eq!(t.stats().timed_out, 1);
    assert_eq!(t.stats().late_writes, 1);
    // The caller reuses its buffer at once: the late write has its own copy.
    buf.fill(0xAB);
    fault.release();
    wait_until("the late write finished", || t.stats().late_done == 1);
    assert_eq!(t.stats().late_writes, 0);
    let mut got = vec![0u8; 4 * BLOCK];
    t.read(10, &mut got).unwrap();
    assert_eq!(got, want, "the late write wrote what it was given");
}

#[test]
fn a_later_overlapping_write_waits_for_the_late_one_and_wins() {
    let (_d, fault, t) = stack(Duration::from_millis(300), 8);
    let t = Arc::new(t);
    fault.hang(&[OpKind::Write]);
    assert!(t.write(0, &pattern(1, 0, 8 * BLOCK), false).is_err());
    // The device is released while the next write waits: it runs after the late one.
    let f2 = fault.clone();
    let rel = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        f2.release();
    });
    t.write(4, &pattern(2, 4, 8 * BLOCK), false).unwrap();
    rel.join().unwrap();
    assert_eq!(t.stats().waited_for_late, 1);
    assert_eq!(
        read_block(&*t, 0),
        pattern(1, 0, BLOCK),
        "the late write's block"
    );
    assert_eq!(
        read_block(&*t, 4),
        pattern(2, 4, BLOCK),
        "the newer write is not overtaken"
    );
    assert_eq!(read_block(&*t, 11), pattern(2, 11, BLOCK));
}

#[test]
fn while_a_late_write_hangs_overlapping_ios_and_flushes_time_out_unissued() {
    let (_d, fault, t) = stack(Duration::from_millis(80), 8);
    t.write(0, &pattern(3, 0, 8 * BLOCK), false).unwrap();
    t.flush().unwrap();
    fault.hang(&[OpKind::Write]);
    assert!(t.write(0, &pattern(4, 0, 8 * BLOCK), false).is_err());
    let writes_before = fault.reached(OpKind::Write);
    // Overlapping read, overlapping write, flush: none reaches the device.
    let mut b = vec![0u8; 2 * BLOCK];
    assert!(t.read(6, &mut b).unwrap_err().is_timed_out());
    assert!(
        t.write(7, &pattern(5, 7, 2 * BLOCK), false)
            .unwrap_err()
            .is_timed_out()
    );
    assert!(t.flush().unwrap_err().is_timed_out());
    assert_eq!(t.stats().timed_out_unissued, 3);
    assert_eq!(fault.reached(OpKind::Flush), 1, "only the first flush ran");
    // Elsewhere the device still works.
    let mut b = vec![0u8; BLOCK];
    t.read(100, &mut b).unwrap();
    fault.release();
    wait_until("late write done", || t.stats().late_done == 1);
    // The late write itself got through once released; the refused write never did.
    assert_eq!(fault.reached(OpKind::Write), writes_before + 1);
    // No flip-flop: once the late write landed, it is what reads return, and a flush covers it.
    t.flush().unwrap();
    assert_eq!(read_block(&t, 7), pattern(4, 7, BLOCK));
}

#[test]
fn a_very_slow_device_times_out_and_a_longer_timeout_waits_for_it() {
    let (_d, fault, t) = stack(Duration::from_millis(40), 8);
    fault.set_slow(Duration::from_millis(150));
    let mut b = vec![0u8; BLOCK];
    assert!(t.read(0, &mut b).unwrap_err().is_timed_out());
    t.set_timeout(Duration::from_secs(10));
    t.read(0, &mut b).unwrap();
    fault.set_slow(Duration::ZERO);
    let t0 = Instant::now();
    t.read(0, &mut b).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn queued_ios_that_time_out_never_reach_the_device() {
    // Two helpers, both stuck: further IOs wait in the queue and are dropped from it.
    let (_d, fault, t) = stack(Duration::from_millis(60), 2);
    let t = Arc::new(t);
    fault.hang(&[OpKind::Read]);
    let mut hs = Vec::new();
    for i in 0..2u64 {
        let t = t.clone();
        hs.push(std::thread::spawn(move || {
            let mut b = vec![0u8; BLOCK];
            t.read(i * 64, &mut b).unwrap_err()
        }));
    }
    for h in hs {
        assert!(h.join().unwrap().is_timed_out());
    }
    wait_until("two reads hung", || fault.hung() == 2);
    let mut b = vec![0u8; BLOCK];
    assert!(t.read(500, &mut b).unwrap_err().is_timed_out());
    let s = t.stats();
    assert_eq!((s.timed_out, s.timed_out_unissued), (2, 1), "{s:?}");
    assert_eq!(s.threads_max, 2);
    // Late reads hold nothing back, and their data is dropped.
    assert_eq!(s.late_writes, 0);
    fault.release();
    wait_until("late reads done", || t.stats().late_done == 2);
    t.read(500, &mut b).unwrap();
}

#[test]
fn batches_run_under_one_timeout() {
    let (_d, fault, t) = stack(Duration::from_millis(80), 4);
    let data: Vec<Vec<u8>> = (0..4u64).map(|i| pattern(7, i * 16, 2 * BLOCK)).collect();
    let mut reqs: Vec<Req<'_>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| Req::Write {
            lba: i as u64 * 16,
            buf: d,
            fua: false,
        })
        .collect();
    reqs.push(Req::Flush);
    assert!(t.submit_batch(&mut reqs).iter().all(|r| r.is_ok()));
    let mut out = vec![0u8; 2 * BLOCK];
    let mut oob = vec![0u8; BLOCK];
    let mut reqs = vec![
        Req::Read {
            lba: 16,
            buf: &mut out,
        },
        Req::Read {
            lba: DEV_BLOCKS,
            buf: &mut oob,
        },
    ];
    let r = t.submit_batch(&mut reqs);
    assert!(r[0].is_ok());
    assert!(matches!(r[1], Err(IoErr::OutOfRange { .. })));
    assert_eq!(out, data[1]);
    fault.hang(&[OpKind::Read]);
    let mut a = vec![0u8; BLOCK];
    let mut reqs = vec![Req::Read {
        lba: 0,
        buf: &mut a,
    }];
    assert!(
        t.submit_batch(&mut reqs)[0]
            .as_ref()
            .unwrap_err()
            .is_timed_out()
    );
    fault.release();
}

#[test]
fn the_fault_wrapper_injects_each_error_kind_and_can_change_at_run_time() {
    let dir = TempDir::fresh("fault-kinds");
    let f = FileBackend::create(dir.0.join("dev.img"), DEV_BLOCKS, false).unwrap();
    let fault = FaultBackend::new(
        f,
        FaultConfig::default()
            .with_error_rate(OpKind::Write, 1.0)
            .with_error_kind(OpKind::Write, InjectedError::NoSpace),
    );
    let d = pattern(9, 0, BLOCK);
    let e = fault.write(0, &d, false).unwrap_err();
    assert!(e.is_no_space(), "{e}");
    fault.set_error_kind(OpKind::Write, InjectedError::TimedOut);
    assert!(fault.write(0, &d, false).unwrap_err().is_timed_out());
    fault.set_error_kind(OpKind::Write, InjectedError::Io);
    assert!(matches!(
        fault.write(0, &d, false),
        Err(IoErr::Injected { op: OpKind::Write })
    ));
    // A device that starts failing everything, then recovers.
    fault.set_error_rate_all(1.0);
    let mut b = vec![0u8; BLOCK];
    assert!(fault.read(0, &mut b).is_err() && fault.flush().is_err());
    fault.set_error_rate_all(0.0);
    fault.write(0, &d, false).unwrap();
    fault.read(0, &mut b).unwrap();
    assert_eq!(b, d);
    assert_eq!(fault.reached(OpKind::Write), 1);
}

#[test]
fn a_real_file_system_full_is_reported_as_no_space() {
    // A sparse file that claims more than a tiny tmpfs can hold: writes past the space fail
    // with ENOSPC from the kernel, which must come out as `is_no_space`. Skipped where no
    // small file system can be mounted (no privilege).
    let dir = TempDir::fresh("enospc");
    let mnt = dir.0.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("skipped: cannot mount a small tmpfs here");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(mnt.clone());
    let path = mnt.join("dev.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let f = FileBackend::open(&path).unwrap();
    println!("{}", f.name());
    let t = TimeoutBackend::new(f, Duration::from_secs(10));
    let data = pattern(11, 0, 64 * BLOCK);
    let mut saw = None;
    for i in 0..(4 << 20) / data.len() as u64 {
        match t.write(i * 64, &data, false) {
            Ok(()) => {}
            Err(e) => {
                saw = Some(e);
                break;
            }
        }
    }
    let e = saw.expect("a 256 KiB file system filled up");
    assert!(e.is_no_space(), "{e}");
}
