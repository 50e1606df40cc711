//! Core op sequences: bytes read as a cache configuration and a sequence of events — reads,
//! writes, FUA writes, flushes, trims, write-zeroes, completions of any IO in flight (in any
//! order, succeeding or failing), ticks, mode switches, IO-class reloads, cleaning, promotion,
//! rate and cutoff parameters (any values: a configuration record read from disk carries any),
//! cores added, resized, invalidated and removed, lines restored, a clean stop — applied to a
//! `tiercache_core::Cache`, persistent or not.
//!
//! Every byte string decodes to some sequence (missing bytes read as zeros), so the target
//! never rejects input; what it checks after **every** event:
//!
//! - `Cache::check_invariants` (mapping, states, lists, counts, staging slots, IO owners);
//! - the driver contract: each IO id is new, every device range is inside its device (a core
//!   range inside the core, a cache range inside the cache device), every buffer reference is
//!   inside a live request's buffer, a staging slot or a live metadata buffer, and each request
//!   completes exactly once;
//! - refusals are errors, not asserts: a request for a missing core, out of range, too long,
//!   of zero blocks, or sent to a stopped cache completes at once with `NoSuchCore`,
//!   `OutOfRange`/`PastEnd`, success, or `NotRunning`;
//! - the core's own counts agree with the driver's (requests and IOs in flight);
//!
//! and at the end: with every IO completing, every request completes (no request is lost or
//! stuck), and a clean stop finishes. For a persistent cache that is the round trip: the
//! metadata its completed writes left on the device (journal, checkpoint, superblock, tables)
//! loads (`cache::open`) into exactly the cache that stopped — every line in its slot with its
//! valid and dirty blocks and class, the cores, the mode and the IO classes.

use crate::mutate::{Field, Rng, Sample};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tiercache_core::cache::CoreRecord;
use tiercache_core::config::{Persist, REQUEST_BLOCKS_MAX};
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::ioclass::IoClassTable;
use tiercache_core::policy::{
    AcpParams, AlruParams, CleaningPolicy, CutoffParams, CutoffPolicy, EvictionPolicy, NhitParams,
    PromotionPolicy, RateParams,
};
use tiercache_core::units::{CoreId, IoId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::{Action, BufRef, Cache, Config, Dev, Event, IoError, ReqError};
use tiercache_format::superblock::Layout;
use tiercache_format::tables::CoreIdentity;

/// IO class tables the sequences load by index.
const CSVS: &[&str] = &[
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n",
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n1,request_size:le:4096,1,0.5\n2,request_size:gt:16384,30,0.25\n",
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n1,io_direction:write,,0.4\n",
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n1,lba:lt:256&done,5,0\n3,core_id:eq:1,10,0.6\n",
    "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,,0.1\n1,done,0,0\n",
];

/// Bytes of the configuration header.
const HEADER: usize = 16;

/// Reads the input; past its end every byte is zero.
struct Bytes<'a> {
    d: &'a [u8],
    pos: usize,
}

impl Bytes<'_> {
    fn done(&self) -> bool {
        self.pos >= self.d.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.d.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        self.u32() as u64 | (self.u32() as u64) << 32
    }
    fn u128(&mut self) -> u128 {
        self.u64() as u128 | (self.u64() as u128) << 64
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let a = self.pos.min(self.d.len());
        let b = (self.pos + n).min(self.d.len());
        self.pos += n;
        &self.d[a..b]
    }
}

/// The configuration a header describes, and the core sizes.
fn config(h: &[u8; HEADER]) -> (Config, Vec<u64>, bool) {
    let ls = LineSize::ALL[h[0] as usize % 5];
    let bpl = ls.blocks() as u64;
    let lines = 16 + h[1] as u32 % 48;
    let mut cfg = Config::new(lines, ls);
    cfg.mode = CacheMode::ALL[h[2] as usize % 6];
    let f = h[3];
    cfg.eviction = if f & 1 != 0 {
        EvictionPolicy::Lru
    } else {
        EvictionPolicy::S3Fifo
    };
    if f & 2 != 0 {
        cfg.promotion = PromotionPolicy::Nhit;
        cfg.nhit = NhitParams {
            threshold: 2,
            trigger_pct: h[15] as u32 % 90,
        };
    }
    cfg.cleaning = [
        CleaningPolicy::Alru,
        CleaningPolicy::Acp,
        CleaningPolicy::Nop,
    ][(f >> 2) as usize % 3];
    cfg.alru = AlruParams {
        wake_up_s: 1,
        staleness_time_s: 1,
        flush_max_buffers: 1 + h[4] as u32 % 16,
        activity_threshold_ms: 0,
    };
    cfg.acp = AcpParams {
        wake_up_ms: 10,
        flush_max_buffers: 1 + h[5] as u32 % 16,
    };
    cfg.rate = RateParams {
        enabled: f & 16 != 0,
        dirty_target_pct: 30 + h[6] as u32 % 40,
        throttle_max_ms: 5,
    };
    cfg.volatile = f & 64 != 0;
    cfg.pool_slots = 1 + h[4] as u32 / 16 % 8;
    cfg.pool_slot_blocks = ls.blocks() * (1 + h[5] as u32 / 16 % 4);
    cfg.data_offset = Lba((h[6] as u64 / 64) * 8);
    let persistent = f & 32 != 0 && !cfg.volatile;
    if persistent {
        let layout = Layout::compact(
            lines as u64,
            ls.bytes() as u32,
            (16 << 10) * (1 + h[6] as u64 % 4),
            0,
        );
        let data = layout.data;
        cfg.data_offset = Lba(data.offset / 512);
        cfg.persist = Some(Persist::new_cache(
            [h[7]; 16],
            data.end(),
            ls,
            lines,
            layout,
        ));
    }
    let ncores = 1 + h[7] as usize % 4;
    let total = lines as u64 * bpl * 3;
    let cores = (0..ncores)
        .map(|i| {
            let v = u16::from_le_bytes([h[8 + 2 * i], h[9 + 2 * i]]) as u64;
            1 + v % (total / ncores as u64 + bpl)
        })
        .collect();
    (cfg, cores, persistent)
}

/// `TIERCACHE_TRACE=1`: print every event and action (replaying one case).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("TIERCACHE_TRACE").is_some())
}

/// A request the driver sent and the core has not completed.
struct Live {
    blocks: u32,
}

struct Driver {
    cache: Cache,
    now: Nanos,
    /// Attached cores and their sizes (blocks).
    cores: BTreeMap<u16, u64>,
    reqs: HashMap<ReqId, Live>,
    /// IOs in flight, with the bytes of a metadata write (captured when it is issued).
    pending: Vec<(IoId, Action, Option<Vec<u8>>)>,
    /// Persistent caches: the cache device's metadata as completed writes left it (512-byte
    /// blocks; absent blocks read as zeros). Cached data is not kept: loading never reads it.
    image: Option<BTreeMap<u64, Vec<u8>>>,
    /// The cache device's data region, in blocks: `[start, end)`.
    data: (u64, u64),
    /// (core, core line) of every line a request or a restore touched.
    touched: BTreeSet<(u16, u64)>,
    next_req: u64,
    cache_blocks: u64,
    pool_slots: u32,
    slot_blocks: u32,
    persistent: bool,
    stopped: bool,
    /// Requests that completed successfully.
    served: u64,
}

impl Driver {
    fn buf_ok(&self, b: BufRef, blocks: u32, what: &Action) {
        match b {
            BufRef::Req { req, offset } => {
                let r = self
                    .reqs
                    .get(&req)
                    .unwrap_or_else(|| panic!("{what:?}: buffer of a request not in flight"));
                assert!(
                    offset as u64 + blocks as u64 <= r.blocks as u64,
                    "{what:?}: outside the request's {} blocks",
                    r.blocks
                );
            }
            BufRef::Pool { slot, offset } => assert!(
                slot < self.pool_slots && offset as u64 + blocks as u64 <= self.slot_blocks as u64,
                "{what:?}: outside the staging pool"
            ),
            BufRef::Meta { id, offset } => {
                let len = self.cache.meta_buf(id).len() as u64;
                assert!(
                    (offset as u64 + blocks as u64) * 512 <= len,
                    "{what:?}: outside metadata buffer of {len} bytes"
                );
            }
        }
    }

    /// A cache device IO with data from or to a request or the staging pool stays in the data
    /// region; a metadata write stays out of it.
    fn region_ok(&self, dev: Dev, lba: Lba, blocks: u32, buf: BufRef, what: &Action) {
        if dev != Dev::Cache {
            return;
        }
        let inside = lba.0 >= self.data.0 && lba.0 + blocks as u64 <= self.data.1;
        let outside = lba.0 + blocks as u64 <= self.data.0 || lba.0 >= self.data.1;
        match buf {
            BufRef::Meta { .. } => assert!(outside, "{what:?}: metadata into the data region"),
            _ => assert!(inside, "{what:?}: cached data outside the data region"),
        }
    }

    fn dev_ok(&self, dev: Dev, lba: Lba, blocks: u32, what: &Action) {
        let size = match dev {
            Dev::Cache => self.cache_blocks,
            Dev::Core(c) => *self
                .cores
                .get(&c.0)
                .unwrap_or_else(|| panic!("{what:?}: IO to a core that is not attached")),
        };
        assert!(blocks > 0, "{what:?}: empty IO");
        assert!(
            lba.0.checked_add(blocks as u64).is_some_and(|e| e <= size),
            "{what:?}: outside the device ({size} blocks)"
        );
    }

    /// Applies one event and checks what the core answered. Returns the completions.
    fn apply(&mut self, ev: Event) -> Vec<(ReqId, Result<(), ReqError>)> {
        let mut actions = Vec::new();
        if trace() {
            eprintln!("t={} {ev:?}", self.now.0);
        }
        self.cache.apply(self.now, ev, &mut actions);
        if trace() {
            for a in &actions {
                eprintln!("  -> {a:?}");
            }
        }
        let mut done = Vec::new();
        for a in actions {
            match a {
                Action::Complete { req, result } => {
                    assert!(
                        self.reqs.remove(&req).is_some(),
                        "completion of {req:?}, which is not in flight (or completed twice)"
                    );
                    self.served += result.is_ok() as u64;
                    done.push((req, result));
                }
                Action::Copy { src, dst, blocks } => {
                    assert!(blocks > 0, "{a:?}: empty copy");
                    assert!(!matches!(dst, BufRef::Meta { .. }), "{a:?}: into metadata");
                    self.buf_ok(src, blocks, &a);
                    self.buf_ok(dst, blocks, &a);
                }
                Action::Read {
                    io,
                    dev,
                    lba,
                    blocks,
                    buf,
                } => {
                    self.dev_ok(dev, lba, blocks, &a);
                    assert!(!matches!(buf, BufRef::Meta { .. }), "{a:?}: into metadata");
                    self.buf_ok(buf, blocks, &a);
                    self.region_ok(dev, lba, blocks, buf, &a);
                    self.issue(io, a, None);
                }
                Action::Write {
                    io,
                    dev,
                    lba,
                    blocks,
                    buf,
                    ..
                } => {
                    self.dev_ok(dev, lba, blocks, &a);
                    self.buf_ok(buf, blocks, &a);
                    self.region_ok(dev, lba, blocks, buf, &a);
                    let meta = match buf {
                        BufRef::Meta { id, offset } if self.image.is_some() => {
                            let s = offset as usize * 512;
                            Some(self.cache.meta_buf(id)[s..s + blocks as usize * 512].to_vec())
                        }
                        _ => None,
                    };
                    self.issue(io, a, meta);
                }
                Action::WriteZeroes {
                    io,
                    dev,
                    lba,
                    blocks,
                    ..
                }
                | Action::Trim {
                    io,
                    dev,
                    lba,
                    blocks,
                } => {
                    self.dev_ok(dev, lba, blocks, &a);
                    self.issue(io, a, None);
                }
                Action::Flush { io, dev } => {
                    if let Dev::Core(c) = dev {
                        assert!(self.cores.contains_key(&c.0), "{a:?}: core not attached");
                    }
                    self.issue(io, a, None);
                }
            }
        }
        self.cache.check_invariants();
        // A persistent cache's replies may wait for their journal record: the core no longer
        // counts such a request, the driver does until its completion arrives.
        assert!(
            self.cache.requests_in_flight() <= self.reqs.len(),
            "the core has {} requests in flight, the driver sent {}",
            self.cache.requests_in_flight(),
            self.reqs.len()
        );
        if !self.persistent {
            assert_eq!(
                self.cache.requests_in_flight(),
                self.reqs.len(),
                "requests in flight: core vs driver"
            );
        }
        assert_eq!(
            self.cache.ios_in_flight(),
            self.pending.len(),
            "IOs in flight: core vs driver"
        );
        done
    }

    fn issue(&mut self, io: IoId, a: Action, meta: Option<Vec<u8>>) {
        assert!(
            self.pending.iter().all(|(i, _, _)| *i != io),
            "{a:?}: IO id already in flight"
        );
        self.pending.push((io, a, meta));
    }

    fn complete(&mut self, i: usize, result: Result<(), IoError>) {
        let (io, a, meta) = self.pending.swap_remove(i);
        if let (Some(img), Ok(())) = (self.image.as_mut(), result) {
            match a {
                Action::Write {
                    dev: Dev::Cache,
                    lba,
                    ..
                } => {
                    if let Some(bytes) = meta {
                        for (k, b) in bytes.chunks(512).enumerate() {
                            img.insert(lba.0 + k as u64, b.to_vec());
                        }
                    }
                }
                Action::WriteZeroes {
                    dev: Dev::Cache,
                    lba,
                    blocks,
                    ..
                }
                | Action::Trim {
                    dev: Dev::Cache,
                    lba,
                    blocks,
                    ..
                } => {
                    let gone: Vec<u64> = img
                        .range(lba.0..lba.0 + blocks as u64)
                        .map(|(&k, _)| k)
                        .collect();
                    for k in gone {
                        img.remove(&k);
                    }
                }
                _ => {}
            }
        }
        self.apply(Event::IoDone { io, result });
    }

    /// Reads `buf.len()` bytes at byte `offset` of the metadata image.
    fn read_image(&self, offset: u64, buf: &mut [u8]) {
        let img = self.image.as_ref().expect("a persistent cache");
        let mut i = 0;
        while i < buf.len() {
            let at = offset + i as u64;
            let (blk, off) = (at / 512, (at % 512) as usize);
            let n = (512 - off).min(buf.len() - i);
            match img.get(&blk) {
                Some(b) => buf[i..i + n].copy_from_slice(&b[off..off + n]),
                None => buf[i..i + n].fill(0),
            }
            i += n;
        }
    }

    /// After a clean stop: the device, loaded again, holds exactly the cache that stopped —
    /// every line in its slot with its blocks, class, the cores and the IO classes.
    fn reload_and_compare(&mut self, base: &Config) {
        let mut read = |offset: u64, buf: &mut [u8]| {
            self.read_image(offset, buf);
            Ok(())
        };
        let (loaded, report) = tiercache_core::cache::open(base, &mut read)
            .unwrap_or_else(|e| panic!("a cleanly stopped cache does not load: {e}"));
        if !report.clean && self.cache.meta_counters().stops_unclean > 0 {
            // A core flush failed during the stop: the superblock says `Running`, and the load
            // was a recovery (dirty lines only; the crash tests check what it brings back).
            return;
        }
        if !report.clean {
            let mut a = vec![0u8; 4096];
            let mut b = vec![0u8; 4096];
            self.read_image(0, &mut a);
            self.read_image(64 << 10, &mut b);
            panic!(
                "the stopped cache is not marked clean: copy A {:?}, copy B {:?}",
                tiercache_format::superblock::Superblock::decode(&a),
                tiercache_format::superblock::Superblock::decode(&b)
            );
        }
        let c = &self.cache;
        // The mode reads follow (a switch still writing back is recorded when it completes).
        assert_eq!(loaded.mode(), c.mode());
        assert_eq!(
            loaded.io_classes(),
            c.io_classes(),
            "IO classes after a reload"
        );
        let mut empty_lines = 0;
        let mut mapped = 0;
        for (&id, &size) in &self.cores {
            let lc = loaded.core(CoreId(id)).expect("a core after a reload");
            assert_eq!(lc.size_blocks, size);
            // A core without a record is stored with an empty one.
            let empty = CoreRecord {
                identity: CoreIdentity::Nbd { uri: String::new() },
                export_name: String::new(),
                device: String::new(),
            };
            assert_eq!(
                loaded.core_record(CoreId(id)),
                Some(c.core_record(CoreId(id)).unwrap_or(&empty))
            );
            // Only core lines a request or a restore touched can be mapped (checked below by
            // count); cores may be huge, so those are the lines compared.
            for &(_, cl) in self.touched.range((id, 0)..=(id, u64::MAX)) {
                let before = c.line_state(CoreId(id), cl);
                mapped += before.is_some() as u32;
                // A line can stay mapped with no valid block (a failed cache write invalidates
                // what it touched and leaves the slot mapped until eviction); the loader skips
                // empty lines, so it comes back unmapped.
                if let Some((_, 0, _)) = before {
                    empty_lines += 1;
                    assert_eq!(loaded.line_state(CoreId(id), cl), None);
                    continue;
                }
                assert_eq!(
                    loaded.line_state(CoreId(id), cl),
                    before,
                    "core {id} line {cl} after a reload"
                );
            }
        }
        assert_eq!(mapped, c.occupancy(), "mapped lines no request touched");
        assert_eq!(
            loaded.occupancy(),
            c.occupancy() - empty_lines,
            "lines after a reload"
        );
        assert_eq!(
            loaded.dirty_lines(),
            c.dirty_lines(),
            "dirty lines after a reload"
        );
        loaded.check_invariants();
        crate::round_trip_checked();
    }

    fn tick(&mut self, advance: u64) {
        self.now = Nanos(self.now.0.saturating_add(advance));
        self.apply(Event::Tick);
    }

    /// Sends a request; if the core must refuse it at once, checks that it did.
    fn request(&mut self, kind: u8, core: u16, lba: u64, blocks: u32, fua: bool) {
        let req = ReqId(self.next_req);
        self.next_req += 1;
        let c = CoreId(core);
        let (ev, blocks) = match kind {
            0 => (
                Event::Read {
                    req,
                    core: c,
                    lba: Lba(lba),
                    blocks,
                },
                blocks,
            ),
            1 => (
                Event::Write {
                    req,
                    core: c,
                    lba: Lba(lba),
                    blocks,
                    fua,
                },
                blocks,
            ),
            2 => (Event::Flush { req, core: c }, 0),
            3 => (
                Event::Trim {
                    req,
                    core: c,
                    lba: Lba(lba),
                    blocks,
                },
                blocks,
            ),
            _ => (
                Event::WriteZeroes {
                    req,
                    core: c,
                    lba: Lba(lba),
                    blocks,
                    fua,
                },
                blocks,
            ),
        };
        let expect: Option<Result<(), ReqError>> = if self.stopped || !self.cache.is_ready() {
            Some(Err(ReqError::NotRunning))
        } else if let Some(&size) = self.cores.get(&core) {
            let past = lba.checked_add(blocks as u64).is_none_or(|e| e > size);
            if kind == 2 {
                None
            } else if past || blocks > REQUEST_BLOCKS_MAX {
                Some(Err(
                    if matches!(kind, 1 | 4) && blocks <= REQUEST_BLOCKS_MAX {
                        ReqError::PastEnd
                    } else {
                        ReqError::OutOfRange
                    },
                ))
            } else if blocks == 0 {
                Some(Ok(()))
            } else {
                None
            }
        } else {
            Some(Err(ReqError::NoSuchCore))
        };
        if expect.is_none() && kind != 2 {
            let shift = self.cache.config().line_size.blocks_shift();
            for cl in lba >> shift..=(lba + blocks as u64 - 1) >> shift {
                self.touched.insert((core, cl));
            }
        }
        self.reqs.insert(req, Live { blocks });
        self.now = self.now.plus(Nanos(1000));
        let done = self.apply(ev);
        if let Some(want) = expect {
            let got = done.iter().find(|d| d.0 == req).map(|d| d.1);
            assert_eq!(
                got,
                Some(want),
                "request {kind} core {core} lba {lba} blocks {blocks} (cores {:?}) must be answered at once",
                self.cores
            );
        }
    }

    /// Completes every IO (successfully) and ticks until nothing is in flight and the cache
    /// has no work left. Time jumps to the cache's next deadline, or (a deadline already
    /// passed, or none) by a step that doubles while nothing changes, so a write throttled for
    /// hours by an extreme rate setting completes too.
    fn drain(&mut self, why: &str) {
        let mut step = 1_000_000u64;
        for _ in 0..4096 {
            if !self.pending.is_empty() {
                while !self.pending.is_empty() {
                    self.complete(0, Ok(()));
                }
                step = 1_000_000;
                continue;
            }
            if self.reqs.is_empty() && !self.cache.has_work() {
                return;
            }
            let t = match self.cache.next_deadline() {
                Some(d) if d.0 > self.now.0 => d.0,
                _ => self.now.0.saturating_add(step),
            };
            step = (step * 2).min(1 << 52);
            self.tick(t - self.now.0);
        }
        let c = self.cache.config();
        panic!(
            "{why}: with every IO completing, {} requests never complete and the cache keeps \
             work (has_work {}; mode {}, {} of {} lines mapped, {} dirty, writebacks {}, next \
             deadline {:?}, now {}, cleaning {:?} {:?} {:?}, rate {:?}, promotion {:?} {:?})",
            self.reqs.len(),
            self.cache.has_work(),
            self.cache.mode(),
            self.cache.occupancy(),
            c.lines,
            self.cache.dirty_lines(),
            self.cache.writebacks_in_flight(),
            self.cache.next_deadline(),
            self.now.0,
            c.cleaning,
            c.alru,
            c.acp,
            c.rate,
            c.promotion,
            c.nhit,
        );
    }
}

/// Reads (and drops) the arguments of management op `op`, as its arm would.
fn skip_args(b: &mut Bytes<'_>, op: u8) {
    match op {
        22 | 24 => {
            if op == 22 {
                b.u8();
            }
        }
        23 => {
            if b.u8() >= 128 {
                let n = b.u16() as usize % 8192;
                b.take(n);
            }
        }
        25 => {
            cleaning(b);
        }
        26 => match b.u8() % 3 {
            0 => {
                b.u8();
                b.u64();
            }
            1 => {
                b.u8();
                b.u64();
            }
            _ => {
                b.u8();
                b.u8();
                b.u64();
                b.u32();
            }
        },
        27 => {
            b.u8();
            b.u8();
            b.u64();
        }
        _ => {
            b.u8();
            b.u64();
            b.u128();
            b.u128();
            b.u8();
        }
    }
}

fn cleaning(b: &mut Bytes<'_>) -> (CleaningPolicy, AlruParams, AcpParams) {
    let p = [
        CleaningPolicy::Alru,
        CleaningPolicy::Acp,
        CleaningPolicy::Nop,
    ][b.u8() as usize % 3];
    let alru = AlruParams {
        wake_up_s: b.u32(),
        staleness_time_s: b.u32(),
        flush_max_buffers: b.u32(),
        activity_threshold_ms: b.u32(),
    };
    let acp = AcpParams {
        wake_up_ms: b.u32(),
        flush_max_buffers: b.u32(),
    };
    (p, alru, acp)
}

/// Fuzz target: a cache configuration and an event sequence (see the module documentation).
/// Accepted when the configuration is valid and at least one request was served.
pub fn core_ops(data: &[u8]) -> bool {
    let mut b = Bytes { d: data, pos: 0 };
    let mut h = [0u8; HEADER];
    h.copy_from_slice(&{
        let mut v = b.take(HEADER).to_vec();
        v.resize(HEADER, 0);
        v
    });
    let (cfg, core_sizes, persistent) = config(&h);
    let cache_blocks = match &cfg.persist {
        Some(p) => p.superblock.device_bytes / 512,
        None => cfg.data_offset.0 + cfg.lines as u64 * cfg.line_size.blocks() as u64,
    };
    let (pool_slots, slot_blocks, bpl) = (
        cfg.pool_slots,
        cfg.pool_slot_blocks,
        cfg.line_size.blocks() as u64,
    );
    let base = cfg.clone();
    let data = (
        cfg.data_offset.0,
        cfg.data_offset.0 + cfg.lines as u64 * cfg.line_size.blocks() as u64,
    );
    let Ok(mut cache) = Cache::new(cfg) else {
        return false; // refused configuration (a lazy mode on a volatile device)
    };
    // The driver checks the invariants after every event itself; with `strict-asserts` the core
    // would check them a second time inside `apply`.
    cache.set_invariant_check_every(u64::MAX);
    let mut d = Driver {
        cache,
        now: Nanos(1),
        cores: BTreeMap::new(),
        reqs: HashMap::new(),
        pending: Vec::new(),
        image: persistent.then(BTreeMap::new),
        data,
        touched: BTreeSet::new(),
        next_req: 1,
        cache_blocks,
        pool_slots,
        slot_blocks,
        persistent,
        stopped: false,
        served: 0,
    };
    // A persistent cache zeroes its journal and writes its superblock before it serves.
    d.tick(0);
    d.drain("start");
    for (i, &n) in core_sizes.iter().enumerate() {
        d.cache.add_core(CoreId(i as u16), n).expect("add a core");
        d.cores.insert(i as u16, n);
        if i % 2 == 1 {
            let record = CoreRecord {
                identity: CoreIdentity::File {
                    fs_uuid: [i as u8; 16],
                    inode: i as u64,
                },
                export_name: format!("core{i}"),
                device: format!("/dev/core{i}"),
            };
            d.cache
                .set_core_record(CoreId(i as u16), record)
                .expect("core record");
        }
    }
    d.tick(0);
    let stop_at_end = h[3] & 128 != 0;
    let mut ops = 0;
    while !b.done() && ops < 4096 {
        ops += 1;
        let tag = b.u8();
        // After a stop the driver only sends requests (refused), completes IOs and ticks: a
        // management call after a *completed* stop would queue a `Running` superblock behind
        // the clean one (the device would then load as after a crash; see docs/TESTING.md).
        let mgmt = matches!(tag % 32, 22..=27 | 29);
        match tag % 32 {
            _ if mgmt && d.stopped => {
                // Consume the arguments as if the call were made, so the rest decodes alike.
                skip_args(&mut b, tag % 32);
            }
            0..=13 => {
                let kind = match tag % 32 {
                    0..=5 => 0,
                    6..=10 => 1,
                    11 => 2,
                    12 => 3,
                    _ => 4,
                };
                let core = (b.u8() % 6) as u16;
                let mode = b.u8();
                let (a, n) = (b.u64(), b.u32());
                // (An attached core may have 0 blocks: every request to it is out of range.)
                let size = d.cores.get(&core).copied().unwrap_or(1).max(1);
                let (lba, blocks) = match mode % 16 {
                    0..=11 => {
                        let lba = a % size;
                        let room = (size - lba).min(3 * bpl);
                        (lba, 1 + (n as u64 % room) as u32)
                    }
                    12 | 13 => (a, n),
                    _ => {
                        let lba = a % (size / 4).max(1);
                        (lba, 1 + (n as u64 % (size - lba).min(bpl)) as u32)
                    }
                };
                d.request(kind, core, lba, blocks, mode & 128 != 0);
            }
            14..=19 | 31 => {
                let pick = b.u16() as usize;
                let r = b.u8();
                if !d.pending.is_empty() {
                    let result = match r {
                        0 => Err(IoError::Io),
                        1 => Err(IoError::TimedOut),
                        2 => Err(IoError::NoSpace),
                        _ => Ok(()),
                    };
                    let i = pick % d.pending.len();
                    d.complete(i, result);
                }
            }
            20 => {
                let pattern = b.u8();
                let mut k = 0u32;
                while !d.pending.is_empty() {
                    let fail = pattern != 0 && (k % 8) as u8 == pattern % 8 && pattern & 8 != 0;
                    d.complete(0, if fail { Err(IoError::Io) } else { Ok(()) });
                    k += 1;
                }
            }
            21 => {
                let v = b.u16() as u64;
                let unit = if b.u8() & 1 == 1 { 1_000_000 } else { 1_000 };
                d.tick(v * unit);
            }
            22 => {
                let m = CacheMode::ALL[b.u8() as usize % 6];
                // Refused only as a lazy mode on a volatile device; never a panic.
                let _ = d.cache.set_mode(m);
                d.tick(0);
            }
            23 => {
                let k = b.u8();
                let text: String = if k < 128 {
                    CSVS[k as usize % CSVS.len()].to_string()
                } else {
                    let n = b.u16() as usize % 8192;
                    String::from_utf8_lossy(b.take(n)).into_owned()
                };
                if let Ok(t) = IoClassTable::parse_csv(&text) {
                    d.cache.load_io_classes(t);
                }
                d.tick(0);
            }
            24 => {
                d.cache.start_writeback();
                d.tick(0);
            }
            25 => {
                let (p, alru, acp) = cleaning(&mut b);
                d.cache.set_cleaning(p, alru, acp);
                d.tick(0);
            }
            26 => {
                match b.u8() % 3 {
                    0 => {
                        let p = if b.u8() & 1 == 1 {
                            PromotionPolicy::Nhit
                        } else {
                            PromotionPolicy::Always
                        };
                        let nhit = NhitParams {
                            threshold: b.u32(),
                            trigger_pct: b.u32(),
                        };
                        d.cache.set_promotion(p, nhit);
                    }
                    1 => d.cache.set_rate(RateParams {
                        enabled: b.u8() & 1 == 1,
                        dirty_target_pct: b.u32(),
                        throttle_max_ms: b.u32(),
                    }),
                    _ => {
                        let core = (b.u8() % 6) as u16;
                        let policy = [
                            CutoffPolicy::Always,
                            CutoffPolicy::Full,
                            CutoffPolicy::Never,
                        ][b.u8() as usize % 3];
                        let p = CutoffParams {
                            policy,
                            threshold_bytes: b.u64(),
                            promotion_count: b.u32(),
                        };
                        let r = d.cache.set_cutoff(CoreId(core), p);
                        assert_eq!(r.is_ok(), d.cores.contains_key(&core));
                    }
                }
                d.tick(0);
            }
            27 => {
                let sub = b.u8();
                let id = b.u8() as u16 % 8;
                let size = b.u64();
                let size = if sub & 4 == 0 {
                    1 + size % (64 * bpl * 4)
                } else {
                    size
                };
                let c = CoreId(id);
                match sub % 4 {
                    0 => {
                        if d.cache.add_core(c, size).is_ok() {
                            assert!(!d.cores.contains_key(&id));
                            d.cores.insert(id, size);
                        }
                    }
                    1 => {
                        if d.cache.remove_core(c).is_ok() {
                            assert!(d.cores.remove(&id).is_some());
                        }
                    }
                    2 => {
                        let r = d.cache.invalidate_core(c);
                        assert!(r.is_err() || d.cores.contains_key(&id));
                    }
                    _ => {
                        if d.cache.resize_core(c, size).is_ok() {
                            assert!(d.cores.insert(id, size).is_some());
                        }
                    }
                }
                d.tick(0);
            }
            28 => {
                if b.u8().is_multiple_of(4) {
                    d.cache.stop();
                    d.stopped = true;
                    d.tick(0);
                }
            }
            29 => {
                let core = (b.u8() % 6) as u16;
                let (cl, valid, dirty, class) = (b.u64() % 1024, b.u128(), b.u128(), b.u8() % 40);
                // Loading and benchmarks only: while idle, and without persistence (a persistent
                // cache's lines come from its metadata).
                if !d.persistent && d.cache.is_idle() && !d.stopped {
                    if d.cache
                        .restore_line(CoreId(core), cl, valid, dirty, class)
                        .is_ok()
                    {
                        d.touched.insert((core, cl));
                    }
                    d.tick(0);
                }
            }
            _ => {
                let t = d.cache.next_deadline().map_or(d.now.0, |t| t.0);
                d.tick(t.saturating_sub(d.now.0));
            }
        }
    }
    d.drain("end of the sequence");
    if stop_at_end || d.stopped {
        d.cache.stop();
        d.stopped = true;
        d.tick(0);
        d.drain("clean stop");
        assert!(d.cache.is_stopped(), "a clean stop did not finish");
        if persistent {
            d.reload_and_compare(&base);
        }
    }
    d.cache.check_invariants();
    d.served > 0
}

/// A valid sequence: a configuration, then mostly in-range requests and completions, some
/// ticks, management calls with sane values, and now and then something out of range.
pub fn gen_core_ops(rng: &mut Rng) -> Sample {
    let mut b = rng.bytes(HEADER);
    // Lazy modes on a volatile device are refused; keep most configurations valid.
    if rng.below(8) != 0 {
        b[3] &= !64;
    }
    if rng.one_in(3) {
        b[3] |= 32;
    }
    let mut fields: Vec<Field> = (0..HEADER).map(|i| Field::le(i, 1)).collect();
    let n = rng.range(10, 120);
    let put32 = |b: &mut Vec<u8>, v: u32| b.extend_from_slice(&v.to_le_bytes());
    for _ in 0..n {
        fields.push(Field::le(b.len(), 1));
        let r = rng.below(100);
        if r < 45 {
            let tag = match rng.below(20) {
                0..=8 => rng.below(6),
                9..=15 => rng.range(6, 10),
                16 => 11,
                17 | 18 => 12,
                _ => 13,
            } as u8;
            b.push(tag);
            b.push(if rng.one_in(20) {
                4 + rng.below(2) as u8
            } else {
                rng.below(4) as u8
            });
            let mode = if rng.one_in(30) {
                12
            } else {
                rng.below(12) as u8 | if rng.one_in(6) { 14 } else { 0 }
            };
            b.push(mode | if rng.one_in(6) { 128 } else { 0 });
            if mode % 16 >= 12 && mode % 16 < 14 {
                b.extend_from_slice(&rng.interesting(64).to_le_bytes());
                put32(&mut b, rng.interesting(32) as u32);
            } else {
                b.extend_from_slice(&rng.next_u64().to_le_bytes());
                put32(&mut b, rng.next_u64() as u32);
            }
        } else if r < 82 {
            b.push(14);
            b.extend_from_slice(&(rng.next_u64() as u16).to_le_bytes());
            b.push(if rng.one_in(20) {
                rng.below(3) as u8
            } else {
                3 + rng.byte() % 250
            });
        } else if r < 86 {
            b.push(20);
            b.push(rng.byte());
        } else if r < 91 {
            b.push(if rng.one_in(2) { 21 } else { 30 });
            b.extend_from_slice(&(rng.below(2000) as u16).to_le_bytes());
            b.push(rng.byte());
        } else {
            match rng.below(9) {
                0 | 1 => b.extend([22, rng.byte()]),
                2 => {
                    if rng.one_in(3) {
                        let t = crate::text::gen_csv_text(rng);
                        b.extend([23, 128 + rng.below(128) as u8]);
                        b.extend_from_slice(&(t.len() as u16).to_le_bytes());
                        b.extend_from_slice(t.as_bytes());
                    } else {
                        b.extend([23, rng.below(128) as u8]);
                    }
                }
                3 => b.extend([24]),
                4 => {
                    b.extend([25, rng.byte()]);
                    let sane = !rng.one_in(8);
                    for k in 0..6 {
                        let v = if !sane {
                            rng.interesting(32) as u32
                        } else if k == 2 || k == 5 {
                            1 + rng.below(64) as u32
                        } else {
                            rng.below(3) as u32
                        };
                        put32(&mut b, v);
                    }
                }
                5 => {
                    b.extend([26, rng.byte(), rng.byte()]);
                    let sane = !rng.one_in(8);
                    for _ in 0..4 {
                        let v = if sane {
                            rng.range(1, 100) as u32
                        } else {
                            rng.interesting(32) as u32
                        };
                        put32(&mut b, v);
                    }
                }
                6 => {
                    b.extend([27, rng.byte() & !4, rng.below(6) as u8]);
                    b.extend_from_slice(&rng.next_u64().to_le_bytes());
                }
                7 => b.extend([28, rng.byte()]),
                _ => {
                    b.extend([29, rng.below(4) as u8]);
                    b.extend_from_slice(&rng.below(64).to_le_bytes());
                    b.extend_from_slice(&rng.bytes(33));
                }
            }
        }
    }
    Sample {
        bytes: b,
        fields,
        ..Sample::default()
    }
}
