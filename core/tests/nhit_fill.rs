//! `nhit` promotion through the whole core (issue 30): with the default parameters (threshold
//! 3, trigger 80%) a cache as large as the trace's footprint fills, because a miss that fits in
//! a free line evicts nothing and is admitted (the one deviation from Open CAS's rule,
//! `policy/promotion/nhit.rs`); once the cache is full, a line seen once is not admitted, and a
//! line missed three times is.

use tiercache_core::event::{Action, Event};
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::{CutoffParams, CutoffPolicy, NhitParams, PromotionPolicy};
use tiercache_core::units::{CoreId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::{Cache, Config};

const LINES: u32 = 2048;
const CORE: CoreId = CoreId(0);

struct Run {
    cache: Cache,
    now: Nanos,
    req: u64,
    actions: Vec<Action>,
}

impl Run {
    fn new(promotion: PromotionPolicy) -> Run {
        let mut cfg = Config::new(LINES, LineSize::K4);
        cfg.mode = CacheMode::Wt;
        cfg.promotion = promotion;
        cfg.nhit = NhitParams::default();
        let mut cache = Cache::new(cfg).unwrap();
        cache.set_invariant_check_every(1000);
        cache.add_core(CORE, 4 * LINES as u64 * 8).unwrap();
        cache
            .set_cutoff(
                CORE,
                CutoffParams {
                    policy: CutoffPolicy::Never,
                    ..CutoffParams::default()
                },
            )
            .unwrap();
        Run {
            cache,
            now: Nanos(1),
            req: 0,
            actions: Vec::new(),
        }
    }

    /// One whole-line read or write of core line `line`, every IO completed at once.
    fn access(&mut self, line: u64, write: bool) {
        self.req += 1;
        self.now = self.now.plus(Nanos(1000));
        let (req, lba) = (ReqId(self.req), Lba(line * 8));
        let ev = if write {
            Event::Write {
                req,
                core: CORE,
                lba,
                blocks: 8,
                fua: false,
            }
        } else {
            Event::Read {
                req,
                core: CORE,
                lba,
                blocks: 8,
            }
        };
        self.cache.apply(self.now, ev, &mut self.actions);
        let mut done = Vec::new();
        while !self.actions.is_empty() {
            done.clear();
            for a in self.actions.drain(..) {
                match a {
                    Action::Read { io, .. }
                    | Action::Write { io, .. }
                    | Action::Flush { io, .. } => done.push(io),
                    Action::Complete { result, .. } => result.expect("no IO fails here"),
                    _ => {}
                }
            }
            for &io in &done {
                self.cache.apply(
                    self.now,
                    Event::IoDone { io, result: Ok(()) },
                    &mut self.actions,
                );
            }
        }
    }

    /// Full hits (reads and writes) so far.
    fn hits(&self) -> u64 {
        let c = self.cache.core_counters(CORE).unwrap();
        c.read.full_hit + c.write.full_hit
    }
}

/// The footprint's lines in a scattered order, each once, a third of them written.
fn one_pass() -> impl Iterator<Item = (u64, bool)> {
    (0..LINES as u64).map(|i| ((i * 1021) % LINES as u64, i % 3 == 0))
}

#[test]
fn nhit_fills_a_cache_as_large_as_the_footprint() {
    let mut nhit = Run::new(PromotionPolicy::Nhit);
    let mut always = Run::new(PromotionPolicy::Always);
    for (line, write) in one_pass() {
        nhit.access(line, write);
        always.access(line, write);
    }
    // Open CAS's rule would stop admitting once-seen lines at 80% (1,639 lines).
    assert_eq!(nhit.cache.occupancy(), LINES, "every free line was filled");
    assert_eq!(always.cache.occupancy(), LINES);
    // So a second pass hits everywhere, exactly as `always` does.
    for (line, write) in one_pass() {
        nhit.access(line, !write);
        always.access(line, !write);
    }
    assert_eq!(nhit.hits(), LINES as u64);
    assert_eq!(nhit.hits(), always.hits());
}

#[test]
fn above_the_trigger_a_full_cache_keeps_a_once_seen_line_out() {
    let mut r = Run::new(PromotionPolicy::Nhit);
    for (line, write) in one_pass() {
        r.access(line, write);
    }
    assert_eq!(r.cache.occupancy(), LINES);
    // Lines outside the footprint, each read once: admitting would evict, so they stay out.
    let hits = r.hits();
    for i in 0..64u64 {
        r.access(LINES as u64 + i, false);
    }
    // The footprint is still whole: no once-seen line took one of its lines.
    for (line, _) in one_pass() {
        r.access(line, false);
    }
    assert_eq!(r.hits(), hits + LINES as u64, "nothing was evicted");
    // A line missed a second time still waits; its third miss gets it in, and it then hits.
    let hot = 3 * LINES as u64;
    r.access(hot, false);
    r.access(hot, false);
    let before = r.hits();
    r.access(hot, false);
    assert_eq!(r.hits(), before, "third miss: admitted, still a miss");
    r.access(hot, false);
    assert_eq!(r.hits(), before + 1, "then a hit");
    assert_eq!(r.cache.occupancy(), LINES);
}
