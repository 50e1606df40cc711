//! Test harness: drives the real cache core against in-memory devices and checks it against a
//! reference model of what a disk must return (docs/TESTING.md, "model-based tests").
//!
//! Devices keep a *volatile* and a *durable* image: writes land in the volatile image (at submit
//! or at completion, chosen at random), a successful device flush copies volatile to durable.
//! IOs complete in random order; a seeded fraction fail (a failed read fills its buffer with
//! junk, a failed write applies to a random subset of its blocks).
//!
//! Every block's content encodes (core, block, write id), so the harness can tell which write a
//! block holds. The oracle keeps, per block, the ordered list of acknowledged writes and the
//! *floor*: the newest write acknowledged before a flush that has completed. Two checks:
//! - **reads**: a read returns, per block, the newest write acknowledged when the read arrived,
//!   or a write that was in flight while it ran, or (after a failed write) the old or the new
//!   data — and then keeps returning that same value (no flip-flop);
//! - **durability**, after every event: what a crash right now would leave — the cache
//!   device's durable copy of a dirty block, else the core's durable copy — must be the floor
//!   write or a later one (SPEC durability points 1–2);
//! - **health** (docs/SAFETY.md, "Faults"), after every event: a core is reported failing
//!   exactly when its last completed IO failed; a cache device error puts the cache in bypass
//!   at once, and while it stays in bypass no client data is written to the cache device; a
//!   failed writeback write to a core opens that core's writeback alarm at once, and an alarm
//!   stays only while the core has dirty lines; and no cached line is left without a valid
//!   block once the request that mapped it is done (`EMPTY LINE`).
//!
//! Faults: a seeded share of IOs fail (`p_io_error`) with a random error kind (`Io`, `NoSpace`,
//! `TimedOut`) when `error_kinds` is set, and an *outage* (`p_outage`) makes one device — the
//! cache or a core — fail every IO for a while.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use tiercache_core::cache::{FaultParams, Problem};
use tiercache_core::event::{Action, BufRef, Dev, Event, IoError};
use tiercache_core::units::{CoreId, IoId, Lba, Nanos, ReqId};
use tiercache_core::{Cache, Config};

pub mod workload;

pub const BS: usize = 512;

/// A small deterministic PRNG (xorshift64*).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 1.0 < p
    }
}

/// A device with a volatile and a durable image.
pub struct Device {
    pub vol: Vec<u8>,
    pub dur: Vec<u8>,
    /// Blocks whose volatile content may differ from the durable one, and the device write
    /// that last touched each.
    unflushed: BTreeMap<u64, u64>,
    writes: u64,
}

impl Device {
    pub fn new(blocks: u64) -> Device {
        Device {
            vol: vec![0; blocks as usize * BS],
            dur: vec![0; blocks as usize * BS],
            unflushed: Default::default(),
            writes: 0,
        }
    }

    pub fn from_image(img: Vec<u8>) -> Device {
        Device {
            vol: img.clone(),
            dur: img,
            unflushed: Default::default(),
            writes: 0,
        }
    }

    /// Starts a device write: blocks `put` until the next one belong to it.
    fn begin_write(&mut self) {
        self.writes += 1;
    }

    fn put(&mut self, b: u64, data: Option<&[u8]>, fua: bool) {
        let s = b as usize * BS;
        match data {
            Some(d) => self.vol[s..s + BS].copy_from_slice(d),
            None => self.vol[s..s + BS].fill(0),
        }
        if fua {
            let (v, d) = (&self.vol[s..s + BS], &mut self.dur[s..s + BS]);
            d.copy_from_slice(v);
        } else {
            self.unflushed.insert(b, self.writes);
        }
    }

    fn flush(&mut self) {
        for b in std::mem::take(&mut self.unflushed).into_keys() {
            let s = b as usize * BS;
            let (v, d) = (&self.vol[s..s + BS], &mut self.dur[s..s + BS]);
            d.copy_from_slice(v);
        }
    }

    /// What a power cut now leaves: the durable image, with each unflushed block's volatile
    /// content kept or not as `pattern` says.
    pub fn crash_image(&self, pattern: CrashPattern, rng: &mut Rng) -> Vec<u8> {
        let mut img = self.dur.clone();
        let salt = rng.next();
        for (&b, &w) in &self.unflushed {
            let keep = match pattern {
                CrashPattern::Kept => true,
                CrashPattern::Dropped => false,
                CrashPattern::Torn => rng.chance(0.5),
                CrashPattern::Reordered => Rng::new(salt ^ w).next() & 1 == 1,
            };
            if keep {
                let s = b as usize * BS;
                img[s..s + BS].copy_from_slice(&self.vol[s..s + BS]);
            }
        }
        img
    }
    fn range(&self, lba: u64, blocks: u32) -> std::ops::Range<usize> {
        let s = lba as usize * BS;
        s..s + blocks as usize * BS
    }
}

/// What a block's content says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Content {
    /// All zeros: the initial state, or a trim/write-zeroes.
    Zero,
    /// Written by write `id`.
    Write(u64),
    /// Not a valid block of this core at this address.
    Junk,
}

pub fn fill_block(buf: &mut [u8], core: u16, lba: u64, id: u64) {
    buf[0..8].copy_from_slice(&lba.to_le_bytes());
    buf[8..16].copy_from_slice(&id.to_le_bytes());
    buf[16..18].copy_from_slice(&core.to_le_bytes());
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ lba ^ ((core as u64) << 40);
    for b in buf[18..BS].iter_mut() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *b = (x >> 56) as u8;
    }
}

/// Decodes a block. Checks the header and the first 32 pattern bytes (enough to tell blocks
/// apart; a full compare of every block after every event would make the tests slow).
pub fn decode_block(buf: &[u8], core: u16, lba: u64) -> Content {
    if buf[..64].iter().all(|&b| b == 0) {
        return if buf.iter().all(|&b| b == 0) {
            Content::Zero
        } else {
            Content::Junk
        };
    }
    let id = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    // Only the first 64 bytes of the pattern are compared, so only those are generated.
    let mut expect = [0u8; 64];
    expect[0..8].copy_from_slice(&lba.to_le_bytes());
    expect[8..16].copy_from_slice(&id.to_le_bytes());
    expect[16..18].copy_from_slice(&core.to_le_bytes());
    let mut x = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ lba ^ ((core as u64) << 40);
    for b in expect[18..].iter_mut() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *b = (x >> 56) as u8;
    }
    if expect[..] == buf[..64] {
        Content::Write(id)
    } else {
        Content::Junk
    }
}

/// Per-block oracle state.
#[derive(Clone, Default)]
struct BlockModel {
    /// Completed writes in order (newest last), with whether they succeeded. Starts with Zero.
    /// A failed write may have left its data or not, so its content stays legal for reads
    /// until the next successful write, and for crashes until a flush covers a later one.
    history: Vec<(Content, bool)>,
    /// Index into `history` of the newest successful write covered by a completed flush.
    floor: usize,
    /// Pinned after a read while failed writes make the value uncertain.
    pinned: Option<Content>,
}

impl BlockModel {
    fn last_ok(&self) -> usize {
        self.history
            .iter()
            .rposition(|x| x.1)
            .expect("history starts with an ok entry")
    }
    fn uncertain(&self) -> bool {
        self.last_ok() + 1 < self.history.len()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqOp {
    Read,
    Write { fua: bool },
    WriteZeroes { fua: bool },
    Trim,
    Flush,
}

struct InFlightReq {
    op: ReqOp,
    core: CoreId,
    lba: u64,
    blocks: u32,
    /// Write id (writes, zeroes, trims).
    id: u64,
    /// For reads: per block, the legal set captured at arrival (grows as writes start).
    legal: Vec<HashSet<Content>>,
    /// For flushes: the acked history length per block of the core at arrival.
    floors: Vec<usize>,
    buf: Vec<u8>,
}

struct PendingIo {
    action: Action,
    applied: bool,
    /// A slow IO: passed over most of the time when an IO is picked to complete.
    slow: bool,
}

/// What a crash does to writes the device completed but did not flush (and to writes whose
/// data already reached the volatile image while still in flight).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum CrashPattern {
    /// Every such write survives.
    Kept,
    /// None survives: the device holds its durable image.
    Dropped,
    /// Each block independently survives or not (seeded), so a multi-block write may tear.
    Torn,
    /// Each write survives whole or not at all (seeded): the device reordered them, so a
    /// later write may outlive an earlier one.
    Reordered,
}

/// Coverage counters the model test requires to be non-zero.
#[derive(Default, Debug, Clone)]
pub struct Coverage {
    pub reads_checked: u64,
    pub blocks_checked: u64,
    pub io_errors_injected: u64,
    pub partial_hits: u64,
    pub evictions_formerly_dirty: u64,
    pub writeback_races: u64,
    pub writebacks: u64,
    pub mode_switches: u64,
    pub class_reloads: u64,
    pub flushes: u64,
    pub durability_checks: u64,
    /// Outages started (a device failing every IO for a while).
    pub outages: u64,
    /// Events applied while the cache was in bypass (its device failing).
    pub bypass_events: u64,
    /// Lazy writes written to the core after their cache write failed.
    pub lazy_write_fallbacks: u64,
    /// Reads of clean blocks retried from the core after a cache read error.
    pub read_retries: u64,
    /// Writeback attempts that failed, and retries.
    pub writeback_failures: u64,
    pub writeback_retries: u64,
    /// Probes of a failing cache device that ended bypass.
    pub recoveries: u64,
    /// Health checks run.
    pub health_checks: u64,
}

impl Coverage {
    /// Adds `o` to `self`.
    pub fn add(&mut self, o: &Coverage) {
        self.reads_checked += o.reads_checked;
        self.blocks_checked += o.blocks_checked;
        self.io_errors_injected += o.io_errors_injected;
        self.partial_hits += o.partial_hits;
        self.evictions_formerly_dirty += o.evictions_formerly_dirty;
        self.writeback_races += o.writeback_races;
        self.writebacks += o.writebacks;
        self.mode_switches += o.mode_switches;
        self.class_reloads += o.class_reloads;
        self.flushes += o.flushes;
        self.durability_checks += o.durability_checks;
        self.outages += o.outages;
        self.bypass_events += o.bypass_events;
        self.lazy_write_fallbacks += o.lazy_write_fallbacks;
        self.read_retries += o.read_retries;
        self.writeback_failures += o.writeback_failures;
        self.writeback_retries += o.writeback_retries;
        self.recoveries += o.recoveries;
        self.health_checks += o.health_checks;
    }
}

/// What every device holds after a power cut.
pub struct CrashImages {
    pub cache: Vec<u8>,
    pub cores: BTreeMap<u16, Vec<u8>>,
}

/// What a read of core block `b` returns after a crash: the recovered cache's copy if it has
/// one (dirty, or clean and proven equal to the core; persistent caches), else the core
/// image's.
fn post_crash(cache: Option<&Cache>, images: &CrashImages, core: u16, b: u64) -> Content {
    if let Some(c) = cache {
        let bpl = c.config().line_size.blocks() as u64;
        if let Some((line, v, _d)) = c.line_state(CoreId(core), b / bpl) {
            let bit = b % bpl;
            if v >> bit & 1 == 1 {
                let cb = c.config().data_offset.0 + line.0 as u64 * bpl + bit;
                let s = cb as usize * BS;
                return decode_block(&images.cache[s..s + BS], core, b);
            }
        }
    }
    let img = &images.cores[&core];
    decode_block(&img[b as usize * BS..(b as usize + 1) * BS], core, b)
}

/// Harness knobs.
#[derive(Clone, Debug)]
pub struct Knobs {
    pub p_io_error: f64,
    pub p_apply_at_submit: f64,
    pub qd: usize,
    pub step_ns_max: u64,
    /// Share of IOs that are slow (complete about ten times later than the others).
    pub p_slow: f64,
    /// Stop at the n-th device write (write, write-zeroes, trim) issued: a crash point.
    pub crash_at_write: Option<u64>,
    /// Stop at the n-th metadata write (journal record, checkpoint chunk, tables, superblock)
    /// issued: a crash point where metadata and data races are likeliest.
    pub crash_at_meta_write: Option<u64>,
    /// Injected failures carry a random kind (`Io`, `NoSpace`, `TimedOut`) instead of `Io`.
    pub error_kinds: bool,
    /// Chance per workload step that an outage starts (one device fails every IO).
    pub p_outage: f64,
    /// Longest outage, ns.
    pub outage_ns_max: u64,
    /// Retry timing given to the cache (the defaults are seconds; tests use milliseconds).
    pub fault_params: Option<FaultParams>,
}

/// Fast retry timing for tests: the cache leaves bypass and retries writeback within a few
/// simulated milliseconds, so a run spends most of its time in the normal paths.
pub fn fast_fault_params() -> FaultParams {
    FaultParams {
        writeback_retry_first: Nanos::from_ms(1),
        writeback_retry_max: Nanos::from_ms(40),
        cache_retry_first: Nanos::from_ms(2),
        cache_retry_max: Nanos::from_ms(100),
    }
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            p_io_error: 0.01,
            p_apply_at_submit: 0.5,
            qd: 8,
            step_ns_max: 2_000_000,
            p_slow: 0.0,
            crash_at_write: None,
            crash_at_meta_write: None,
            error_kinds: false,
            p_outage: 0.0,
            outage_ns_max: 200_000_000,
            fault_params: Some(fast_fault_params()),
        }
    }
}

/// A device failing every IO until a time.
#[derive(Clone, Copy, Debug)]
pub struct Outage {
    pub dev: Dev,
    pub until: Nanos,
    /// The error every IO of the device fails with.
    pub kind: IoError,
}

/// The environment: cache + devices + oracle.
pub struct Env {
    pub cache: Cache,
    pub rng: Rng,
    pub knobs: Knobs,
    pub now: Nanos,
    pub cache_dev: Device,
    cores: BTreeMap<u16, (Device, Vec<BlockModel>)>,
    pool: Vec<Vec<u8>>,
    reqs: BTreeMap<ReqId, InFlightReq>,
    pending: Vec<(IoId, PendingIo)>,
    next_req: u64,
    next_write: u64,
    pub cov: Coverage,
    /// Trace of the last events, printed on failure.
    pub trace: Vec<String>,
    pub check_durability: bool,
    /// Every device IO action issued, when recording.
    pub record: Option<Vec<Action>>,
    /// Device writes issued so far.
    pub device_writes: u64,
    /// Metadata writes issued so far.
    pub meta_writes: u64,
    /// The crash point was reached: the run must stop and be checked with `crash_check`.
    pub crashed: bool,
    /// The device failing every IO now, if any.
    pub outage: Option<Outage>,
    /// Per core: whether its last completed IO failed (the health oracle).
    last_core_failed: BTreeMap<u16, bool>,
    /// Read hints checked against a mapped line, and how many named another line.
    hints_mapped: u64,
    hints_wrong: u64,
    /// Whether health is checked after every event.
    pub check_health: bool,
    /// Results of completed requests, when kept (scenario tests).
    pub results: Option<BTreeMap<ReqId, Result<(), tiercache_core::event::ReqError>>>,
    /// Exact crash points: once the crash write is issued, the rest of the actions the cache
    /// asked for in the same batch are not carried out (the process died right after issuing
    /// it). Without it a crash takes effect at the end of the batch, so consecutive crash
    /// points within one batch leave the same state.
    pub crash_exact: bool,
    /// `Cache::stop` was called (by `stop_or_crash`): a crash since then is a crash mid-stop.
    pub stop_requested: bool,
    /// Lines the last `crash_check` recovery brought back with clean blocks (warm after a
    /// crash).
    pub last_warm_clean: u32,
}

impl Env {
    pub fn new(cfg: Config, seed: u64, knobs: Knobs) -> Env {
        let mut env = Env::new_unsettled(cfg, seed, knobs);
        env.settle();
        env
    }

    /// A new cache on a zeroed device, before it has written anything: the caller may set
    /// fields (`crash_exact`, `check_durability`) and then `settle` it, so crash points while
    /// the cache is created behave like any other.
    pub fn new_unsettled(cfg: Config, seed: u64, knobs: Knobs) -> Env {
        let cache_blocks = match &cfg.persist {
            Some(p) => p.superblock.device_bytes / BS as u64,
            None => cfg.data_offset.0 + cfg.lines as u64 * cfg.line_size.blocks() as u64,
        };
        let cache = Cache::new(cfg).expect("valid config");
        Env::with_cache(cache, Device::new(cache_blocks), seed, knobs)
    }

    /// An environment around a cache (new or loaded) and its cache device.
    pub fn with_cache(mut cache: Cache, cache_dev: Device, seed: u64, knobs: Knobs) -> Env {
        if let Some(p) = knobs.fault_params {
            cache.set_fault_params(p);
        }
        let cfg = cache.config().clone();
        let slot_bytes = cfg.pool_slot_blocks as usize * BS;
        let pool = (0..cfg.pool_slots).map(|_| vec![0u8; slot_bytes]).collect();
        Env {
            cache,
            rng: Rng::new(seed),
            knobs,
            now: Nanos(1),
            cache_dev,
            cores: BTreeMap::new(),
            pool,
            reqs: BTreeMap::new(),
            pending: Vec::new(),
            next_req: 1,
            next_write: 1,
            cov: Coverage::default(),
            trace: Vec::new(),
            check_durability: true,
            record: None,
            device_writes: 0,
            meta_writes: 0,
            crashed: false,
            outage: None,
            last_core_failed: BTreeMap::new(),
            hints_mapped: 0,
            hints_wrong: 0,
            check_health: true,
            results: None,
            crash_exact: false,
            stop_requested: false,
            last_warm_clean: 0,
        }
    }

    /// Runs the cache's own work (metadata writes, superblock, recovery checkpoint) until it is
    /// ready and its tables are durable, or the crash point is reached.
    pub fn settle(&mut self) {
        let mut guard = 0;
        while !self.crashed && (!self.cache.is_ready() || !self.cache.tables_durable()) {
            if !self.complete_one() {
                self.now = self.now.plus(Nanos::from_ms(200));
                self.tick();
            }
            guard += 1;
            if guard > 1_000_000 {
                self.fail("the cache never became ready");
            }
        }
    }

    pub fn add_core(&mut self, core: u16, blocks: u64) {
        self.cache.add_core(CoreId(core), blocks).expect("add core");
        self.cache
            .set_core_record(
                CoreId(core),
                tiercache_core::cache::CoreRecord {
                    identity: tiercache_format::tables::CoreIdentity::File {
                        fs_uuid: [7; 16],
                        inode: core as u64,
                    },
                    export_name: format!("core{core}"),
                    device: String::new(),
                },
            )
            .expect("core record");
        self.add_core_model(core, blocks);
        self.settle();
    }

    fn add_core_model(&mut self, core: u16, blocks: u64) {
        let model = vec![
            BlockModel {
                history: vec![(Content::Zero, true)],
                floor: 0,
                pinned: None
            };
            blocks as usize
        ];
        self.cores.insert(core, (Device::new(blocks), model));
    }

    pub fn core_blocks(&self, core: u16) -> u64 {
        self.cores[&core].1.len() as u64
    }

    fn log(&mut self, s: String) {
        if std::env::var_os("TIERCACHE_TRACE").is_some() {
            eprintln!("{s}");
            return;
        }
        if self.trace.len() > 400 {
            self.trace.drain(..200);
        }
        self.trace.push(s);
    }

    pub fn fail(&self, msg: &str) -> ! {
        let tail: Vec<&String> = self.trace.iter().rev().take(60).collect();
        let mut t = String::new();
        for l in tail.into_iter().rev() {
            t.push_str(l);
            t.push('\n');
        }
        panic!("{msg}\n--- last events ---\n{t}");
    }

    /// Applies an event to the cache and executes the resulting actions.
    pub fn apply(&mut self, ev: Event) {
        self.apply_io(ev, None);
    }

    /// Applies an event; `done` names the device of an `IoDone`, whether it failed, and
    /// whether it was a writeback write (a core write from a staging slot).
    fn apply_io(&mut self, ev: Event, done: Option<(Dev, bool, bool)>) {
        self.log(format!("t={} {:?}", self.now.0, ev));
        let bypass_before = self
            .cache
            .health()
            .problems
            .iter()
            .any(|p| matches!(p, Problem::CacheDevice { .. }));
        let mut actions = Vec::new();
        self.cache.apply(self.now, ev, &mut actions);
        if self.check_health {
            self.check_health_after(bypass_before, done, &actions);
        }
        self.execute(actions);
        if self.check_durability {
            self.check_durable();
        }
    }

    /// A cached line with no valid block may only exist while a request that mapped it is in
    /// flight (a failed cache write used to leave such lines behind).
    fn check_no_empty_line(&self) {
        let bpl = self.cache.config().line_size.blocks() as u64;
        for (&core, (_, model)) in &self.cores {
            for cl in 0..(model.len() as u64).div_ceil(bpl) {
                let Some((line, v, _)) = self.cache.line_state(CoreId(core), cl) else {
                    continue;
                };
                if v != 0 {
                    continue;
                }
                let (s, e) = (cl * bpl, (cl + 1) * bpl);
                let held = self
                    .reqs
                    .values()
                    .any(|r| r.core.0 == core && r.lba < e && r.lba + r.blocks as u64 > s);
                if !held {
                    self.fail(&format!(
                        "EMPTY LINE: core {core} line {cl} is cached in line {} with no valid block and no request in flight",
                        line.0
                    ));
                }
            }
        }
    }

    /// The health checks (module docs), after an event whose actions are `actions`.
    fn check_health_after(
        &mut self,
        bypass_before: bool,
        done: Option<(Dev, bool, bool)>,
        actions: &[Action],
    ) {
        self.cov.health_checks += 1;
        if let Some((Dev::Core(c), failed, _)) = done {
            self.last_core_failed.insert(c.0, failed);
        }
        let h = self.cache.health();
        let bypass = h
            .problems
            .iter()
            .any(|p| matches!(p, Problem::CacheDevice { .. }));
        if bypass {
            self.cov.bypass_events += 1;
        }
        if let Some((Dev::Cache, true, _)) = done
            && !bypass
        {
            self.fail("HEALTH: a cache device error did not put the cache in bypass");
        }
        if bypass_before && bypass {
            for a in actions {
                if let Action::Write {
                    dev: Dev::Cache,
                    buf: BufRef::Req { req, .. },
                    ..
                } = a
                {
                    self.fail(&format!(
                        "HEALTH: client data of {req:?} written to the cache device in bypass"
                    ));
                }
            }
        }
        for (&c, &failed) in &self.last_core_failed {
            let reported = h
                .problems
                .iter()
                .any(|p| matches!(p, Problem::CoreDevice { core, .. } if core.0 == c));
            if reported != failed {
                self.fail(&format!(
                    "HEALTH: core {c}'s last IO failed: {failed}, reported failing: {reported}"
                ));
            }
        }
        if let Some((Dev::Core(c), true, true)) = done {
            let alarm = h
                .problems
                .iter()
                .any(|p| matches!(p, Problem::Writeback { core, .. } if *core == c));
            if !alarm {
                self.fail(&format!(
                    "HEALTH: a failed writeback write to core {} raised no alarm",
                    c.0
                ));
            }
        }
        self.check_no_empty_line();
        let mut at_risk = 0;
        for p in &h.problems {
            if let Problem::Writeback {
                core,
                dirty_blocks,
                since,
                ..
            } = *p
            {
                if self.cache.core_dirty_lines(core) == 0 || dirty_blocks == 0 {
                    self.fail(&format!(
                        "HEALTH: writeback alarm for core {} without dirty data",
                        core.0
                    ));
                }
                if since > self.now {
                    self.fail("HEALTH: an alarm from the future");
                }
                at_risk += dirty_blocks;
            }
        }
        let expect = if bypass
            || h.problems
                .iter()
                .any(|p| matches!(p, Problem::WritebackRead { .. }))
        {
            self.cache.dirty_blocks()
        } else {
            at_risk
        };
        if h.dirty_at_risk_blocks != expect {
            self.fail(&format!(
                "HEALTH: {} dirty blocks at risk reported, {expect} expected",
                h.dirty_at_risk_blocks
            ));
        }
    }

    fn execute(&mut self, actions: Vec<Action>) {
        for a in actions {
            if self.crashed && self.crash_exact {
                self.log(format!("  -> (not carried out: crashed) {a:?}"));
                continue;
            }
            self.log(format!("  -> {a:?}"));
            match a {
                Action::Copy { src, dst, blocks } => {
                    let data = self.buf_read(src, blocks);
                    self.buf_write(dst, &data);
                }
                Action::Complete { req, result } => self.on_complete(req, result),
                Action::Read { io, .. }
                | Action::Write { io, .. }
                | Action::WriteZeroes { io, .. }
                | Action::Trim { io, .. }
                | Action::Flush { io, .. } => {
                    if let Some(rec) = self.record.as_mut() {
                        rec.push(a.clone());
                    }
                    if matches!(
                        a,
                        Action::Write { .. } | Action::WriteZeroes { .. } | Action::Trim { .. }
                    ) {
                        self.device_writes += 1;
                        if self.knobs.crash_at_write == Some(self.device_writes) {
                            self.crashed = true;
                        }
                        if let Action::Write {
                            buf: BufRef::Meta { .. },
                            ..
                        } = a
                        {
                            self.meta_writes += 1;
                            if self.knobs.crash_at_meta_write == Some(self.meta_writes) {
                                self.crashed = true;
                            }
                        }
                    }
                    let slow = self.rng.chance(self.knobs.p_slow);
                    let mut p = PendingIo {
                        action: a,
                        applied: false,
                        slow,
                    };
                    let is_flush = matches!(p.action, Action::Flush { .. });
                    if !is_flush && self.rng.chance(self.knobs.p_apply_at_submit) {
                        // Data moves now; the IO still completes later (and may still fail,
                        // leaving what it did).
                        self.move_data(&p.action, true);
                        p.applied = true;
                    }
                    self.pending.push((io, p));
                }
            }
        }
    }

    fn dev_mut(&mut self, dev: Dev) -> &mut Device {
        match dev {
            Dev::Cache => &mut self.cache_dev,
            Dev::Core(c) => &mut self.cores.get_mut(&c.0).expect("core").0,
        }
    }

    fn buf_slice(&mut self, b: BufRef, blocks: u32) -> &mut [u8] {
        let len = blocks as usize * BS;
        match b {
            BufRef::Req { req, offset } => {
                let r = self.reqs.get_mut(&req).expect("buffer of a live request");
                let s = offset as usize * BS;
                &mut r.buf[s..s + len]
            }
            BufRef::Pool { slot, offset } => {
                let s = offset as usize * BS;
                &mut self.pool[slot as usize][s..s + len]
            }
            BufRef::Meta { .. } => unreachable!("metadata buffers are write sources only"),
        }
    }

    fn buf_read(&mut self, b: BufRef, blocks: u32) -> Vec<u8> {
        if let BufRef::Meta { id, offset } = b {
            let s = offset as usize * BS;
            return self.cache.meta_buf(id)[s..s + blocks as usize * BS].to_vec();
        }
        self.buf_slice(b, blocks).to_vec()
    }

    fn buf_write(&mut self, b: BufRef, data: &[u8]) {
        let blocks = (data.len() / BS) as u32;
        self.buf_slice(b, blocks).copy_from_slice(data);
    }

    /// Performs the data movement of an IO (`ok`: fully; otherwise a failed IO's effect).
    fn move_data(&mut self, a: &Action, ok: bool) {
        match *a {
            Action::Read {
                dev,
                lba,
                blocks,
                buf,
                ..
            } => {
                let data = if ok {
                    let d = self.dev_mut(dev);
                    let r = d.range(lba.0, blocks);
                    d.vol[r].to_vec()
                } else {
                    vec![0xee; blocks as usize * BS]
                };
                self.buf_write(buf, &data);
            }
            Action::Write {
                dev,
                lba,
                blocks,
                buf,
                fua,
                ..
            } => {
                let data = self.buf_read(buf, blocks);
                let mask: Vec<bool> = (0..blocks).map(|_| ok || self.rng.chance(0.5)).collect();
                let d = self.dev_mut(dev);
                d.begin_write();
                for (i, m) in mask.into_iter().enumerate() {
                    if m {
                        d.put(lba.0 + i as u64, Some(&data[i * BS..(i + 1) * BS]), fua);
                    }
                }
            }
            Action::WriteZeroes {
                dev, lba, blocks, ..
            }
            | Action::Trim {
                dev, lba, blocks, ..
            } => {
                let fua = matches!(a, Action::WriteZeroes { fua: true, .. });
                let mask: Vec<bool> = (0..blocks).map(|_| ok || self.rng.chance(0.5)).collect();
                let d = self.dev_mut(dev);
                d.begin_write();
                for (i, m) in mask.into_iter().enumerate() {
                    if m {
                        d.put(lba.0 + i as u64, None, fua);
                    }
                }
            }
            Action::Flush { dev, .. } => {
                if ok {
                    self.dev_mut(dev).flush();
                }
            }
            Action::Copy { .. } | Action::Complete { .. } => unreachable!(),
        }
    }

    /// Completes one pending IO chosen at random. Returns false if none is pending.
    pub fn complete_one(&mut self) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        let mut i = self.rng.below(self.pending.len() as u64) as usize;
        if self.pending[i].1.slow && self.rng.chance(0.9) {
            // A slow IO is passed over nine times in ten while others are pending.
            if let Some(j) = self.pending.iter().position(|p| !p.1.slow) {
                i = j;
            }
        }
        let (io, p) = self.pending.swap_remove(i);
        let dev = match p.action {
            Action::Read { dev, .. }
            | Action::Write { dev, .. }
            | Action::WriteZeroes { dev, .. }
            | Action::Trim { dev, .. }
            | Action::Flush { dev, .. } => dev,
            Action::Copy { .. } | Action::Complete { .. } => unreachable!("not an IO"),
        };
        if self.outage.is_some_and(|o| o.until <= self.now) {
            self.outage = None;
        }
        let out = self.outage.filter(|o| o.dev == dev).map(|o| o.kind);
        let fail = out.is_some() || self.rng.chance(self.knobs.p_io_error);
        if fail {
            self.cov.io_errors_injected += 1;
        }
        if !p.applied {
            self.move_data(&p.action, !fail);
        } else if fail && matches!(p.action, Action::Read { .. }) {
            self.move_data(&p.action, false);
        }
        let result = if !fail {
            Ok(())
        } else if let Some(k) = out {
            Err(k)
        } else if self.knobs.error_kinds {
            Err([IoError::Io, IoError::NoSpace, IoError::TimedOut][self.rng.below(3) as usize])
        } else {
            Err(IoError::Io)
        };
        let wb_write = matches!(
            p.action,
            Action::Write {
                dev: Dev::Core(_),
                buf: BufRef::Pool { .. },
                ..
            }
        );
        self.apply_io(Event::IoDone { io, result }, Some((dev, fail, wb_write)));
        true
    }

    /// Maybe starts an outage (one device fails every IO for up to `outage_ns_max`).
    pub fn maybe_outage(&mut self) {
        if self.knobs.p_outage <= 0.0 || self.outage.is_some() {
            return;
        }
        if !self.rng.chance(self.knobs.p_outage) {
            return;
        }
        let cores: Vec<u16> = self.cores.keys().copied().collect();
        let k = self.rng.below(cores.len() as u64 + 1) as usize;
        let dev = if k == cores.len() {
            Dev::Cache
        } else {
            Dev::Core(CoreId(cores[k]))
        };
        let len = 1 + self.rng.below(self.knobs.outage_ns_max);
        let kind = if self.knobs.error_kinds {
            [IoError::Io, IoError::NoSpace, IoError::TimedOut][self.rng.below(3) as usize]
        } else {
            IoError::Io
        };
        self.outage = Some(Outage {
            dev,
            until: self.now.plus(Nanos(len)),
            kind,
        });
        self.cov.outages += 1;
        self.log(format!("t={} OUTAGE {dev:?} for {len} ns", self.now.0));
    }

    pub fn advance(&mut self) {
        let d = self.rng.below(self.knobs.step_ns_max) + 1;
        self.now = self.now.plus(Nanos(d));
    }

    pub fn tick(&mut self) {
        self.apply(Event::Tick);
    }

    pub fn in_flight(&self) -> usize {
        self.reqs.len()
    }

    /// The set of contents legal for a read of (core, block) arriving now.
    fn legal_now(&self, core: u16, b: u64) -> HashSet<Content> {
        let m = &self.cores[&core].1[b as usize];
        let mut s = HashSet::new();
        if let Some(p) = m.pinned {
            s.insert(p);
        } else {
            let last_ok = m.last_ok();
            s.extend(m.history[last_ok..].iter().map(|x| x.0));
        }
        // Writes in flight to this block.
        for r in self.reqs.values() {
            if r.core.0 == core
                && b >= r.lba
                && b < r.lba + r.blocks as u64
                && let Some(c) = Self::content_of(r, b)
            {
                s.insert(c);
            }
        }
        s
    }

    fn content_of(r: &InFlightReq, _b: u64) -> Option<Content> {
        match r.op {
            ReqOp::Write { .. } => Some(Content::Write(r.id)),
            ReqOp::WriteZeroes { .. } | ReqOp::Trim => Some(Content::Zero),
            ReqOp::Read | ReqOp::Flush => None,
        }
    }

    /// Submits a request.
    pub fn submit(&mut self, op: ReqOp, core: u16, lba: u64, blocks: u32) -> ReqId {
        let req = ReqId(self.next_req);
        self.next_req += 1;
        let id = self.next_write;
        self.next_write += 1;
        let mut buf = vec![0u8; blocks as usize * BS];
        if let ReqOp::Write { .. } = op {
            for i in 0..blocks as usize {
                fill_block(&mut buf[i * BS..(i + 1) * BS], core, lba + i as u64, id);
            }
        }
        let mut r = InFlightReq {
            op,
            core: CoreId(core),
            lba,
            blocks,
            id,
            legal: Vec::new(),
            floors: Vec::new(),
            buf,
        };
        let blocks_total = self.core_blocks(core);
        if op == ReqOp::Read && lba + blocks as u64 <= blocks_total {
            r.legal = (lba..lba + blocks as u64)
                .map(|b| self.legal_now(core, b))
                .collect();
        }
        if op == ReqOp::Flush {
            r.floors = self.cores[&core].1.iter().map(|m| m.last_ok()).collect();
            self.cov.flushes += 1;
        }
        // A write now in flight is legal for reads already in flight that overlap it.
        if let Some(c) = Self::content_of(&r, 0) {
            for other in self.reqs.values_mut() {
                if other.op == ReqOp::Read && other.core.0 == core {
                    for (i, s) in other.legal.iter_mut().enumerate() {
                        let b = other.lba + i as u64;
                        if b >= lba && b < lba + blocks as u64 {
                            s.insert(c);
                        }
                    }
                }
            }
        }
        self.reqs.insert(req, r);
        let c = CoreId(core);
        let ev = match op {
            ReqOp::Read => Event::Read {
                req,
                core: c,
                lba: Lba(lba),
                blocks,
            },
            ReqOp::Write { fua } => Event::Write {
                req,
                core: c,
                lba: Lba(lba),
                blocks,
                fua,
            },
            ReqOp::WriteZeroes { fua } => Event::WriteZeroes {
                req,
                core: c,
                lba: Lba(lba),
                blocks,
                fua,
            },
            ReqOp::Trim => Event::Trim {
                req,
                core: c,
                lba: Lba(lba),
                blocks,
            },
            ReqOp::Flush => Event::Flush { req, core: c },
        };
        if op == ReqOp::Read {
            self.check_read_hint(c, lba, blocks);
        }
        self.apply(ev);
        req
    }

    /// The engine's prefetch hint for a read ([`Cache::read_hint`]): it always names blocks
    /// inside the cache's data area, no more than the read has in its first line; where that
    /// line is mapped, the hint is given and names exactly where the line holds the read's
    /// first block, except after a fingerprint collision in the mapping table (the hint does
    /// not verify the slot it finds). Those are rare (a fingerprint has 32 minus the line id's
    /// bits: at least 19 in these tests, whose caches have at most 4096 lines), so more than
    /// 8 + 1/1024 of the checked hints being wrong is a failure.
    fn check_read_hint(&mut self, core: CoreId, lba: u64, blocks: u32) {
        let cfg = self.cache.config();
        let bpl = cfg.line_size.blocks() as u64;
        let data = cfg.data_offset.0;
        let end = data + cfg.lines as u64 * bpl;
        let mut got = None;
        self.cache
            .read_hint(core, Lba(lba), blocks, |at, n| got = Some((at.0, n)));
        let mapped = self
            .cache
            .line_state(core, lba / bpl)
            .map(|(line, ..)| line);
        let Some((at, n)) = got else {
            if let Some(line) = mapped {
                self.fail(&format!("no read hint for lba {lba}, mapped to {line:?}"));
            }
            return;
        };
        let in_line = (bpl - lba % bpl).min(blocks as u64);
        if at < data || at + n as u64 > end || n as u64 != in_line {
            self.fail(&format!(
                "read hint ({at}, {n}) for {blocks} blocks at lba {lba}: outside the data area \
                 [{data}, {end}) or not {in_line} blocks"
            ));
        }
        if let Some(line) = mapped {
            self.hints_mapped += 1;
            let want = data + line.0 as u64 * bpl + lba % bpl;
            if at != want {
                self.hints_wrong += 1;
                if self.hints_wrong > 8 + self.hints_mapped / 1024 {
                    self.fail(&format!(
                        "read hint for lba {lba} names cache block {at}, the line holds it at \
                         {want} ({} of {} hints on mapped lines wrong)",
                        self.hints_wrong, self.hints_mapped
                    ));
                }
            }
        }
    }

    fn on_complete(&mut self, req: ReqId, result: Result<(), tiercache_core::event::ReqError>) {
        let r = self
            .reqs
            .remove(&req)
            .unwrap_or_else(|| self.fail("completion of unknown request"));
        if let Some(res) = self.results.as_mut() {
            res.insert(req, result);
        }
        let core = r.core.0;
        let nblocks = self.core_blocks(core);
        if r.op != ReqOp::Flush && r.lba + r.blocks as u64 > nblocks {
            if result.is_ok() {
                self.fail("out-of-range request succeeded");
            }
            return;
        }
        match r.op {
            ReqOp::Read => {
                if result.is_err() {
                    return;
                }
                self.cov.reads_checked += 1;
                for i in 0..r.blocks as usize {
                    let b = r.lba + i as u64;
                    let got = decode_block(&r.buf[i * BS..(i + 1) * BS], core, b);
                    let legal = &r.legal[i];
                    self.cov.blocks_checked += 1;
                    if !legal.contains(&got) {
                        let m = &self.cores[&core].1[b as usize];
                        self.fail(&format!(
                            "STALE READ: req {req:?} core {core} block {b}: got {got:?}, legal {legal:?}, history tail {:?}",
                            &m.history[m.history.len().saturating_sub(4)..]
                        ));
                    }
                    let no_write_in_flight = !self.reqs.values().any(|o| {
                        o.core.0 == core
                            && b >= o.lba
                            && b < o.lba + o.blocks as u64
                            && Self::content_of(o, b).is_some()
                    });
                    let m = &mut self.cores.get_mut(&core).unwrap().1[b as usize];
                    if m.uncertain() && m.pinned.is_none() && no_write_in_flight {
                        m.pinned = Some(got);
                    }
                }
            }
            ReqOp::Write { .. } | ReqOp::WriteZeroes { .. } | ReqOp::Trim => {
                let content = Self::content_of(&r, 0).unwrap();
                // A FUA write that succeeded is durable on completion: it is the new floor.
                let fua = matches!(
                    r.op,
                    ReqOp::Write { fua: true } | ReqOp::WriteZeroes { fua: true }
                ) && result.is_ok();
                let m = &mut self.cores.get_mut(&core).unwrap().1;
                for b in r.lba..r.lba + r.blocks as u64 {
                    let bm = &mut m[b as usize];
                    bm.history.push((content, result.is_ok()));
                    bm.pinned = None;
                    if fua {
                        bm.floor = bm.history.len() - 1;
                    }
                }
            }
            ReqOp::Flush => {
                if result.is_ok() {
                    let m = &mut self.cores.get_mut(&core).unwrap().1;
                    for (b, &f) in r.floors.iter().enumerate() {
                        if m[b].floor < f {
                            m[b].floor = f;
                        }
                    }
                }
            }
        }
    }

    /// Durability check: what a crash now would leave must be the floor write or later.
    pub fn check_durable(&mut self) {
        self.cov.durability_checks += 1;
        let cores: Vec<u16> = self.cores.keys().copied().collect();
        let bpl = self.cache.config().line_size.blocks() as u64;
        let off = self.cache.config().data_offset.0;
        for core in cores {
            let n = self.core_blocks(core);
            for b in 0..n {
                let m = &self.cores[&core].1[b as usize];
                if m.floor == 0 && m.history.len() == 1 {
                    continue;
                }
                let dev = &self.cores[&core].0;
                let core_c =
                    decode_block(&dev.dur[b as usize * BS..(b as usize + 1) * BS], core, b);
                // Fast path: the core's durable copy is a legal post-crash value on its own.
                if m.history[m.floor..].iter().any(|x| x.0 == core_c) {
                    continue;
                }
                let mut legal: HashSet<Content> =
                    m.history[m.floor..].iter().map(|x| x.0).collect();
                for r in self.reqs.values() {
                    if r.core.0 == core
                        && b >= r.lba
                        && b < r.lba + r.blocks as u64
                        && let Some(c) = Self::content_of(r, b)
                    {
                        legal.insert(c);
                    }
                }
                if legal.contains(&core_c) {
                    continue;
                }
                let cl = b / bpl;
                let mut cache_ok = false;
                if let Some((line, _v, d)) = self.cache.line_state(CoreId(core), cl) {
                    let bit = b % bpl;
                    if d >> bit & 1 == 1 {
                        let cb = off + line.0 as u64 * bpl + bit;
                        let cc = decode_block(
                            &self.cache_dev.dur[cb as usize * BS..(cb as usize + 1) * BS],
                            core,
                            b,
                        );
                        cache_ok = legal.contains(&cc);
                    }
                }
                if !cache_ok {
                    let m = &self.cores[&core].1[b as usize];
                    self.fail(&format!(
                        "DURABILITY: core {core} block {b}: a crash now would leave {core_c:?} on the core (cache copy not durable or not dirty); legal {legal:?}; history {:?} floor {} pinned {:?}",
                        m.history, m.floor, m.pinned
                    ));
                }
            }
        }
    }

    /// Completes every pending IO (and whatever they trigger) until nothing is in flight.
    pub fn drain(&mut self) {
        self.drain_inner(false);
    }

    /// Like [`Env::drain`], but returns false as soon as the crash point is reached.
    pub fn drain_or_crash(&mut self) -> bool {
        self.drain_inner(true)
    }

    fn drain_inner(&mut self, stop_at_crash: bool) -> bool {
        let (mut ios, mut waits) = (0u64, 0u64);
        loop {
            if stop_at_crash && self.crashed {
                return false;
            }
            if self.complete_one() {
                ios += 1;
                if ios > 10_000_000 {
                    self.fail("drain did not converge");
                }
                continue;
            }
            if self.reqs.is_empty() && self.cache.is_idle() {
                return true;
            }
            // Something waits on time (throttle, cleaner): move time forward.
            self.now = self.now.plus(Nanos::from_ms(50));
            self.tick();
            waits += 1;
            if waits > 200_000 {
                self.fail("drain did not converge (waiting on time)");
            }
        }
    }

    /// Like [`Env::writeback_all`], but returns false as soon as the crash point is reached.
    pub fn writeback_or_crash(&mut self) -> bool {
        self.writeback_inner(true)
    }

    /// A clean stop that a crash point may interrupt: completes the requests in flight, stops
    /// the cache and runs it until the stop is complete — its final checkpoint, tables and
    /// superblock writes are device writes like any other, counted for `crash_at_write`.
    /// Returns false if the crash point came first; `stop_requested` then tells whether it
    /// came after `Cache::stop` (mid-stop). The devices keep what the stop wrote (volatile
    /// images); `crash_check` then recovers from a half-done stop.
    pub fn stop_or_crash(&mut self) -> bool {
        if !self.drain_or_crash() {
            return false;
        }
        self.cache.stop();
        self.stop_requested = true;
        self.run_stop(true)
    }

    /// Runs the cache until its stop is complete; with `stop_at_crash`, returns false as soon
    /// as the crash point is reached.
    fn run_stop(&mut self, stop_at_crash: bool) -> bool {
        let mut guard = 0;
        while !self.cache.is_stopped() {
            if stop_at_crash && self.crashed {
                return false;
            }
            if !self.complete_one() {
                self.now = self.now.plus(Nanos::from_ms(200));
                self.tick();
            }
            guard += 1;
            if guard > 1_000_000 {
                self.fail("stop never completed");
            }
        }
        !(stop_at_crash && self.crashed)
    }

    /// Once faults have stopped: time passes until every backoff has run out, and the cache
    /// must report no cache device, writeback or writeback-read problem (a core may still be
    /// reported failing, exactly when its last IO failed).
    pub fn heal_and_check(&mut self) {
        self.outage = None;
        let saved = self.knobs.p_io_error;
        self.knobs.p_io_error = 0.0;
        let wait = self.cache.fault_params().cache_retry_max.0
            + self.cache.fault_params().writeback_retry_max.0;
        for _ in 0..4 {
            self.now = self.now.plus(Nanos(wait));
            self.tick();
            self.drain();
        }
        self.writeback_all();
        self.now = self.now.plus(Nanos(wait));
        self.tick();
        self.drain();
        self.knobs.p_io_error = saved;
        let h = self.cache.health();
        for p in &h.problems {
            if !matches!(p, Problem::CoreDevice { .. }) {
                self.fail(&format!(
                    "HEALTH: still {p:?} after the faults stopped and everything was written back"
                ));
            }
        }
    }

    /// Runs writeback to completion.
    pub fn writeback_all(&mut self) {
        self.writeback_inner(false);
    }

    fn writeback_inner(&mut self, stop_at_crash: bool) -> bool {
        self.cache.start_writeback();
        self.tick();
        let mut guard = 0;
        while self.cache.dirty_lines() > 0 || !self.cache.is_idle() {
            if stop_at_crash && self.crashed {
                return false;
            }
            if !self.complete_one() {
                self.now = self.now.plus(Nanos::from_ms(100));
                self.tick();
            }
            guard += 1;
            if guard > 20_000 {
                self.fail("writeback did not finish");
            }
        }
        !(stop_at_crash && self.crashed)
    }

    /// The legal post-crash contents of core block `b`: the newest write covered by a
    /// completed flush or anything after it, or a write still in flight.
    fn crash_legal(&self, core: u16, b: u64) -> HashSet<Content> {
        let m = &self.cores[&core].1[b as usize];
        let mut legal: HashSet<Content> = m.history[m.floor..].iter().map(|x| x.0).collect();
        for r in self.reqs.values() {
            if r.core.0 == core
                && b >= r.lba
                && b < r.lba + r.blocks as u64
                && let Some(c) = Self::content_of(r, b)
            {
                legal.insert(c);
            }
        }
        legal
    }

    /// A power cut now: the images every device would hold, with `pattern` applied to the
    /// writes not covered by a completed flush.
    pub fn crash_images(&mut self, pattern: CrashPattern) -> CrashImages {
        let mut rng = self.rng.clone();
        let cache = self.cache_dev.crash_image(pattern, &mut rng);
        let cores = self
            .cores
            .iter()
            .map(|(&c, d)| (c, d.0.crash_image(pattern, &mut rng)))
            .collect();
        self.rng = rng;
        CrashImages { cache, cores }
    }

    /// The crash check. Persistent caches are recovered from the cache image (`open`); then
    /// every block of every core — the recovered cache's dirty copy if it has one, else the
    /// core image's — must be legal. Returns the images and the recovered cache (`None`: no
    /// persistence, or the crash came before the cache's first superblock was durable).
    pub fn crash_check(&mut self, pattern: CrashPattern) -> (CrashImages, Option<Cache>) {
        let images = self.crash_images(pattern);
        let recovered = if self.cache.config().persist.is_some() {
            let base = self.cache.config().clone();
            let img = &images.cache;
            let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
                let s = off as usize;
                buf.copy_from_slice(&img[s..s + buf.len()]);
                Ok(())
            };
            match tiercache_core::cache::open(&base, &mut read) {
                Ok((c, report)) => {
                    self.last_warm_clean = report.warm_clean_lines;
                    Some(c)
                }
                Err(e) if e.contains("holds no tiercache cache") => None,
                Err(e) => self.fail(&format!(
                    "CRASH ({pattern:?}) after device write {}: recovery failed: {e}",
                    self.device_writes
                )),
            }
        } else {
            None
        };
        let cores: Vec<u16> = self.cores.keys().copied().collect();
        for core in cores {
            let n = self.core_blocks(core);
            for b in 0..n {
                let got = post_crash(recovered.as_ref(), &images, core, b);
                // A clean block the recovery kept must equal the core's: else the block flips
                // once the line is evicted (SPEC point 3).
                let on_core = post_crash(None, &images, core, b);
                if got != on_core
                    && let Some(c) = recovered.as_ref()
                {
                    let bpl = c.config().line_size.blocks() as u64;
                    let (_, v, d) = c.line_state(CoreId(core), b / bpl).expect("from the cache");
                    let bit = b % bpl;
                    if v >> bit & 1 == 1 && d >> bit & 1 == 0 {
                        self.fail(&format!(
                            "CRASH ({pattern:?}) after device write {}: CLEAN COPY DIFFERS: core {core} block {b}: the recovered cache's clean copy holds {got:?}, the core {on_core:?} (a flip-flop once evicted)",
                            self.device_writes
                        ));
                    }
                }
                let legal = self.crash_legal(core, b);
                if !legal.contains(&got) {
                    let m = &self.cores[&core].1[b as usize];
                    self.fail(&format!(
                        "CRASH ({pattern:?}) after device write {}: core {core} block {b} would hold {got:?}; legal {legal:?}; history {:?} floor {}",
                        self.device_writes, m.history, m.floor
                    ));
                }
            }
        }
        (images, recovered)
    }

    /// A new environment after a crash: the recovered cache (or a cold one with `cfg`) over
    /// devices holding `images`; the oracle starts from what a read must now return. Cores
    /// the recovered cache does not know (a crash while adding them) are added again.
    pub fn restart(
        cfg: Config,
        seed: u64,
        knobs: Knobs,
        images: CrashImages,
        recovered: Option<Cache>,
    ) -> Env {
        let persistent = cfg.persist.is_some();
        let (cache, cache_dev) = match recovered {
            Some(c) => (c, Device::from_image(images.cache.clone())),
            None => {
                let blocks = images.cache.len() as u64 / BS as u64;
                let mut cfg = cfg;
                if let Some(p) = cfg.persist.as_mut() {
                    // No cache survived: create it again on the same device.
                    p.superblock.generation = 0;
                    p.superblock_copy = 1;
                }
                (Cache::new(cfg).expect("valid config"), Device::new(blocks))
            }
        };
        let mut env = Env::with_cache(cache, cache_dev, seed, knobs);
        // Write ids after the restart must not collide with ids the images already hold.
        env.next_write = 1 << 40;
        let values: BTreeMap<u16, Vec<Content>> = images
            .cores
            .keys()
            .map(|&c| {
                let n = (images.cores[&c].len() / BS) as u64;
                let vals = (0..n)
                    .map(|b| post_crash(Some(&env.cache).filter(|_| persistent), &images, c, b))
                    .collect();
                (c, vals)
            })
            .collect();
        for (core, img) in images.cores {
            let n = (img.len() / BS) as u64;
            if env.cache.core(CoreId(core)).is_some() {
                env.add_core_model(core, n);
            } else {
                env.add_core(core, n);
            }
            let (dev, model) = env.cores.get_mut(&core).expect("just added");
            for (b, c) in values[&core].iter().enumerate() {
                model[b].history = vec![(*c, true)];
            }
            *dev = Device::from_image(img);
        }
        env.settle();
        env
    }

    /// A clean stop, then a load of the cache from its device (warm), as a new environment
    /// with the same oracle. Nothing may change: every block must read as before.
    pub fn stop_and_reload(mut self, seed: u64) -> Env {
        self.drain();
        self.cache.stop();
        self.run_stop(false);
        let base = self.cache.config().clone();
        let img = &self.cache_dev.vol;
        let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            let s = off as usize;
            buf.copy_from_slice(&img[s..s + buf.len()]);
            Ok(())
        };
        let (cache, report) = tiercache_core::cache::open(&base, &mut read)
            .unwrap_or_else(|e| self.fail(&format!("load after a clean stop failed: {e}")));
        // A stop whose core flush failed writes the superblock `Running`: the load is then a
        // recovery, which keeps dirty lines only.
        let unclean = self.cache.meta_counters().stops_unclean > 0;
        assert!(
            report.clean != unclean,
            "a clean stop must load as clean (unless a core flush failed during it: {unclean})"
        );
        // Every line with data comes back, with the same blocks valid and dirty.
        let mut with_data = 0;
        for (&core, d) in &self.cores {
            let bpl = self.cache.config().line_size.blocks() as u64;
            for cl in 0..(d.1.len() as u64).div_ceil(bpl) {
                let before = self.cache.line_state(CoreId(core), cl);
                let Some((_, v, dd)) = before.filter(|x| x.1 != 0) else {
                    continue;
                };
                let after = cache.line_state(CoreId(core), cl).map(|x| (x.1, x.2));
                // After an unclean stop dirty lines come back, and clean blocks only of lines
                // the final checkpoint proved (all of the line's valid blocks, or only its
                // dirty ones).
                let (v, dd) = match (unclean, dd) {
                    (false, _) => (v, dd),
                    (true, _) if after == Some((v, dd)) => (v, dd),
                    (true, 0) => continue,
                    (true, d) => (d, d),
                };
                with_data += 1;
                if after != Some((v, dd)) {
                    self.fail(&format!(
                        "load after a clean stop: core {core} line {cl} was {:?}, loaded {after:?}",
                        (v, dd)
                    ));
                }
            }
        }
        assert_eq!(
            report.lines, with_data,
            "a clean load brings back every line"
        );
        let cache_dev = std::mem::replace(&mut self.cache_dev, Device::new(0));
        let mut env = Env::with_cache(cache, cache_dev, seed, self.knobs.clone());
        env.next_write = self.next_write;
        env.cores = std::mem::take(&mut self.cores);
        env.cov = self.cov.clone();
        // The checks the caller chose carry over (a crash test checks by crashing).
        env.check_durability = self.check_durability;
        env.settle();
        env
    }

    /// Reads every block of every core and checks it (through the cache).
    pub fn verify_all(&mut self) {
        let cores: Vec<(u16, u64)> = self
            .cores
            .iter()
            .map(|(&c, d)| (c, d.1.len() as u64))
            .collect();
        for (core, n) in cores {
            let mut b = 0;
            while b < n {
                let len = (n - b).min(64) as u32;
                self.submit(ReqOp::Read, core, b, len);
                b += len as u64;
                let saved = self.knobs.p_io_error;
                self.knobs.p_io_error = 0.0;
                self.drain();
                self.knobs.p_io_error = saved;
            }
        }
    }

    pub fn counters_into_coverage(&mut self) {
        let c = *self.cache.counters();
        self.cov.evictions_formerly_dirty += c.evictions_formerly_dirty;
        self.cov.writeback_races += c.writeback_races;
        self.cov.writebacks += c.writeback_lines;
        let f = *self.cache.faults();
        self.cov.lazy_write_fallbacks += f.lazy_write_fallbacks;
        self.cov.read_retries += f.read_retries_from_core;
        self.cov.recoveries += f.probes_ok;
        self.cov.writeback_failures += f.writeback_reads.failures;
        self.cov.writeback_retries += f.writeback_reads.retries;
        for core in self.cores.keys() {
            if let Some(cf) = self.cache.core_faults(CoreId(*core)) {
                self.cov.writeback_failures += cf.writeback.failures;
                self.cov.writeback_retries += cf.writeback.retries;
            }
        }
        for core in self.cores.keys() {
            if let Some(rc) = self.cache.core_counters(CoreId(*core)) {
                self.cov.partial_hits += rc.read.partial_hit + rc.write.partial_hit;
            }
        }
    }

    /// What core `core`'s device holds at block `b` (its volatile image: what a read returns).
    pub fn core_content(&self, core: u16, b: u64) -> Content {
        let d = &self.cores[&core].0;
        decode_block(&d.vol[b as usize * BS..(b as usize + 1) * BS], core, b)
    }

    /// Direct view of the oracle's newest content for a block (semantics tests).
    pub fn newest(&self, core: u16, b: u64) -> Content {
        self.cores[&core].1[b as usize].history.last().unwrap().0
    }

    pub fn pending_ios(&self) -> Vec<Action> {
        self.pending.iter().map(|(_, p)| p.action.clone()).collect()
    }

    pub fn req_ids(&self) -> HashMap<ReqId, ReqOp> {
        self.reqs.iter().map(|(k, v)| (*k, v.op)).collect()
    }

    /// A clean stop without reloading: drains, stops, waits until the stop is complete, and
    /// returns what every device holds (nothing is lost without a power cut: the volatile
    /// images). The environment stays usable for inspection only.
    pub fn stop_images(&mut self) -> CrashImages {
        self.drain();
        self.cache.stop();
        let mut guard = 0;
        while !self.cache.is_stopped() {
            if !self.complete_one() {
                self.now = self.now.plus(Nanos::from_ms(200));
                self.tick();
            }
            guard += 1;
            if guard > 1_000_000 {
                self.fail("stop never completed");
            }
        }
        CrashImages {
            cache: self.cache_dev.vol.clone(),
            cores: self
                .cores
                .iter()
                .map(|(&c, d)| (c, d.0.vol.clone()))
                .collect(),
        }
    }

    /// What each block of each core of `images` reads as once `cache` is loaded from
    /// `images.cache`: the cache's dirty copy if it has one, else the core image's.
    pub fn loaded_values(
        cache: Option<&Cache>,
        images: &CrashImages,
    ) -> BTreeMap<u16, Vec<Content>> {
        images
            .cores
            .iter()
            .map(|(&c, img)| {
                let n = (img.len() / BS) as u64;
                (c, (0..n).map(|b| post_crash(cache, images, c, b)).collect())
            })
            .collect()
    }

    /// Per block of every core, the contents a crash now may legally leave (the newest write
    /// covered by a completed flush or anything after it, or a write in flight).
    pub fn crash_legal_all(&self) -> BTreeMap<u16, Vec<HashSet<Content>>> {
        self.cores
            .keys()
            .map(|&c| {
                let n = self.core_blocks(c);
                (c, (0..n).map(|b| self.crash_legal(c, b)).collect())
            })
            .collect()
    }

    /// Like [`Env::restart`] with a loaded cache, but the oracle is given: every block of core
    /// `c` must read as `values[c][b]` (e.g. what loading an undamaged image gives). Cores the
    /// loaded cache does not know are added again, as `restart` does.
    pub fn restart_with_oracle(
        seed: u64,
        knobs: Knobs,
        images: CrashImages,
        cache: Cache,
        values: &BTreeMap<u16, Vec<Content>>,
    ) -> Env {
        let mut env = Env::with_cache(cache, Device::from_image(images.cache), seed, knobs);
        env.next_write = 1 << 40;
        for (core, img) in images.cores {
            let n = (img.len() / BS) as u64;
            if env.cache.core(CoreId(core)).is_some() {
                env.add_core_model(core, n);
            } else {
                env.add_core(core, n);
            }
            let (dev, model) = env.cores.get_mut(&core).expect("just added");
            for (b, c) in values[&core].iter().enumerate() {
                model[b].history = vec![(*c, true)];
            }
            *dev = Device::from_image(img);
        }
        env.settle();
        env
    }
}
