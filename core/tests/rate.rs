//! The writeback-rate controller, measured in a model run against a slow simulated core: under a
//! client write rate above what the core can absorb, the dirty ratio stays within ±5 points of
//! its target and client throughput does not collapse (no cliff when dirty would be full).
//!
//! The driver here is a minimal discrete-event loop: every device IO completes after a fixed
//! service time, with a bounded number in service at once per device (the simulator of issue 3
//! replaces these toy models with HDD/NVMe ones). No data is moved: this test measures time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use tiercache_core::event::{Action, Dev, Event};
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::{AlruParams, CleaningPolicy, RateParams};
use tiercache_core::units::{CoreId, IoId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::{Cache, Config};

struct Dev_ {
    service: Nanos,
    parallel: usize,
    busy: usize,
    queue: std::collections::VecDeque<IoId>,
}

struct Sim {
    cache: Cache,
    now: Nanos,
    /// (completion time, seq, io)
    events: BinaryHeap<Reverse<(u64, u64, u64)>>,
    seq: u64,
    cache_dev: Dev_,
    core_dev: Dev_,
    dev_of: std::collections::HashMap<u64, bool>,
    completed_writes: u64,
    in_flight: usize,
}

impl Sim {
    fn start(&mut self, io: IoId, core: bool) {
        let d = if core {
            &mut self.core_dev
        } else {
            &mut self.cache_dev
        };
        if d.busy < d.parallel {
            d.busy += 1;
            let t = self.now.0 + d.service.0;
            self.seq += 1;
            self.events.push(Reverse((t, self.seq, io.0)));
        } else {
            d.queue.push_back(io);
        }
        self.dev_of.insert(io.0, core);
    }

    fn run_actions(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Read { io, dev, .. }
                | Action::Write { io, dev, .. }
                | Action::WriteZeroes { io, dev, .. }
                | Action::Trim { io, dev, .. }
                | Action::Flush { io, dev } => self.start(io, dev != Dev::Cache),
                Action::Complete { .. } => {
                    self.completed_writes += 1;
                    self.in_flight -= 1;
                }
                Action::Copy { .. } => {}
            }
        }
    }

    fn apply(&mut self, ev: Event) {
        let mut actions = Vec::new();
        self.cache.apply(self.now, ev, &mut actions);
        self.run_actions(actions);
    }
}

/// Runs `secs` simulated seconds of 4 KiB random writes at queue depth `qd` over a working set
/// of 4× the cache; returns (dirty ratio, client writes) per second.
fn run(rate: RateParams, secs: u64, qd: usize) -> Vec<(f64, u64)> {
    let lines = 4096u32;
    let mut cfg = Config::new(lines, LineSize::K4);
    cfg.mode = CacheMode::Wb;
    cfg.cleaning = CleaningPolicy::Alru;
    cfg.alru = AlruParams {
        activity_threshold_ms: 1000,
        ..AlruParams::default()
    };
    cfg.rate = rate;
    cfg.pool_slots = 32;
    let mut cache = Cache::new(cfg).unwrap();
    cache.set_invariant_check_every(64);
    let ws_lines = lines as u64 * 4;
    cache.add_core(CoreId(0), ws_lines * 8).unwrap();
    let mut sim = Sim {
        cache,
        now: Nanos(1),
        events: BinaryHeap::new(),
        seq: 0,
        // NVMe-ish cache: 20 µs, 16 at once. Slow core: 4 ms per IO, 4 at once (~1000 IOPS).
        cache_dev: Dev_ {
            service: Nanos(20_000),
            parallel: 16,
            busy: 0,
            queue: Default::default(),
        },
        core_dev: Dev_ {
            service: Nanos(4_000_000),
            parallel: 4,
            busy: 0,
            queue: Default::default(),
        },
        dev_of: Default::default(),
        completed_writes: 0,
        in_flight: 0,
    };
    let mut rng = 0x1234_5678u64;
    let mut req = 0u64;
    let mut out = Vec::new();
    let mut next_sample = Nanos::SECOND.0;
    let mut last_writes = 0;
    let end = secs * Nanos::SECOND.0;
    while sim.now.0 < end {
        // Keep the client queue full.
        while sim.in_flight < qd {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let line = rng % ws_lines;
            req += 1;
            sim.in_flight += 1;
            sim.apply(Event::Write {
                req: ReqId(req),
                core: CoreId(0),
                lba: Lba(line * 8),
                blocks: 8,
                fua: false,
            });
        }
        // Next event: an IO completion or the cache's deadline or the next sample.
        let t_io = sim
            .events
            .peek()
            .map(|Reverse((t, _, _))| *t)
            .unwrap_or(u64::MAX);
        let t_dl = sim.cache.next_deadline().map(|n| n.0).unwrap_or(u64::MAX);
        let t = t_io.min(t_dl).min(next_sample).max(sim.now.0);
        sim.now = Nanos(t);
        if t == next_sample {
            let dirty = sim.cache.dirty_lines() as f64 / lines as f64;
            out.push((dirty, sim.completed_writes - last_writes));
            last_writes = sim.completed_writes;
            next_sample += Nanos::SECOND.0;
            sim.apply(Event::Tick);
            continue;
        }
        if t == t_io {
            let Reverse((_, _, io)) = sim.events.pop().unwrap();
            let core = sim.dev_of.remove(&io).unwrap();
            let d = if core {
                &mut sim.core_dev
            } else {
                &mut sim.cache_dev
            };
            d.busy -= 1;
            if let Some(next) = d.queue.pop_front() {
                d.busy += 1;
                let t2 = sim.now.0 + d.service.0;
                sim.seq += 1;
                sim.events.push(Reverse((t2, sim.seq, next.0)));
                sim.dev_of.insert(next.0, core);
            }
            sim.apply(Event::IoDone {
                io: IoId(io),
                result: Ok(()),
            });
        } else {
            sim.apply(Event::Tick);
        }
    }
    out
}

#[test]
fn rate_controller_holds_dirty_ratio_at_target() {
    let target = 50;
    let series = run(
        RateParams {
            enabled: true,
            dirty_target_pct: target,
            throttle_max_ms: 50,
        },
        60,
        32,
    );
    println!("second  dirty%  writes/s");
    for (i, (d, w)) in series.iter().enumerate() {
        println!("{:>6} {:>7.1} {:>9}", i + 1, d * 100.0, w);
    }
    // After warm-up (the cache starts empty), every sample within ±5 points of the target.
    let settled = &series[20..];
    for (i, (d, _)) in settled.iter().enumerate() {
        let pct = d * 100.0;
        assert!(
            (pct - target as f64).abs() <= 5.0,
            "second {}: dirty {pct:.1}% is more than 5 points from the target {target}%",
            i + 21
        );
    }
    // No cliff: no second's client throughput below half the median.
    let mut w: Vec<u64> = settled.iter().map(|x| x.1).collect();
    w.sort_unstable();
    let median = w[w.len() / 2];
    assert!(median > 0);
    for (i, (_, x)) in settled.iter().enumerate() {
        assert!(
            *x * 2 >= median,
            "second {}: {x} writes/s, below half the median {median}",
            i + 21
        );
    }
}

/// The measurement can fail: without the controller, the same load drives the dirty share far
/// from the target (ALRU alone never cleans a busy cache, so dirty data piles up until every
/// write waits for on-demand cleaning).
#[test]
fn without_the_controller_the_dirty_ratio_runs_away() {
    let series = run(
        RateParams {
            enabled: false,
            dirty_target_pct: 50,
            throttle_max_ms: 50,
        },
        30,
        32,
    );
    println!("second  dirty%  writes/s  (controller off)");
    for (i, (d, w)) in series.iter().enumerate() {
        println!("{:>6} {:>7.1} {:>9}", i + 1, d * 100.0, w);
    }
    let worst = series[20..]
        .iter()
        .map(|(d, _)| (d * 100.0 - 50.0).abs())
        .fold(0.0, f64::max);
    assert!(
        worst > 5.0,
        "dirty stayed within 5 points of 50% with the controller off"
    );
}
