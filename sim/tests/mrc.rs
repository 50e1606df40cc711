//! Miss-ratio curves: the one-pass stack-distance LRU against an independent textbook LRU
//! (a list, simulated line by line), the SHARDS estimate against the exact curve, and the
//! core-driven curve against the stack method where they must agree.

use std::time::Instant;

use tiercache_core::mode::CacheMode;
use tiercache_core::policy::{CutoffPolicy, EvictionPolicy, NhitParams, PromotionPolicy};
use tiercache_core::units::LineSize;
use tiercache_sim::mrc::policy::{Policy, run};
use tiercache_sim::mrc::{Point, max_error, stack};
use tiercache_sim::rng::{Rng, Zipf};
use tiercache_sim::trace::{Op, Request};

/// Seeded synthetic trace: Zipf-hot 4 KiB slots, 30% writes, requests of 512 B to 20 KiB
/// at unaligned sector offsets (so they span one to six 4 KiB lines).
fn synthetic(n: usize, slots: u64, seed: u64) -> Vec<Request> {
    let mut rng = Rng::new(seed);
    let z = Zipf::new(slots, 0.8);
    (0..n)
        .map(|i| {
            let slot = (z.sample(&mut rng) * 2_654_435_761) % slots;
            Request {
                time_us: i as u64 * 10,
                offset: slot * 4096 + rng.below(8) * 512,
                len: (1 + rng.below(40) as u32) * 512,
                op: if rng.below(10) < 3 {
                    Op::Write
                } else {
                    Op::Read
                },
            }
        })
        .collect()
}

/// A textbook LRU of `cap` lines: most recent at the end of a list; a request is a full hit
/// when all its lines were present, a partial hit when some were. Returns read hits, write
/// hits, partial hits and bytes read from the core.
fn textbook_lru(reqs: &[Request], line: u64, cap: usize) -> (u64, u64, u64, u64) {
    let mut list: Vec<u64> = Vec::new();
    let (mut rh, mut wh, mut partial, mut core_read) = (0, 0, 0, 0);
    for r in reqs {
        let (first, last) = (r.offset / line, (r.end() - 1) / line);
        let mut hit = 0;
        for l in first..=last {
            if let Some(i) = list.iter().position(|&x| x == l) {
                list.remove(i);
                hit += 1;
            } else if r.op == Op::Read {
                core_read += r.end().min((l + 1) * line) - r.offset.max(l * line);
            }
            list.push(l);
            if list.len() > cap {
                list.remove(0);
            }
        }
        let n = last - first + 1;
        if hit == n {
            if r.op == Op::Read { rh += 1 } else { wh += 1 }
        } else if hit > 0 {
            partial += 1;
        }
    }
    (rh, wh, partial, core_read)
}

/// The requests cut down to the one whole 4 KiB line each starts in.
fn whole_lines(mut reqs: Vec<Request>) -> Vec<Request> {
    for r in &mut reqs {
        r.offset = r.offset / 4096 * 4096;
        r.len = 4096;
    }
    reqs
}

/// 4 KiB lines, write-through, promotion `always`, no cutoff: the policy the stack method models.
fn wt_policy(eviction: EvictionPolicy) -> Policy {
    Policy {
        line: LineSize::K4,
        mode: CacheMode::Wt,
        eviction,
        promotion: PromotionPolicy::Always,
        nhit: NhitParams::default(),
        cutoff: CutoffPolicy::Never,
    }
}

#[test]
fn stack_distances_equal_a_textbook_lru_at_every_size() {
    let reqs = synthetic(20_000, 3_000, 11);
    let p = stack::profile(&reqs, 4096, 1.0);
    for cap in [1usize, 16, 100, 333, 1000, 2500, 5000] {
        let pt = p.point(cap as u64);
        let (rh, wh, partial, core_read) = textbook_lru(&reqs, 4096, cap);
        assert_eq!(
            (
                pt.read_hits,
                pt.write_hits,
                pt.partial_hits,
                pt.core_read_bytes
            ),
            (rh, wh, partial, core_read),
            "{cap} lines"
        );
        assert_eq!(pt.reads + pt.writes, 20_000);
    }
    // 16 KiB lines too.
    let p = stack::profile(&reqs, 16384, 1.0);
    for cap in [8usize, 64, 400] {
        let pt = p.point(cap as u64);
        let (rh, wh, partial, _) = textbook_lru(&reqs, 16384, cap);
        assert_eq!(
            (pt.read_hits, pt.write_hits, pt.partial_hits),
            (rh, wh, partial)
        );
    }
}

#[test]
fn shards_is_within_two_points_of_exact_on_a_large_zipf_trace() {
    let n = 10_000_000usize;
    let mut rng = Rng::new(5);
    let z = Zipf::new(1_000_000, 0.9);
    let reqs: Vec<Request> = (0..n)
        .map(|i| Request {
            time_us: i as u64,
            offset: ((z.sample(&mut rng) * 2_654_435_761) % 1_000_000) * 4096,
            len: 4096,
            op: if i % 4 == 0 { Op::Write } else { Op::Read },
        })
        .collect();
    let t = Instant::now();
    let exact = stack::profile(&reqs, 4096, 1.0);
    let t_exact = t.elapsed();
    let t = Instant::now();
    let sampled = stack::profile(&reqs, 4096, 0.01);
    let t_shards = t.elapsed();
    let sizes: Vec<u64> = (0..=20)
        .map(|i| (1_000f64 * 1000f64.powf(i as f64 / 20.0)) as u64)
        .collect();
    let a: Vec<Point> = sizes.iter().map(|&c| exact.point(c)).collect();
    let b: Vec<Point> = sizes.iter().map(|&c| sampled.point(c)).collect();
    let err = max_error(&a, &b);
    println!(
        "10M accesses: exact {:.2} s, SHARDS 1% {:.2} s ({} sampled accesses), max |error| {err:.4}",
        t_exact.as_secs_f64(),
        t_shards.as_secs_f64(),
        sampled.accesses
    );
    assert!(err <= 0.02, "SHARDS max error {err}");
    assert!(
        a[0].miss_ratio() > a[20].miss_ratio() + 0.2,
        "the curve falls"
    );
}

#[test]
fn the_core_with_lru_on_a_mixed_read_write_trace_matches_the_stack_method() {
    // Whole 4 KiB lines (no partial-line state), 30% writes: a write hit refreshes recency in
    // the core's LRU as a read hit does, so the core must equal textbook LRU exactly, reads
    // and writes alike.
    let reqs = whole_lines(synthetic(6_000, 800, 3));
    assert!(reqs.iter().filter(|r| r.op == Op::Write).count() > 1_500);
    let policy = wt_policy(EvictionPolicy::Lru);
    let sizes = [16u64, 50, 200, 500];
    let core = run(&reqs, &policy, &sizes, 2).unwrap();
    let p = stack::profile(&reqs, 4096, 1.0);
    for (c, &n) in core.iter().zip(&sizes) {
        let s = p.point(n);
        assert_eq!(
            (c.read_hits, c.reads, c.write_hits, c.writes),
            (s.read_hits, s.reads, s.write_hits, s.writes),
            "{n} lines"
        );
        assert_eq!(c.core_read_bytes, s.core_read_bytes, "{n} lines");
    }
    assert!(run(&reqs, &policy, &[4], 1).unwrap_err().contains("16"));
}

#[test]
fn write_hits_count_like_read_hits_in_lru_and_s3fifo() {
    // Whole 4 KiB lines in write-through: a write is an access like a read for eviction, so
    // the core must hit exactly as often on the mixed trace as on the same trace read-only,
    // under either policy (S3-FIFO's frequency counters and LRU's order hear write hits).
    let mixed = whole_lines(synthetic(6_000, 800, 9));
    let reads: Vec<Request> = mixed
        .iter()
        .map(|r| Request { op: Op::Read, ..*r })
        .collect();
    for eviction in [EvictionPolicy::Lru, EvictionPolicy::S3Fifo] {
        let policy = wt_policy(eviction);
        let sizes = [16u64, 60, 200, 500];
        let a = run(&mixed, &policy, &sizes, 2).unwrap();
        let b = run(&reads, &policy, &sizes, 2).unwrap();
        for ((a, b), n) in a.iter().zip(&b).zip(sizes) {
            assert!(a.writes > 1_500);
            assert_eq!(
                a.read_hits + a.write_hits,
                b.read_hits,
                "{eviction:?}, {n} lines"
            );
        }
    }
}
