//! Policies are measured, and the measurement asserted: on a Zipf + sequential-scan read trace
//! the scan-resistant policy (S3-FIFO) keeps a hit ratio at least 5 points above LRU's.
//!
//! The trace: a cache of 4096 lines (4 KiB); half the requests are Zipf(0.9)-distributed over a
//! hot set of 8192 lines, the other half walk one-pass sequential scans, each twice the size of
//! the cache, over fresh core space (backups, `dd`, a database table scan). Sequential cutoff is
//! off so the scans reach the eviction policy (with cutoff on, they would be passed through and
//! both policies would look alike). The run is deterministic: the hit ratios are exact numbers.

use tiercache_core::event::{Action, Event};
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::{CutoffParams, CutoffPolicy, EvictionPolicy};
use tiercache_core::units::{CoreId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::{Cache, Config};
use tiercache_testkit::rng::XorShift as Rng;

const LINES: u32 = 4096;
const HOT: u64 = 8192;
const SCAN_LEN: u64 = 2 * LINES as u64;
const REQUESTS: u64 = 400_000;

/// Zipf(s) over `0..n` by inverse CDF.
struct Zipf {
    cdf: Vec<f64>,
}
impl Zipf {
    fn new(n: u64, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut acc = 0.0;
        for k in 1..=n {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }
    fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u) as u64
    }
}

/// Runs the trace; returns the read hit ratio in percent (full hits / reads).
fn hit_ratio(policy: EvictionPolicy) -> f64 {
    let mut cfg = Config::new(LINES, LineSize::K4);
    cfg.mode = CacheMode::Wt;
    cfg.eviction = policy;
    let mut cache = Cache::new(cfg).unwrap();
    // A measurement, not a correctness test: full invariant checks (strict-asserts) now and then.
    cache.set_invariant_check_every(10_000);
    let core_lines = HOT + SCAN_LEN * 64;
    cache.add_core(CoreId(0), core_lines * 8).unwrap();
    cache
        .set_cutoff(
            CoreId(0),
            CutoffParams {
                policy: CutoffPolicy::Never,
                ..CutoffParams::default()
            },
        )
        .unwrap();
    let zipf = Zipf::new(HOT, 0.9);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    // Hot keys are scattered over the hot region (so rank does not imply adjacency).
    let scatter = |k: u64| (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 13) % HOT;
    let mut scan_pos = HOT;
    let mut now = Nanos(1);
    let mut actions = Vec::new();
    let mut done = Vec::new();
    for i in 0..REQUESTS {
        let line = if rng.next().is_multiple_of(2) {
            scatter(zipf.sample(&mut rng))
        } else {
            let l = scan_pos;
            scan_pos += 1;
            if scan_pos >= core_lines {
                scan_pos = HOT;
            }
            l
        };
        now = now.plus(Nanos(1000));
        cache.apply(
            now,
            Event::Read {
                req: ReqId(i),
                core: CoreId(0),
                lba: Lba(line * 8),
                blocks: 8,
            },
            &mut actions,
        );
        // Complete every IO at once, in order, until the request is answered.
        while !actions.is_empty() {
            done.clear();
            for a in actions.drain(..) {
                match a {
                    Action::Read { io, .. }
                    | Action::Write { io, .. }
                    | Action::Flush { io, .. } => done.push(io),
                    Action::Complete { result, .. } => result.expect("no IO fails here"),
                    other => panic!("unexpected action {other:?}"),
                }
            }
            for &io in &done {
                cache.apply(now, Event::IoDone { io, result: Ok(()) }, &mut actions);
            }
        }
    }
    let c = cache.core_counters(CoreId(0)).unwrap().read;
    assert_eq!(c.total(), REQUESTS);
    c.full_hit as f64 * 100.0 / REQUESTS as f64
}

#[test]
fn s3fifo_beats_lru_by_5_points_on_zipf_plus_scan() {
    let lru = hit_ratio(EvictionPolicy::Lru);
    let s3 = hit_ratio(EvictionPolicy::S3Fifo);
    println!(
        "hit ratio on Zipf(0.9) + scans: lru {lru:.2}%  s3fifo {s3:.2}%  (+{:.2} points)",
        s3 - lru
    );
    // Half the trace is scans, which can never hit: 50% is the ceiling.
    assert!(s3 <= 50.0 && lru <= 50.0);
    assert!(
        s3 >= lru + 5.0,
        "s3fifo {s3:.2}% is not 5 points above lru {lru:.2}%"
    );
}
