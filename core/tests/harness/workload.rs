//! The model workload, shared by the model test and the crash test: random configurations,
//! request ranges and steps.

use super::{Env, ReqOp, Rng};
use tiercache_core::Config;
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::ioclass::IoClassTable;
use tiercache_core::policy::{
    AcpParams, AlruParams, CleaningPolicy, EvictionPolicy, NhitParams, PromotionPolicy, RateParams,
};
use tiercache_core::units::LineSize;

/// IO class tables the workload reloads at random.
pub const CSVS: &[&str] = &[
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n",
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n1,request_size:le:4096,1,0.5\n2,request_size:gt:16384,30,0.25\n",
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n1,io_direction:write,,0.4\n",
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n1,lba:lt:256&done,5,0\n3,core_id:eq:1,10,0.6\n",
];

/// A random cache configuration and core sizes; the mode is drawn from `modes`.
pub fn random_config(rng: &mut Rng, modes: &[CacheMode]) -> (Config, Vec<u64>) {
    let ls = LineSize::ALL[rng.below(5) as usize];
    let lines = 16 + rng.below(48) as u32;
    let mut cfg = Config::new(lines, ls);
    cfg.data_offset = tiercache_core::units::Lba(rng.below(3) * 8);
    cfg.mode = modes[rng.below(modes.len() as u64) as usize];
    cfg.eviction = if rng.chance(0.5) {
        EvictionPolicy::Lru
    } else {
        EvictionPolicy::S3Fifo
    };
    if rng.chance(0.25) {
        cfg.promotion = PromotionPolicy::Nhit;
        cfg.nhit = NhitParams {
            threshold: 2,
            trigger_pct: rng.below(90) as u32,
        };
    }
    cfg.cleaning = match rng.below(3) {
        0 => CleaningPolicy::Alru,
        1 => CleaningPolicy::Acp,
        _ => CleaningPolicy::Nop,
    };
    cfg.alru = AlruParams {
        wake_up_s: 1,
        staleness_time_s: 1,
        flush_max_buffers: 1 + rng.below(16) as u32,
        activity_threshold_ms: 0,
    };
    cfg.acp = AcpParams {
        wake_up_ms: 10,
        flush_max_buffers: 1 + rng.below(16) as u32,
    };
    cfg.rate = RateParams {
        enabled: rng.chance(0.5),
        dirty_target_pct: 30 + rng.below(40) as u32,
        throttle_max_ms: 5,
    };
    cfg.pool_slots = 1 + rng.below(8) as u32;
    cfg.pool_slot_blocks = ls.blocks() * (1 + rng.below(4) as u32);
    let ncores = 1 + rng.below(4) as usize;
    let total = lines as u64 * ls.blocks() as u64 * (2 + rng.below(4));
    let cores = (0..ncores)
        .map(|_| (total / ncores as u64).max(ls.blocks() as u64) + rng.below(7))
        .collect();
    (cfg, cores)
}

/// A random request range: mostly small, a hot quarter, rarely out of range.
pub fn pick_range(rng: &mut Rng, blocks_total: u64, bpl: u64) -> (u64, u32) {
    let len = match rng.below(10) {
        0..=4 => 1 + rng.below(bpl),
        5..=7 => 1 + rng.below(3 * bpl),
        8 => bpl,
        _ => 1 + rng.below(8),
    }
    .min(blocks_total);
    // Hot spot for hits, uniform otherwise; occasionally out of range.
    let lba = if rng.chance(0.6) {
        rng.below((blocks_total / 4).max(1))
    } else {
        rng.below(blocks_total)
    };
    if rng.chance(0.005) {
        return (blocks_total - 1, 2 + len as u32);
    }
    (lba.min(blocks_total - len), len as u32)
}

/// One random step of the model workload: a mode switch (among `modes`), an IO-class reload,
/// a writeback command, a new request, or an IO completion; then time moves on.
pub fn random_step(env: &mut Env, modes: &[CacheMode], ncores: u64, bpl: u64) {
    let r = env.rng.below(1000);
    if r < 4 {
        let m = modes[env.rng.below(modes.len() as u64) as usize];
        env.cache
            .set_mode(m)
            .expect("non-volatile cache accepts every mode");
        env.cov.mode_switches += 1;
        env.tick();
    } else if r < 6 {
        let csv = CSVS[env.rng.below(CSVS.len() as u64) as usize];
        env.cache
            .load_io_classes(IoClassTable::parse_csv(csv).expect("valid csv"));
        env.cov.class_reloads += 1;
    } else if r < 8 {
        env.cache.start_writeback();
        env.tick();
    } else if r < 500 && env.in_flight() < env.knobs.qd {
        let core = env.rng.below(ncores) as u16;
        let n = env.core_blocks(core);
        let (lba, len) = pick_range(&mut env.rng, n, bpl);
        let fua = env.rng.chance(0.15);
        let op = match env.rng.below(100) {
            0..=44 => ReqOp::Read,
            45..=84 => ReqOp::Write { fua },
            85..=90 => ReqOp::Flush,
            91..=95 => ReqOp::Trim,
            _ => ReqOp::WriteZeroes { fua },
        };
        env.submit(op, core, lba, len);
    } else if !env.complete_one() {
        env.tick();
    }
    env.maybe_outage();
    env.advance();
    if env.rng.chance(0.02) {
        env.tick();
    }
}

/// Makes `cfg` persistent on a compact cache device: the superblocks and their tables, then a
/// small journal (16–64 KiB, so commits wrap it and running checkpoints happen often), the two
/// checkpoint regions, then the lines. (Real devices use `Layout::plan`, with 1 MiB alignment
/// and a journal of at least 1 MiB; the format only requires 4 KiB alignment.)
pub fn persistent(mut cfg: Config, rng: &mut Rng) -> Config {
    use tiercache_format::superblock::Layout;
    let ls = cfg.line_size.bytes();
    let journal = (16 << 10) * (1 + rng.below(4));
    let layout = Layout::compact(cfg.lines as u64, ls as u32, journal, 0);
    let data = layout.data;
    let device = data.end();
    layout.validate(device).expect("valid layout");
    cfg.data_offset = tiercache_core::units::Lba(data.offset / 512);
    let mut id = [0u8; 16];
    for b in id.iter_mut() {
        *b = rng.below(256) as u8;
    }
    cfg.persist = Some(tiercache_core::config::Persist::new_cache(
        id,
        device,
        cfg.line_size,
        cfg.lines,
        layout,
    ));
    cfg
}
