//! The engine part of `bench core`: a 4 KiB read hit through the engine with a `ram:` cache at
//! QD1, including the copy into the caller's buffer (SPEC P6: <= 1.0 us), and hit throughput
//! from 1 to 4 queues (caller threads, one request in flight each).
//!
//! The QD1 hit is measured twice: with uniform keys over 90% of the cache (nearly every hit's
//! metadata and data come from DRAM: the worst case), and with Zipf(0.9) keys (the key
//! distribution of the core's own figures) whose ranks are scattered over the cache, so that
//! hot keys are not also neighbours.

use super::core::{Timings, scatter, summarize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_core::Config;
use tiercache_core::cache::CoreRecord;
use tiercache_core::units::{CoreId, LineSize};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_format::tables::CoreIdentity;
use tiercache_io::{AlignedBuf, RamBackend};
use tiercache_sim::rng::{Rng, Zipf};

/// What the engine measurement found.
pub struct EngineNumbers {
    /// Lines of the engine's cache.
    pub lines: u32,
    /// QD1 4 KiB read hit, p50 and p99 (ns), copy included.
    pub hit_p50: f64,
    pub hit_p99: f64,
    pub hit_mean: f64,
    /// The same with Zipf(0.9) keys, ranks scattered.
    pub zipf_p50: f64,
    pub zipf_p99: f64,
    pub zipf_mean: f64,
    /// (queues, IOPS) for 1..=4 queues of 4 KiB read hits.
    pub queues: Vec<(usize, f64)>,
}

/// Runs the measurement with a cache of `lines` 4 KiB lines and `ops` timed hits.
pub fn measure(lines: u32, ops: u64) -> Result<EngineNumbers, String> {
    let blocks = lines as u64 * 8;
    let cache: Device = Arc::new(RamBackend::new(blocks));
    let core: Device = Arc::new(RamBackend::new(blocks * 2));
    let mut cfg = Config::new(lines, LineSize::K4);
    cfg.volatile = true;
    cfg.pool_slots = 8;
    cfg.pool_slot_blocks = 256;
    let e = Engine::create(
        cfg,
        cache,
        vec![CoreSpec {
            id: CoreId(0),
            dev: core,
            record: CoreRecord {
                identity: CoreIdentity::Nbd { uri: "ram:".into() },
                export_name: "bench".into(),
                device: String::new(),
            },
        }],
        EngineConfig::threads(2),
    )?;
    // Warm: a working set of 90% of the cache, written through (wt keeps clean copies).
    let set = lines as u64 * 9 / 10;
    let mut buf = AlignedBuf::new(4096);
    for l in 0..set {
        buf[0] = l as u8;
        let (r, b) = e.write_owned(CoreId(0), l * 8, buf, false);
        r.map_err(|e| format!("warm-up write failed: {e:?}"))?;
        buf = b;
    }
    let mut rng = Rng::new(42);
    let zipf = Zipf::new(set, 0.9);
    let timed = |mut buf: AlignedBuf,
                 rng: &mut Rng,
                 key: &dyn Fn(&mut Rng) -> u64|
     -> Result<(Timings, AlignedBuf), String> {
        let mut v = Vec::with_capacity(ops as usize);
        for _ in 0..ops {
            let l = key(rng);
            let t = Instant::now();
            let (r, b) = e.read_owned(CoreId(0), l * 8, buf);
            v.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
            r.map_err(|e| format!("read failed: {e:?}"))?;
            buf = b;
        }
        Ok((summarize(v), buf))
    };
    let (uniform, buf) = timed(buf, &mut rng, &|rng| rng.below(set))?;
    let (skewed, _) = timed(buf, &mut rng, &|rng| scatter(zipf.sample(rng), set))?;
    let mut queues = Vec::new();
    for q in 1..=4usize {
        let dur = Duration::from_millis(400);
        let total: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..q)
                .map(|t| {
                    let e = &e;
                    s.spawn(move || {
                        let mut rng = Rng::new(7 + t as u64);
                        let mut buf = AlignedBuf::new(4096);
                        let mut n = 0u64;
                        let start = Instant::now();
                        while start.elapsed() < dur {
                            for _ in 0..64 {
                                let (r, b) = e.read_owned(CoreId(0), rng.below(set) * 8, buf);
                                buf = b;
                                if r.is_ok() {
                                    n += 1;
                                }
                            }
                        }
                        n
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        queues.push((q, total as f64 / dur.as_secs_f64()));
    }
    e.stop()?;
    Ok(EngineNumbers {
        lines,
        hit_p50: uniform.p50,
        hit_p99: uniform.p99,
        hit_mean: uniform.mean,
        zipf_p50: skewed.p50,
        zipf_p99: skewed.p99,
        zipf_mean: skewed.mean,
        queues,
    })
}
