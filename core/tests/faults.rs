//! Device faults, scenario by scenario (SPEC R3, R4, C19; docs/SAFETY.md, "Faults"): what the
//! client sees, what the cache reports ([`Cache::health`], counters), and that the data stays
//! right. Every scenario runs on the model harness, so every read is also checked against the
//! oracle (no stale data), durability is checked after every event (no lost flushed write), and
//! the harness's health checks run after every event.
//!
//! A fault is an *outage*: one device fails every IO with one error kind until it is lifted.

mod harness;

use harness::workload::persistent;
use harness::{Content, Env, Knobs, Outage, ReqOp, Rng};
use tiercache_core::Config;
use tiercache_core::cache::{FaultParams, HealthState, Problem};
use tiercache_core::event::{Dev, IoError, ReqError};
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::CleaningPolicy;
use tiercache_core::units::{CoreId, LineSize, Nanos};

const NON_LAZY: [CacheMode; 4] = [CacheMode::Wt, CacheMode::Wa, CacheMode::Wi, CacheMode::Pt];
const LAZY: [CacheMode; 2] = [CacheMode::Wb, CacheMode::Wo];
const KINDS: [IoError; 3] = [IoError::Io, IoError::NoSpace, IoError::TimedOut];

/// A 64-line cache of 4 KiB lines with core 0 (1024 blocks), cleaning only on command.
fn env_with(mode: CacheMode, cores: u16, params: Option<FaultParams>, persist: bool) -> Env {
    let mut cfg = Config::new(64, LineSize::K4);
    cfg.mode = mode;
    cfg.cleaning = CleaningPolicy::Nop;
    cfg.rate.enabled = false;
    cfg.pool_slots = 4;
    if persist {
        cfg = persistent(cfg, &mut Rng::new(5));
    }
    let knobs = Knobs {
        p_io_error: 0.0,
        fault_params: params,
        ..Knobs::default()
    };
    let mut env = Env::new(cfg, 3, knobs);
    env.results = Some(Default::default());
    for c in 0..cores {
        env.add_core(c, 1024);
    }
    env
}

fn env(mode: CacheMode) -> Env {
    env_with(mode, 1, Some(harness::fast_fault_params()), false)
}

/// Runs one request to completion and returns its result.
fn run(env: &mut Env, op: ReqOp, core: u16, lba: u64, blocks: u32) -> Result<(), ReqError> {
    let id = env.submit(op, core, lba, blocks);
    env.drain();
    env.results.as_ref().expect("kept")[&id]
}

fn write(env: &mut Env, lba: u64, blocks: u32) -> Result<(), ReqError> {
    run(env, ReqOp::Write { fua: false }, 0, lba, blocks)
}

fn read(env: &mut Env, lba: u64, blocks: u32) -> Result<(), ReqError> {
    run(env, ReqOp::Read, 0, lba, blocks)
}

fn outage(env: &mut Env, dev: Dev, kind: IoError) {
    env.outage = Some(Outage {
        dev,
        until: Nanos(u64::MAX),
        kind,
    });
}

fn cache_failing(env: &Env) -> bool {
    env.cache
        .health()
        .problems
        .iter()
        .any(|p| matches!(p, Problem::CacheDevice { .. }))
}

fn writeback_alarm(env: &Env, core: u16) -> Option<Problem> {
    env.cache
        .health()
        .problems
        .into_iter()
        .find(|p| matches!(p, Problem::Writeback { core: c, .. } if c.0 == core))
}

/// Moves time on by `ms` and lets the cache act (probes, writeback retries).
fn wait(env: &mut Env, ms: u64) {
    env.now = env.now.plus(Nanos::from_ms(ms));
    env.tick();
    env.drain();
}

#[test]
fn core_read_errors_reach_the_client_with_their_kind() {
    for mode in CacheMode::ALL {
        for kind in KINDS {
            let mut e = env(mode);
            outage(&mut e, Dev::Core(CoreId(0)), kind);
            assert_eq!(
                read(&mut e, 100, 8),
                Err(ReqError::Io(kind)),
                "{mode}: a read miss during a core outage"
            );
            let h = e.cache.health();
            assert_eq!(h.state, HealthState::Degraded, "{mode}");
            assert!(
                matches!(h.problems[..], [Problem::CoreDevice { core: CoreId(0), last_error, .. }] if last_error == kind),
                "{mode}: {h:?}"
            );
            let f = e.cache.core_faults(CoreId(0)).expect("core").device;
            assert_eq!(f.reads, 1, "{mode}");
            match kind {
                IoError::Io => assert_eq!(f.io, 1),
                IoError::NoSpace => assert_eq!(f.no_space, 1),
                IoError::TimedOut => assert_eq!(f.timed_out, 1),
            }
            assert_eq!(e.cache.core_counters(CoreId(0)).unwrap().errors, 1);
            // The device works again: the next IO on it clears the state.
            e.outage = None;
            assert_eq!(read(&mut e, 100, 8), Ok(()));
            assert_eq!(e.cache.health().state, HealthState::Running, "{mode}");
        }
    }
}

#[test]
fn writes_that_reach_the_core_return_its_error() {
    // Non-lazy modes write the core; lazy modes do for pass-through requests (write-zeroes,
    // trims) and while the cache device fails.
    for mode in CacheMode::ALL {
        for kind in KINDS {
            let mut e = env(mode);
            assert_eq!(write(&mut e, 8, 8), Ok(()));
            outage(&mut e, Dev::Core(CoreId(0)), kind);
            let ops: &[ReqOp] = if mode.is_lazy() {
                &[ReqOp::WriteZeroes { fua: false }, ReqOp::Trim]
            } else {
                &[
                    ReqOp::Write { fua: false },
                    ReqOp::Write { fua: true },
                    ReqOp::WriteZeroes { fua: true },
                    ReqOp::Trim,
                ]
            };
            for &op in ops {
                let r = run(&mut e, op, 0, 8, 8);
                // A lazy cache's dirty blocks make write-zeroes wait for a core flush, which
                // fails too: the error is the core's either way.
                assert_eq!(r, Err(ReqError::Io(kind)), "{mode} {op:?}");
            }
            // Whatever the failed writes left, reads agree with each other (the harness pins
            // the value a read returns after a failed write and checks every later read).
            e.outage = None;
            for _ in 0..3 {
                assert_eq!(read(&mut e, 8, 8), Ok(()), "{mode}");
            }
            e.cache.check_invariants();
        }
    }
}

#[test]
fn failing_writeback_keeps_lines_dirty_backs_off_and_alarms() {
    for mode in LAZY {
        // The default timing: 50 ms doubling to 5 s.
        let mut e = env_with(mode, 1, None, false);
        assert_eq!(write(&mut e, 0, 64), Ok(()));
        let dirty_before: Vec<_> = (0..8).map(|cl| e.cache.line_state(CoreId(0), cl)).collect();
        assert_eq!(e.cache.dirty_lines(), 8);
        outage(&mut e, Dev::Core(CoreId(0)), IoError::TimedOut);
        e.cache.start_writeback();
        let t0 = e.now;
        e.tick();
        e.drain();
        let Some(Problem::Writeback {
            since,
            failures,
            last_error,
            next_retry,
            dirty_blocks,
            ..
        }) = writeback_alarm(&e, 0)
        else {
            panic!("{mode}: no writeback alarm: {:?}", e.cache.health());
        };
        assert!(since >= t0 && failures >= 1, "{mode}");
        assert_eq!(last_error, IoError::TimedOut);
        assert_eq!(dirty_blocks, 64);
        assert_eq!(e.cache.health().dirty_at_risk_blocks, 64);
        let first_since = since;
        // Retries back off: 50, 100, 200, ... ms, up to 5 s; the episode keeps its start.
        let mut gaps = Vec::new();
        let mut last = next_retry;
        let mut last_failures = failures;
        let mut last_retries = 0;
        for _ in 0..10 {
            e.now = last;
            e.tick();
            e.drain();
            let Some(Problem::Writeback {
                since,
                failures,
                retries,
                next_retry,
                ..
            }) = writeback_alarm(&e, 0)
            else {
                panic!("{mode}: the alarm went away while the core still fails");
            };
            assert_eq!(
                since, first_since,
                "{mode}: the episode keeps its first failure"
            );
            // Each round retries (every job started in the episode is a retry) and fails.
            assert!(
                failures > last_failures && retries > last_retries,
                "{mode}: failures {failures} (before {last_failures}), retries {retries}"
            );
            last_failures = failures;
            last_retries = retries;
            gaps.push((next_retry.0 - e.now.0) / 1_000_000);
            last = next_retry;
        }
        assert_eq!(
            gaps,
            [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000],
            "{mode}: backoff"
        );
        // Never marked clean.
        let dirty_after: Vec<_> = (0..8).map(|cl| e.cache.line_state(CoreId(0), cl)).collect();
        assert_eq!(
            dirty_before, dirty_after,
            "{mode}: the lines stay as they were"
        );
        let st = e.cache.writeback_status();
        assert_eq!(st.dirty_lines, 8);
        assert!(st.forced, "{mode}: the writeback command is still on");
        assert_eq!(st.failing.len(), 1);
        assert_eq!(st.failing[0].core, Some(CoreId(0)));
        assert_eq!(st.failing[0].dirty_lines, 8);
        // Reads of dirty data are still served from the cache.
        assert_eq!(read(&mut e, 0, 64), Ok(()));
        // The core comes back; an operator says so: writeback finishes, the alarm ends.
        e.outage = None;
        e.cache.retry_writeback_now();
        e.tick();
        e.drain();
        assert_eq!(e.cache.dirty_lines(), 0, "{mode}");
        assert!(writeback_alarm(&e, 0).is_none(), "{mode}");
        assert!(e.cache.writeback_status().failing.is_empty());
        assert_eq!(e.cache.health().state, HealthState::Running, "{mode}");
        for b in 0..64 {
            assert_eq!(e.core_content(0, b), e.newest(0, b), "{mode}: block {b}");
        }
    }
}

#[test]
fn a_failing_core_does_not_hold_back_writeback_to_the_others() {
    let mut e = env_with(CacheMode::Wb, 2, Some(harness::fast_fault_params()), false);
    assert_eq!(run(&mut e, ReqOp::Write { fua: false }, 0, 0, 32), Ok(()));
    assert_eq!(run(&mut e, ReqOp::Write { fua: false }, 1, 0, 32), Ok(()));
    assert_eq!(e.cache.dirty_lines(), 8);
    outage(&mut e, Dev::Core(CoreId(0)), IoError::Io);
    e.cache.start_writeback();
    for _ in 0..20 {
        wait(&mut e, 10);
    }
    assert_eq!(
        e.cache.core_dirty_lines(CoreId(1)),
        0,
        "core 1 was written back"
    );
    assert_eq!(
        e.cache.core_dirty_lines(CoreId(0)),
        4,
        "core 0 keeps its dirty lines"
    );
    let h = e.cache.health();
    assert!(writeback_alarm(&e, 0).is_some() && writeback_alarm(&e, 1).is_none());
    assert_eq!(h.dirty_at_risk_blocks, 32);
    assert_eq!(
        e.cache.core_health(CoreId(1)).expect("core").state,
        HealthState::Running
    );
    assert_eq!(
        e.cache
            .core_health(CoreId(0))
            .expect("core")
            .dirty_at_risk_blocks,
        32
    );
    e.outage = None;
    wait(&mut e, 100);
    assert_eq!(e.cache.dirty_lines(), 0);
    assert_eq!(e.cache.health().state, HealthState::Running);
}

#[test]
fn a_stop_tells_that_writeback_fails_and_can_stop_without_it() {
    let mut e = env_with(CacheMode::Wb, 1, None, true);
    assert_eq!(write(&mut e, 0, 48), Ok(()));
    outage(&mut e, Dev::Core(CoreId(0)), IoError::Io);
    // What a stop-cache that writes back first does: start writeback and watch its status.
    e.cache.start_writeback();
    for _ in 0..5 {
        wait(&mut e, 60);
    }
    let st = e.cache.writeback_status();
    assert_eq!(st.dirty_lines, 6);
    assert_eq!(st.failing.len(), 1, "{st:?}");
    assert_eq!(st.failing[0].last_error, IoError::Io);
    // Forced: stop without writeback. The dirty data stays on the cache device, persisted.
    let images = e.stop_images();
    let base = e.cache.config().clone();
    let mut rd = |off: u64, buf: &mut [u8]| -> Result<(), String> {
        buf.copy_from_slice(&images.cache[off as usize..off as usize + buf.len()]);
        Ok(())
    };
    let (loaded, report) = tiercache_core::cache::open(&base, &mut rd).expect("loads");
    assert!(report.clean);
    assert_eq!(loaded.dirty_lines(), 6, "the dirty data survives the stop");
}

#[test]
fn cache_read_errors_on_clean_data_are_read_from_the_core() {
    for mode in [CacheMode::Wt, CacheMode::Wa, CacheMode::Wb] {
        let mut e = env(mode);
        // Clean, cached data: written through (or written back) and read once.
        assert_eq!(write(&mut e, 0, 16), Ok(()));
        e.writeback_all();
        assert_eq!(read(&mut e, 0, 16), Ok(()));
        assert!(e.cache.line_state(CoreId(0), 0).is_some());
        outage(&mut e, Dev::Cache, IoError::Io);
        assert_eq!(read(&mut e, 0, 16), Ok(()), "{mode}: served from the core");
        let f = *e.cache.faults();
        assert_eq!(f.read_retries_from_core, 1, "{mode}");
        assert!(f.cache_device.reads >= 1 && f.cache_episodes == 1, "{mode}");
        assert!(cache_failing(&e), "{mode}");
        // In bypass: clean data comes from the core without touching the cache device.
        e.record = Some(Vec::new());
        assert_eq!(read(&mut e, 0, 16), Ok(()));
        let touched_cache = e.record.take().unwrap().iter().any(|a| {
            matches!(
                a,
                tiercache_core::Action::Read {
                    dev: Dev::Cache,
                    ..
                }
            )
        });
        assert!(
            !touched_cache,
            "{mode}: a bypassed read went to the cache device"
        );
        assert!(e.cache.faults().bypassed_requests >= 1);
    }
}

#[test]
fn dirty_data_the_cache_cannot_read_fails_the_read_and_is_at_risk() {
    for mode in LAZY {
        let mut e = env(mode);
        assert_eq!(write(&mut e, 0, 16), Ok(()));
        outage(&mut e, Dev::Cache, IoError::Io);
        assert_eq!(
            read(&mut e, 0, 16),
            Err(ReqError::Io(IoError::Io)),
            "{mode}"
        );
        assert_eq!(e.cache.faults().dirty_read_errors, 1);
        let h = e.cache.health();
        assert_eq!(h.dirty_at_risk_blocks, 16, "{mode}: {h:?}");
        assert_eq!(e.cache.dirty_lines(), 2, "{mode}: still dirty");
        // Reads of clean data elsewhere still work (from the core).
        assert_eq!(read(&mut e, 200, 8), Ok(()));
        // The device comes back: the data is served again and written back.
        e.outage = None;
        wait(&mut e, 200);
        assert_eq!(read(&mut e, 0, 16), Ok(()), "{mode}");
        e.writeback_all();
        assert_eq!(e.cache.health().state, HealthState::Running, "{mode}");
    }
}

#[test]
fn lazy_modes_stop_admitting_dirty_data_while_the_cache_device_fails() {
    for mode in LAZY {
        for kind in KINDS {
            let mut e = env(mode);
            outage(&mut e, Dev::Cache, kind);
            // The first write meets the error on the cache and goes to the core instead.
            assert_eq!(write(&mut e, 0, 8), Ok(()), "{mode} {kind:?}");
            assert_eq!(e.cache.faults().lazy_write_fallbacks, 1, "{mode}");
            // Later writes go straight to the core (bypass): no dirty data is admitted.
            for lba in [8, 16, 300] {
                assert_eq!(write(&mut e, lba, 8), Ok(()), "{mode}");
            }
            assert_eq!(e.cache.dirty_lines(), 0, "{mode}: no new dirty data");
            for b in [0, 8, 16, 300] {
                assert_eq!(e.core_content(0, b), e.newest(0, b), "{mode}: on the core");
            }
            assert!(cache_failing(&e), "{mode}");
            let Some(Problem::CacheDevice { last_error, .. }) =
                e.cache.health().problems.into_iter().next()
            else {
                panic!("{mode}: no cache device problem");
            };
            assert_eq!(last_error, kind);
            // The device comes back: the next probe ends bypass, writes are lazy again.
            e.outage = None;
            wait(&mut e, 200);
            assert!(!cache_failing(&e), "{mode}: still in bypass");
            assert!(e.cache.faults().probes_ok >= 1);
            assert_eq!(write(&mut e, 40, 8), Ok(()));
            assert_eq!(e.cache.dirty_lines(), 1, "{mode}: lazy again");
            assert_eq!(e.cache.health().state, HealthState::Running);
        }
    }
}

#[test]
fn a_lazy_write_over_dirty_data_falls_back_to_the_core_and_drops_the_dirty_copy() {
    for mode in LAZY {
        let mut e = env(mode);
        assert_eq!(write(&mut e, 0, 8), Ok(()));
        assert_eq!(e.cache.dirty_lines(), 1);
        outage(&mut e, Dev::Cache, IoError::NoSpace);
        assert_eq!(
            run(&mut e, ReqOp::Write { fua: true }, 0, 2, 4),
            Ok(()),
            "{mode}"
        );
        // The core holds the new blocks (durably: FUA); the cache no longer serves them.
        for b in 2..6 {
            assert_eq!(e.core_content(0, b), e.newest(0, b));
        }
        let (_, v, d) = e.cache.line_state(CoreId(0), 0).expect("mapped");
        assert_eq!(
            d & 0b111100,
            0,
            "{mode}: the overwritten blocks are not dirty"
        );
        assert_eq!(v & 0b111100, 0, "{mode}: nor cached");
        e.outage = None;
        wait(&mut e, 200);
        assert_eq!(read(&mut e, 0, 8), Ok(()));
    }
}

#[test]
fn non_lazy_modes_continue_in_pass_through() {
    for mode in NON_LAZY {
        let mut e = env(mode);
        assert_eq!(write(&mut e, 0, 8), Ok(()));
        assert_eq!(read(&mut e, 0, 8), Ok(()));
        assert_eq!(read(&mut e, 64, 16), Ok(()));
        outage(&mut e, Dev::Cache, IoError::Io);
        for lba in [0, 64, 128, 512] {
            assert_eq!(write(&mut e, lba, 8), Ok(()), "{mode}");
            assert_eq!(read(&mut e, lba, 8), Ok(()), "{mode}");
        }
        assert_eq!(read(&mut e, 66, 12), Ok(()), "{mode}");
        let h = e.cache.health();
        assert_eq!(h.dirty_at_risk_blocks, 0);
        if mode == CacheMode::Pt {
            // Nothing touches the cache device in pt: nothing to report.
            assert_eq!(h.state, HealthState::Running);
        } else {
            assert_eq!(h.state, HealthState::Degraded, "{mode}");
            let f = *e.cache.faults();
            assert!(f.cache_device.total() >= 1, "{mode}: {f:?}");
            assert!(f.bypassed_requests >= 1, "{mode}");
        }
        e.outage = None;
        wait(&mut e, 200);
        assert_eq!(e.cache.health().state, HealthState::Running, "{mode}");
        assert_eq!(read(&mut e, 0, 8), Ok(()));
    }
}

#[test]
fn a_failed_cache_write_leaves_no_empty_mapped_line() {
    // Write-through misses map new lines; the cache write fails, the core write succeeds: the
    // new lines must not stay mapped without a valid block (they used to).
    for mode in [CacheMode::Wt] {
        let mut e = env(mode);
        let occupancy = e.cache.occupancy();
        outage(&mut e, Dev::Cache, IoError::Io);
        assert_eq!(write(&mut e, 80, 24), Ok(()), "{mode}");
        assert_eq!(
            e.cache.faults().write_through_cache_failed,
            1,
            "{mode}: written through, cache write failed"
        );
        for cl in 10..13 {
            assert_eq!(e.cache.line_state(CoreId(0), cl), None, "{mode}: line {cl}");
        }
        assert_eq!(e.cache.occupancy(), occupancy);
        e.cache.check_invariants();
        for b in 80..104 {
            assert_eq!(e.core_content(0, b), e.newest(0, b));
        }
    }
}

#[test]
fn a_failing_cache_device_is_probed_with_backoff_until_it_works() {
    let mut e = env_with(CacheMode::Wt, 1, None, false);
    outage(&mut e, Dev::Cache, IoError::TimedOut);
    assert_eq!(write(&mut e, 0, 8), Ok(()));
    assert!(cache_failing(&e));
    let mut probes = Vec::new();
    for _ in 0..7 {
        let Some(Problem::CacheDevice { next_probe, .. }) =
            e.cache.health().problems.into_iter().next()
        else {
            panic!("not failing");
        };
        probes.push((next_probe.0 - e.now.0) / 1_000_000);
        e.now = next_probe;
        e.tick();
        e.drain();
    }
    // 1 s, then doubling up to 30 s (each gap measured from the failed probe).
    assert_eq!(probes, [1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    assert_eq!(e.cache.faults().probes, 7);
    e.outage = None;
    wait(&mut e, 30_000);
    assert_eq!(e.cache.health().state, HealthState::Running);
    assert_eq!(e.cache.faults().probes_ok, 1);
    // A new error soon after keeps the long backoff (a device that fails writes but passes a
    // flush probe does not flap every second).
    outage(&mut e, Dev::Cache, IoError::NoSpace);
    assert_eq!(write(&mut e, 0, 8), Ok(()));
    let Some(Problem::CacheDevice { next_probe, .. }) =
        e.cache.health().problems.into_iter().next()
    else {
        panic!("not failing");
    };
    assert_eq!(next_probe.0 - e.now.0, 30_000_000_000);
}

#[test]
fn persistent_lazy_cache_with_a_failing_cache_device_keeps_flushed_data() {
    // The journal lives on the failing device too: writes that must change dirty metadata
    // fail (the change cannot be made durable), everything else goes to the core; nothing
    // flushed is lost (the harness checks durability after every event).
    for mode in LAZY {
        let mut e = env_with(mode, 1, Some(harness::fast_fault_params()), true);
        assert_eq!(write(&mut e, 0, 16), Ok(()));
        assert_eq!(run(&mut e, ReqOp::Flush, 0, 0, 0), Ok(()));
        outage(&mut e, Dev::Cache, IoError::Io);
        assert_eq!(
            write(&mut e, 64, 8),
            Ok(()),
            "{mode}: a clean range goes to the core"
        );
        let r = write(&mut e, 0, 4);
        assert!(
            r.is_ok() || r == Err(ReqError::Io(IoError::Io)),
            "{mode}: over dirty data: {r:?}"
        );
        let f = run(&mut e, ReqOp::Flush, 0, 0, 0);
        assert!(f.is_ok() || f == Err(ReqError::Io(IoError::Io)), "{mode}");
        e.outage = None;
        wait(&mut e, 500);
        assert_eq!(run(&mut e, ReqOp::Flush, 0, 0, 0), Ok(()));
        e.verify_all();
        let legal = e.crash_legal_all();
        let images = e.stop_images();
        let base = e.cache.config().clone();
        let mut rd = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            buf.copy_from_slice(&images.cache[off as usize..off as usize + buf.len()]);
            Ok(())
        };
        let (loaded, _) = tiercache_core::cache::open(&base, &mut rd).expect("loads");
        let values = Env::loaded_values(Some(&loaded), &images);
        for (b, v) in values[&0].iter().enumerate() {
            assert!(
                legal[&0][b].contains(v),
                "{mode}: block {b} loads as {v:?}, legal {:?}",
                legal[&0][b]
            );
            if (64..72).contains(&b) {
                assert_ne!(*v, Content::Zero, "{mode}: block {b} was written");
            }
        }
    }
}
