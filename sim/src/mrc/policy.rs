//! Miss-ratio curves from the product's own cache core: one [`Cache`] per size, fed the trace
//! request by request with every device IO completed at once (hits and misses do not depend
//! on device timing), the sizes spread over threads. Exact to tiercache's eviction,
//! promotion, sequential cutoff, mode and 512-byte valid/dirty state; the rate controller is
//! off (it delays writes, it does not change what hits).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tiercache_core::config::REQUEST_BLOCKS_MAX;
use tiercache_core::event::{Action, Event};
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::{
    CutoffParams, CutoffPolicy, EvictionPolicy, NhitParams, PromotionPolicy, RateParams,
};
use tiercache_core::units::{CoreId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::{Cache, Config};

use super::Point;
use crate::trace::{Op, Request};

/// The cache to simulate at each size.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Line size.
    pub line: LineSize,
    /// Cache mode.
    pub mode: CacheMode,
    /// Eviction.
    pub eviction: EvictionPolicy,
    /// Promotion.
    pub promotion: PromotionPolicy,
    /// `nhit` parameters.
    pub nhit: NhitParams,
    /// Sequential cutoff policy (threshold and count at Open CAS defaults).
    pub cutoff: CutoffPolicy,
}

/// Smallest cache the core accepts, lines.
pub const MIN_LINES: u64 = 16;

/// Runs every size (each at least [`MIN_LINES`]) on up to `threads` threads; the points come
/// back in the order of `lines`.
pub fn run(
    reqs: &[Request],
    policy: &Policy,
    lines: &[u64],
    threads: usize,
) -> Result<Vec<Point>, String> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<Result<Point, String>>>> = Mutex::new(vec![None; lines.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, lines.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&n) = lines.get(i) else { break };
                    let r = run_one(reqs, policy, n);
                    out.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                }
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a size was not run".into())))
        .collect()
}

/// One size.
pub fn run_one(reqs: &[Request], policy: &Policy, lines: u64) -> Result<Point, String> {
    if !(MIN_LINES..u32::MAX as u64 / 2).contains(&lines) {
        return Err(format!(
            "{lines} lines: the core runs caches of {MIN_LINES} to {} lines (use a larger line size for more)",
            u32::MAX / 2 - 1
        ));
    }
    let mut cfg = Config::new(lines as u32, policy.line);
    cfg.mode = policy.mode;
    cfg.eviction = policy.eviction;
    cfg.promotion = policy.promotion;
    cfg.nhit = policy.nhit;
    cfg.rate = RateParams {
        enabled: false,
        ..RateParams::default()
    };
    let mut cache = Cache::new(cfg)?;
    let core = CoreId(0);
    let end = reqs.iter().map(|r| r.end()).max().unwrap_or(0);
    let core_blocks = end.div_ceil(policy.line.bytes()) * policy.line.blocks() as u64;
    cache
        .add_core(core, core_blocks.max(policy.line.blocks() as u64))
        .map_err(|e| e.to_string())?;
    cache
        .set_cutoff(
            core,
            CutoffParams {
                policy: policy.cutoff,
                ..CutoffParams::default()
            },
        )
        .map_err(|e| e.to_string())?;
    let mut d = Driver {
        cache,
        actions: Vec::with_capacity(16),
        req: 0,
    };
    for (i, r) in reqs.iter().enumerate() {
        // Time from the trace; the index keeps it strictly increasing.
        let now = Nanos(
            r.time_us
                .saturating_mul(1000)
                .saturating_add(i as u64 % 1000),
        );
        if d.cache.next_deadline().is_some_and(|t| t <= now) {
            d.step(now, Event::Tick)?;
        }
        let mut lba = r.offset / 512;
        let mut left = r.len / 512;
        if r.op == Op::Flush {
            d.req += 1;
            d.step(
                now,
                Event::Flush {
                    req: ReqId(d.req),
                    core,
                },
            )?;
            continue;
        }
        while left > 0 {
            let blocks = left.min(REQUEST_BLOCKS_MAX);
            d.req += 1;
            let (req, l) = (ReqId(d.req), Lba(lba));
            let ev = match r.op {
                Op::Read => Event::Read {
                    req,
                    core,
                    lba: l,
                    blocks,
                },
                Op::Write => Event::Write {
                    req,
                    core,
                    lba: l,
                    blocks,
                    fua: false,
                },
                _ => Event::Trim {
                    req,
                    core,
                    lba: l,
                    blocks,
                },
            };
            d.step(now, ev)?;
            lba += blocks as u64;
            left -= blocks;
        }
    }
    let c = d.cache.core_counters(core).copied().unwrap_or_default();
    let k = d.cache.counters();
    Ok(Point {
        bytes: lines * policy.line.bytes(),
        lines,
        reads: c.read.total(),
        writes: c.write.total(),
        read_hits: c.read.full_hit,
        write_hits: c.write.full_hit,
        partial_hits: c.read.partial_hit + c.write.partial_hit,
        core_read_bytes: k.core_blocks_read * 512,
        core_write_bytes: k.core_blocks_written * 512,
        writeback_bytes: k.writeback_blocks * 512,
    })
}

struct Driver {
    cache: Cache,
    actions: Vec<Action>,
    req: u64,
}

impl Driver {
    /// Applies `ev` and completes every IO it leads to at once, ticking the core's timers
    /// while the request waits for one (at most 10,000 ticks: a core that never completes
    /// the request is an error, not a hang).
    fn step(&mut self, now: Nanos, ev: Event) -> Result<(), String> {
        let want = match ev {
            Event::Read { req, .. }
            | Event::Write { req, .. }
            | Event::Flush { req, .. }
            | Event::Trim { req, .. } => Some(req),
            _ => None,
        };
        let mut now = now;
        self.actions.clear();
        self.cache.apply(now, ev, &mut self.actions);
        let mut done = want.is_none();
        for _ in 0..10_000 {
            let mut i = 0;
            while i < self.actions.len() {
                match self.actions[i] {
                    Action::Read { io, .. }
                    | Action::Write { io, .. }
                    | Action::WriteZeroes { io, .. }
                    | Action::Trim { io, .. }
                    | Action::Flush { io, .. } => {
                        let ev = Event::IoDone { io, result: Ok(()) };
                        self.cache.apply(now, ev, &mut self.actions);
                    }
                    Action::Complete { req, .. } if Some(req) == want => done = true,
                    _ => {}
                }
                i += 1;
            }
            self.actions.clear();
            if done {
                return Ok(());
            }
            now = self
                .cache
                .next_deadline()
                .map_or(Nanos(now.0 + 1_000_000), |t| t.max(now));
            self.cache.apply(now, Event::Tick, &mut self.actions);
        }
        Err("the cache core did not complete a request after 10000 timer ticks".into())
    }
}
