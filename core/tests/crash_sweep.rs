//! SPEC R1 (issue 4): a crash at **every** device write, for every mode but `wl` (`wt`, `wb`,
//! `wa`, `wi`, `pt`, `wo`; `wl` has its own enumeration in `wl.rs`) and every lifecycle step.
//!
//! Per mode and variant (two: 16 lines of 8 KiB with 4 requests in flight; 24 lines of 4 KiB
//! with 8 in flight and more slow IOs), one short deterministic script runs a persistent cache
//! with two cores of 384 blocks through the lifecycle, step by step:
//!
//! | step | what it does |
//! |---|---|
//! | `create` | the cache is created (tables, checkpoint, superblocks) |
//! | `add-core` | two cores are added |
//! | `write` | partial-line, multi-line and FUA writes with reads between (dirty data in lazy modes) |
//! | `flush` | writes and client flushes on both cores |
//! | `trim` | trims and write-zeroes (with and without FUA) over dirty and clean data, a flush |
//! | `writeback` | non-lazy modes first switch to `wb` (the only way they hold dirty data); dirty writes, the `alru` cleaner at work (1 s timings), then an explicit writeback of everything |
//! | `mode-switch` | lazy modes: `M`→`wt` (writes back first) with writes meanwhile, then `wt`→`M`; non-lazy modes: `wb`→`M` (writes back first), `M`→`wb`, `wb`→`M` |
//! | `io-class` | two IO-class table reloads with writes between |
//! | `stop` | writes (unflushed), then a clean stop: drain, `Cache::stop`, the final checkpoint, tables and superblock (crash points mid-stop) |
//!
//! The script is run once to count its device writes N (cache and cores, data and metadata;
//! each write belongs to the step that issued it). Then for every n in 1..=N it is run again and
//! cut right after it issues write n (`Env::crash_exact`: nothing the cache asked for after that
//! write is carried out) — plus one point N+1 after the script's end (a power cut after the
//! clean stop, counted in `stop`) — and for each crash pattern — un-flushed writes all kept, all dropped,
//! K seeded torn (per block) and K seeded reordered (per write) variants — the harness:
//! recovers the cache from the device image (`Env::crash_check`: recovery must succeed, every
//! block must hold the newest flushed write or a later one, and every clean block the recovery
//! kept — warm after the crash, proven by a checkpoint — must equal the core's), restarts over what
//! survived, reads every block (each settles on its recovered value), runs a few more requests
//! and a writeback against the oracle, stops cleanly, loads warm and reads every block again
//! (no stale read, no flip-flop across the second restart).
//!
//! It prints a table, mode × step: crash points, recoveries (pattern runs that loaded a cache
//! from the crash image), those with dirty data, those that brought clean lines back warm and
//! how many, restarts on a device that held no cache yet, points mid-stop; and asserts
//! coverage (every cell has crash points, every lazy mode recovered dirty data, every mode
//! recovered clean lines warm, every mode was cut mid-stop). Every failing point is reported at the
//! end with a replay line.
//!
//! Environment: `TIERCACHE_SWEEP_K=N` seeded torn and reordered variants per crash point (2);
//! `TIERCACHE_SWEEP_VARIANTS=1` only the first variant, `=3` also a third (16 lines of 4 KiB,
//! S3-FIFO, `acp`); `TIERCACHE_SWEEP_NESTED=1` also crashes again at every write of each
//! recovery (its checkpoint or superblock), kept and dropped, and checks the second recovery
//! reads as the first (slow: about 6× the time); `TIERCACHE_SWEEP_SALT=S` other seeds
//! (completion orders, slow IOs, patterns) for the same scripts; replay one case with
//! `TIERCACHE_SWEEP_MODE=wb TIERCACHE_SWEEP_VARIANT=0 TIERCACHE_SWEEP_N=57` (and optionally
//! `TIERCACHE_SWEEP_PATTERN=torn1`); `TIERCACHE_SWEEP_STEP=stop` limits a run to the crash
//! points of one step; `TIERCACHE_TRACE=1` prints every event. A replay keeps the full failure
//! report (with the last events).
//!
//! It found a real bug on its first run: a clean stop wrote its final checkpoint and the
//! superblock saying "clean" before the cores were flushed, so in `wt` a power cut right after
//! that superblock could load warm clean lines holding data the core then lost (STALE READ at
//! the stop's last write and after the end: a flip-flop once the line is evicted). The stop now
//! flushes every core with writes no flush covered first, and writes `Clean` only if that
//! succeeded.

mod harness;

use harness::workload::{CSVS, persistent};
use harness::{CrashPattern, Env, Knobs, ReqOp, Rng};
use std::collections::BTreeMap;
use tiercache_core::Config;
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::ioclass::IoClassTable;
use tiercache_core::policy::{AcpParams, AlruParams, CleaningPolicy, EvictionPolicy, RateParams};
use tiercache_core::units::{LineSize, Nanos};

/// The modes swept (Open CAS's six), in a fixed order: a script's seed depends on it.
const MODES: [CacheMode; 6] = CacheMode::ALL;

fn mode_name(m: CacheMode) -> &'static str {
    m.rules().name
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Create,
    AddCore,
    Write,
    Flush,
    Trim,
    Writeback,
    ModeSwitch,
    IoClass,
    Stop,
}

const STEPS: [Step; 9] = [
    Step::Create,
    Step::AddCore,
    Step::Write,
    Step::Flush,
    Step::Trim,
    Step::Writeback,
    Step::ModeSwitch,
    Step::IoClass,
    Step::Stop,
];

impl Step {
    fn name(self) -> &'static str {
        match self {
            Step::Create => "create",
            Step::AddCore => "add-core",
            Step::Write => "write",
            Step::Flush => "flush",
            Step::Trim => "trim",
            Step::Writeback => "writeback",
            Step::ModeSwitch => "mode-switch",
            Step::IoClass => "io-class",
            Step::Stop => "stop",
        }
    }
}

/// Blocks per core (two cores of 24 lines of 8 KiB, against a cache of 16 lines).
const CORE_BLOCKS: u64 = 384;
const CORES: u16 = 2;

/// One script: a mode and a variant of the geometry and IO timing.
#[derive(Clone, Copy, Debug)]
struct Case {
    mode: CacheMode,
    /// 0: 16 lines of 8 KiB, LRU, `alru`, 4 requests in flight; 1: 24 lines of 4 KiB, 8 in
    /// flight, more slow IOs (so more completions out of order); 2 (on demand only): 16 lines
    /// of 4 KiB (a sixth of the cores: the scripts overfill it), S3-FIFO, `acp` (cleaning all
    /// the time), 6 in flight.
    variant: u64,
}

/// Variants a full run sweeps (`TIERCACHE_SWEEP_VARIANTS` may ask for fewer, or for
/// `VARIANTS_ALL`).
const VARIANTS: u64 = 2;
const VARIANTS_ALL: u64 = 3;

fn line_size(c: Case) -> LineSize {
    match c.variant {
        1 => LineSize::K4,
        2 => LineSize::K4,
        _ => LineSize::K8,
    }
}

fn config(c: Case) -> Config {
    let ls = line_size(c);
    let lines = [16, 24, 16][c.variant as usize];
    let mut cfg = Config::new(lines, ls);
    cfg.mode = c.mode;
    cfg.eviction = if c.variant == 2 {
        EvictionPolicy::S3Fifo
    } else {
        EvictionPolicy::Lru
    };
    cfg.cleaning = if c.variant == 2 {
        CleaningPolicy::Acp
    } else {
        CleaningPolicy::Alru
    };
    cfg.acp = AcpParams {
        wake_up_ms: 10,
        flush_max_buffers: 2,
    };
    cfg.alru = AlruParams {
        wake_up_s: 1,
        staleness_time_s: 1,
        flush_max_buffers: 4,
        activity_threshold_ms: 0,
    };
    cfg.rate = RateParams {
        enabled: false,
        dirty_target_pct: 50,
        throttle_max_ms: 5,
    };
    cfg.pool_slots = 4;
    cfg.pool_slot_blocks = 2 * ls.blocks();
    // A 48 KiB journal (this seed's draw), so commits wrap it and running checkpoints happen
    // (the table's header counts them).
    let mut rng = Rng::new(4);
    persistent(cfg, &mut rng)
}

fn knobs(c: Case, crash: Option<u64>) -> Knobs {
    Knobs {
        p_io_error: 0.0,
        // Every write reaches the device's volatile image when issued: a crash pattern then
        // decides, per block or per write, what survives (the widest set of outcomes).
        p_apply_at_submit: 1.0,
        qd: [4, 8, 6][c.variant as usize],
        step_ns_max: 2_000_000,
        p_slow: [0.2, 0.5, 0.3][c.variant as usize],
        crash_at_write: crash,
        crash_at_meta_write: None,
        error_kinds: false,
        p_outage: 0.0,
        outage_ns_max: 0,
        fault_params: Some(harness::fast_fault_params()),
    }
}

/// `TIERCACHE_SWEEP_SALT=S` changes every seed: other IO completion orders, slow IOs and
/// torn/reordered patterns, same scripts (for longer runs on demand).
fn seed_of(c: Case) -> u64 {
    let salt = env_u64("TIERCACHE_SWEEP_SALT").unwrap_or(0);
    (0x5eed_0000 + MODES.iter().position(|&m| m == c.mode).expect("mode") as u64 + (c.variant << 8))
        ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// `None` once the crash point is reached: the script stops there.
type Go = Option<()>;

fn alive(env: &Env) -> Go {
    (!env.crashed).then_some(())
}

/// One unit of progress: completes an IO (or lets time pass), then time moves on.
fn step(env: &mut Env) -> Go {
    if !env.complete_one() {
        env.now = env.now.plus(Nanos::from_ms(1));
        env.tick();
    }
    alive(env)?;
    env.advance();
    Some(())
}

/// Submits a request once fewer than `qd` are in flight, then lets one thing happen.
fn io(env: &mut Env, op: ReqOp, core: u16, lba: u64, blocks: u32) -> Go {
    while env.in_flight() >= env.knobs.qd {
        step(env)?;
    }
    env.submit(op, core, lba, blocks);
    alive(env)?;
    step(env)
}

fn w(env: &mut Env, core: u16, lba: u64, blocks: u32) -> Go {
    io(env, ReqOp::Write { fua: false }, core, lba, blocks)
}

fn fua(env: &mut Env, core: u16, lba: u64, blocks: u32) -> Go {
    io(env, ReqOp::Write { fua: true }, core, lba, blocks)
}

fn r(env: &mut Env, core: u16, lba: u64, blocks: u32) -> Go {
    io(env, ReqOp::Read, core, lba, blocks)
}

fn flush(env: &mut Env, core: u16) -> Go {
    io(env, ReqOp::Flush, core, 0, 0)
}

fn quiesce(env: &mut Env) -> Go {
    env.drain_or_crash().then_some(())
}

fn set_mode(env: &mut Env, m: CacheMode) -> Go {
    env.cache
        .set_mode(m)
        .expect("a persistent cache takes every mode");
    env.tick();
    alive(env)
}

/// Lets `ms` of simulated time pass in ticks of 100 ms, completing IOs (the cleaner runs).
fn wait(env: &mut Env, ms: u64) -> Go {
    let end = env.now.plus(Nanos::from_ms(ms));
    while env.now.0 < end.0 {
        while env.complete_one() {
            alive(env)?;
        }
        env.now = env.now.plus(Nanos::from_ms(100));
        env.tick();
        alive(env)?;
    }
    Some(())
}

/// Runs one lifecycle step of the script.
fn run_step(env: &mut Env, mode: CacheMode, s: Step) -> Go {
    let lazy = mode.is_lazy();
    match s {
        Step::Create => {
            env.settle();
            alive(env)
        }
        Step::AddCore => {
            for c in 0..CORES {
                env.add_core(c, CORE_BLOCKS);
                alive(env)?;
            }
            Some(())
        }
        Step::Write => {
            for c in 0..CORES {
                w(env, c, 3, 5)?; // inside one line
                w(env, c, 14, 20)?; // across two line boundaries
                fua(env, c, 40, 6)?; // FUA, partial line
                r(env, c, 0, 32)?;
                w(env, c, 64, 48)?; // three whole lines
                w(env, c, 4, 2)?; // over the first, partly
                r(env, c, 60, 12)?;
            }
            quiesce(env)
        }
        Step::Flush => {
            w(env, 0, 130, 10)?;
            flush(env, 0)?;
            w(env, 1, 150, 20)?;
            w(env, 0, 131, 3)?;
            flush(env, 1)?;
            fua(env, 0, 200, 4)?;
            flush(env, 0)?;
            quiesce(env)
        }
        Step::Trim => {
            io(env, ReqOp::Trim, 0, 4, 8)?; // over dirty blocks, partly
            io(env, ReqOp::WriteZeroes { fua: false }, 0, 14, 18)?;
            io(env, ReqOp::Trim, 1, 64, 32)?; // two whole lines
            io(env, ReqOp::WriteZeroes { fua: true }, 1, 3, 2)?;
            w(env, 0, 20, 4)?;
            flush(env, 0)?;
            flush(env, 1)?;
            quiesce(env)
        }
        Step::Writeback => {
            if !lazy {
                set_mode(env, CacheMode::Wb)?;
            }
            w(env, 0, 96, 16)?;
            w(env, 1, 240, 9)?;
            flush(env, 0)?;
            w(env, 0, 300, 20)?;
            quiesce(env)?;
            // The alru cleaner (wake-up and staleness 1 s) writes back on its own.
            wait(env, 1_500)?;
            w(env, 1, 241, 2)?;
            wait(env, 1_200)?;
            env.writeback_or_crash().then_some(())?;
            quiesce(env)
        }
        Step::ModeSwitch => {
            if lazy {
                w(env, 0, 8, 30)?;
                w(env, 1, 180, 12)?;
                set_mode(env, CacheMode::Wt)?; // writes back first
                w(env, 0, 10, 4)?;
                r(env, 1, 176, 24)?;
                quiesce(env)?;
                w(env, 1, 181, 2)?;
                set_mode(env, mode)?;
                w(env, 0, 50, 10)?;
                flush(env, 0)?;
            } else {
                // In `wb` since the writeback step.
                w(env, 0, 8, 30)?;
                w(env, 1, 180, 12)?;
                set_mode(env, mode)?; // writes back first
                w(env, 0, 10, 4)?;
                quiesce(env)?;
                set_mode(env, CacheMode::Wb)?;
                w(env, 1, 181, 2)?;
                flush(env, 1)?;
                set_mode(env, mode)?;
                w(env, 0, 50, 10)?;
            }
            quiesce(env)
        }
        Step::IoClass => {
            env.cache
                .load_io_classes(IoClassTable::parse_csv(CSVS[1]).expect("valid csv"));
            env.tick();
            alive(env)?;
            w(env, 0, 260, 3)?;
            w(env, 1, 0, 40)?;
            r(env, 0, 256, 16)?;
            env.cache
                .load_io_classes(IoClassTable::parse_csv(CSVS[3]).expect("valid csv"));
            env.tick();
            alive(env)?;
            w(env, 1, 100, 5)?;
            flush(env, 1)?;
            quiesce(env)
        }
        Step::Stop => {
            r(env, 0, 32, 16)?;
            w(env, 1, 330, 16)?;
            flush(env, 0)?;
            // Not flushed by the client: over a cached line (in `wt` and `wa` too).
            w(env, 0, 33, 7)?;
            w(env, 0, 1, 1)?;
            env.stop_or_crash().then_some(())
        }
    }
}

/// One run of a mode's script, cut at device write `crash` if given.
struct Run {
    env: Env,
    /// Device writes issued when each step began.
    starts: Vec<(Step, u64)>,
}

fn run_script(c: Case, crash: Option<u64>) -> Run {
    let mode = c.mode;
    let mut env = Env::new_unsettled(config(c), seed_of(c), knobs(c, crash));
    env.crash_exact = true;
    // The crash is the check (the model test checks durability after every event).
    env.check_durability = false;
    let mut starts = Vec::new();
    for s in STEPS {
        starts.push((s, env.device_writes));
        if run_step(&mut env, mode, s).is_none() {
            break;
        }
    }
    Run { env, starts }
}

fn patterns(k: u64) -> Vec<(String, CrashPattern)> {
    let mut v = vec![
        ("kept".to_string(), CrashPattern::Kept),
        ("dropped".to_string(), CrashPattern::Dropped),
    ];
    for i in 0..k {
        v.push((format!("torn{i}"), CrashPattern::Torn));
        v.push((format!("reordered{i}"), CrashPattern::Reordered));
    }
    v
}

/// What one crash point gave.
#[derive(Default)]
struct Point {
    recoveries: u64,
    recovered_dirty: u64,
    /// Recoveries that brought clean lines back warm, and those lines.
    recovered_warm: u64,
    warm_lines: u64,
    /// Pattern runs that found no cache on the device (crash before its first superblock).
    fresh: u64,
    mid_stop: bool,
    /// Second crashes during the recovery (`TIERCACHE_SWEEP_NESTED`).
    nested: u64,
}

/// Crash at write `n` of case `c`'s script and check every pattern (or only `only`).
/// `n` = the script's write count + 1: the power cut comes after the script's end (after the
/// clean stop completed, before anything else happens to the devices).
fn run_point(
    c: Case,
    n: u64,
    total: u64,
    k: u64,
    only: Option<&str>,
    current: &mut String,
) -> Point {
    let mode = c.mode;
    let Run { mut env, .. } = run_script(c, (n <= total).then_some(n));
    assert!(
        env.crashed || n > total,
        "{}: write {n} was never issued",
        mode_name(mode)
    );
    let mut pt = Point {
        mid_stop: env.stop_requested && !env.cache.is_stopped(),
        ..Point::default()
    };
    let cfg = config(c);
    for (pi, (name, pattern)) in patterns(k).into_iter().enumerate() {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        *current = name.clone();
        env.rng = Rng::new(seed_of(c) ^ (n << 16) ^ pi as u64);
        let (mut images, recovered) = env.crash_check(pattern);
        match &recovered {
            Some(cache) => {
                pt.recoveries += 1;
                pt.recovered_dirty += (cache.dirty_lines() > 0) as u64;
                pt.recovered_warm += (env.last_warm_clean > 0) as u64;
                pt.warm_lines += env.last_warm_clean as u64;
            }
            None => pt.fresh += 1,
        }
        // Cores the crash came before: the restart adds them with empty images.
        for core in 0..CORES {
            images
                .cores
                .entry(core)
                .or_insert_with(|| vec![0; CORE_BLOCKS as usize * harness::BS]);
        }
        let seed = seed_of(c) ^ 0xa11 ^ (n << 20) ^ pi as u64;
        if env_u64("TIERCACHE_SWEEP_NESTED").is_some() {
            nested(
                &mut env,
                c,
                pattern,
                seed_of(c) ^ (n << 16) ^ pi as u64,
                seed,
                &mut pt,
            );
        }
        let mut e = Env::restart(cfg.clone(), seed, knobs(c, None), images, recovered);
        e.check_durability = false;
        after_restart(e, seed);
    }
    pt
}

/// The crash image again (same seed: same image), with the cores the crash came before.
fn recover_again(
    env: &mut Env,
    pattern: CrashPattern,
    rseed: u64,
) -> (harness::CrashImages, Option<tiercache_core::Cache>) {
    env.rng = Rng::new(rseed);
    let (mut images, rec) = env.crash_check(pattern);
    for core in 0..CORES {
        images
            .cores
            .entry(core)
            .or_insert_with(|| vec![0; CORE_BLOCKS as usize * harness::BS]);
    }
    (images, rec)
}

/// A second crash at every write of the recovery (its checkpoint or superblock), kept and
/// dropped: recovery again, and every block must still read as after the first one.
fn nested(env: &mut Env, c: Case, pattern: CrashPattern, rseed: u64, seed: u64, pt: &mut Point) {
    let cfg = config(c);
    let (im, rec) = recover_again(env, pattern, rseed);
    let r = Env::restart(cfg.clone(), seed, knobs(c, None), im, rec).device_writes;
    for j in 1..=r {
        let (im, rec) = recover_again(env, pattern, rseed);
        let mut e1 = Env::restart(cfg.clone(), seed, knobs(c, Some(j)), im, rec);
        e1.check_durability = false;
        assert!(e1.crashed, "recovery write {j} of {r} never issued");
        for (qi, p2) in [CrashPattern::Kept, CrashPattern::Dropped]
            .into_iter()
            .enumerate()
        {
            e1.rng = Rng::new(rseed ^ 0x2c ^ (j << 8) ^ qi as u64);
            let (im2, rec2) = e1.crash_check(p2);
            pt.nested += 1;
            let mut e2 = Env::restart(cfg.clone(), seed ^ 0x2, knobs(c, None), im2, rec2);
            e2.check_durability = false;
            after_restart(e2, seed ^ 0x2);
        }
    }
}

/// After a restart: every block settles on its recovered value, more requests and a
/// writeback run against the oracle, then a clean stop, a warm load and every block again.
fn after_restart(mut e: Env, seed: u64) {
    e.verify_all();
    let ops: [(ReqOp, u16, u64, u32); 7] = [
        (ReqOp::Write { fua: false }, 0, 5, 9),
        (ReqOp::Write { fua: false }, 1, 30, 20),
        (ReqOp::Read, 0, 0, 64),
        (ReqOp::Trim, 1, 100, 10),
        (ReqOp::Flush, 0, 0, 0),
        (ReqOp::Write { fua: true }, 1, 250, 3),
        (ReqOp::Flush, 1, 0, 0),
    ];
    for (op, c, lba, len) in ops {
        while e.in_flight() >= e.knobs.qd {
            if !e.complete_one() {
                e.tick();
            }
            e.advance();
        }
        e.submit(op, c, lba, len);
        e.advance();
    }
    e.drain();
    e.writeback_all();
    e.submit(ReqOp::Write { fua: false }, 0, 200, 10);
    e.drain();
    let mut e = e.stop_and_reload(seed ^ 0x10ad);
    e.verify_all();
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: expected a number"))
    })
}

#[derive(Default, Clone, Copy)]
struct Cell {
    points: u64,
    recoveries: u64,
    dirty: u64,
    /// Recoveries that brought clean lines back warm, and those lines.
    warm: u64,
    warm_lines: u64,
    fresh: u64,
    mid_stop: u64,
    nested: u64,
}

struct Sweep {
    table: BTreeMap<(usize, Step), Cell>,
    writes: u64,
    /// Journal commits and checkpoints of the uncut scripts.
    commits: u64,
    checkpoints: u64,
    /// Write intents journaled, requests that waited for one, allocations refused while one
    /// was pending (uncut scripts).
    intents: u64,
    intent_waits: u64,
    refused_allocs: u64,
    failures: Vec<String>,
}

/// What to sweep: K, and filters (a replay).
#[derive(Default)]
struct Filter {
    k: u64,
    /// Variants 0..variants.
    variants: u64,
    mode: Option<String>,
    variant: Option<u64>,
    step: Option<String>,
    n: Option<u64>,
    pattern: Option<String>,
    /// Failing points are collected (each panic caught quietly) instead of reported at once.
    collect: bool,
}

/// Runs the sweep over the cases and crash points `f` leaves.
fn sweep(f: &Filter) -> Sweep {
    let (k, collect) = (f.k, f.collect);
    let mut out = Sweep {
        table: BTreeMap::new(),
        writes: 0,
        commits: 0,
        checkpoints: 0,
        intents: 0,
        intent_waits: 0,
        refused_allocs: 0,
        failures: Vec::new(),
    };
    let cases = MODES
        .into_iter()
        .enumerate()
        .flat_map(|(mi, mode)| (0..f.variants).map(move |variant| (mi, Case { mode, variant })));
    for (mi, c) in cases {
        let (mode, variant) = (c.mode, c.variant);
        let name = mode_name(mode);
        if f.mode.as_deref().is_some_and(|m| m != name) || f.variant.is_some_and(|v| v != variant) {
            continue;
        }
        // The whole script, uncut: how many device writes, and which step issued each.
        let Run { env, starts } = run_script(c, None);
        assert!(
            env.cache.is_stopped(),
            "{name}: the script must end with a clean stop"
        );
        let total = env.device_writes;
        out.writes += total;
        let mc = env.cache.meta_counters();
        out.commits += mc.commits;
        out.checkpoints += mc.checkpoints;
        let ic = env.cache.intent_counters();
        out.intents += ic.intents;
        out.intent_waits += ic.waits;
        out.refused_allocs += ic.refused_allocs;
        // The script's own run, loaded from its clean stop, reads back as written.
        let mut e = env.stop_and_reload(seed_of(c) ^ 0x10ad);
        e.verify_all();
        let step_of = |n: u64| {
            starts
                .iter()
                .rev()
                .find(|(_, at)| *at < n)
                .expect("n ≥ 1")
                .0
        };
        // Every write, and once more after the end (the clean stop done).
        for n in 1..=total + 1 {
            let s = step_of(n);
            if f.n.is_some_and(|o| o != n) || f.step.as_deref().is_some_and(|o| o != s.name()) {
                continue;
            }
            let mut current = String::new();
            // Each failing point's panic is caught and reported with the others at the end;
            // the default hook's report (with the last events) is kept for replays.
            let hook = collect.then(|| {
                let prev = std::panic::take_hook();
                std::panic::set_hook(Box::new(|_| {}));
                prev
            });
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_point(c, n, total, k, f.pattern.as_deref(), &mut current)
            }));
            if let Some(h) = hook {
                std::panic::set_hook(h);
            }
            let cell = out.table.entry((mi, s)).or_default();
            match res {
                Ok(pt) => {
                    cell.points += 1;
                    cell.recoveries += pt.recoveries;
                    cell.dirty += pt.recovered_dirty;
                    cell.warm += pt.recovered_warm;
                    cell.warm_lines += pt.warm_lines;
                    cell.fresh += pt.fresh;
                    cell.mid_stop += pt.mid_stop as u64;
                    cell.nested += pt.nested;
                }
                Err(e) => {
                    let msg = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let first = msg.lines().next().unwrap_or("").to_string();
                    let at = if n > total {
                        format!("after the end ({total} writes)")
                    } else {
                        format!("write {n} of {total}")
                    };
                    let line = format!(
                        "mode {name} variant {variant} step {} {at} pattern {current}: {first}\n  replay: TIERCACHE_SWEEP_MODE={name} TIERCACHE_SWEEP_VARIANT={variant} TIERCACHE_SWEEP_N={n} TIERCACHE_SWEEP_PATTERN={current} cargo test -p tiercache-core --test crash_sweep -- --nocapture",
                        s.name()
                    );
                    out.failures.push(line);
                }
            }
        }
    }
    out
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[test]
fn crash_at_every_device_write_of_every_mode_and_step() {
    let k = env_u64("TIERCACHE_SWEEP_K").unwrap_or(2);
    let f = Filter {
        k,
        variants: env_u64("TIERCACHE_SWEEP_VARIANTS")
            .unwrap_or(VARIANTS)
            .min(VARIANTS_ALL),
        mode: var("TIERCACHE_SWEEP_MODE"),
        variant: env_u64("TIERCACHE_SWEEP_VARIANT"),
        step: var("TIERCACHE_SWEEP_STEP"),
        n: env_u64("TIERCACHE_SWEEP_N"),
        pattern: var("TIERCACHE_SWEEP_PATTERN"),
        collect: false,
    };
    let replay = f.mode.is_some() || f.variant.is_some() || f.step.is_some() || f.n.is_some();
    let f = Filter {
        collect: !replay,
        ..f
    };
    let sw = sweep(&f);
    print_table(&sw, &f);
    if !sw.failures.is_empty() {
        panic!(
            "{} crash points failed (the first failing pattern of each is shown):\n{}",
            sw.failures.len(),
            sw.failures.join("\n")
        );
    }
    if replay {
        return;
    }
    let table = &sw.table;
    // Coverage: every mode × step had crash points; the lazy modes recovered dirty data; the
    // stop step was cut mid-stop (after `Cache::stop`) in every mode.
    for (mi, mode) in MODES.into_iter().enumerate() {
        for s in STEPS {
            let c = table.get(&(mi, s)).copied().unwrap_or_default();
            assert!(
                c.points > 0,
                "coverage: no crash point in {} step {}",
                mode_name(mode),
                s.name()
            );
        }
        if mode.is_lazy() {
            let dirty: u64 = STEPS
                .iter()
                .map(|&s| table.get(&(mi, s)).map_or(0, |c| c.dirty))
                .sum();
            assert!(
                dirty > 0,
                "coverage: {} never recovered with dirty data",
                mode_name(mode)
            );
        }
        assert!(
            table.get(&(mi, Step::Stop)).is_some_and(|c| c.mid_stop > 0),
            "coverage: {} had no crash point mid-stop",
            mode_name(mode)
        );
        // Every mode's script holds clean lines after its first checkpoint: some recoveries
        // must bring them back warm (proven equal to the core), not only drop them.
        let warm: u64 = STEPS
            .iter()
            .map(|&s| table.get(&(mi, s)).map_or(0, |c| c.warm))
            .sum();
        assert!(
            warm > 0,
            "coverage: {} never recovered clean lines warm after a crash",
            mode_name(mode)
        );
    }
}

fn print_table(sw: &Sweep, f: &Filter) {
    let (k, v, table) = (f.k, f.variants, &sw.table);
    let mut out = String::new();
    out.push_str(&format!(
        "crash sweep: 6 modes x {v} variants, {} device writes (with {} journal commits and {} checkpoints; {} write intents, {} requests waited for one, {} allocations refused meanwhile), each a crash point, and one after each script's end; patterns per point: kept, dropped, {k} torn, {k} reordered\n",
        sw.writes, sw.commits, sw.checkpoints, sw.intents, sw.intent_waits, sw.refused_allocs
    ));
    out.push_str(&format!(
        "{:<6}{:<13}{:>8}{:>12}{:>10}{:>8}{:>12}{:>8}{:>10}\n",
        "mode",
        "step",
        "points",
        "recoveries",
        "w/ dirty",
        "w/ warm",
        "warm lines",
        "fresh",
        "mid-stop"
    ));
    let mut sum = Cell::default();
    for (&(mi, s), c) in table {
        out.push_str(&format!(
            "{:<6}{:<13}{:>8}{:>12}{:>10}{:>8}{:>12}{:>8}{:>10}\n",
            mode_name(MODES[mi]),
            s.name(),
            c.points,
            c.recoveries,
            c.dirty,
            c.warm,
            c.warm_lines,
            c.fresh,
            if s == Step::Stop {
                c.mid_stop.to_string()
            } else {
                "-".into()
            }
        ));
        sum.points += c.points;
        sum.recoveries += c.recoveries;
        sum.dirty += c.dirty;
        sum.warm += c.warm;
        sum.warm_lines += c.warm_lines;
        sum.fresh += c.fresh;
        sum.mid_stop += c.mid_stop;
        sum.nested += c.nested;
    }
    if sum.nested > 0 {
        out.push_str(&format!(
            "second crashes during recovery (TIERCACHE_SWEEP_NESTED): {} checked\n",
            sum.nested
        ));
    }
    out.push_str(&format!(
        "total: {} crash points, {} recoveries ({} with dirty data, {} with {} clean lines back warm), {} restarts on a device with no cache yet, {} points mid-stop; checked: recovery, every block legal, every clean block kept equal to the core, re-read after restart, clean stop, warm load, every block again\n",
        sum.points, sum.recoveries, sum.dirty, sum.warm, sum.warm_lines, sum.fresh, sum.mid_stop
    ));
    println!("{out}");
}
