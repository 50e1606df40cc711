//! Mode `wl` through the engine on real backends: requests from several threads, a clean stop
//! and reload, writeback to the core, `invalidate`, and power cuts (SPEC R2's in-process form
//! for the write log: caller threads write, trim, flush and verify reads; the engine is killed
//! at a random point and both devices lose or tear what no flush covered; after recovery
//! every block holds its newest flushed write or a later one, and once the log is written back
//! the core holds the same).
//!
//! `TIERCACHE_POWERCUT_ROUNDS=N` runs more rounds.

mod common;
use common::*;
use std::sync::Arc;
use tiercache_core::units::{CoreId, LineSize};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_io::{Backend, FaultBackend, FaultConfig, RamBackend};

fn base() -> tiercache_core::Config {
    let mut c = tiercache_core::Config::new(16, LineSize::K4);
    c.pool_slots = 8;
    c.pool_slot_blocks = 256;
    c
}

fn spec(dev: &Device) -> Vec<CoreSpec> {
    vec![CoreSpec {
        id: CoreId(0),
        dev: dev.clone(),
        record: record(0),
    }]
}

fn wait_clean(e: &Engine) {
    e.wait(|m| m.wl().expect("wl").is_clean());
}

#[test]
fn wl_serves_stops_reloads_and_writes_back() {
    let cache: Device = Arc::new(RamBackend::new(32 << 11));
    let core: Device = Arc::new(RamBackend::new(8192));
    let cfg = wl_config(32 << 20, 8 << 20, LineSize::K4, 3);
    let e = Engine::create_wl(cfg, cache.clone(), spec(&core), EngineConfig::threads(4))
        .expect("create");
    assert!(e.is_wl());
    let mut buf = vec![0u8; 8 * BS];
    for b in 0..64u64 {
        for i in 0..8 {
            fill(&mut buf[i * BS..(i + 1) * BS], b * 8 + i as u64, 1);
        }
        e.write(CoreId(0), b * 8, &buf, false).expect("write");
    }
    e.trim(CoreId(0), 8, 8).expect("trim");
    e.flush(CoreId(0)).expect("flush");
    let check = |e: &Engine, what: &str| {
        let mut r = vec![0u8; 512 * BS];
        e.read(CoreId(0), 0, &mut r).expect("read");
        for i in 0..512u64 {
            let want = if (8..16).contains(&i) { 0 } else { 1 };
            assert_eq!(
                decode(&r[i as usize * BS..(i as usize + 1) * BS], i),
                Some(want),
                "{what}: block {i}"
            );
        }
    };
    check(&e, "running");
    // A clean stop keeps the log; the reload serves it.
    e.stop().expect("stop");
    let (e, report) = Engine::open(
        &base(),
        cache.clone(),
        vec![(CoreId(0), core.clone())],
        EngineConfig::default(),
    )
    .expect("reload");
    assert!(report.clean, "stopped cleanly");
    assert!(e.is_wl());
    check(&e, "reloaded");
    // Writeback drains the log to the core.
    wait_clean(&e);
    let mut raw = vec![0u8; 512 * BS];
    core.read(0, &mut raw).expect("core read");
    for i in 0..512u64 {
        let want = if (8..16).contains(&i) { 0 } else { 1 };
        assert_eq!(
            decode(&raw[i as usize * BS..(i as usize + 1) * BS], i),
            Some(want),
            "core block {i}"
        );
    }
    // invalidate drops what is not written back, durably.
    e.with_machine(|m| m.wl_mut().unwrap().set_writeback_paused(true));
    for i in 0..8 {
        fill(&mut buf[i * BS..(i + 1) * BS], 100 + i as u64, 2);
    }
    e.write(CoreId(0), 100, &buf, false).expect("write");
    let dropped = e
        .with_machine(|m| m.wl_mut().unwrap().invalidate(CoreId(0)))
        .expect("invalidate");
    assert_eq!(dropped, 8);
    e.wait(|m| m.wl().unwrap().invalidate_done().0);
    e.with_machine(|m| m.wl_mut().unwrap().set_writeback_paused(false));
    let mut r = vec![0u8; 8 * BS];
    e.read(CoreId(0), 100, &mut r).expect("read");
    for i in 0..8 {
        assert_eq!(
            decode(&r[i * BS..(i + 1) * BS], 100 + i as u64),
            Some(1),
            "invalidated block {i} reads the core"
        );
    }
    wait_clean(&e);
    e.stop().expect("stop");
    // The core never received the invalidated data.
    core.read(100, &mut r).expect("core read");
    assert_eq!(decode(&r[..BS], 100), Some(1));
}

fn rounds() -> u64 {
    std::env::var("TIERCACHE_POWERCUT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

#[test]
fn wl_power_cut_loses_no_flushed_write() {
    const THREADS: u64 = 3;
    const REGION: u64 = 2048;
    let mut totals = (0u64, 0u64, 0u64);
    for round in 0..rounds() {
        let mut rng = Rng(0x007a_110c ^ ((round + 1) * 0x9e37_79b9));
        let track = FaultConfig::default();
        let cache = Arc::new(FaultBackend::new(RamBackend::new(16 << 11), track.clone()));
        // A core slower than the log (most rounds), so that the kill finds data not yet
        // written back.
        let mut slow = track.clone();
        if rng.below(4) != 0 {
            slow.delay[1] = std::time::Duration::from_micros(100 + rng.below(400));
        }
        let core = Arc::new(FaultBackend::new(RamBackend::new(THREADS * REGION), slow));
        // A small log (1 MiB) so that it wraps and writeback runs while clients write.
        let mut cfg = wl_config(16 << 20, 1 << 20, LineSize::K4, round as u8);
        cfg.gen_max_writes = 1 + rng.below(64) as u32;
        let e = Engine::create_wl(
            cfg,
            cache.clone(),
            spec(&(core.clone() as Device)),
            EngineConfig::threads(4),
        )
        .expect("create");
        let ops = 200 + rng.below(1200);
        let windows = run_writers(
            &e,
            THREADS,
            REGION,
            ops,
            &mut rng,
            &format!("round {round}"),
        );
        let dirty = e.with_machine(|m| m.wl().unwrap().dirty_blocks());
        e.kill();
        let (pattern, reverted) = power_cut_both(&mut rng, [&cache, &core]);
        totals.0 += 1;
        totals.1 += reverted;
        totals.2 += dirty;
        let (e, _) = Engine::open(
            &base(),
            cache.clone(),
            vec![(CoreId(0), core.clone() as Device)],
            EngineConfig::threads(4),
        )
        .unwrap_or_else(|err| panic!("round {round} ({pattern:?}): recovery failed: {err}"));
        let verify = |e: &Engine, what: &str| {
            check_windows(
                e,
                &windows,
                REGION,
                &format!("(wl) round {round} ({pattern:?}, {what})"),
            )
        };
        let first = verify(&e, "after recovery");
        // No flip-flop: once the log is written back, the same values, on the core too.
        wait_clean(&e);
        assert_eq!(
            first,
            verify(&e, "after writeback"),
            "round {round}: values changed after writeback"
        );
        let mut raw = vec![0u8; (THREADS * REGION) as usize * BS];
        core.read(0, &mut raw).expect("core read");
        for (i, v) in first.iter().enumerate() {
            assert_eq!(
                decode(&raw[i * BS..(i + 1) * BS], i as u64),
                Some(*v),
                "round {round}: core block {i}"
            );
        }
        e.stop().expect("stop");
    }
    println!(
        "wl power cut: {} rounds, {} unflushed blocks reverted, {} dirty log blocks at the kills",
        totals.0, totals.1, totals.2
    );
    assert!(
        totals.1 > 0 && totals.2 > 0,
        "coverage: nothing was reverted or dirty"
    );
}
