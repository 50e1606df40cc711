//! Mode `wl` against an oracle (SPEC C9, durability points 1-3 and 5; docs/TESTING.md).
//!
//! A seeded driver runs the write log over in-memory devices that model a volatile write cache
//! exactly (a flush makes durable only the writes completed before it was issued), completes
//! IOs in random order, injects errors, and checks:
//! - **reads** while running return, per block, the newest write acknowledged when the read
//!   arrived or a write in flight meanwhile;
//! - **crash**: at a random point, both devices lose their unflushed writes (all kept, all
//!   dropped, or torn per block); the log is scanned and reopened, every block must hold a
//!   legal value (the newest flushed write or a later one), then everything is written back,
//!   the power is cut again and every block must still read the same (no flip-flop);
//! - **cache loss**: at random points, the cores alone (the cache device thrown away) must
//!   equal "every generation up to some k, plus some writes of generation k+1".
//!
//! Failures print `TIERCACHE_WL_SEED=N`, which replays the run exactly.

mod harness;

use harness::{Content, Rng, decode_block, fill_block};
use std::collections::{BTreeMap, HashMap, HashSet};
use tiercache_core::Config;
use tiercache_core::event::{Action, BufRef, Dev, Event, IoError, ReqError};
use tiercache_core::units::{CoreId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::wl::pace::Pacing;
use tiercache_core::wl::{self, WlConfig, WriteLog};
use tiercache_format::crc::crc32c;
use tiercache_format::wlog::RING_OFFSET_BLOCKS;

const BS: usize = 512;
const CORE_BLOCKS: u64 = 384;
const LOG_BLOCKS: u64 = 8 + 420;

/// A device with a volatile write cache modelled write by write.
#[derive(Clone)]
struct Device {
    vol: Vec<u8>,
    dur: Vec<u8>,
    /// Unflushed blocks: block -> completion counter of the write that last touched it.
    unflushed: BTreeMap<u64, u64>,
    completed: u64,
}

impl Device {
    fn new(blocks: u64) -> Device {
        Device {
            vol: vec![0; blocks as usize * BS],
            dur: vec![0; blocks as usize * BS],
            unflushed: BTreeMap::new(),
            completed: 0,
        }
    }
    fn from_image(img: Vec<u8>) -> Device {
        Device {
            vol: img.clone(),
            dur: img,
            unflushed: BTreeMap::new(),
            completed: 0,
        }
    }
    fn write(&mut self, lba: u64, data: Option<&[u8]>, blocks: u32, fua: bool) {
        self.completed += 1;
        for i in 0..blocks as u64 {
            let s = ((lba + i) as usize) * BS;
            match data {
                Some(d) => self.vol[s..s + BS].copy_from_slice(&d[i as usize * BS..][..BS]),
                None => self.vol[s..s + BS].fill(0),
            }
            if fua {
                let v = self.vol[s..s + BS].to_vec();
                self.dur[s..s + BS].copy_from_slice(&v);
                self.unflushed.remove(&(lba + i));
            } else {
                self.unflushed.insert(lba + i, self.completed);
            }
        }
    }
    /// Completes a flush issued when `completed` was `mark`: writes completed up to then are
    /// durable (later ones on the same block keep the block unflushed, but the older content
    /// is what it would hold at least — we keep the newer too, conservatively not durable).
    fn flush(&mut self, mark: u64) {
        let done: Vec<u64> = self
            .unflushed
            .iter()
            .filter(|&(_, &w)| w <= mark)
            .map(|(&b, _)| b)
            .collect();
        for b in done {
            let s = b as usize * BS;
            let v = self.vol[s..s + BS].to_vec();
            self.dur[s..s + BS].copy_from_slice(&v);
            self.unflushed.remove(&b);
        }
    }
    fn crash_image(&self, pattern: u8, rng: &mut Rng) -> Vec<u8> {
        let mut img = self.dur.clone();
        for &b in self.unflushed.keys() {
            let keep = match pattern {
                0 => true,
                1 => false,
                _ => rng.chance(0.5),
            };
            if keep {
                let s = b as usize * BS;
                img[s..s + BS].copy_from_slice(&self.vol[s..s + BS]);
            }
        }
        img
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Write {
        fua: bool,
    },
    Zero {
        fua: bool,
    },
    Trim,
    Flush,
    /// A read of the recovery check: its buffer is kept, nothing is checked.
    ReadAll,
}

impl Op {
    fn writes(self) -> bool {
        matches!(self, Op::Write { .. } | Op::Zero { .. } | Op::Trim)
    }
}

struct ReqState {
    op: Op,
    core: u16,
    lba: u64,
    blocks: u32,
    buf: Vec<u8>,
    /// For reads: legal contents per block.
    legal: Vec<HashSet<Content>>,
    /// Ack counter at arrival (flushes).
    ack_mark: u64,
    content: Content,
}

/// Per block: completed writes in order with their ack number (`u64::MAX` for a write that
/// failed: its data may or may not have landed, so it stays legal until the next good write).
#[derive(Clone)]
struct Block {
    history: Vec<(Content, u64)>,
    floor: usize,
}

struct Sim {
    seed: u64,
    rng: Rng,
    wl: WriteLog,
    cfg: WlConfig,
    cache: Device,
    cores: Vec<Device>,
    pool: Vec<Vec<u8>>,
    reqs: HashMap<ReqId, ReqState>,
    ios: Vec<(Action, u64)>,
    next_req: u64,
    next_write_id: u64,
    now: u64,
    acks: u64,
    model: Vec<Vec<Block>>,
    /// (seq, gen, core, lba, blocks, content) of logged client entries, by request.
    issued: HashMap<ReqId, (u64, u64)>,
    entries: Vec<(u64, u64, u16, u64, u32, Content)>,
    err_rate: f64,
    cache_errors: bool,
    stats: Stats,
    /// Per block, its value at the start of this history (recovered values after a crash).
    base: Vec<Vec<Content>>,
    last_buf: Option<Vec<u8>>,
    /// After a crash, a cache-loss check after every this many completions while the
    /// recovered log is written back.
    replay_check_every: u64,
    /// What the log's health must say: `None` healthy, `Some(write_failed)` failing (an own
    /// IO failed and none of the kinds that failed succeeded since).
    log_failing: Option<bool>,
}

#[derive(Default, Debug)]
struct Stats {
    reads_checked: u64,
    writes: u64,
    flushes: u64,
    crashes: u64,
    loss_checks: u64,
    /// Cache-loss checks while a recovered log was written back.
    replay_loss_checks: u64,
    errors: u64,
    waits_for_space: u64,
    gens_retired: u64,
    prefix_retires: u64,
    device_writes: u64,
    /// Log IOs after which the log's health was checked, and episodes it reported.
    log_health_checks: u64,
    log_episodes: u64,
}

fn config(seed: u64) -> WlConfig {
    let mut rc = Config::new(16, LineSize::K4);
    rc.data_offset = Lba(LOG_BLOCKS);
    rc.pool_slots = 4;
    rc.pool_slot_blocks = 16;
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&seed.to_le_bytes());
    WlConfig {
        cache_id: id,
        log_start: Lba(0),
        log_blocks: LOG_BLOCKS,
        gen_max_writes: 1 + (seed % 7) as u32,
        gen_max_blocks: 64,
        staging_slots: 2 + (seed % 3) as u32,
        // Every other seed paces writeback (it holds while requests keep coming and the log
        // is under a quarter full; the steps' ticks reach the idle and expiry times). The
        // writeback depth (1-6 entries in flight) varies too.
        pacing: if seed.is_multiple_of(2) {
            Pacing {
                depth: 1 + (seed / 3 % 6) as u32,
                ..Pacing::ALWAYS
            }
        } else {
            Pacing {
                background_fill_pct: 25,
                idle: Nanos::from_ms(100),
                expire: Nanos::from_secs(1),
                depth: 1 + (seed / 3 % 6) as u32,
            }
        },
        read_cache: rc,
    }
}

fn cache_blocks() -> u64 {
    LOG_BLOCKS + 16 * 8
}

impl Sim {
    fn new(seed: u64, cores: u16) -> Sim {
        Sim::created(seed, config(seed), cores)
    }

    /// A new log of configuration `cfg` on a blank cache device, ready.
    fn created(seed: u64, cfg: WlConfig, cores: u16) -> Sim {
        let wl = WriteLog::create(cfg.clone()).expect("create");
        let mut s = Sim::with(seed, wl, cfg, Device::new(cache_blocks()), cores, None);
        s.settle_ready();
        s
    }

    fn with(
        seed: u64,
        mut wl: WriteLog,
        cfg: WlConfig,
        cache: Device,
        ncores: u16,
        cores: Option<Vec<Device>>,
    ) -> Sim {
        for c in 0..ncores {
            wl.add_core(CoreId(c), CORE_BLOCKS).expect("core");
        }
        let pool = (0..wl.pool_slots())
            .map(|_| vec![0u8; wl.pool_slot_blocks() as usize * BS])
            .collect();
        Sim {
            seed,
            rng: Rng::new(seed),
            wl,
            cfg,
            cache,
            cores: cores.unwrap_or_else(|| (0..ncores).map(|_| Device::new(CORE_BLOCKS)).collect()),
            pool,
            reqs: HashMap::new(),
            ios: Vec::new(),
            next_req: 1,
            next_write_id: 1 + seed * 1_000_000,
            now: 0,
            acks: 0,
            model: (0..ncores)
                .map(|_| {
                    vec![
                        Block {
                            history: vec![(Content::Zero, 0)],
                            floor: 0,
                        };
                        CORE_BLOCKS as usize
                    ]
                })
                .collect(),
            issued: HashMap::new(),
            entries: Vec::new(),
            err_rate: 0.0,
            cache_errors: false,
            stats: Stats::default(),
            log_failing: None,
            base: vec![vec![Content::Zero; CORE_BLOCKS as usize]; ncores as usize],
            last_buf: None,
            replay_check_every: 3,
        }
    }

    fn fail(&self, msg: &str) -> ! {
        panic!(
            "{msg}\n  replay: TIERCACHE_WL_SEED={} cargo test -p tiercache-core --test wl",
            self.seed
        )
    }

    fn apply(&mut self, ev: Event) {
        let mut acts = Vec::new();
        let reqs = &self.reqs;
        let mut crc = |r: ReqId| crc32c(&reqs[&r].buf);
        self.wl.apply(Nanos(self.now), ev, &mut acts, &mut crc);
        for (r, seq, g) in self.wl.take_issued() {
            self.issued.insert(r, (seq, g));
            // Recorded when logged, not when acknowledged: a FUA write's entry may be written
            // back before its flush lets it be acknowledged.
            let q = &self.reqs[&r];
            self.entries
                .push((seq, g, q.core, q.lba, q.blocks, q.content));
        }
        self.execute(acts);
    }

    fn execute(&mut self, acts: Vec<Action>) {
        for a in acts {
            match a {
                Action::Copy { src, dst, blocks } => {
                    let d = self.buf_read(src, blocks);
                    self.buf_slice(dst, blocks).copy_from_slice(&d);
                }
                Action::Complete { req, result } => self.on_complete(req, result),
                io => {
                    let mark = match &io {
                        Action::Flush { dev, .. } => self.dev(*dev).completed,
                        _ => 0,
                    };
                    self.ios.push((io, mark));
                }
            }
        }
    }

    fn dev(&mut self, d: Dev) -> &mut Device {
        match d {
            Dev::Cache => &mut self.cache,
            Dev::Core(c) => &mut self.cores[c.0 as usize],
        }
    }

    fn buf_slice(&mut self, b: BufRef, blocks: u32) -> &mut [u8] {
        let n = blocks as usize * BS;
        match b {
            BufRef::Req { req, offset } => {
                &mut self.reqs.get_mut(&req).expect("live request").buf[offset as usize * BS..][..n]
            }
            BufRef::Pool { slot, offset } => {
                &mut self.pool[slot as usize][offset as usize * BS..][..n]
            }
            BufRef::Meta { .. } => unreachable!("meta buffers are sources only"),
        }
    }

    fn buf_read(&self, b: BufRef, blocks: u32) -> Vec<u8> {
        let n = blocks as usize * BS;
        match b {
            BufRef::Req { req, offset } => {
                self.reqs[&req].buf[offset as usize * BS..][..n].to_vec()
            }
            BufRef::Pool { slot, offset } => {
                self.pool[slot as usize][offset as usize * BS..][..n].to_vec()
            }
            BufRef::Meta { id, offset } => {
                self.wl.meta_buf(id)[offset as usize * BS..][..n].to_vec()
            }
        }
    }

    /// Completes one random IO in flight.
    fn complete_one(&mut self) -> bool {
        if self.ios.is_empty() {
            return false;
        }
        let i = self.rng.below(self.ios.len() as u64) as usize;
        let (a, mark) = self.ios.swap_remove(i);
        let (io, dev) = match &a {
            Action::Read { io, dev, .. }
            | Action::Write { io, dev, .. }
            | Action::WriteZeroes { io, dev, .. }
            | Action::Trim { io, dev, .. }
            | Action::Flush { io, dev } => (*io, *dev),
            _ => unreachable!(),
        };
        let may_fail = match dev {
            Dev::Cache => self.cache_errors,
            Dev::Core(_) => true,
        };
        let fail = may_fail && self.err_rate > 0.0 && self.rng.chance(self.err_rate);
        if fail {
            self.stats.errors += 1;
        }
        if matches!(
            a,
            Action::Write { .. } | Action::WriteZeroes { .. } | Action::Trim { .. }
        ) {
            self.stats.device_writes += 1;
        }
        match a {
            Action::Read {
                dev,
                lba,
                blocks,
                buf,
                ..
            } => {
                let data = if fail {
                    vec![0xEE; blocks as usize * BS]
                } else {
                    self.dev(dev).vol[lba.0 as usize * BS..][..blocks as usize * BS].to_vec()
                };
                self.buf_slice(buf, blocks).copy_from_slice(&data);
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
                if !fail {
                    self.dev(dev).write(lba.0, Some(&data), blocks, fua);
                } else {
                    // A failed write lands on a random prefix of its blocks.
                    let n = self.rng.below(blocks as u64 + 1) as u32;
                    self.dev(dev).write(lba.0, Some(&data), n, false);
                }
            }
            Action::WriteZeroes {
                dev,
                lba,
                blocks,
                fua,
                ..
            } => {
                if !fail {
                    self.dev(dev).write(lba.0, None, blocks, fua);
                }
            }
            Action::Trim {
                dev, lba, blocks, ..
            } => {
                if !fail {
                    self.dev(dev).write(lba.0, None, blocks, false);
                }
            }
            Action::Flush { dev, .. } => {
                if !fail {
                    self.dev(dev).flush(mark);
                }
            }
            _ => unreachable!(),
        }
        let result = if fail { Err(IoError::Io) } else { Ok(()) };
        let reads = matches!(a, Action::Read { .. });
        self.apply(Event::IoDone { io, result });
        if io.0 & 1 == 1 {
            self.check_log_health(fail, reads);
        }
        true
    }

    /// After an IO of the log itself (odd ids): the log device is reported failing from a
    /// failed IO until an IO of the kinds that failed succeeds (a write or flush once one of
    /// those failed), and while it is, the cache is degraded with every logged block not yet
    /// written back at risk.
    fn check_log_health(&mut self, failed: bool, read: bool) {
        self.log_failing = match (failed, self.log_failing) {
            (true, prev) => Some(prev.unwrap_or(false) || !read),
            (false, Some(true)) if read => Some(true),
            (false, _) => None,
        };
        self.stats.log_health_checks += 1;
        let p = self.wl.log_problem();
        if p.is_some() != self.log_failing.is_some() {
            self.fail(&format!(
                "LOG HEALTH: after a {} log {} the log reports {p:?}, want failing = {}",
                if failed { "failed" } else { "good" },
                if read { "read" } else { "write or flush" },
                self.log_failing.is_some()
            ));
        }
        let h = self.wl.health();
        if p.is_some()
            && (h.state != tiercache_core::cache::HealthState::Degraded
                || h.dirty_at_risk_blocks != self.wl.pending(None).1)
        {
            self.fail(&format!("LOG HEALTH: failing log, but health {h:?}"));
        }
        self.stats.log_episodes = self.wl.log_episodes();
    }

    fn legal_now(&self, core: u16, b: u64) -> HashSet<Content> {
        let mut s = HashSet::new();
        let h = &self.model[core as usize][b as usize].history;
        let last_good = h
            .iter()
            .rposition(|&(_, a)| a != u64::MAX)
            .expect("history");
        s.extend(h[last_good..].iter().map(|x| x.0));
        for r in self.reqs.values() {
            if r.op.writes() && r.core == core && b >= r.lba && b < r.lba + r.blocks as u64 {
                s.insert(r.content);
            }
        }
        s
    }

    fn submit(&mut self, op: Op, core: u16, lba: u64, blocks: u32) -> ReqId {
        let req = ReqId(self.next_req);
        self.next_req += 1;
        let mut buf = vec![0u8; blocks as usize * BS];
        let content = match op {
            Op::Write { .. } => {
                let id = self.next_write_id;
                self.next_write_id += 1;
                for i in 0..blocks as u64 {
                    fill_block(&mut buf[i as usize * BS..][..BS], core, lba + i, id);
                }
                Content::Write(id)
            }
            _ => Content::Zero,
        };
        let mut legal = Vec::new();
        if op == Op::Read {
            legal = (0..blocks as u64)
                .map(|i| self.legal_now(core, lba + i))
                .collect();
        } else if op.writes() {
            // Reads in flight may see this write.
            for r in self.reqs.values_mut() {
                if r.op == Op::Read && r.core == core {
                    for i in 0..blocks as u64 {
                        let b = lba + i;
                        if b >= r.lba && b < r.lba + r.blocks as u64 {
                            r.legal[(b - r.lba) as usize].insert(content);
                        }
                    }
                }
            }
        }
        self.reqs.insert(
            req,
            ReqState {
                op,
                core,
                lba,
                blocks,
                buf,
                legal,
                ack_mark: self.acks,
                content,
            },
        );
        let (c, l) = (CoreId(core), Lba(lba));
        let ev = match op {
            Op::Read => Event::Read {
                req,
                core: c,
                lba: l,
                blocks,
            },
            Op::Write { fua } => Event::Write {
                req,
                core: c,
                lba: l,
                blocks,
                fua,
            },
            Op::Zero { fua } => Event::WriteZeroes {
                req,
                core: c,
                lba: l,
                blocks,
                fua,
            },
            Op::Trim => Event::Trim {
                req,
                core: c,
                lba: l,
                blocks,
            },
            Op::Flush => Event::Flush { req, core: c },
            Op::ReadAll => unreachable!("read_all submits its own"),
        };
        self.apply(ev);
        req
    }

    fn on_complete(&mut self, req: ReqId, result: Result<(), ReqError>) {
        let r = self
            .reqs
            .remove(&req)
            .expect("completion of a live request");
        if std::env::var("TIERCACHE_TRACE").is_ok() {
            eprintln!(
                "complete {req:?} {:?} core {} lba {} +{} {:?} {result:?} issued {:?}",
                r.op,
                r.core,
                r.lba,
                r.blocks,
                r.content,
                self.issued.get(&req)
            );
        }
        match r.op {
            Op::ReadAll => {
                if result.is_err() {
                    self.fail("a recovery read failed");
                }
                self.last_buf = Some(r.buf);
            }
            Op::Read => {
                if result.is_err() {
                    return;
                }
                self.stats.reads_checked += 1;
                for i in 0..r.blocks as u64 {
                    let b = r.lba + i;
                    let got = decode_block(&r.buf[i as usize * BS..][..BS], r.core, b);
                    if !r.legal[i as usize].contains(&got) {
                        self.fail(&format!(
                            "STALE READ: core {} block {b}: got {got:?}, legal {:?}",
                            r.core, r.legal[i as usize]
                        ));
                    }
                }
            }
            Op::Flush => {
                if result.is_ok() {
                    self.stats.flushes += 1;
                    for core in &mut self.model {
                        for blk in core.iter_mut() {
                            let i = blk
                                .history
                                .iter()
                                .rposition(|&(_, a)| a <= r.ack_mark)
                                .unwrap_or(0);
                            blk.floor = blk.floor.max(i);
                        }
                    }
                }
            }
            _ => {
                let issued = self.issued.remove(&req);
                if result.is_err() {
                    for i in 0..r.blocks as u64 {
                        let blk = &mut self.model[r.core as usize][(r.lba + i) as usize];
                        blk.history.push((r.content, u64::MAX));
                    }
                    return;
                }
                self.stats.writes += 1;
                self.acks += 1;
                let fua = matches!(r.op, Op::Write { fua: true } | Op::Zero { fua: true });
                for i in 0..r.blocks as u64 {
                    let blk = &mut self.model[r.core as usize][(r.lba + i) as usize];
                    blk.history.push((r.content, self.acks));
                    if fua {
                        blk.floor = blk.history.len() - 1;
                    }
                }
                if issued.is_none() {
                    self.fail("acknowledged write without a log entry");
                }
            }
        }
    }

    fn settle_ready(&mut self) {
        let mut n = 0;
        while !self.wl.is_ready() {
            if !self.complete_one() {
                self.now += 1_000_000;
                self.apply(Event::Tick);
            }
            n += 1;
            assert!(n < 100_000, "the log never became ready");
        }
    }

    /// Runs until nothing is in flight and everything is written back.
    fn drain(&mut self) {
        self.complete_until_clean(None);
    }

    /// Completes IOs (ticking when none is in flight) until no request is left and the log is
    /// clean; with `loss_check_every`, a cache-loss check after every that many steps.
    fn complete_until_clean(&mut self, loss_check_every: Option<u64>) {
        let mut n = 0u64;
        while !(self.reqs.is_empty() && self.ios.is_empty() && self.wl.is_clean()) {
            if !self.complete_one() {
                self.now += 60_000_000;
                self.apply(Event::Tick);
            }
            n += 1;
            if loss_check_every.is_some_and(|k| n.is_multiple_of(k)) {
                let imgs: Vec<Vec<u8>> = self.cores.iter().map(|d| d.vol.clone()).collect();
                self.cache_loss_check(&imgs);
                self.stats.replay_loss_checks += 1;
            }
            if n > 1_000_000 {
                self.fail("drain does not end");
            }
        }
    }

    /// Asks for a drain (as `tiercache writeback` does) and runs it like [`Sim::drain`], with a
    /// cache-loss check after every `replay_check_every` completions.
    fn drain_checking_cache_loss(&mut self) {
        self.wl.drain();
        self.complete_until_clean(Some(self.replay_check_every));
    }

    fn random_step(&mut self, ncores: u16) {
        let core = self.rng.below(ncores as u64) as u16;
        let big = self.rng.chance(0.1);
        let blocks = 1 + self.rng.below(if big { 40 } else { 8 }) as u32;
        let lba = self.rng.below(CORE_BLOCKS - blocks as u64 + 1);
        let in_flight = self.reqs.len();
        let r = self.rng.below(100);
        if in_flight < 12 {
            let op = match r {
                0..=34 => Some(Op::Read),
                35..=69 => Some(Op::Write { fua: false }),
                70..=74 => Some(Op::Write { fua: true }),
                75..=79 => Some(Op::Trim),
                80..=83 => Some(Op::Zero {
                    fua: self.rng.chance(0.3),
                }),
                84..=87 => Some(Op::Flush),
                _ => None,
            };
            if let Some(op) = op {
                self.submit(op, core, lba, blocks);
                return;
            }
        }
        if !self.complete_one() || self.rng.chance(0.05) {
            self.now += self.rng.below(80_000_000);
            self.apply(Event::Tick);
        }
    }

    /// Checks the cores alone (cache device lost) against "generations up to k, plus some
    /// writes of k+1".
    fn cache_loss_check(&mut self, images: &[Vec<u8>]) {
        self.stats.loss_checks += 1;
        let mut ents = self.entries.clone();
        ents.sort_by_key(|e| e.0);
        let max_gen = ents.iter().map(|e| e.1).max().unwrap_or(0);
        let ncores = images.len();
        let mut state: Vec<Vec<Content>> = vec![vec![Content::Zero; CORE_BLOCKS as usize]; ncores];
        let mut got: Vec<Vec<Content>> = Vec::new();
        for (c, img) in images.iter().enumerate() {
            got.push(
                (0..CORE_BLOCKS)
                    .map(|b| decode_block(&img[b as usize * BS..][..BS], c as u16, b))
                    .collect(),
            );
        }
        // Blocks written before this run's history (after a crash) start as the recovered values.
        for (c, core) in self.base.iter().enumerate() {
            for (b, v) in core.iter().enumerate() {
                state[c][b] = *v;
            }
        }
        let mut best = None;
        for k in 0..=max_gen + 1 {
            // Generation k+1's contents per block.
            let mut next: HashMap<(usize, u64), Vec<Content>> = HashMap::new();
            for e in ents.iter().filter(|e| e.1 == k + 1) {
                for i in 0..e.4 as u64 {
                    next.entry((e.2 as usize, e.3 + i)).or_default().push(e.5);
                }
            }
            let mut bad = Vec::new();
            for c in 0..ncores {
                for b in 0..CORE_BLOCKS {
                    let g = got[c][b as usize];
                    if !(g == state[c][b as usize]
                        || next.get(&(c, b)).is_some_and(|v| v.contains(&g)))
                    {
                        bad.push((c, b, g, state[c][b as usize]));
                    }
                }
            }
            if bad.is_empty() {
                return;
            }
            if best
                .as_ref()
                .is_none_or(|(_, v): &(u64, Vec<_>)| bad.len() < v.len())
            {
                best = Some((k, bad));
            }
            for e in ents.iter().filter(|e| e.1 == k + 1) {
                for i in 0..e.4 as u64 {
                    state[e.2 as usize][(e.3 + i) as usize] = e.5;
                }
            }
        }
        let (k, bad) = best.expect("some k");
        self.fail(&format!(
            "CACHE LOSS: the cores are not a prefix of sync generations; closest: k={k}, {} blocks off, e.g. (core, block, holds, expected) {:?}",
            bad.len(),
            &bad[..bad.len().min(4)]
        ));
    }
}

impl Sim {
    /// A power cut now: both devices lose unflushed writes by `pattern`; the log is scanned
    /// and reopened over the survivors; every block must be legal; then a writeback, a second
    /// power cut with nothing unflushed, and a reread that must match (no flip-flop).
    fn crash_and_recover(mut self, pattern: u8) -> Sim {
        self.stats.crashes += 1;
        let ncores = self.cores.len() as u16;
        let cache_img = self.cache.crash_image(pattern, &mut self.rng);
        let core_imgs: Vec<Vec<u8>> = self
            .cores
            .iter()
            .map(|d| d.crash_image(pattern, &mut self.rng.clone()))
            .collect();
        // Legal values per block after the crash.
        let mut legal: Vec<Vec<HashSet<Content>>> = Vec::new();
        for c in 0..ncores as usize {
            let mut v = Vec::new();
            for b in 0..CORE_BLOCKS {
                let blk = &self.model[c][b as usize];
                let mut s: HashSet<Content> =
                    blk.history[blk.floor..].iter().map(|h| h.0).collect();
                for r in self.reqs.values() {
                    if r.op.writes()
                        && r.core as usize == c
                        && b >= r.lba
                        && b < r.lba + r.blocks as u64
                    {
                        s.insert(r.content);
                    }
                }
                v.push(s);
            }
            legal.push(v);
        }
        let mut sim = reopen(
            self.seed,
            &self.cfg,
            cache_img,
            core_imgs,
            ncores,
            &mut self.stats,
        );
        // Even seeds write the recovered log back first, losing the cache (in the check) along
        // the way: the cores must stay a prefix of this history's generations (the recovered
        // entries are a prefix of its log). Odd seeds read first (reads served by the
        // recovered log index, its writeback going on meanwhile).
        if self.seed.is_multiple_of(2) && !self.cache_errors {
            sim.entries = self.entries.clone();
            sim.base = self.base.clone();
            sim.replay_check_every = self.replay_check_every;
            sim.drain_checking_cache_loss();
            sim.entries.clear();
        }
        let values = sim.read_all();
        for c in 0..ncores as usize {
            for b in 0..CORE_BLOCKS as usize {
                if !legal[c][b].contains(&values[c][b]) {
                    let name = ["Kept", "Dropped", "Torn"][pattern as usize];
                    sim.fail(&format!(
                        "CRASH ({name}): core {c} block {b} holds {:?} after recovery, legal {:?}",
                        values[c][b], legal[c][b]
                    ));
                }
            }
        }
        // Write everything back, cut the power again, and read again: same values.
        sim.drain();
        let cache_img = sim.cache.crash_image(1, &mut sim.rng);
        let core_imgs: Vec<Vec<u8>> = sim
            .cores
            .iter()
            .map(|d| d.crash_image(1, &mut Rng::new(1)))
            .collect();
        let mut stats = std::mem::take(&mut sim.stats);
        let mut again = reopen(
            self.seed, &self.cfg, cache_img, core_imgs, ncores, &mut stats,
        );
        let values2 = again.read_all();
        if values != values2 {
            again.fail("FLIP-FLOP: a block changed across a second restart");
        }
        again.rng = Rng::new(self.rng.next());
        again.next_write_id = self.next_write_id;
        again.set_base(&values);
        again
    }

    fn set_base(&mut self, values: &[Vec<Content>]) {
        self.base = values.to_vec();
        for (c, core) in values.iter().enumerate() {
            for (b, v) in core.iter().enumerate() {
                self.model[c][b] = Block {
                    history: vec![(*v, 0)],
                    floor: 0,
                };
            }
        }
        self.entries.clear();
    }

    /// Reads every block of every core through the log.
    fn read_all(&mut self) -> Vec<Vec<Content>> {
        let ncores = self.cores.len() as u16;
        let mut out = Vec::new();
        for c in 0..ncores {
            let mut v = Vec::new();
            let mut lba = 0;
            while lba < CORE_BLOCKS {
                let n = 32.min(CORE_BLOCKS - lba) as u32;
                let req = ReqId(self.next_req);
                self.next_req += 1;
                self.reqs.insert(
                    req,
                    ReqState {
                        op: Op::ReadAll,
                        core: c,
                        lba,
                        blocks: n,
                        buf: vec![0; n as usize * BS],
                        legal: Vec::new(),
                        ack_mark: u64::MAX,
                        content: Content::Zero,
                    },
                );
                self.apply(Event::Read {
                    req,
                    core: CoreId(c),
                    lba: Lba(lba),
                    blocks: n,
                });
                while self.reqs.contains_key(&req) {
                    if !self.complete_one_no_errors() {
                        self.now += 60_000_000;
                        self.apply(Event::Tick);
                    }
                }
                let buf = self.last_buf.take().expect("read buffer");
                for i in 0..n as u64 {
                    v.push(decode_block(&buf[i as usize * BS..][..BS], c, lba + i));
                }
                lba += n as u64;
            }
            out.push(v);
        }
        out
    }

    fn complete_one_no_errors(&mut self) -> bool {
        let r = self.err_rate;
        self.err_rate = 0.0;
        let x = self.complete_one();
        self.err_rate = r;
        x
    }
}

fn reopen(
    seed: u64,
    cfg: &WlConfig,
    cache_img: Vec<u8>,
    core_imgs: Vec<Vec<u8>>,
    ncores: u16,
    stats: &mut Stats,
) -> Sim {
    let cache = Device::from_image(cache_img);
    let mut read = |lba: Lba, buf: &mut [u8]| -> Result<(), String> {
        buf.copy_from_slice(&cache.vol[lba.0 as usize * BS..][..buf.len()]);
        Ok(())
    };
    let rec = wl::scan(cfg, &mut read).unwrap_or_else(|e| {
        panic!("RECOVERY FAILED: {e}\n  replay: TIERCACHE_WL_SEED={seed} cargo test -p tiercache-core --test wl")
    });
    let wl = WriteLog::open(cfg.clone(), rec).expect("open");
    let cores = core_imgs.into_iter().map(Device::from_image).collect();
    let mut sim = Sim::with(seed, wl, cfg.clone(), cache, ncores, Some(cores));
    sim.stats = std::mem::take(stats);
    sim.settle_ready();
    sim
}

fn run_seed(seed: u64) -> Stats {
    let ncores = 1 + (seed % 2) as u16;
    let mut sim = Sim::new(seed, ncores);
    sim.err_rate = if seed.is_multiple_of(3) { 0.0 } else { 0.02 };
    // Cache-device errors make "which writes reached the log" unknowable to the cache-loss
    // check; they run in the seeds that skip it.
    sim.cache_errors = seed % 3 == 2;
    let steps = 1500;
    let crash_at = if seed % 4 == 3 {
        None
    } else {
        Some(200 + (seed * 7919) % 1200)
    };
    for step in 0..steps {
        sim.random_step(ncores);
        if !sim.cache_errors && step % 97 == 0 {
            let imgs: Vec<Vec<u8>> = sim.cores.iter().map(|d| d.vol.clone()).collect();
            sim.cache_loss_check(&imgs);
        }
        if Some(step) == crash_at {
            let pattern = (seed % 3) as u8;
            sim = sim.crash_and_recover(pattern);
            sim.err_rate = if seed.is_multiple_of(3) { 0.0 } else { 0.02 };
            sim.cache_errors = seed % 3 == 2;
        }
    }
    sim.drain();
    if !sim.cache_errors {
        let imgs: Vec<Vec<u8>> = sim.cores.iter().map(|d| d.vol.clone()).collect();
        sim.cache_loss_check(&imgs);
    }
    // After a full writeback the cores alone hold the newest data.
    let vals = sim.read_all();
    #[allow(clippy::needless_range_loop)]
    for c in 0..ncores as usize {
        for b in 0..CORE_BLOCKS as usize {
            let h = &sim.model[c][b].history;
            let last_good = h
                .iter()
                .rposition(|&(_, a)| a != u64::MAX)
                .expect("history");
            let legal: HashSet<Content> = h[last_good..].iter().map(|x| x.0).collect();
            let newest = h[last_good].0;
            let on_core = decode_block(&sim.cores[c].vol[b * BS..][..BS], c as u16, b as u64);
            if !legal.contains(&vals[c][b]) || on_core != vals[c][b] {
                sim.fail(&format!(
                    "after writeback core {c} block {b}: read {:?}, core holds {on_core:?}, newest {newest:?}",
                    vals[c][b]
                ));
            }
        }
    }
    sim.stats.waits_for_space = sim.wl.counters().waited_for_space;
    sim.stats.gens_retired = sim.wl.counters().gens_retired;
    sim.stats.prefix_retires = sim.wl.counters().prefix_retires;
    sim.stats
}

/// Runs `seed`'s workload for `steps` steps with a power cut right after device write number
/// `crash_after` completes (`pattern`: 0 all unflushed writes kept, 1 all dropped, 2+ torn per
/// block, seeded by the pattern number), then recovery, the legality check, writeback, a second
/// power cut and the no-flip-flop check (all in `crash_and_recover`). Returns the device
/// writes the run completed before the crash (all of them without one).
fn run_crash_at(seed: u64, steps: u64, crash_after: Option<u64>, pattern: u8) -> (u64, Stats) {
    let mut sim = Sim::new(seed, 1);
    sim.err_rate = 0.0;
    sim.cache_errors = false;
    for _ in 0..steps {
        sim.random_step(1);
        if crash_after.is_some_and(|n| sim.stats.device_writes >= n) {
            let at = sim.stats.device_writes;
            for _ in 2..pattern {
                sim.rng.next();
            }
            let sim = sim.crash_and_recover(pattern.min(2));
            return (at, sim.stats);
        }
    }
    let n = sim.stats.device_writes;
    (n, sim.stats)
}

/// SPEC R1 for `wl`: a power cut after every single device write of a workload (log headers
/// and data, void headers, log superblocks, the read cache's metadata, writeback to the core,
/// flushes in between), with the unflushed writes all kept, all dropped, and two seeded torn
/// patterns. `TIERCACHE_WL_ENUM_SEEDS=N` enumerates N workloads (4 in CI).
#[test]
fn crash_at_every_device_write() {
    let seeds = std::env::var("TIERCACHE_WL_ENUM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4u64);
    let steps = 300;
    let (mut points, mut runs, mut total_writes) = (0u64, 0u64, 0u64);
    for seed in 10_000..10_000 + seeds {
        let (writes, _) = run_crash_at(seed, steps, None, 0);
        total_writes += writes;
        // A step completes at most one IO, but the log may complete several writes at once
        // (those it answers itself): each crash lands at the first step boundary at or after
        // write i, so consecutive i may share a point.
        let mut last = 0;
        for i in 1..=writes {
            let (at, _) = run_crash_at(seed, steps, Some(i), 0);
            if at == last {
                continue;
            }
            last = at;
            for pattern in 1..4u8 {
                let (_, st) = run_crash_at(seed, steps, Some(i), pattern);
                assert_eq!(st.crashes, 1);
                runs += 1;
            }
            runs += 1;
            points += 1;
        }
    }
    println!(
        "wl crash enumeration: {seeds} workloads, {total_writes} device writes, {points} distinct crash points (the step boundary after each write), {runs} recoveries checked (kept, dropped, 2 torn patterns each); 0 violations"
    );
    assert!(points > 0);
}

#[test]
fn write_log_against_the_oracle() {
    let seeds: Vec<u64> = match std::env::var("TIERCACHE_WL_SEED") {
        Ok(s) => vec![s.parse().expect("seed")],
        Err(_) => {
            let n = std::env::var("TIERCACHE_WL_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(600);
            (0..n).collect()
        }
    };
    let mut total = Stats::default();
    for s in seeds {
        let st = run_seed(s);
        total.reads_checked += st.reads_checked;
        total.writes += st.writes;
        total.flushes += st.flushes;
        total.crashes += st.crashes;
        total.loss_checks += st.loss_checks;
        total.replay_loss_checks += st.replay_loss_checks;
        total.errors += st.errors;
        total.waits_for_space += st.waits_for_space;
        total.gens_retired += st.gens_retired;
        total.prefix_retires += st.prefix_retires;
        total.log_health_checks += st.log_health_checks;
        total.log_episodes += st.log_episodes;
    }
    println!("wl oracle: {total:?}");
    assert!(total.crashes > 0 && total.loss_checks > 0 && total.reads_checked > 0);
    assert!(
        total.replay_loss_checks > 0,
        "no cache loss was checked while a recovered log was written back"
    );
    assert!(
        total.log_episodes > 0,
        "no log device error episode was checked"
    );
}

/// Pacing (`wl::pace`): while requests keep coming and the log is under its background fill,
/// nothing is written back; writeback goes once the clients are idle, a drain is asked for,
/// the log reaches the background fill, or the oldest entry expires — and everything read
/// meanwhile is still checked against the oracle.
#[test]
fn paced_writeback_holds_while_busy_and_goes_when_idle_drained_full_or_expired() {
    const MS: u64 = 1_000_000;
    let mut cfg = config(1);
    cfg.gen_max_writes = 10_000;
    cfg.gen_max_blocks = 10_000;
    cfg.pacing = Pacing {
        background_fill_pct: 50,
        idle: Nanos::from_ms(100),
        expire: Nanos::from_secs(1),
        depth: 8,
    };
    let mut s = Sim::created(1, cfg, 1);
    let mut lba = 0u64;
    // `n` one-block writes `gap` apart, each finished (with what it set off) before the next,
    // and a checked read of the block after each.
    let busy = |s: &mut Sim, lba: &mut u64, n: usize, gap: u64| {
        for _ in 0..n {
            s.now += gap;
            s.submit(Op::Write { fua: false }, 0, *lba, 1);
            while s.complete_one() {}
            s.submit(Op::Read, 0, *lba, 1);
            while s.complete_one() {}
            *lba = (*lba + 7) % CORE_BLOCKS;
        }
    };
    let fill = |s: &Sim| {
        let (u, r) = s.wl.log_fill();
        u * 100 / r
    };
    let core_writes = |s: &Sim| s.cores[0].completed;
    let settle = |s: &mut Sim| {
        while s.complete_one() {}
    };

    // Busy, the log under half full: nothing reaches the core.
    busy(&mut s, &mut lba, 40, MS);
    assert!((10..50).contains(&fill(&s)), "fill {}%", fill(&s));
    assert_eq!(
        core_writes(&s),
        0,
        "writeback went while the clients were busy"
    );
    // Idle for 100 ms: everything is written back and retired.
    assert_eq!(s.wl.next_deadline(), Some(Nanos(s.now + 100 * MS)));
    s.now += 100 * MS;
    s.apply(Event::Tick);
    settle(&mut s);
    assert_eq!(core_writes(&s), 40);
    assert!(s.wl.is_clean(), "the idle log was not drained");

    // Busy again; a drain makes writeback go at once.
    busy(&mut s, &mut lba, 40, MS);
    assert_eq!(core_writes(&s), 40);
    s.wl.drain();
    s.apply(Event::Tick);
    settle(&mut s);
    assert_eq!(core_writes(&s), 80, "the drain did not write back");
    assert!(s.wl.is_clean());

    // Busy until the log is half full: writeback goes while the clients still write.
    busy(&mut s, &mut lba, 130, MS);
    assert!(
        core_writes(&s) > 80,
        "nothing written back at {}% full",
        fill(&s)
    );
    s.now += 100 * MS;
    s.apply(Event::Tick);
    settle(&mut s);
    assert!(s.wl.is_clean());

    // A slow, steady writer (never idle for 100 ms): held until the oldest entry is 1 s old.
    let before = core_writes(&s);
    busy(&mut s, &mut lba, 19, 50 * MS);
    assert_eq!(core_writes(&s), before, "written back before the expiry");
    busy(&mut s, &mut lba, 2, 50 * MS);
    assert!(
        core_writes(&s) > before,
        "the expired entries were not written back"
    );
    s.drain();
}

/// After a whole generation is retired, the next one is written back only once the log
/// superblock with the new tail is durable. Otherwise a crash before that superblock would
/// make recovery write the retired generation again over the next one's writes on the core,
/// and losing the cache during that replay would leave the core in no generation's state.
/// Superblock writes are held back here as long as anything else can complete; then a crash
/// keeps everything written, and the recovered log is written back with a cache-loss check
/// after every completion.
#[test]
fn next_generation_waits_for_the_superblock_that_retires_the_last() {
    let mut cfg = config(2);
    // Generations end at the flushes only, and writeback waits for a drain.
    cfg.gen_max_writes = 100;
    cfg.gen_max_blocks = 1000;
    cfg.pacing = Pacing {
        background_fill_pct: 100,
        idle: Nanos::from_secs(3600),
        expire: Nanos::from_secs(3600),
        depth: 8,
    };
    let mut s = Sim::created(2, cfg, 1);
    let is_super = |a: &Action| match a {
        Action::Write { dev, lba, .. } => *dev == Dev::Cache && lba.0 < RING_OFFSET_BLOCKS,
        _ => false,
    };
    let mut early = 0;
    // Completes `s.ios[i]` only (complete_one picks at random: leave it one candidate).
    let complete_only = |s: &mut Sim, i: usize| {
        let last = s.ios.len() - 1;
        s.ios.swap(i, last);
        let rest: Vec<_> = s.ios.drain(..last).collect();
        s.complete_one();
        s.ios.extend(rest);
    };
    // Generation g: two writes of blocks `a..a + 8`; generation g + 1: blocks `a + 8..a + 16`;
    // all logged, then a drain asked for.
    let two_generations = |s: &mut Sim, a: u64| {
        for _ in 0..2 {
            s.submit(Op::Write { fua: false }, 0, a, 8);
            while s.complete_one() {}
        }
        s.submit(Op::Flush, 0, 0, 0);
        s.submit(Op::Write { fua: false }, 0, a + 8, 8);
        s.submit(Op::Flush, 0, 0, 0);
        while s.complete_one() {}
        s.wl.drain();
        s.apply(Event::Tick);
    };
    let mut supers = 0;
    for round in 0..6u64 {
        let a = round * 16;
        two_generations(&mut s, a);
        let c = a + 8;
        let on_core = |s: &Sim| {
            (c..c + 8).any(|b| {
                decode_block(&s.cores[0].vol[b as usize * BS..][..BS], 0, b) != Content::Zero
            })
        };
        let mut supers_this_round = 0;
        loop {
            // Complete anything but a superblock write while there is such an IO.
            if let Some(i) = (0..s.ios.len()).find(|&i| !is_super(&s.ios[i].0)) {
                complete_only(&mut s, i);
                // Generation g + 1 on the core before any superblock write completed: before
                // the one that retires g.
                if supers_this_round == 0 && on_core(&s) {
                    early += 1;
                }
            } else if !s.ios.is_empty() {
                supers += 1;
                supers_this_round += 1;
                s.complete_one();
            } else if s.wl.is_clean() && s.reqs.is_empty() {
                break;
            } else {
                s.now += 60_000_000;
                s.apply(Event::Tick);
            }
        }
    }
    assert!(supers > 0, "no superblock write was ever held back");
    assert_eq!(
        early, 0,
        "a generation reached the core before the superblock retiring the one before it was durable"
    );
    // A crash while superblock writes are held, then the recovered log written back with a
    // cache-loss check after every completion.
    two_generations(&mut s, 200);
    for _ in 0..200 {
        let Some(i) = (0..s.ios.len()).find(|&i| !is_super(&s.ios[i].0)) else {
            break;
        };
        complete_only(&mut s, i);
    }
    s.replay_check_every = 1;
    let s = s.crash_and_recover(0);
    assert!(s.stats.replay_loss_checks > 0);
}
