//! Device faults in the simulator (docs/SAFETY.md, "Faults"): the real cache core on modelled
//! devices, with a window in which one device fails every IO or becomes very slow. Each run
//! checks what clients saw and the health the cache reported at every sample.

use tiercache_core::Config;
use tiercache_core::cache::HealthState;
use tiercache_core::event::IoError;
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::CleaningPolicy;
use tiercache_core::units::{CoreId, LineSize, Nanos};
use tiercache_sim::device;
use tiercache_sim::engine::{
    CacheSetup, DeviceFault, Direct, FaultKind, Load, Region, RunResult, ServerModel, Sim, Target,
    Window,
};
use tiercache_sim::workload::{Distribution, Generator, Pattern, WorkloadSpec};

const CORE_BLOCKS: u64 = 8 << 21; // 8 GiB
const WS_BLOCKS: u64 = 64 << 11; // 64 MiB
const LINES: u32 = 32768; // 128 MiB of 4 KiB lines

/// An NVMe cache (device 1) in front of a 10k RPM HDD (device 0), one volume.
fn sim(mode: CacheMode, faults: &[DeviceFault]) -> Sim {
    let core = device::preset("hdd-10k-sas").unwrap().build(CORE_BLOCKS);
    let cache_blocks = LINES as u64 * 8;
    let nvme = device::preset("nvme-p4510").unwrap().build(1 << 21);
    let mut cfg = Config::new(LINES, LineSize::K4);
    cfg.mode = mode;
    cfg.cleaning = CleaningPolicy::Acp;
    let mut cache = tiercache_core::Cache::new(cfg).unwrap();
    cache.set_invariant_check_every(4096);
    cache.add_core(CoreId(0), CORE_BLOCKS).unwrap();
    let target = Target::cached(
        "volume".into(),
        ServerModel::NONE,
        Region {
            dev: 0,
            offset: 0,
            blocks: CORE_BLOCKS,
        },
        CacheSetup {
            cache,
            region: Region {
                dev: 1,
                offset: 0,
                blocks: cache_blocks,
            },
        },
    );
    let mut s = Sim::new(
        vec![core, nvme],
        vec![target],
        Box::new(Direct { blocks: WS_BLOCKS }),
    );
    for &f in faults {
        s.add_fault(f);
    }
    s
}

fn run(s: &mut Sim, read_pct: u32, seconds: u64) -> RunResult {
    let spec = WorkloadSpec {
        name: "4k".into(),
        pattern: Pattern::Random,
        read_pct,
        block_kib: 4,
        qd: 8,
        jobs: 1,
        distribution: Distribution::Uniform,
        duration_s: seconds as f64,
        cold: false,
    };
    let mut g = Generator::new(&spec, WS_BLOCKS, 7);
    s.run(
        Load::Closed {
            source: &mut g,
            jobs: 1,
            qd: 8,
        },
        Window {
            warmup: Nanos(0),
            duration: Nanos::from_secs(seconds),
            sample: Nanos::from_ms(250),
        },
    )
}

fn print(r: &RunResult) {
    for (s, h) in r.series.iter().zip(&r.health) {
        println!(
            "{:>5.2}s {:>7.0} IOPS p99 {:>8.0} us dirty {:>5.1}% degraded {} at risk {}",
            s.t_s, s.iops, s.lat_p99_us, s.dirty_pct, h.degraded, h.dirty_at_risk_blocks
        );
    }
    println!("{:?}, client errors {}", r.faults, r.errors);
}

fn health(s: &Sim) -> HealthState {
    s.targets[0].cache.as_ref().unwrap().cache.health().state
}

#[test]
fn core_outage_in_write_back_alarms_keeps_data_dirty_and_recovers() {
    // The HDD fails every IO from 1 s to 3 s of a 6 s random-write run.
    let f = DeviceFault {
        dev: 0,
        from: Nanos::SECOND,
        until: Nanos::from_secs(3),
        kind: FaultKind::Fail(IoError::Io),
    };
    let mut s = sim(CacheMode::Wb, &[f]);
    let r = run(&mut s, 0, 6);
    print(&r);
    assert_eq!(r.errors, 0, "lazy writes do not need the core");
    assert!(r.faults.io_errors > 0, "writeback met the outage");
    let during: Vec<_> = r
        .health
        .iter()
        .filter(|h| (1500..=3000).contains(&h.t_s_ms))
        .collect();
    assert!(
        during
            .iter()
            .all(|h| h.degraded == 1 && h.dirty_at_risk_blocks > 0),
        "the writeback alarm is on during the outage"
    );
    let after = r.health.iter().filter(|h| h.t_s_ms >= 5000);
    for h in after {
        assert_eq!(
            (h.degraded, h.dirty_at_risk_blocks),
            (0, 0),
            "t={}",
            h.t_s_ms
        );
    }
    assert_eq!(health(&s), HealthState::Running);
    let c = &s.targets[0].cache.as_ref().unwrap().cache;
    let w = c.core_faults(CoreId(0)).unwrap().writeback;
    assert!(w.failures > 0 && w.retries > 0 && w.episodes >= 1, "{w:?}");
}

#[test]
fn cache_device_outage_in_write_through_is_invisible_to_clients() {
    // Warm the working set, then the NVMe fails every IO from 1 s to 2 s of a 70/30 run.
    let f = DeviceFault {
        dev: 1,
        from: Nanos::from_secs(1),
        until: Nanos::from_secs(2),
        kind: FaultKind::Fail(IoError::TimedOut),
    };
    let mut s = sim(CacheMode::Wt, &[f]);
    let r = run(&mut s, 70, 6);
    print(&r);
    assert_eq!(r.errors, 0, "clean data is served from the core");
    assert!(r.faults.io_errors > 0);
    assert!(
        r.health
            .iter()
            .any(|h| h.degraded == 1 && (1000..=2250).contains(&h.t_s_ms)),
        "degraded while the cache device fails"
    );
    assert!(
        r.health
            .iter()
            .filter(|h| h.t_s_ms >= 5000)
            .all(|h| h.degraded == 0),
        "running again after a probe"
    );
    let c = &s.targets[0].cache.as_ref().unwrap().cache;
    let f = c.faults();
    assert!(f.probes_ok >= 1 && f.cache_episodes >= 1, "{f:?}");
}

#[test]
fn a_very_slow_core_slows_write_through_without_errors() {
    let f = DeviceFault {
        dev: 0,
        from: Nanos::from_secs(1),
        until: Nanos::from_secs(2),
        kind: FaultKind::Slow(Nanos::from_ms(300)),
    };
    let mut s = sim(CacheMode::Wt, &[f]);
    let r = run(&mut s, 0, 4);
    print(&r);
    assert_eq!(r.errors, 0);
    assert!(r.faults.ios_delayed > 0);
    let slow = r
        .series
        .iter()
        .filter(|x| x.t_s > 1.2 && x.t_s <= 2.0)
        .map(|x| x.lat_p99_us)
        .fold(0.0, f64::max);
    assert!(slow >= 300_000.0, "p99 {slow} us while the core stalls");
    assert_eq!(health(&s), HealthState::Running, "slow is not an error");
}
