//! IO classes do something: under eviction pressure, priority order, allocation caps and
//! pinning hold — with Open CAS's CSV accepted verbatim and the configuration of the Open CAS +
//! Ceph study (`wb`, 4 KiB lines, seq-cutoff `always` 16 KiB, `alru` activity threshold 1 s).

mod harness;

use harness::{Env, Knobs, ReqOp};
use tiercache_core::Config;
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::ioclass::IoClassTable;
use tiercache_core::policy::{AlruParams, CleaningPolicy, CutoffParams, CutoffPolicy};
use tiercache_core::units::{CoreId, LineSize};

const LINES: u32 = 64;

fn env(mode: CacheMode, csv: &str) -> Env {
    let mut cfg = Config::new(LINES, LineSize::K4);
    cfg.mode = mode;
    cfg.cleaning = CleaningPolicy::Alru;
    cfg.alru = AlruParams {
        activity_threshold_ms: 1000,
        ..AlruParams::default()
    };
    let mut env = Env::new(
        cfg,
        11,
        Knobs {
            p_io_error: 0.0,
            ..Knobs::default()
        },
    );
    env.add_core(0, 1 << 16);
    env.cache
        .set_cutoff(
            CoreId(0),
            CutoffParams {
                policy: CutoffPolicy::Always,
                threshold_bytes: 16 << 10,
                promotion_count: 8,
            },
        )
        .unwrap();
    env.cache
        .load_io_classes(IoClassTable::parse_csv(csv).expect("csv parses"));
    env
}

/// Reads line `l` (4 KiB) and waits for it.
fn touch(env: &mut Env, l: u64) {
    env.submit(ReqOp::Read, 0, l * 8, 8);
    env.drain();
}

#[test]
fn study_csv_caches_small_requests_and_passes_large_ones() {
    let csv = "IO class id,IO class name,Eviction priority,Allocation\n\
               0,unclassified,22,0\n\
               1,request_size:le:131072,1,1\n";
    let mut env = env(CacheMode::Wb, csv);
    // 4 KiB random writes: class 1, cached (dirty).
    for i in 0..20u64 {
        env.submit(ReqOp::Write { fua: false }, 0, (i * 37 % 500) * 8, 8);
        env.drain();
    }
    // 256 KiB reads: class 0, allocation 0: never cached.
    for i in 0..4u64 {
        env.submit(ReqOp::Read, 0, 8192 + i * 4096, 512);
        env.drain();
    }
    assert_eq!(env.cache.class_lines(0), 0, "class 0 has allocation 0");
    assert_eq!(env.cache.class_lines(1), 20);
    let c0 = env.cache.class_counters(0).unwrap();
    assert_eq!(c0.read.pass_through, 4);
    env.verify_all();
}

#[test]
fn priority_order_and_caps_hold_under_pressure() {
    // Class 1 (important) lives in LBA < 2048 blocks; class 2 (less important) above, capped at
    // 50%; class 3 is pinned.
    let csv = "IO class id,IO class name,Eviction priority,Allocation\n\
               0,unclassified,22,1\n\
               1,lba:lt:2048,1,1\n\
               2,lba:ge:4096&lba:lt:1000000,10,0.5\n\
               3,lba:ge:2048&lba:lt:4096,,0.25\n";
    let mut env = env(CacheMode::Wt, csv);
    // Pinned class 3: 8 lines.
    // (Lines are touched with a stride of 2 so sequential cutoff never fires.)
    for l in (256..272).step_by(2) {
        touch(&mut env, l);
    }
    // Class 1: 16 lines.
    for l in (0..32).step_by(2) {
        touch(&mut env, l);
    }
    assert_eq!(env.cache.class_lines(3), 8);
    assert_eq!(env.cache.class_lines(1), 16);
    // Heavy pressure from the less important class 2: it may not take class 1's or the pinned
    // class's lines, and stays under its cap of 50% (32 lines).
    for l in (512..(512 + 800)).step_by(2) {
        touch(&mut env, l);
        assert!(
            env.cache.class_lines(2) <= LINES / 2,
            "class 2 over its allocation cap"
        );
    }
    assert_eq!(
        env.cache.class_lines(1),
        16,
        "a less important class evicted a more important one"
    );
    assert_eq!(
        env.cache.class_lines(3),
        8,
        "pinned lines were evicted by another class"
    );
    assert_eq!(env.cache.class_lines(2), LINES / 2);
    // Pressure from the important class 1: it takes the least important class's lines first
    // (class 2, priority 10, before unclassified's 0 lines) and never the pinned ones.
    for l in (32..80).step_by(2) {
        touch(&mut env, l);
    }
    assert_eq!(env.cache.class_lines(1), 40);
    assert_eq!(env.cache.class_lines(3), 8, "pinned lines were evicted");
    assert_eq!(env.cache.class_lines(2), LINES - 40 - 8);
    env.verify_all();
}

#[test]
fn unsupported_classifier_is_refused_and_nothing_changes() {
    let mut env = env(
        CacheMode::Wt,
        "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n",
    );
    let bad = "IO class id,IO class name,Eviction priority,Allocation\n\
               0,unclassified,22,1\n\
               1,file_name_prefix:foo,1,1\n";
    let err = IoClassTable::parse_csv(bad).unwrap_err();
    assert_eq!(err.line, 3);
    assert!(err.message.contains("file_name_prefix"), "{}", err.message);
    // The table in force is untouched (the parse failed before anything was loaded).
    assert_eq!(env.cache.io_classes().classes().count(), 1);
    touch(&mut env, 1);
    assert_eq!(env.cache.class_lines(0), 1);
}
