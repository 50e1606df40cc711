//! The engine on real backends: requests from several threads, and power cuts.
//!
//! The power-cut test is the in-process form of SPEC R2: caller threads write, flush, trim and
//! read (verifying) on a persistent cache whose cache and core devices are fault backends that
//! track what a completed flush covers; at a random point the engine is killed (nothing more is
//! written) and both devices lose or tear (at 512 B) what no flush covered. The cache is then
//! recovered by `Engine::open` and every block is read back: it must hold the newest flushed
//! write or something written after it — never older data, never another block's data. A
//! build with the engine's `canary-skip-flush` feature (device flushes acknowledged without
//! being done) must fail it.
//!
//! `TIERCACHE_POWERCUT_ROUNDS=N` runs more rounds.

use std::sync::Arc;
use tiercache_core::ReqError;
use tiercache_core::cache::CoreRecord;
use tiercache_core::mode::CacheMode;
use tiercache_core::units::{CoreId, LineSize};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_io::{FaultBackend, FaultConfig, RamBackend};

mod common;
use common::*;

#[test]
fn requests_from_several_threads_read_back_in_every_mode() {
    // The last two run with an IO buffer pool of two pages: IOs wait for buffers.
    for (mode, tiny_pool) in [
        (CacheMode::Wt, false),
        (CacheMode::Wb, false),
        (CacheMode::Wo, false),
        (CacheMode::Wa, false),
        (CacheMode::Wt, true),
        (CacheMode::Wb, true),
    ] {
        let cache: Device = Arc::new(FaultBackend::new(
            RamBackend::new(16 << 11),
            FaultConfig::default(),
        ));
        let core: Device = Arc::new(RamBackend::new(64 << 11));
        let cfg = persistent(16 << 20, LineSize::K4, mode, 1);
        let e = Engine::create(
            cfg,
            cache,
            vec![CoreSpec {
                id: CoreId(0),
                dev: core,
                record: record(0),
            }],
            EngineConfig {
                io_buffer_bytes: if tiny_pool { 8 << 10 } else { 64 << 20 },
                ..EngineConfig::threads(4)
            },
        )
        .expect("create");
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let e = &e;
                s.spawn(move || {
                    let mut rng = Rng(0x9e37 + t * 7919);
                    let base = t * 16384;
                    let mut versions = vec![0u64; 16384];
                    let mut buf = vec![0u8; 8 * BS];
                    for n in 1..3000u64 {
                        let b = rng.below(16384 - 8);
                        let len = 1 + rng.below(8) as usize;
                        if rng.below(3) == 0 {
                            for i in 0..len {
                                fill(&mut buf[i * BS..(i + 1) * BS], base + b + i as u64, n);
                                versions[(b as usize) + i] = n;
                            }
                            e.write(CoreId(0), base + b, &buf[..len * BS], false)
                                .expect("write");
                        } else {
                            e.read(CoreId(0), base + b, &mut buf[..len * BS])
                                .expect("read");
                            for i in 0..len {
                                let got = decode(&buf[i * BS..(i + 1) * BS], base + b + i as u64);
                                assert_eq!(
                                    got,
                                    Some(versions[b as usize + i]),
                                    "{mode}: thread {t} block {}",
                                    b as usize + i
                                );
                            }
                        }
                        if rng.below(200) == 0 {
                            e.flush(CoreId(0)).expect("flush");
                        }
                    }
                });
            }
        });
        let st = e.stats();
        println!(
            "{mode}: {} requests, {} IOs on IO threads (at most {} at once), {} inline; IO \
             buffers: pool {} B, peak {} B, {} waits, {} larger than the pool",
            st.requests,
            st.thread_ios,
            st.in_flight_max,
            st.inline_ios,
            st.buffer_bytes,
            st.buffer_peak,
            st.buffer_waits,
            st.buffer_oversize
        );
        assert!(st.in_flight_max >= 2, "IO threads ran IOs concurrently");
        assert!(st.buffer_peak <= st.buffer_bytes);
        // The requests are done, but IOs they left behind (writeback of what they dirtied, the
        // journal) may still hold buffers: once nothing is in flight, every buffer is back.
        let t = std::time::Instant::now();
        let st = loop {
            let st = e.stats();
            if (st.in_flight == 0 && st.buffer_in_use == 0)
                || t.elapsed() > std::time::Duration::from_secs(20)
            {
                break st;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(
            st.buffer_in_use, 0,
            "every IO gave its buffer back ({} in flight)",
            st.in_flight
        );
        if tiny_pool {
            assert!(st.buffer_waits > 0, "IOs waited for the two-page pool");
        }
        e.stop().expect("stop");
    }
}

fn rounds() -> u64 {
    std::env::var("TIERCACHE_POWERCUT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

#[test]
fn power_cut_loses_no_flushed_write() {
    const THREADS: u64 = 3;
    const REGION: u64 = 4096;
    let mut totals = (0u64, 0u64, 0u64);
    for round in 0..rounds() {
        let mut rng = Rng(0x51ed_270b ^ ((round + 1) * 0x9e37_79b9));
        let mode = [CacheMode::Wb, CacheMode::Wo, CacheMode::Wt][rng.below(3) as usize];
        let ls = [LineSize::K4, LineSize::K16, LineSize::K64][rng.below(3) as usize];
        let track = FaultConfig::default();
        let cache = Arc::new(FaultBackend::new(RamBackend::new(16 << 11), track.clone()));
        let core = Arc::new(FaultBackend::new(
            RamBackend::new(THREADS * REGION),
            track.clone(),
        ));
        let cfg = persistent(16 << 20, ls, mode, round as u8);
        let e = Engine::create(
            cfg.clone(),
            cache.clone(),
            vec![CoreSpec {
                id: CoreId(0),
                dev: core.clone(),
                record: record(0),
            }],
            EngineConfig::threads(4),
        )
        .expect("create");
        let ops = 200 + rng.below(1500);
        let label = format!("round {round} ({mode})");
        let windows = run_writers(&e, THREADS, REGION, ops, &mut rng, &label);
        // Crash: the engine stops dead, the devices lose what no flush covered.
        e.kill();
        let (pattern, reverted) = power_cut_both(&mut rng, [&cache, &core]);
        totals.0 += 1;
        totals.1 += reverted;
        let (e, report) = Engine::open(
            &cfg,
            cache.clone(),
            vec![(CoreId(0), core.clone() as Device)],
            EngineConfig::threads(4),
        )
        .unwrap_or_else(|err| {
            panic!("round {round} ({mode}, {pattern:?}): recovery failed: {err}")
        });
        totals.2 += report.dirty_lines as u64;
        check_windows(
            &e,
            &windows,
            REGION,
            &format!("round {round} ({mode}, {ls}, {pattern:?})"),
        );
        e.stop().expect("stop");
    }
    println!(
        "power cut: {} rounds, {} unflushed blocks reverted, {} dirty lines recovered",
        totals.0, totals.1, totals.2
    );
    assert!(
        totals.1 > 0 && totals.2 > 0,
        "coverage: nothing was reverted or recovered"
    );
}

#[test]
fn open_refuses_a_missing_or_resized_core() {
    let cache: Device = Arc::new(FaultBackend::new(
        RamBackend::new(16 << 11),
        FaultConfig::default(),
    ));
    let core: Device = Arc::new(RamBackend::new(4096));
    let cfg = persistent(16 << 20, LineSize::K4, CacheMode::Wb, 9);
    let e = Engine::create(
        cfg.clone(),
        cache.clone(),
        vec![CoreSpec {
            id: CoreId(0),
            dev: core,
            record: record(0),
        }],
        EngineConfig::default(),
    )
    .expect("create");
    e.write(CoreId(0), 0, &[7u8; 4096], false).expect("write");
    e.stop().expect("stop");
    let err = Engine::open(&cfg, cache.clone(), vec![], EngineConfig::default())
        .err()
        .expect("refused");
    assert!(err.contains("was not given"), "{err}");
    let other: Device = Arc::new(RamBackend::new(8192));
    let err = Engine::open(
        &cfg,
        cache,
        vec![(CoreId(0), other)],
        EngineConfig::default(),
    )
    .err()
    .expect("refused");
    assert!(err.contains("not the same device"), "{err}");
    let _ = ReqError::NotRunning;
}

#[test]
fn a_swapped_core_of_the_same_size_is_refused() {
    use tiercache_engine::identity;
    let dir = std::env::temp_dir().join(format!("tiercache-ident-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.img"), dir.join("b.img"));
    for p in [&a, &b] {
        std::fs::write(p, vec![0u8; 4096 * 512]).unwrap();
    }
    let ia = identity::of_path(&a).unwrap();
    let ib = identity::of_path(&b).unwrap();
    assert_ne!(ia, ib, "two files are two devices");
    assert_eq!(ia, identity::of_path(&a).unwrap(), "stable");
    assert!(identity::of_path(&dir.join("missing")).is_err());

    let cache: Device = Arc::new(FaultBackend::new(
        RamBackend::new(16 << 11),
        FaultConfig::default(),
    ));
    let dev_a: Device = Arc::new(tiercache_io::FileBackend::open(&a).unwrap());
    let dev_b: Device = Arc::new(tiercache_io::FileBackend::open(&b).unwrap());
    let cfg = persistent(16 << 20, LineSize::K4, CacheMode::Wb, 11);
    let spec = |dev: &Device, id| CoreSpec {
        id: CoreId(0),
        dev: dev.clone(),
        record: CoreRecord {
            identity: id,
            export_name: "v".into(),
            device: String::new(),
        },
    };
    let e = Engine::create(
        cfg.clone(),
        cache.clone(),
        vec![spec(&dev_a, ia.clone())],
        EngineConfig::default(),
    )
    .unwrap();
    e.write(CoreId(0), 8, &[9u8; 4096], false).unwrap();
    e.stop().unwrap();
    let err = Engine::open_checked(
        &cfg,
        cache.clone(),
        vec![spec(&dev_b, ib)],
        EngineConfig::default(),
    )
    .err()
    .expect("a swapped core is refused");
    assert!(err.contains("not the same device"), "{err}");
    let (e, report) =
        Engine::open_checked(&cfg, cache, vec![spec(&dev_a, ia)], EngineConfig::default())
            .expect("the right core loads");
    assert_eq!(report.dirty_lines, 1);
    let mut buf = vec![0u8; 4096];
    e.read(CoreId(0), 8, &mut buf).unwrap();
    assert_eq!(buf, vec![9u8; 4096]);
    e.stop().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
