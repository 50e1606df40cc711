//! The daemon's caches and cores: what each verb does, and the states of SPEC C19.
//!
//! A cache is one of:
//! - `running`: its engine serves every core;
//! - `incomplete`: loaded from its device, but some recorded cores are not attached yet
//!   (`add-core` with the same device, or the config file, attaches them); nothing of it is
//!   served until every core is there, because the cache may hold dirty data of any of them
//!   and a bare core would be stale;
//! - `detached`: the cache device is missing; its cores are not served (a lazy cache's core
//!   is missing its dirty data), unless the config forces the bare cores out (`degraded`);
//! - `degraded` also: running, with a device problem the core reports (`Cache::health`: the
//!   cache device failing and bypassed, a core device failing, writeback to a core failing;
//!   [`crate::health`]), with the problems as the reason.
//!
//! A wait for writeback (`writeback`, `stop-cache`, `remove-core`) first ends every retry
//! backoff (`Cache::retry_writeback_now`: the operator may just have repaired the device),
//! then waits while writeback makes progress; when writeback to a core keeps failing and
//! nothing has been written back for [`STALL_GRACE`], it fails with one line naming the core,
//! since when, the error and the dirty data left, and what to do instead.
//!
//! The registry's lock is held only to look things up and to change the tables; long waits
//! (writeback, stop) run outside it on the cache's engine.
//!
//! RBD cores carry the dirty marker of SPEC C18 (image metadata `tiercache.dirty` =
//! `dirty in tiercache <cache uuid>`), kept conservatively — set whenever the core *may* have
//! dirty data in the cache: at attach when the cache is in a lazy mode (`wb`, `wo`) or holds
//! dirty lines of it, and before a switch to a lazy mode; removed only when it has none and
//! cannot get any: after a writeback or a mode switch in a non-lazy mode, after
//! `stop-cache` left none of its lines dirty, after `remove-core`. An image marked by another
//! cache is refused at attach (docs/CEPH.md).

use crate::device::{DeviceSpec, Timed, preallocate, timed, with_timeout};
use crate::health::{err_name, human, utc, wall};
use crate::identity::{Holder, Identity, refusal};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiercache_core::cache::{Cache, CoreRecord, LoadReport, Problem, WritebackFailure};
use tiercache_core::event::IoError;
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::ioclass::IoClassTable;
use tiercache_core::policy::{CleaningPolicy, CutoffParams, CutoffPolicy, PromotionPolicy};
use tiercache_core::units::{CoreId, Lba, LineSize, Nanos};
use tiercache_core::wl::WlConfig;
use tiercache_core::wl::pace::Pacing;
use tiercache_core::{Config, config::Persist};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_format::superblock::{Layout, journal_bytes_for};
use tiercache_io::RbdBackend;

/// Highest cache id (as casadm).
pub const CACHE_ID_MAX: u16 = 16384;
/// Highest core id (the core table's limit).
pub const CORE_ID_MAX: u16 = 254;

/// How a cache is doing.
pub enum CacheRun {
    /// Serving.
    Running(Arc<Engine>),
    /// Loaded metadata, waiting for recorded cores: the base configuration, the report, and the
    /// cache device, kept open (a device is opened once: a second handle on a device with its
    /// own write cache, like `powercut:`, would not see the first one's writes).
    Incomplete(Box<Config>, Box<LoadReport>, Device),
    /// The cache device is missing (why).
    Detached(String),
}

/// One core of a cache.
pub struct CoreEntry {
    /// Device string as given (empty while not attached).
    pub device: String,
    /// The opened device, while attached.
    pub dev: Option<Device>,
    /// Export name.
    pub export: String,
    /// Size in blocks (recorded or current).
    pub size_blocks: u64,
    /// Serve the bare core although the cache device is missing (config `force_bare_core`).
    pub bare: bool,
    /// The same device as `dev` when it is an RBD image (for its dirty marker).
    pub rbd: Option<Arc<RbdBackend>>,
    /// The IO timeout `dev` runs under, if any.
    pub io_timeout: Option<Duration>,
    /// The timeout wrapper `dev` is, if it has one (its limit can change).
    pub timer: Option<Timed>,
    /// Why the config file's core could not be attached (while `dev` is `None`).
    pub error: Option<String>,
    /// Which storage `dev` is (set with it): no other device of this daemon may be it.
    pub held: Option<Identity>,
}

impl CoreEntry {
    /// A core the config file names that did not attach to a running cache: listed, with its
    /// error, until `add-core` attaches it or `remove-core` drops it.
    fn unattached(&self, c: &CacheEntry) -> bool {
        self.dev.is_none() && matches!(c.run, CacheRun::Running(_))
    }
}

/// One cache.
pub struct CacheEntry {
    /// Cache id.
    pub id: u16,
    /// Device string as given.
    pub device: String,
    /// State and engine.
    pub run: CacheRun,
    /// Cores by id.
    pub cores: BTreeMap<u16, CoreEntry>,
    /// Line size.
    pub line_size: LineSize,
    /// Volatile (`ram:`).
    pub volatile: bool,
    /// When counters were last reset, and the writeback count then (for the ETA).
    pub wb_sample: (Instant, u64),
    /// The IO timeout the cache device runs under, if any.
    pub io_timeout: Option<Duration>,
    /// Which storage the cache device is, while it is open (not detached): no other device of
    /// this daemon may be it.
    pub held: Option<Identity>,
}

impl CacheEntry {
    /// The state word of SPEC C19.
    pub fn state(&self) -> &'static str {
        match &self.run {
            CacheRun::Running(e) if e.with_machine(|m| m.is_degraded()) => "degraded",
            CacheRun::Running(_) => "running",
            CacheRun::Incomplete(..) => "incomplete",
            CacheRun::Detached(_) if self.cores.values().any(|c| c.bare) => "degraded",
            CacheRun::Detached(_) => "detached",
        }
    }

    fn engine(&self) -> Result<Arc<Engine>, String> {
        match &self.run {
            CacheRun::Running(e) => Ok(e.clone()),
            CacheRun::Incomplete(_, r, _) => Err(format!(
                "cache {} is incomplete: cores {} are not attached (add-core them)",
                self.id,
                missing_cores(self, r).join(", ")
            )),
            CacheRun::Detached(why) => Err(format!("cache {} is detached: {why}", self.id)),
        }
    }
}

fn missing_cores(c: &CacheEntry, r: &LoadReport) -> Vec<String> {
    r.cores
        .iter()
        .filter(|e| c.cores.get(&(e.id as u16)).is_none_or(|x| x.dev.is_none()))
        .map(|e| format!("{} ({})", e.id, e.export_name))
        .collect()
}

/// What an NBD export resolves to.
pub enum ExportTarget {
    /// Through the cache.
    Cached(Arc<Engine>, CoreId, LineSize),
    /// The bare core (forced while the cache device is missing).
    Bare(Device),
}

/// Every cache of the daemon.
#[derive(Default)]
pub struct Registry {
    caches: Mutex<BTreeMap<u16, CacheEntry>>,
    /// Held while deciding and writing RBD dirty markers, across a switch to a lazy mode and
    /// across `add-core`, so that a marker is never removed, or left unset, after another
    /// thread made the core dirtiable. Taken before `caches`, never while holding it.
    markers: Mutex<()>,
    /// The cores' IO timeouts by cache device string: those of the config file, and those a
    /// cache's cores had when it stopped. `start-cache --load` gives the recorded cores these
    /// (the on-disk core table does not hold timeouts). Taken after `caches`, never before.
    core_timeouts: Mutex<BTreeMap<String, BTreeMap<u16, Duration>>>,
    /// The health watcher's view (one log line per problem start and end). Taken before
    /// `caches`, never while holding it.
    watch: Mutex<crate::health::Watch>,
    /// Each export's request latencies and client bytes, by export name: kept across
    /// connections (the NBD server counts into them, `/metrics` reads them).
    request_stats: Mutex<BTreeMap<String, Arc<tiercache_nbd::RequestStats>>>,
    /// The NBD server, for its connection counts in `/metrics`.
    nbd: Mutex<Option<std::sync::Weak<tiercache_nbd::Server>>>,
    /// Held by `start-cache` until its cache is listed and by `add-core` throughout, so that a
    /// device checked as held by no one here (see [`Registry::claimable`]) is not taken by
    /// another attach before it is listed. Taken before `markers` and `caches`.
    attach: Mutex<()>,
    /// `writeback --cancel` requests so far, by cache id: a waiting `writeback` that sees the
    /// count change stops (see [`Registry::cancel_writeback`]).
    wb_cancels: Mutex<BTreeMap<u16, u64>>,
}

/// Creation parameters of a cache.
pub struct NewCache<'a> {
    /// Device string.
    pub device: &'a str,
    /// Cache id (default: smallest free).
    pub id: Option<u16>,
    /// Mode (default wt).
    pub mode: Option<&'a str>,
    /// Line size (default 4k).
    pub line_size: Option<&'a str>,
    /// Load what the device holds.
    pub load: bool,
    /// Format whatever the device holds.
    pub force: bool,
    /// Check everything and say what a new cache would use (lines, metadata on the device,
    /// RAM), without formatting or preallocating anything.
    pub dry_run: bool,
}

/// IO timeouts of a cache's devices (config `io_timeout`, `--io-timeout`): the cache device's,
/// and the cores' by id (used when `--load` attaches the recorded cores).
#[derive(Debug, Clone, Default)]
pub struct IoTimeouts {
    /// The cache device.
    pub cache: Option<Duration>,
    /// Core devices by core id.
    pub cores: BTreeMap<u16, Duration>,
}

/// How long writeback may make no progress while it is failing before a wait for it gives up.
pub const STALL_GRACE: Duration = Duration::from_secs(2);

/// Who waits for writeback (for what the failure says to do instead).
#[derive(Clone, Copy, PartialEq, Eq)]
enum WbFor {
    Writeback,
    Stop,
    Remove,
}

fn engine_config() -> EngineConfig {
    EngineConfig::threads(16)
}

/// A random cache identity.
fn new_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut u);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    for (i, b) in t.to_le_bytes().iter().enumerate() {
        u[i] ^= b;
    }
    u
}

fn hex(u: &[u8]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// Metadata RAM per line (measured by `tiercache bench core`, rounded up) and the staging pool.
const RAM_PER_LINE: u64 = 20;

/// A new cache's configuration on a device of `bytes`.
pub fn plan_cache(
    bytes: u64,
    ls: LineSize,
    mode: CacheMode,
    volatile: bool,
) -> Result<(Config, Value), String> {
    let mut cfg;
    let meta_bytes;
    if volatile {
        let lines = u32::try_from(bytes / ls.bytes()).map_err(|_| "too many lines".to_string())?;
        cfg = Config::new(lines, ls);
        cfg.volatile = true;
        meta_bytes = 0;
    } else {
        let (layout, lines) = Layout::plan(
            bytes,
            ls.bytes() as u32,
            journal_bytes_for(bytes),
        )
        .ok_or_else(|| {
            format!(
                "the cache device ({bytes} bytes) is too small for its metadata and one {ls} line"
            )
        })?;
        cfg = Config::new(lines, ls);
        cfg.data_offset = Lba(layout.data.offset / 512);
        cfg.persist = Some(Persist::new_cache(new_uuid(), bytes, ls, lines, layout));
        meta_bytes = layout.data.offset;
    }
    cfg.mode = mode;
    cfg.validate()?;
    let ram =
        cfg.lines as u64 * RAM_PER_LINE + cfg.pool_slots as u64 * cfg.pool_slot_blocks as u64 * 512;
    let space = json!({
        "lines": cfg.lines,
        "line_size": ls.bytes(),
        "data_bytes": cfg.lines as u64 * ls.bytes(),
        "metadata_bytes_on_device": meta_bytes,
        "ram_bytes": ram,
    });
    Ok((cfg, space))
}

/// A new `wl` cache on a device of `bytes`: half of it (in MiB) is the write log, the rest
/// the read cache's metadata and lines.
pub fn plan_wl_cache(bytes: u64, ls: LineSize) -> Result<(WlConfig, Value), String> {
    let log_bytes = (bytes / 2) & !((1 << 20) - 1);
    let (layout, lines) =
        Layout::plan_wl(bytes, ls.bytes() as u32, journal_bytes_for(bytes / 2), log_bytes)
            .ok_or_else(|| {
                format!(
                    "the cache device ({bytes} bytes) is too small for a write log, its read cache's metadata and one {ls} line"
                )
            })?;
    let mut rc = Config::new(lines, ls);
    rc.mode = CacheMode::Wa;
    rc.data_offset = Lba(layout.data.offset / 512);
    rc.persist = Some(Persist::new_cache(new_uuid(), bytes, ls, lines, layout));
    rc.validate()?;
    let cfg = WlConfig::on_device(rc)?;
    cfg.validate()?;
    let rc = &cfg.read_cache;
    let ram = rc.lines as u64 * RAM_PER_LINE
        + (rc.pool_slots + cfg.staging_slots) as u64 * rc.pool_slot_blocks as u64 * 512;
    let space = json!({
        "lines": rc.lines,
        "line_size": ls.bytes(),
        "data_bytes": rc.lines as u64 * ls.bytes(),
        "log_bytes": layout.log.bytes,
        "metadata_bytes_on_device": layout.data.offset - layout.log.bytes,
        "ram_bytes": ram,
    });
    Ok((cfg, space))
}

/// A mode name as given (any case, spaces around it) in the form modes are compared in.
fn mode_word(m: &str) -> String {
    m.trim().to_ascii_lowercase()
}

/// The mode a running cache serves in (`wl` for a write log).
fn mode_name(e: &Engine) -> String {
    if e.is_wl() {
        "wl".into()
    } else {
        e.with_cache(|c| c.mode().to_string())
    }
}

/// Whether the cache may hold dirty data of any core now (a lazy mode, or switching to one).
fn lazy_now(e: &Engine) -> bool {
    e.is_wl()
        || e.with_cache(|c| c.mode().is_lazy() || c.target_mode().is_some_and(CacheMode::is_lazy))
}

/// Whether the cache holds data of core `i` not yet on it (dirty lines; for `wl`, log entries).
fn core_has_dirty(e: &Engine, i: u16) -> bool {
    e.with_machine(|m| match m.wl() {
        Some(w) => w.pending(Some(CoreId(i))).0 > 0,
        None => m.cache().core_lines(CoreId(i)).1 > 0,
    })
}

/// Dirty bytes of a cache (for `wl`: log data not yet written back).
fn dirty_bytes(e: &Engine) -> u64 {
    e.with_machine(|m| match m.wl() {
        Some(w) => w.pending(None).1 * 512,
        None => m.cache().dirty_blocks() * 512,
    })
}

/// What a device holds at its start: a tiercache cache (its superblock's identity), other
/// data, or nothing (zeros).
enum Holds {
    Cache(String),
    Data,
    Nothing,
}

fn holds(dev: &Device) -> Holds {
    let d = dev.clone();
    let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
        d.read(off / 512, buf).map_err(|e| e.to_string())
    };
    if let Ok((sb, _, _)) = tiercache_core::cache::read_superblock(&mut read) {
        return Holds::Cache(hex(&sb.cache_id));
    }
    let n = dev.blocks().min(2048) as usize * 512;
    let mut b = vec![0u8; n];
    match dev.read(0, &mut b) {
        Ok(()) if b.iter().all(|&x| x == 0) => Holds::Nothing,
        _ => Holds::Data,
    }
}

/// What a device holds: `"cache"`, `"data"` or `"nothing"` (zeros at its start).
pub fn probe(device: &str) -> Result<&'static str, String> {
    let dev = DeviceSpec::parse(device)?.open(device)?;
    Ok(match holds(&dev) {
        Holds::Cache(_) => "cache",
        Holds::Data => "data",
        Holds::Nothing => "nothing",
    })
}

fn base_config() -> Config {
    Config::new(16, LineSize::K4)
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, CacheEntry>> {
        self.caches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `start-cache`.
    pub fn start_cache(&self, p: NewCache<'_>) -> Result<Value, String> {
        self.start_cache_with(p, &IoTimeouts::default())
    }

    /// `start-cache` with IO timeouts for the cache device and the recorded cores.
    pub fn start_cache_with(&self, p: NewCache<'_>, io: &IoTimeouts) -> Result<Value, String> {
        let spec = DeviceSpec::parse(p.device)?;
        let attach = lock_markers(&self.attach);
        if matches!(spec, DeviceSpec::Nbd(_) | DeviceSpec::Rbd(_)) {
            return Err(format!(
                "{}: nbd: and rbd: devices can be cores, not cache devices",
                p.device
            ));
        }
        if p.load && p.force {
            return Err("--load and --force contradict each other: pick one".into());
        }
        if p.load && p.dry_run {
            return Err(
                "--dry-run shows what a new cache would use; a loaded cache keeps its own (tiercache inspect shows it)".into(),
            );
        }
        // Mode names in any case (`WB`, `Wl`).
        let wl = p.mode.is_some_and(|m| mode_word(m) == "wl");
        let mode = match p.mode {
            _ if wl => None,
            Some(m) => Some(CacheMode::parse(m).ok_or_else(|| {
                format!("unknown mode '{m}' (want wt, wb, wa, wi, pt, wo or wl)")
            })?),
            None => None,
        };
        if wl && spec.volatile() {
            return Err(format!(
                "{}: mode wl keeps acknowledged writes in its log, which a ram: device loses at a crash; use a file or block device",
                p.device
            ));
        }
        if p.load && (mode.is_some() || wl || p.line_size.is_some()) {
            return Err(
                "--load takes mode and line size from the device; drop --mode/--line-size".into(),
            );
        }
        let ls = match p.line_size {
            Some(s) => LineSize::parse(s)
                .ok_or_else(|| format!("unknown line size '{s}' (want 4k, 8k, 16k, 32k or 64k)"))?,
            None => LineSize::K4,
        };
        {
            let caches = self.lock();
            if let Some(id) = p.id {
                if id == 0 || id > CACHE_ID_MAX {
                    return Err(format!("cache id {id} is out of range (1-{CACHE_ID_MAX})"));
                }
                if caches.contains_key(&id) {
                    return Err(format!("cache {id} already exists"));
                }
            }
            // A detached cache's device, back: `start-cache --load` it under its own id.
            if let Some(c) = caches
                .values()
                .find(|c| c.held.is_none() && !spec.volatile() && c.device == p.device)
            {
                return Err(format!("{} is already cache {}", p.device, c.id));
            }
        }
        if !spec.present() {
            return Err(format!("{}: no such file or device", p.device));
        }
        // Before anything opens it (opening locks it; creating a cache preallocates and
        // formats it).
        let held = self.claimable(&spec, p.device, None)?;
        if other_user(&spec) {
            return Err(format!(
                "{} is mounted or opened exclusively by another program; refusing to use it as a cache device (--force does not override this)",
                p.device
            ));
        }
        if spec.volatile() && p.load {
            return Err(format!(
                "{}: a ram: device holds no cache to load",
                p.device
            ));
        }
        let dev = with_timeout(spec.open(p.device)?, io.cache);
        let (run, volatile, line_size, report) = if p.load {
            let d = dev.clone();
            let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
                d.read(off / 512, buf)
                    .map_err(|e| format!("reading the cache device at byte {off}: {e}"))
            };
            let (cache, report) = tiercache_core::cache::open(&base_config(), &mut read)?;
            let ls = cache.config().line_size;
            drop(cache);
            let rep = load_summary(&report);
            let run = if report.cores.is_empty() {
                let (e, _) = Engine::open(&base_config(), dev.clone(), vec![], engine_config())?;
                CacheRun::Running(Arc::new(e))
            } else {
                CacheRun::Incomplete(Box::new(base_config()), Box::new(report), dev.clone())
            };
            (run, false, ls, rep)
        } else {
            if !spec.volatile() && !p.force {
                match holds(&dev) {
                    Holds::Cache(uuid) => {
                        return Err(format!(
                            "{} holds tiercache cache {uuid}; --load to load it, or --force to format it (its data is lost)",
                            p.device
                        ));
                    }
                    Holds::Data => {
                        return Err(format!(
                            "{} holds data (a file system or another program's); --force to format it (the data is lost)",
                            p.device
                        ));
                    }
                    Holds::Nothing => {}
                }
            }
            if p.dry_run {
                let bytes = dev.blocks() * 512;
                let space = if wl {
                    plan_wl_cache(bytes, ls)?.1
                } else {
                    let mode = mode.unwrap_or(CacheMode::Wt);
                    plan_cache(bytes, ls, mode, spec.volatile())?.1
                };
                return Ok(
                    json!({"dry_run": true, "cache_device": p.device, "would_create": space}),
                );
            }
            if let Some(path) = spec.path() {
                preallocate(path)?;
            }
            let e = if wl {
                let (cfg, space) = plan_wl_cache(dev.blocks() * 512, ls)?;
                let e = Engine::create_wl(cfg, dev.clone(), vec![], engine_config())?;
                (e, space)
            } else {
                let mode = mode.unwrap_or(CacheMode::Wt);
                let (cfg, space) = plan_cache(dev.blocks() * 512, ls, mode, spec.volatile())?;
                (
                    Engine::create(cfg, dev.clone(), vec![], engine_config())?,
                    space,
                )
            };
            (CacheRun::Running(Arc::new(e.0)), spec.volatile(), ls, e.1)
        };
        let mut caches = self.lock();
        let id = match p.id {
            Some(id) if !caches.contains_key(&id) => id,
            Some(id) => return Err(format!("cache {id} already exists")),
            None => (1..=CACHE_ID_MAX)
                .find(|i| !caches.contains_key(i))
                .ok_or("no free cache id")?,
        };
        let mut entry = CacheEntry {
            id,
            device: p.device.to_string(),
            run,
            cores: BTreeMap::new(),
            line_size,
            volatile,
            wb_sample: (Instant::now(), 0),
            io_timeout: io.cache,
            held: Some(held),
        };
        if let CacheRun::Incomplete(_, r, _) = &entry.run {
            for e in &r.cores {
                entry.cores.insert(
                    e.id as u16,
                    CoreEntry {
                        device: String::new(),
                        dev: None,
                        export: e.export_name.clone(),
                        size_blocks: e.size_blocks,
                        bare: false,
                        rbd: None,
                        io_timeout: None,
                        timer: None,
                        error: None,
                        held: None,
                    },
                );
            }
        }
        let recorded: Vec<(u16, String)> = match &entry.run {
            CacheRun::Incomplete(_, r, _) => r
                .cores
                .iter()
                .filter(|e| !e.device.is_empty())
                .map(|e| (e.id as u16, e.device.clone()))
                .collect(),
            _ => vec![],
        };
        caches.insert(id, entry);
        drop(caches);
        drop(attach);
        // `--load` brings the cores back by the device strings they were attached with (each
        // checked against its recorded identity and size), with the IO timeouts given, or else
        // those they had (config file, last stop); a core not found stays detached until
        // `add-core` attaches it.
        let known = self.known_core_timeouts(p.device);
        let mut problems = Vec::new();
        for (core, dev) in recorded {
            let t = io.cores.get(&core).or(known.get(&core)).copied();
            if let Err(e) = self.add_core_with(id, &dev, Some(core), None, t) {
                crate::log!(
                    warn,
                    "recorded core not attached",
                    cache = id,
                    core = core,
                    device = dev,
                    reason = e
                );
                problems.push(format!("core {core} ({dev}): {e}"));
            }
        }
        let state = self.state(id).unwrap_or("detached");
        crate::log!(
            info,
            "cache started",
            cache = id,
            device = p.device,
            state = state,
            io_timeout = io.cache.map_or("none".into(), crate::device::show_timeout)
        );
        Ok(
            json!({"cache_id": id, "state": state, if p.load {"loaded"} else {"created"}: report,
            "cores_not_attached": problems}),
        )
    }

    /// Remembers the IO timeouts of the cores of the cache on `device` (the config file's, or
    /// what the cores had when the cache stopped), for `start-cache --load`.
    pub fn remember_core_timeouts(&self, device: &str, t: BTreeMap<u16, Duration>) {
        self.core_timeouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(device.to_string(), t);
    }

    fn known_core_timeouts(&self, device: &str) -> BTreeMap<u16, Duration> {
        self.core_timeouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(device)
            .cloned()
            .unwrap_or_default()
    }

    /// A core of the config file that could not be attached to cache `cache_id` (`error`):
    /// listed as `detached` with the error (a recorded core of an incomplete cache gets the
    /// error as its reason), until `add-core` attaches it. Its export name is kept unless
    /// another core has it (the error may be just that).
    pub fn note_unattached(
        &self,
        cache_id: u16,
        core_id: u16,
        device: &str,
        export: &str,
        error: &str,
    ) {
        let mut caches = self.lock();
        let taken = caches
            .values()
            .any(|c| c.cores.values().any(|k| k.export == export));
        let Some(c) = caches.get_mut(&cache_id) else {
            return;
        };
        if let Some(k) = c.cores.get_mut(&core_id) {
            if k.dev.is_none() {
                k.error = Some(error.to_string());
            }
            return;
        }
        c.cores.insert(
            core_id,
            CoreEntry {
                device: device.to_string(),
                dev: None,
                export: if taken {
                    String::new()
                } else {
                    export.to_string()
                },
                size_blocks: 0,
                bare: false,
                rbd: None,
                io_timeout: None,
                timer: None,
                error: Some(error.to_string()),
                held: None,
            },
        );
    }

    /// Registers a cache whose device is missing (reassembly from the config).
    pub fn add_detached(
        &self,
        id: u16,
        device: &str,
        why: String,
        cores: Vec<(u16, String, String, bool)>,
    ) {
        let _attach = lock_markers(&self.attach);
        let mut caches = self.lock();
        caches.insert(
            id,
            CacheEntry {
                id,
                device: device.to_string(),
                run: CacheRun::Detached(why),
                cores: BTreeMap::new(),
                line_size: LineSize::K4,
                volatile: false,
                wb_sample: (Instant::now(), 0),
                io_timeout: None,
                held: None,
            },
        );
        for (cid, dev, export, bare) in cores {
            // A bare core is opened only when no other device of this daemon is it.
            let opened = bare.then(|| {
                let spec = DeviceSpec::parse(&dev)?;
                let held = Identity::of(&spec, &dev)?;
                check_unheld(&caches, &dev, &held, None)?;
                let (d, rbd) = spec.open_core(&dev)?;
                Ok::<_, String>((d, rbd, held))
            });
            let (d, rbd, held, error) = match opened {
                Some(Ok((d, rbd, held))) => (Some(d), rbd, Some(held), None),
                Some(Err(e)) => {
                    crate::log!(
                        error,
                        "bare core not served",
                        cache = id,
                        core = cid,
                        reason = e
                    );
                    (None, None, None, Some(e))
                }
                None => (None, None, None, None),
            };
            let size_blocks = d.as_ref().map_or(0, |d| d.blocks());
            let entry = CoreEntry {
                device: dev,
                dev: d,
                export,
                size_blocks,
                bare,
                rbd,
                io_timeout: None,
                timer: None,
                error,
                held,
            };
            if let Some(c) = caches.get_mut(&id) {
                c.cores.insert(cid, entry);
            }
        }
    }

    /// `add-core`.
    pub fn add_core(
        &self,
        cache_id: u16,
        device: &str,
        core_id: Option<u16>,
        export: Option<&str>,
    ) -> Result<Value, String> {
        self.add_core_with(cache_id, device, core_id, export, None)
    }

    /// `add-core`, with the core device behind an IO timeout when one is given. A core already
    /// attached (by `--load`, or the same `add-core` again) gets the timeout when one is given
    /// and keeps its own otherwise.
    pub fn add_core_with(
        &self,
        cache_id: u16,
        device: &str,
        core_id: Option<u16>,
        export: Option<&str>,
        io_timeout: Option<Duration>,
    ) -> Result<Value, String> {
        let spec = DeviceSpec::parse(device)?;
        // Lock order: attach, markers, then the registry (then an engine). Held throughout, so
        // that no other attach takes the device between the identity check and the core being
        // listed, and a set-mode cannot switch to a lazy mode between the marker decision and
        // the core being listed.
        let _attach = lock_markers(&self.attach);
        let _markers = lock_markers(&self.markers);
        if let Some(i) = core_id
            && i > CORE_ID_MAX
        {
            return Err(format!("core id {i} is out of range (0-{CORE_ID_MAX})"));
        }
        if let Some(n) = export {
            check_export_name(n)?;
        }
        {
            let caches = self.lock();
            let c = caches
                .get(&cache_id)
                .ok_or_else(|| format!("no cache {cache_id}"))?;
            if let CacheRun::Detached(why) = &c.run {
                return Err(format!("cache {cache_id} is detached ({why})"));
            }
            // A core listed but not attached (of a detached cache, say) by its device string;
            // attached devices by their identity, below.
            for other in caches.values() {
                if let Some((i, _)) = other.cores.iter().find(|(i, x)| {
                    x.dev.is_none()
                        && x.device == device
                        && !(other.id == cache_id && (core_id == Some(**i) || x.unattached(other)))
                }) {
                    return Err(format!(
                        "{device} is already core {i} of cache {}",
                        other.id
                    ));
                }
            }
            if other_user(&spec) {
                return Err(format!(
                    "{device} is mounted or opened exclusively by another program; refusing to cache it"
                ));
            }
        }
        if !spec.present() {
            return Err(format!("{device}: no such file or device"));
        }
        // The same core added again (by id) is not another holder of it.
        let held = self.claimable(&spec, device, core_id.map(|i| (cache_id, i)))?;
        let identity = spec.identity(device, &held)?;
        // Opened only where it is attached: a core already attached keeps its one handle.
        let open = || {
            spec.open_core(device).map(|(d, rbd)| {
                let (d, timer) = timed(d, io_timeout);
                (d, timer, rbd)
            })
        };
        let mut caches = self.lock();
        let all_exports: Vec<String> = caches
            .values()
            .flat_map(|c| c.cores.values().map(|x| x.export.clone()))
            .collect();
        let c = caches
            .get_mut(&cache_id)
            .ok_or_else(|| format!("no cache {cache_id}"))?;
        match &c.run {
            CacheRun::Incomplete(base, report, cache_dev) => {
                // Attach a recorded core: by id, else by identity.
                let e = report
                    .cores
                    .iter()
                    .find(|e| match core_id {
                        Some(i) => e.id as u16 == i,
                        None => e.identity.same_device(&identity),
                    })
                    .ok_or_else(|| {
                        format!(
                            "cache {cache_id} is incomplete and {device} is none of its recorded cores (missing: {})",
                            missing_cores(c, report).join(", ")
                        )
                    })?;
                if !e.identity.same_device(&identity) {
                    return Err(format!(
                        "core {} of cache {cache_id} was recorded as {}; {device} is {}: not the same device",
                        e.id, e.identity, identity
                    ));
                }
                if let Some(k) = c.cores.get_mut(&(e.id as u16))
                    && k.dev.is_some()
                {
                    if let Some(t) = io_timeout {
                        retime(cache_id, e.id as u16, k, t, None)?;
                    }
                    return Ok(json!({"cache_id": cache_id, "core_id": e.id,
                        "export": k.export, "already_attached": true, "state": "incomplete"}));
                }
                let (dev, timer, rbd) = open()?;
                if let Some(r) = &rbd {
                    check_marker(device, r, &hex(&report.superblock.cache_id))?;
                }
                // A core that grew is taken at its new size when the engine opens (SPEC C22).
                if e.size_blocks > dev.blocks() {
                    return Err(format!(
                        "core {} of cache {cache_id} was {} bytes, {device} is {}: it shrank, or it is not the same device",
                        e.id,
                        e.size_blocks * 512,
                        dev.blocks() * 512
                    ));
                }
                let id = e.id as u16;
                if let Some(n) = export
                    && all_exports.iter().any(|x| x == n)
                    && c.cores[&id].export != n
                {
                    return Err(format!("export name '{n}' is taken"));
                }
                let ce = c.cores.get_mut(&id).expect("recorded cores are listed");
                ce.device = device.to_string();
                ce.dev = Some(dev);
                ce.rbd = rbd;
                ce.io_timeout = io_timeout;
                ce.timer = timer;
                ce.error = None;
                ce.held = Some(held);
                if let Some(n) = export {
                    ce.export = n.to_string();
                }
                let missing = missing_cores(c, report);
                if !missing.is_empty() {
                    return Ok(
                        json!({"cache_id": cache_id, "core_id": id, "state": "incomplete",
                        "missing": missing}),
                    );
                }
                let base = (**base).clone();
                let specs: Vec<CoreSpec> = report
                    .cores
                    .iter()
                    .map(|e| CoreSpec {
                        id: CoreId(e.id as u16),
                        dev: c.cores[&(e.id as u16)].dev.clone().expect("all attached"),
                        record: CoreRecord {
                            identity: e.identity.clone(),
                            export_name: e.export_name.clone(),
                            device: e.device.clone(),
                        },
                    })
                    .collect();
                let (engine, rep) =
                    Engine::open_checked(&base, cache_dev.clone(), specs, engine_config())?;
                // Export names and device strings given now (config file, add-core) replace
                // the recorded ones.
                for e in &report.cores {
                    let k = &c.cores[&(e.id as u16)];
                    if k.export != e.export_name || k.device != e.device {
                        let rec = CoreRecord {
                            identity: e.identity.clone(),
                            export_name: k.export.clone(),
                            device: k.device.clone(),
                        };
                        engine.with_cache(|k| k.set_core_record(CoreId(e.id as u16), rec))?;
                    }
                }
                engine.wait(|k| k.tables_durable());
                // Before anything is served: the marker of every RBD core as the loaded cache
                // says (kept or set when it may have dirty data, removed when it cannot).
                let rbds = rbd_markers(&c.cores);
                if !rbds.is_empty()
                    && let Err(why) = sync_markers(&engine, &rbds, false)
                {
                    crate::log!(
                        error,
                        "dirty marker not updated",
                        cache = cache_id,
                        reason = why
                    );
                }
                c.run = CacheRun::Running(Arc::new(engine));
                crate::log!(
                    info,
                    "cache running",
                    cache = cache_id,
                    dirty_lines = rep.dirty_lines
                );
                Ok(
                    json!({"cache_id": cache_id, "core_id": id, "state": "running",
                    "loaded": load_summary(&rep)}),
                )
            }
            CacheRun::Running(engine) => {
                // Attaching a core that is already attached, by the same device (another name
                // for it is fine: the identity decides), changes nothing: reassembly after
                // `--load` attached the recorded cores by themselves.
                if let Some(i) = core_id
                    && c.cores.contains_key(&i)
                {
                    let rec = engine.with_cache(|k| k.core_record(CoreId(i)).cloned());
                    if rec
                        .as_ref()
                        .is_some_and(|r| r.identity.same_device(&identity))
                    {
                        if let Some(n) = export
                            && c.cores[&i].export != n
                        {
                            if all_exports.iter().any(|x| x == n) {
                                return Err(format!("export name '{n}' is taken"));
                            }
                            let mut r = rec.expect("checked");
                            r.export_name = n.to_string();
                            r.device = device.to_string();
                            engine.with_cache(|k| k.set_core_record(CoreId(i), r))?;
                            engine.wait(|k| k.tables_durable());
                            let ce = c.cores.get_mut(&i).expect("checked");
                            ce.export = n.to_string();
                            ce.device = device.to_string();
                        }
                        // A new IO timeout applies to the core as attached (e.g. by `--load`).
                        if let Some(t) = io_timeout {
                            let engine = engine.clone();
                            let k = c.cores.get_mut(&i).expect("checked");
                            retime(cache_id, i, k, t, Some(&engine))?;
                        }
                        return Ok(json!({"cache_id": cache_id, "core_id": i,
                            "export": c.cores[&i].export, "already_attached": true,
                            "io_timeout_ms": c.cores[&i].io_timeout.map(|t| t.as_millis() as u64)}));
                    }
                }
                // A core of the config file that did not attach at start (listed with its
                // error) is this one when the id, or else the device, is its: it takes its
                // place and, unless another is given, its export name.
                let waiting = match core_id {
                    Some(i) => c.cores.get(&i).filter(|k| k.dev.is_none()).map(|_| i),
                    None => c
                        .cores
                        .iter()
                        .find(|(_, k)| k.dev.is_none() && k.device == device)
                        .map(|(i, _)| *i),
                };
                let id = match core_id {
                    Some(i) if c.cores.contains_key(&i) && waiting != Some(i) => {
                        return Err(format!("core {i} of cache {cache_id} already exists"));
                    }
                    Some(i) => i,
                    None => match waiting {
                        Some(i) => i,
                        None => (0..=CORE_ID_MAX)
                            .find(|i| !c.cores.contains_key(i))
                            .ok_or("no free core id")?,
                    },
                };
                let own = waiting.map(|i| c.cores[&i].export.clone());
                let name = export
                    .map(str::to_string)
                    .or_else(|| own.clone().filter(|n| !n.is_empty()))
                    .unwrap_or_else(|| format!("cache{cache_id}-core{id}"));
                if all_exports.contains(&name) && own.as_ref() != Some(&name) {
                    return Err(format!("export name '{name}' is taken"));
                }
                let (dev, timer, rbd) = open()?;
                if let Some(r) = &rbd {
                    // Marked (in a lazy mode) before the core can get dirty data; set-mode
                    // waits for the marker lock, held here until the core is listed.
                    let uuid = engine_uuid(engine);
                    check_marker(device, r, &uuid)?;
                    let lazy = lazy_now(engine);
                    r.set_dirty_marker(lazy.then_some(uuid.as_str()))
                        .map_err(|e| format!("{device}: dirty marker: {e}"))?;
                }
                engine.add_core(CoreSpec {
                    id: CoreId(id),
                    dev: dev.clone(),
                    record: CoreRecord {
                        identity,
                        export_name: name.clone(),
                        device: device.to_string(),
                    },
                })?;
                c.cores.insert(
                    id,
                    CoreEntry {
                        device: device.to_string(),
                        size_blocks: dev.blocks(),
                        dev: Some(dev),
                        export: name.clone(),
                        bare: false,
                        rbd,
                        io_timeout,
                        timer,
                        error: None,
                        held: Some(held),
                    },
                );
                crate::log!(
                    info,
                    "core added",
                    cache = cache_id,
                    core = id,
                    export = name,
                    io_timeout = io_timeout.map_or("none".into(), crate::device::show_timeout)
                );
                Ok(json!({"cache_id": cache_id, "core_id": id, "export": name}))
            }
            CacheRun::Detached(why) => Err(format!("cache {cache_id} is detached ({why})")),
        }
    }

    /// Which storage `device` (`spec`) is, when no device this daemon holds — a cache device
    /// that is open, an attached core — is it or overlaps it (module `identity`); else the
    /// one-line refusal naming the holder. `except` (cache id, core id) is a core not counted
    /// (the same core added again). Nothing is opened.
    pub fn claimable(
        &self,
        spec: &DeviceSpec,
        device: &str,
        except: Option<(u16, u16)>,
    ) -> Result<Identity, String> {
        let held = Identity::of(spec, device)?;
        check_unheld(&self.lock(), device, &held, except)?;
        Ok(held)
    }

    /// The engine of a running cache.
    pub fn engine(&self, cache_id: u16) -> Result<Arc<Engine>, String> {
        self.lock()
            .get(&cache_id)
            .ok_or_else(|| format!("no cache {cache_id}"))?
            .engine()
    }

    fn check_core(&self, cache_id: u16, core_id: u16) -> Result<Arc<Engine>, String> {
        let caches = self.lock();
        let c = caches
            .get(&cache_id)
            .ok_or_else(|| format!("no cache {cache_id}"))?;
        match c.cores.get(&core_id) {
            None => return Err(format!("cache {cache_id} has no core {core_id}")),
            Some(k) if k.unattached(c) => {
                return Err(format!(
                    "core {core_id} of cache {cache_id} is {}",
                    core_state(c, k).1
                ));
            }
            Some(_) => {}
        }
        c.engine()
    }

    /// Writes every dirty line back; `only` waits for one core's lines only. Calls `progress`
    /// with (lines written back, lines that were dirty) about every 200 ms. Retries failing
    /// writeback at once, then fails with one line when it keeps failing (see the module
    /// docs).
    pub fn writeback(
        &self,
        cache_id: u16,
        only: Option<u16>,
        progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        self.writeback_for(cache_id, only, WbFor::Writeback, progress)
    }

    /// `writeback --cancel` (or a `writeback` whose client went away): every `writeback`
    /// command waiting on the cache stops and answers with what it wrote and what is still
    /// dirty; the lines are no longer written back regardless of the cleaning policy (the
    /// writeback jobs already running finish, and the policy cleans as it would have).
    /// `stop-cache` and `remove-core` are not cancelled by it.
    pub fn cancel_writeback(&self, cache_id: u16) -> Result<Value, String> {
        let e = self.engine(cache_id)?;
        let was = e.with_cache(|c| c.cancel_writeback());
        *self.wb_cancels.lock().unwrap().entry(cache_id).or_default() += 1;
        let (lines, blocks) = e.with_cache(|c| (c.dirty_lines() as u64, c.dirty_blocks()));
        crate::log!(
            info,
            "writeback cancelled",
            cache = cache_id,
            running = was,
            dirty_lines = lines
        );
        Ok(json!({"cache_id": cache_id, "was_running": was,
            "dirty_lines": lines, "dirty_bytes": blocks * 512}))
    }

    fn wb_cancel_count(&self, cache_id: u16) -> u64 {
        self.wb_cancels
            .lock()
            .unwrap()
            .get(&cache_id)
            .copied()
            .unwrap_or(0)
    }

    /// The one line a cancelled `writeback` answers with.
    fn wb_cancelled(
        cache_id: u16,
        written: u64,
        left: u64,
        unit: &str,
        unit_bytes: u64,
        t0: Instant,
    ) -> String {
        format!(
            "writeback of cache {cache_id} cancelled after {:.1} s: {} ({written} {unit}) written back, {} ({left} {unit}) still dirty",
            t0.elapsed().as_secs_f64(),
            human(written * unit_bytes),
            human(left * unit_bytes),
        )
    }

    fn writeback_for(
        &self,
        cache_id: u16,
        only: Option<u16>,
        who: WbFor,
        mut progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        let e = match only {
            Some(k) => self.check_core(cache_id, k)?,
            None => self.engine(cache_id)?,
        };
        // Only `writeback` itself can be cancelled.
        let cancels0 = (who == WbFor::Writeback).then(|| self.wb_cancel_count(cache_id));
        let cancelled = || cancels0.is_some_and(|n| self.wb_cancel_count(cache_id) != n);
        if e.is_wl() {
            return self.writeback_wl(cache_id, &e, only, who, &cancelled, progress);
        }
        let line_bytes = e.with_cache(|c| c.config().line_size.bytes());
        let dirty = |c: &Cache| match only {
            Some(k) => c.core_lines(CoreId(k)).1 as u64,
            None => c.dirty_lines() as u64,
        };
        // Failed attempts so far, per core (`None`: reading the cache device).
        let failures = |c: &Cache| -> BTreeMap<Option<u16>, u64> {
            let mut m: BTreeMap<Option<u16>, u64> = (0..=CORE_ID_MAX)
                .filter_map(|i| Some((Some(i), c.core_faults(CoreId(i))?.writeback.failures)))
                .collect();
            m.insert(None, c.faults().writeback_reads.failures);
            m
        };
        let (total, failures0) = e.with_cache(|c| {
            c.retry_writeback_now();
            c.start_writeback();
            (dirty(c), failures(c))
        });
        let t0 = Instant::now();
        let (mut least, mut moved) = (total, Instant::now());
        loop {
            let (left, running, st) =
                e.with_cache(|c| (dirty(c), c.writeback_running(), c.writeback_status()));
            progress(total.saturating_sub(left), total.max(left), "lines");
            if left == 0 {
                break;
            }
            if cancelled() {
                let written = total.saturating_sub(left);
                return Err(Self::wb_cancelled(
                    cache_id, written, left, "lines", line_bytes, t0,
                ));
            }
            if left < least {
                (least, moved) = (left, Instant::now());
            }
            // Failing, tried again since this wait began, and nothing written back lately.
            let failed = st.failing.iter().find(|f| {
                (only.is_none() || f.core.is_none() || f.core == only.map(CoreId))
                    && f.failures > failures0.get(&f.core.map(|k| k.0)).copied().unwrap_or(0)
            });
            if let Some(f) = failed
                && moved.elapsed() >= STALL_GRACE
            {
                return Err(self.writeback_failed(cache_id, &e, f, who));
            }
            if !running {
                e.with_cache(|c| c.start_writeback());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.markers_after_writeback(cache_id, &e, only)?;
        Ok(json!({"cache_id": cache_id, "lines_written_back": total,
            "seconds": t0.elapsed().as_secs_f64()}))
    }

    /// What to do when a wait for writeback gives up, for each verb.
    fn instead(cache_id: u16, core: Option<u16>, who: WbFor) -> String {
        match (who, core) {
            (WbFor::Writeback, _) => format!(
                "repair it and run `tiercache writeback --cache-id {cache_id}` again (it retries at once), or `tiercache stop-cache --cache-id {cache_id} --no-writeback` to stop and keep the dirty data on the cache device"
            ),
            (WbFor::Stop, _) | (WbFor::Remove, None) => format!(
                "repair it and try again, or `tiercache stop-cache --cache-id {cache_id} --no-writeback` to stop now and keep the dirty data on the cache device (written back after `start-cache --load`)"
            ),
            (WbFor::Remove, Some(k)) => format!(
                "repair it and try again; or `tiercache stop-cache --cache-id {cache_id} --no-writeback` keeps the dirty data on the cache device, and `tiercache invalidate --cache-id {cache_id} --core-id {k} --force` drops it (lost)"
            ),
        }
    }

    /// The one line a wait for writeback fails with: which core, since when, the error, how
    /// much dirty data, and what to do instead.
    fn writeback_failed(
        &self,
        cache_id: u16,
        e: &Engine,
        f: &WritebackFailure,
        who: WbFor,
    ) -> String {
        let now = e.now();
        let core = f.core.map(|k| k.0);
        let dirty_bytes = e.with_cache(|c| match f.core {
            Some(k) => c
                .core_health(k)
                .and_then(|h| {
                    h.problems.iter().find_map(|p| match p {
                        Problem::Writeback { dirty_blocks, .. } => Some(*dirty_blocks),
                        _ => None,
                    })
                })
                .unwrap_or(0),
            None => c.dirty_blocks(),
        }) * 512;
        let what = match core {
            Some(k) => {
                let dev = self
                    .lock()
                    .get(&cache_id)
                    .and_then(|c| c.cores.get(&k).map(|x| x.device.clone()))
                    .unwrap_or_default();
                format!("writeback to core {k} ({dev}) of cache {cache_id}")
            }
            None => format!(
                "writeback of cache {cache_id} (reading its dirty data from the cache device)"
            ),
        };
        format!(
            "{what} has been failing since {} ({:.0} s; {}; {} failed attempts): {} of dirty data ({} lines) stay on the cache device; {}",
            utc(wall(f.since, now)),
            now.0.saturating_sub(f.since.0) as f64 / 1e9,
            err_name(f.last_error),
            f.failures,
            human(dirty_bytes),
            f.dirty_lines,
            Self::instead(cache_id, core, who)
        )
    }

    /// `writeback` of a write log (PWL's `persistent-cache flush`): the log is written back
    /// generation by generation all the time; this waits until nothing of the core(s) is left
    /// in it, with progress in blocks.
    fn writeback_wl(
        &self,
        cache_id: u16,
        e: &Engine,
        only: Option<u16>,
        who: WbFor,
        cancelled: &dyn Fn() -> bool,
        mut progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        let left = || {
            e.with_machine(|m| {
                let w = m.wl_mut().expect("a write log");
                w.set_writeback_paused(false);
                w.drain();
                (w.pending(only.map(CoreId)), w.counters().wb_errors)
            })
        };
        let ((_, total), errors0) = left();
        let t0 = Instant::now();
        let (mut least, mut moved) = (total, Instant::now());
        loop {
            let ((entries, blocks), errors) = left();
            progress(total.saturating_sub(blocks), total.max(blocks), "blocks");
            if entries == 0 {
                break;
            }
            // The log goes on being written back: only the wait ends.
            if cancelled() {
                let written = total.saturating_sub(blocks);
                return Err(Self::wb_cancelled(
                    cache_id, written, blocks, "blocks", 512, t0,
                ));
            }
            if blocks < least {
                (least, moved) = (blocks, Instant::now());
            }
            // The log is written back in order: a failing core holds back everything after it.
            if errors > errors0 && moved.elapsed() >= STALL_GRACE {
                let now = e.now();
                let why = e.with_machine(|m| {
                    if let Some(Problem::LogDevice {
                        since, last_error, ..
                    }) = m.wl().and_then(|w| w.log_problem())
                    {
                        return format!(
                            "the log on the cache device has been failing since {} ({})",
                            utc(wall(since, now)),
                            err_name(last_error)
                        );
                    }
                    let c = m.cache();
                    let failing = (0..=CORE_ID_MAX).find_map(|i| {
                        let f = c.core_faults(CoreId(i))?;
                        let since = f.failing_since?;
                        Some((i, since, f.device.last.map_or(IoError::Io, |x| x.0)))
                    });
                    match failing {
                        Some((k, since, err)) => format!(
                            "core {k} has been failing since {} ({})",
                            utc(wall(since, now)),
                            err_name(err)
                        ),
                        None => "reading the log or writing the cores fails".to_string(),
                    }
                });
                return Err(format!(
                    "writeback of the write log of cache {cache_id} is failing: {why}; {} writeback errors since this command began; {} of logged data stay in the log on the cache device; {}",
                    errors - errors0,
                    human(blocks * 512),
                    Self::instead(cache_id, only, who)
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.markers_after_writeback(cache_id, e, only)?;
        Ok(
            json!({"cache_id": cache_id, "bytes_written_back": total * 512,
            "seconds": t0.elapsed().as_secs_f64()}),
        )
    }

    /// After a writeback (of core `only`, or of all): nothing of those cores is dirty now, so
    /// their RBD markers go unless the mode may dirty them again.
    fn markers_after_writeback(
        &self,
        cache_id: u16,
        e: &Engine,
        only: Option<u16>,
    ) -> Result<(), String> {
        let _m = lock_markers(&self.markers);
        let rbds: Vec<_> = self
            .rbd_cores(cache_id)
            .into_iter()
            .filter(|(i, ..)| only.is_none_or(|k| k == *i))
            .collect();
        if !rbds.is_empty() {
            sync_markers(e, &rbds, false)?;
        }
        Ok(())
    }

    /// The RBD cores of a cache, with their handles and dirty-marker waits ([`rbd_markers`]).
    fn rbd_cores(&self, cache_id: u16) -> Vec<(u16, Arc<RbdBackend>, Duration)> {
        self.lock()
            .get(&cache_id)
            .map_or(Vec::new(), |c| rbd_markers(&c.cores))
    }

    /// `remove-core`.
    pub fn remove_core(
        &self,
        cache_id: u16,
        core_id: u16,
        no_writeback: bool,
        progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        {
            // A core of the config file that never attached: nothing of it is in the cache.
            let mut caches = self.lock();
            if let Some(c) = caches.get_mut(&cache_id)
                && c.cores.get(&core_id).is_some_and(|k| k.unattached(c))
            {
                c.cores.remove(&core_id);
                crate::log!(info, "core removed", cache = cache_id, core = core_id);
                return Ok(json!({"cache_id": cache_id, "core_id": core_id, "removed": true}));
            }
        }
        let e = self.check_core(cache_id, core_id)?;
        if !no_writeback {
            self.writeback_for(cache_id, Some(core_id), WbFor::Remove, progress)?;
        } else if core_has_dirty(&e, core_id) {
            let blocks = match e
                .with_machine(|m| m.wl().map(|w| w.pending(Some(CoreId(core_id))).1))
            {
                Some(b) => b,
                None => e.with_cache(|c| {
                    c.core_lines(CoreId(core_id)).1 as u64 * c.config().line_size.blocks() as u64
                }),
            };
            return Err(format!(
                "core {core_id} of cache {cache_id} has dirty data (up to {}) and --no-writeback removes a core only when it has none: write it back with `tiercache writeback --cache-id {cache_id} --core-id {core_id}`, keep it on the cache device with `tiercache stop-cache --cache-id {cache_id} --no-writeback`, or drop it with `tiercache invalidate --cache-id {cache_id} --core-id {core_id} --force` (lost)",
                human(blocks * 512)
            ));
        }
        let mut tries = 0;
        loop {
            match e.remove_core(CoreId(core_id)) {
                Ok(()) => break,
                Err(m) if m.contains("in flight") && tries < 500 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(m) => return Err(m),
            }
        }
        let removed = {
            let mut caches = self.lock();
            caches
                .get_mut(&cache_id)
                .and_then(|c| c.cores.remove(&core_id))
        };
        // The cache holds nothing of it any more.
        if let Some(r) = removed.and_then(|k| k.rbd) {
            let _m = lock_markers(&self.markers);
            if let Err(e) = r.set_dirty_marker(None) {
                crate::log!(
                    warn,
                    "dirty marker not removed",
                    cache = cache_id,
                    core = core_id,
                    reason = e
                );
            }
        }
        crate::log!(info, "core removed", cache = cache_id, core = core_id);
        Ok(json!({"cache_id": cache_id, "core_id": core_id, "removed": true}))
    }

    /// `stop-cache`: writeback (unless `no_writeback`), final checkpoint, devices flushed.
    pub fn stop_cache(
        &self,
        cache_id: u16,
        no_writeback: bool,
        progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        let running = {
            let caches = self.lock();
            let c = caches
                .get(&cache_id)
                .ok_or_else(|| format!("no cache {cache_id}"))?;
            matches!(c.run, CacheRun::Running(_))
        };
        let mut dirty = 0;
        let mut dirty_b = 0;
        if running && !no_writeback {
            self.writeback_for(cache_id, None, WbFor::Stop, progress)?;
        }
        // Problems that ended (the writeback above) are logged as ended before the cache
        // leaves the watcher's view (between two polls they would go without a line).
        self.poll_health();
        let entry = self.lock().remove(&cache_id);
        let Some(entry) = entry else {
            return Err(format!("no cache {cache_id}"));
        };
        // For a later `start-cache --load`: the cores' IO timeouts as they were.
        if matches!(entry.run, CacheRun::Running(_)) {
            let mut t = self.known_core_timeouts(&entry.device);
            t.extend(
                entry
                    .cores
                    .iter()
                    .filter_map(|(i, k)| Some((*i, k.io_timeout?))),
            );
            self.remember_core_timeouts(&entry.device, t);
        }
        let mut flush_failed = None;
        if let CacheRun::Running(e) = entry.run {
            // NBD connections may still hold the engine: stop it in place (final checkpoint,
            // core flushes; their later requests fail), then let it go. A core whose flush
            // fails does not keep the cache from stopping (its checkpoint is written): said
            // in the log and the answer.
            note_flush_failure(cache_id, e.stop_shared(), &mut flush_failed);
            // What stays dirty, counted once stopped: writeback runs until the stop (it kept
            // going after an earlier count, and the answer said more than the device held).
            dirty = e.with_cache(|c| c.dirty_lines());
            // For a write log: what stays in the log on the device (what `inspect` and the
            // next load find), including entries written back in a generation the stop
            // left unretired.
            dirty_b = e.with_machine(|m| match m.wl() {
                Some(w) => w.logged_blocks() * 512,
                None => m.cache().dirty_blocks() * 512,
            });
            // Stopped: nothing can become dirty any more; an RBD core keeps its marker only if
            // dirty lines of it stay on the cache device.
            let rbds = rbd_markers(&entry.cores);
            if !rbds.is_empty() {
                let _m = lock_markers(&self.markers);
                if let Err(why) = sync_markers(&e, &rbds, true) {
                    crate::log!(
                        warn,
                        "dirty marker not updated",
                        cache = cache_id,
                        reason = why
                    );
                }
            }
            let mut e = e;
            for _ in 0..50 {
                match Arc::try_unwrap(e) {
                    Ok(x) => {
                        note_flush_failure(cache_id, x.stop(), &mut flush_failed);
                        break;
                    }
                    Err(a) => {
                        e = a;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        }
        crate::log!(
            info,
            "cache stopped",
            cache = cache_id,
            dirty_lines = dirty,
            dirty_bytes = dirty_b
        );
        Ok(
            json!({"cache_id": cache_id, "stopped": true, "dirty_lines_kept": dirty,
            "dirty_bytes_kept": dirty_b, "core_flush_failed": flush_failed}),
        )
    }

    /// Cache ids.
    pub fn ids(&self) -> Vec<u16> {
        self.lock().keys().copied().collect()
    }

    /// `list`.
    pub fn list(&self) -> Value {
        let caches = self.lock();
        let mut out = Vec::new();
        for c in caches.values() {
            let mut dirty_b = 0;
            let (mode, lines, occ, dirty, why) = match &c.run {
                CacheRun::Running(e) => {
                    dirty_b = dirty_bytes(e);
                    let mode = mode_name(e);
                    let why = crate::health::states(e).0.map_or(Value::Null, Value::from);
                    e.with_cache(|k| (mode, k.config().lines, k.occupancy(), k.dirty_lines(), why))
                }
                CacheRun::Incomplete(_, r, _) => (
                    "-".into(),
                    r.superblock.lines,
                    0,
                    r.dirty_lines,
                    json!(format!(
                        "cores not attached: {}",
                        missing_cores(c, r).join(", ")
                    )),
                ),
                CacheRun::Detached(w) => ("-".into(), 0, 0, 0, json!(w)),
            };
            let states = core_states(c);
            // Per core, where the cache runs: dirty lines and read requests (all, hits) since
            // the counters were reset (O(1) each).
            let per_core = |id: u16| -> (Value, u64, u64) {
                match &c.run {
                    CacheRun::Running(e) => e.with_cache(|k| {
                        let id = CoreId(id);
                        let r = k.core_counters(id).map(|n| n.read);
                        let (all, hits) =
                            r.map_or((0, 0), |r| (r.total(), r.full_hit + r.partial_hit));
                        (json!(k.core_dirty_lines(id)), all, hits)
                    }),
                    _ => (Value::Null, 0, 0),
                }
            };
            let ratio = |all: u64, hits: u64| -> Value {
                if all > 0 {
                    json!(hits as f64 / all as f64)
                } else {
                    Value::Null
                }
            };
            let (mut reads, mut read_hits) = (0, 0);
            let cores: Vec<Value> = c
                .cores
                .iter()
                .map(|(i, k)| {
                    let (state, why) = states.get(i).cloned().unwrap_or_default();
                    let (dirty_lines, all, hits) = per_core(*i);
                    reads += all;
                    read_hits += hits;
                    json!({"core_id": i, "device": k.device, "export": k.export,
                        "size_bytes": k.size_blocks * 512, "state": state, "reason": why,
                        "io_timeout_ms": k.io_timeout.map(|t| t.as_millis() as u64),
                        "dirty_lines": dirty_lines, "read_hit_ratio": ratio(all, hits)})
                })
                .collect();
            out.push(
                json!({"cache_id": c.id, "device": c.device, "state": c.state(),
                "io_timeout_ms": c.io_timeout.map(|t| t.as_millis() as u64),
                "mode": mode, "line_size": c.line_size.bytes(), "lines": lines,
                "occupancy_lines": occ, "dirty_lines": dirty, "dirty_bytes": dirty_b,
                "read_hit_ratio": ratio(reads, read_hits),
                "reason": why,
                "cores": cores}),
            );
        }
        Value::Array(out)
    }

    /// Resolves an export name.
    pub fn export(&self, name: &str) -> Result<ExportTarget, String> {
        let mut caches = self.lock();
        let found = caches.values().find_map(|c| {
            c.cores
                .iter()
                .find(|(_, k)| k.export == name && !name.is_empty())
                .map(|(i, _)| (c.id, *i))
        });
        let Some((cid, i)) = found else {
            return Err(format!("no export named '{name}'"));
        };
        let c = caches.get_mut(&cid).expect("found above");
        let engine = match &c.run {
            CacheRun::Running(_) if c.cores[&i].unattached(c) => {
                return Err(format!("not served: {}", core_state(c, &c.cores[&i]).1));
            }
            CacheRun::Running(e) => e.clone(),
            CacheRun::Detached(_) if c.cores[&i].bare => {
                let k = &c.cores[&i];
                return k
                    .dev
                    .clone()
                    .map(ExportTarget::Bare)
                    .ok_or_else(|| format!("core device {} is missing", k.device));
            }
            _ => return Err(format!("not served: {}", core_state(c, &c.cores[&i]).1)),
        };
        let line_size = c.line_size;
        let k = c.cores.get_mut(&i).expect("found above");
        // SPEC C22: a core that grew is picked up by the next connection; a shrink below cached
        // data is refused (and the export with it).
        let now = current_blocks(&k.device).or_else(|| {
            k.rbd
                .as_ref()
                .and_then(|r| r.refresh_size_within(rbd_wait(k.io_timeout, RBD_SIZE_WAIT)))
        });
        if let Some(now) = now
            && now != k.size_blocks
        {
            // An RBD image is held open (and locked) once: its handle sees the new size.
            // Reopened (not an RBD image) behind the core's IO timeout, if it has one.
            let (dev, timer) = match (&k.rbd, &k.dev) {
                (Some(_), Some(d)) => (d.clone(), k.timer.clone()),
                _ => timed(DeviceSpec::parse(&k.device)?.open(&k.device)?, k.io_timeout),
            };
            match engine.resize_core(CoreId(i), dev.clone()) {
                Ok(()) => {
                    crate::log!(
                        info,
                        "core resized",
                        cache = cid,
                        core = i,
                        from_bytes = k.size_blocks * 512,
                        to_bytes = now * 512
                    );
                    k.size_blocks = now;
                    k.dev = Some(dev);
                    k.timer = timer;
                }
                Err(why) => {
                    crate::log!(
                        error,
                        "core resize refused",
                        cache = cid,
                        core = i,
                        reason = why
                    );
                    return Err(format!("not served: {why}"));
                }
            }
        }
        Ok(ExportTarget::Cached(engine, CoreId(i), line_size))
    }

    /// Remembers the NBD server (its counters are read by `/metrics`).
    pub fn set_nbd_server(&self, s: std::sync::Weak<tiercache_nbd::Server>) {
        *self.nbd.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    /// The NBD server's counters, while it runs.
    pub fn nbd_stats(&self) -> Option<tiercache_nbd::ServerStats> {
        let s = self.nbd.lock().unwrap_or_else(|e| e.into_inner()).clone();
        s.and_then(|w| w.upgrade()).map(|s| s.stats())
    }

    /// The request statistics of export `name` (made at first use, then kept).
    pub fn request_stats(&self, name: &str) -> Arc<tiercache_nbd::RequestStats> {
        let mut m = self.request_stats.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(name.to_string()).or_default().clone()
    }

    /// Every export: (name, description, served).
    pub fn exports(&self) -> Vec<(String, String)> {
        let caches = self.lock();
        let mut v = Vec::new();
        for c in caches.values() {
            let states = core_states(c);
            for (i, k) in c.cores.iter().filter(|(_, k)| !k.export.is_empty()) {
                let state = states.get(i).map_or("detached", |x| x.0);
                v.push((
                    k.export.clone(),
                    format!("cache {} core {i} ({}) {state}", c.id, k.device),
                ));
            }
        }
        v
    }

    /// Runs `f` on a cache's core (parameters, modes, counters).
    pub fn with_cache<R>(
        &self,
        cache_id: u16,
        f: impl FnOnce(&mut Cache) -> Result<R, String>,
    ) -> Result<R, String> {
        self.engine(cache_id)?.with_cache(f)
    }

    /// `set-mode`.
    pub fn set_mode(&self, cache_id: u16, mode: &str) -> Result<Value, String> {
        let wl_refusal = "a cache cannot switch to or from mode wl (the log and the read cache have their own layout): stop the cache (it writes back first) and start-cache --force --mode ... on the device";
        if mode_word(mode) == "wl" {
            return Err(wl_refusal.into());
        }
        let m = CacheMode::parse(mode)
            .ok_or_else(|| format!("unknown mode '{mode}' (want wt, wb, wa, wi, pt or wo)"))?;
        let e = self.engine(cache_id)?;
        if e.is_wl() {
            return Err(wl_refusal.into());
        }
        {
            // A lazy mode may dirty any core at once: mark RBD cores first. A non-lazy one
            // lets their markers go when nothing is dirty any more.
            let _m = lock_markers(&self.markers);
            let rbds = self.rbd_cores(cache_id);
            if m.is_lazy() {
                let uuid = engine_uuid(&e);
                for (i, r, wait) in &rbds {
                    r.set_dirty_marker_within(Some(&uuid), *wait)
                        .map_err(|err| {
                            format!(
                                "core {i}: cannot set the dirty marker, mode not changed: {err}"
                            )
                        })?;
                }
            }
            e.with_cache(|c| c.set_mode(m).map_err(|e| e.to_string()))?;
            if !m.is_lazy() && !rbds.is_empty() {
                sync_markers(&e, &rbds, false)?;
            }
        }
        e.wait(|c| c.tables_durable());
        let (now, target) = e.with_cache(|c| (c.mode(), c.target_mode()));
        Ok(json!({"cache_id": cache_id, "mode": now.to_string(),
            "switching_to": target.map(|t| t.to_string())}))
    }

    /// `io-class load`.
    pub fn io_class_load(&self, cache_id: u16, csv: &str) -> Result<Value, String> {
        let t = IoClassTable::parse_csv(csv).map_err(|e| e.to_string())?;
        let n = t.classes().count();
        let e = self.engine(cache_id)?;
        e.with_cache(|c| c.load_io_classes(t));
        e.wait(|c| c.tables_durable());
        Ok(json!({"cache_id": cache_id, "classes": n}))
    }

    /// `io-class list`.
    pub fn io_class_list(&self, cache_id: u16) -> Result<Value, String> {
        let e = self.engine(cache_id)?;
        Ok(e.with_cache(|c| {
            let classes: Vec<Value> = c
                .io_classes()
                .classes()
                .map(|k| {
                    json!({"id": k.id, "name": k.name,
                        "eviction_priority": k.priority.map_or("pinned".to_string(), |p| p.to_string()),
                        "allocation": k.allocation_pct as f64 / 100.0,
                        "lines": c.class_lines(k.id)})
                })
                .collect();
            json!({"cache_id": cache_id, "csv": c.io_classes().to_csv(), "classes": classes})
        }))
    }

    /// `invalidate`.
    pub fn invalidate(&self, cache_id: u16, core_id: u16) -> Result<Value, String> {
        let e = self.check_core(cache_id, core_id)?;
        if e.is_wl() {
            let dropped =
                e.with_machine(|m| m.wl_mut().expect("a write log").invalidate(CoreId(core_id)))?;
            e.wait(|m| m.wl().is_some_and(|w| w.invalidate_done().0));
            let lines = e
                .with_cache(|c| c.invalidate_core(CoreId(core_id)))
                .map(|x| x.0)
                .unwrap_or(0);
            crate::log!(
                warn,
                "core invalidated",
                cache = cache_id,
                core = core_id,
                log_blocks_dropped = dropped
            );
            return Ok(
                json!({"cache_id": cache_id, "core_id": core_id, "lines_dropped": lines,
                "dirty_bytes_dropped": dropped * 512}),
            );
        }
        let mut tries = 0;
        let (lines, dirty) = loop {
            match e.with_cache(|c| c.invalidate_core(CoreId(core_id))) {
                Ok(x) => break x,
                Err(m) if m.to_string().contains("in flight") && tries < 500 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(m) => return Err(m.to_string()),
            }
        };
        e.wait(|c| c.tables_durable());
        crate::log!(
            warn,
            "core invalidated",
            cache = cache_id,
            core = core_id,
            lines = lines,
            dirty_blocks_dropped = dirty
        );
        Ok(
            json!({"cache_id": cache_id, "core_id": core_id, "lines_dropped": lines,
            "dirty_bytes_dropped": dirty * 512}),
        )
    }

    /// `reset-counters`.
    pub fn reset_counters(&self, cache_id: u16) -> Result<Value, String> {
        let e = self.engine(cache_id)?;
        e.with_cache(|c| c.reset_counters());
        if let Some(c) = self.lock().get_mut(&cache_id) {
            c.wb_sample = (Instant::now(), 0);
        }
        Ok(json!({"cache_id": cache_id, "reset": true}))
    }

    /// The writeback rate since the last sample (blocks/s), and takes a new sample.
    pub fn writeback_rate(&self, cache_id: u16, wb_blocks: u64) -> f64 {
        let mut caches = self.lock();
        let Some(c) = caches.get_mut(&cache_id) else {
            return 0.0;
        };
        let (t, n) = c.wb_sample;
        let dt = t.elapsed().as_secs_f64();
        let rate = if dt > 0.0 {
            wb_blocks.saturating_sub(n) as f64 / dt
        } else {
            0.0
        };
        if dt > 1.0 {
            c.wb_sample = (Instant::now(), wb_blocks);
        }
        rate
    }

    /// Stops every cache (daemon shutdown): dirty data stays persisted, nothing is written back.
    pub fn stop_all(&self) {
        for id in self.ids() {
            if let Err(e) = self.stop_cache(id, true, |_, _, _| {}) {
                crate::log!(error, "stopping a cache failed", cache = id, error = e);
            }
        }
    }

    /// Line size and whether the cache is volatile.
    pub fn geometry(&self, cache_id: u16) -> Option<(LineSize, bool, String)> {
        self.lock()
            .get(&cache_id)
            .map(|c| (c.line_size, c.volatile, c.device.clone()))
    }

    /// Core ids and export names of a cache.
    pub fn cores(&self, cache_id: u16) -> Vec<(u16, String, String, &'static str)> {
        self.lock()
            .get(&cache_id)
            .map(|c| {
                let states = core_states(c);
                c.cores
                    .iter()
                    .map(|(i, k)| {
                        let st = states.get(i).map_or("detached", |x| x.0);
                        (*i, k.device.clone(), k.export.clone(), st)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Compares every running cache's health with what was seen last and logs the problems
    /// that started and ended ([`crate::health::Watch`]); the daemon calls it every 250 ms.
    pub fn poll_health(&self) {
        let engines = self.engines();
        self.watch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .poll(&engines);
    }

    /// The engines of the running caches (for the health watcher).
    pub fn engines(&self) -> Vec<(u16, Arc<Engine>)> {
        self.lock()
            .values()
            .filter_map(|c| match &c.run {
                CacheRun::Running(e) => Some((c.id, e.clone())),
                _ => None,
            })
            .collect()
    }

    /// The IO timeouts in force: the cache device's and each core's (milliseconds).
    pub fn io_timeouts(&self, cache_id: u16) -> (Option<u64>, BTreeMap<u16, u64>) {
        let ms = |t: Duration| t.as_millis() as u64;
        self.lock()
            .get(&cache_id)
            .map_or_else(Default::default, |c| {
                (
                    c.io_timeout.map(ms),
                    c.cores
                        .iter()
                        .filter_map(|(i, k)| Some((*i, ms(k.io_timeout?))))
                        .collect(),
                )
            })
    }

    /// State word of a cache.
    pub fn state(&self, cache_id: u16) -> Option<&'static str> {
        self.lock().get(&cache_id).map(|c| c.state())
    }
}

/// A stop step's core flush result: the first failure is logged (one warning) and kept for
/// the answer's `core_flush_failed`; later ones of the same stop add nothing.
fn note_flush_failure(cache_id: u16, r: Result<(), String>, failed: &mut Option<String>) {
    if let Err(why) = r
        && failed.is_none()
    {
        crate::log!(
            warn,
            "core flush failed at stop (writes no client flushed may not be durable on it)",
            cache = cache_id,
            reason = why
        );
        *failed = Some(why);
    }
}

/// Gives attached core `core` the IO timeout `t`: a device already behind a timeout gets the
/// new limit (IOs started afterwards use it); one without is wrapped, and `engine`, when the
/// cache runs, serves the core from the wrapped handle from now on.
fn retime(
    cache_id: u16,
    core: u16,
    k: &mut CoreEntry,
    t: Duration,
    engine: Option<&Engine>,
) -> Result<(), String> {
    if k.io_timeout == Some(t) {
        return Ok(());
    }
    match &k.timer {
        Some(w) => w.set_timeout(t),
        None => {
            let dev = k
                .dev
                .clone()
                .ok_or_else(|| format!("core {core} of cache {cache_id} is not attached"))?;
            let (d, w) = timed(dev, Some(t));
            if let Some(e) = engine {
                e.replace_core_device(CoreId(core), d.clone())?;
            }
            k.dev = Some(d);
            k.timer = w;
        }
    }
    k.io_timeout = Some(t);
    crate::log!(
        info,
        "core io timeout set",
        cache = cache_id,
        core = core,
        io_timeout = crate::device::show_timeout(t)
    );
    Ok(())
}

fn lock_markers(m: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cache's identity as the dirty marker names it (its superblock's cache id, in hex).
fn engine_uuid(e: &Engine) -> String {
    e.with_cache(|c| {
        c.config()
            .persist
            .as_ref()
            .map(|p| hex(&p.superblock.cache_id))
    })
    .unwrap_or_else(|| "volatile".into())
}

/// Refuses an RBD image whose dirty marker names another cache: that cache holds dirty data
/// the image lacks.
fn check_marker(device: &str, r: &RbdBackend, uuid: &str) -> Result<(), String> {
    let mine = format!("dirty in tiercache {uuid}");
    match r.dirty_marker() {
        Ok(Some(v)) if v != mine => Err(format!(
            "{device}: the image is marked '{v}' (image metadata {}): another tiercache cache holds dirty data of it; write that cache back, or if it is gone for good: rbd image-meta remove {} {}",
            tiercache_io::DIRTY_KEY,
            r.target().spec(),
            tiercache_io::DIRTY_KEY
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{device}: reading its dirty marker: {e}")),
    }
}

/// The RBD cores among `cores`, each with how long an update of its dirty marker is waited
/// for: its IO timeout, at most [`RBD_MARKER_WAIT`], and that when it has none.
fn rbd_markers(cores: &BTreeMap<u16, CoreEntry>) -> Vec<(u16, Arc<RbdBackend>, Duration)> {
    cores
        .iter()
        .filter_map(|(i, k)| Some((*i, k.rbd.clone()?, rbd_wait(k.io_timeout, RBD_MARKER_WAIT))))
        .collect()
}

/// How long a librbd call that may wait as long as the cluster is down is waited for: the
/// core's IO timeout, at most `cap`, and `cap` when it has none.
fn rbd_wait(io_timeout: Option<Duration>, cap: Duration) -> Duration {
    io_timeout.map_or(cap, |t| t.min(cap))
}

/// Sets the dirty marker of each RBD core that may have dirty data (the mode is lazy, unless
/// `stopped`, or the cache holds dirty lines of it) and removes the others'. The caller holds
/// the registry's marker lock.
fn sync_markers(
    e: &Engine,
    cores: &[(u16, Arc<RbdBackend>, Duration)],
    stopped: bool,
) -> Result<(), String> {
    let uuid = engine_uuid(e);
    for (i, r, wait) in cores {
        let want = (lazy_now(e) && !stopped) || core_has_dirty(e, *i);
        r.set_dirty_marker_within(want.then_some(uuid.as_str()), *wait)
            .map_err(|err| format!("core {i}: dirty marker: {err}"))?;
    }
    Ok(())
}

/// The longest a dirty-marker update of an RBD image is waited for (the registry's marker lock
/// is held meanwhile, and a stopping cache waits for it): an unresponsive cluster makes it a
/// `TimedOut` error (logged, or the answer of the command that needed it) instead of a hang. A
/// marker left as it was errs on the safe side only when it says "dirty" (see docs/CEPH.md). A
/// core with a shorter IO timeout waits that long instead.
const RBD_MARKER_WAIT: Duration = Duration::from_secs(10);

/// The longest a new connection waits for an RBD image's current size (the registry is locked
/// meanwhile): the core's IO timeout, at most this, and this when it has none.
const RBD_SIZE_WAIT: Duration = Duration::from_secs(5);

/// The size in blocks a local core device has now (files and block devices; `None` for others
/// or when it cannot be read).
fn current_blocks(device: &str) -> Option<u64> {
    use std::os::unix::fs::FileTypeExt;
    let spec = DeviceSpec::parse(device).ok()?;
    let p = spec.path()?;
    let md = std::fs::metadata(p).ok()?;
    if md.is_file() {
        Some(md.len() / 512)
    } else if md.file_type().is_block_device() {
        spec.open(device).ok().map(|d| d.blocks())
    } else {
        None
    }
}

/// The state word and reason of every core of a cache (one health walk for all of them).
fn core_states(c: &CacheEntry) -> BTreeMap<u16, (&'static str, String)> {
    let degraded = match &c.run {
        CacheRun::Running(e) => crate::health::states(e).1,
        _ => BTreeMap::new(),
    };
    c.cores
        .iter()
        .map(|(i, k)| {
            let st = match degraded.get(i) {
                Some(why) => ("degraded", why.clone()),
                None => core_state(c, k),
            };
            (*i, st)
        })
        .collect()
}

fn core_state(c: &CacheEntry, k: &CoreEntry) -> (&'static str, String) {
    let why = k.error.as_deref().unwrap_or("not attached");
    match &c.run {
        CacheRun::Running(_) if k.dev.is_none() => (
            "detached",
            format!(
                "not attached at start: {why}; `tiercache add-core --cache-id {} --core-device {}` attaches it once fixed",
                c.id, k.device
            ),
        ),
        CacheRun::Running(_) => ("running", String::new()),
        CacheRun::Incomplete(..) if k.dev.is_none() => match &k.error {
            Some(e) => (
                "detached",
                format!("core device not attached: {e}; add-core it"),
            ),
            None => (
                "detached",
                "core device not attached yet (add-core it)".into(),
            ),
        },
        CacheRun::Incomplete(..) => ("incomplete", "waiting for the cache's other cores".into()),
        CacheRun::Detached(_) if k.error.is_some() => ("detached", format!("{why}: not served")),
        CacheRun::Detached(why) if k.bare => (
            "degraded",
            format!(
                "{why}; serving the bare core (forced: dirty data on the missing cache device is not in it)"
            ),
        ),
        CacheRun::Detached(why) => (
            "detached",
            format!(
                "{why}; the bare core is not served because it may lack dirty data (force_bare_core = true in the config to serve it anyway)"
            ),
        ),
    }
}

fn load_summary(r: &LoadReport) -> Value {
    json!({"clean_stop": r.clean, "lines": r.lines, "dirty_lines": r.dirty_lines,
        "dropped_clean_lines": r.dropped_clean_lines, "journal_records": r.journal_records,
        "cores": r.cores.iter().map(|e| json!({"core_id": e.id, "export": e.export_name,
            "size_bytes": e.size_blocks * 512})).collect::<Vec<_>>()})
}

/// Export names: 1–255 printable characters without spaces or `/`... as NBD allows, kept simple.
fn check_export_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 255 || !n.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "export name '{}' must be 1-255 printable ASCII characters without spaces",
            n.escape_debug()
        ));
    }
    Ok(())
}

/// Whether a block device is mounted or opened exclusively by someone else (O_EXCL fails).
/// [`Registry::claimable`]'s check against the caches listed.
fn check_unheld(
    caches: &BTreeMap<u16, CacheEntry>,
    device: &str,
    id: &Identity,
    except: Option<(u16, u16)>,
) -> Result<(), String> {
    for c in caches.values() {
        let cores = c
            .cores
            .iter()
            .filter(|(i, k)| k.dev.is_some() && except != Some((c.id, **i)))
            .filter_map(|(i, k)| Some((Holder::Core(c.id, *i), k.held.as_ref()?, &k.device)));
        let cache = c.held.as_ref().map(|h| (Holder::Cache(c.id), h, &c.device));
        for (holder, h, shown) in cache.into_iter().chain(cores) {
            if let Some(how) = id.overlap(h) {
                return Err(refusal(device, how, holder, shown));
            }
        }
    }
    Ok(())
}

fn other_user(spec: &DeviceSpec) -> bool {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let Some(p) = spec.path() else {
        return false;
    };
    let Ok(md) = std::fs::metadata(p) else {
        return false;
    };
    if !md.file_type().is_block_device() {
        return false;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(p)
        .is_err()
}

/// The sequential cutoff parameters of `values` applied to `p`.
pub fn apply_cutoff(
    mut p: CutoffParams,
    values: &[(String, String)],
) -> Result<CutoffParams, String> {
    for (k, v) in values {
        match k.as_str() {
            "policy" => {
                p.policy = match v.as_str() {
                    "always" => CutoffPolicy::Always,
                    "full" => CutoffPolicy::Full,
                    "never" => CutoffPolicy::Never,
                    _ => {
                        return Err(format!(
                            "seq-cutoff policy '{v}' (want always, full or never)"
                        ));
                    }
                }
            }
            // A bare number is KiB, as casadm's `-t`; a suffix says the unit.
            "threshold" if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
                p.threshold_bytes = v
                    .parse::<u64>()
                    .ok()
                    .and_then(|k| k.checked_mul(1024))
                    .ok_or_else(|| format!("threshold '{v}' is too large"))?
            }
            "threshold" => p.threshold_bytes = crate::device::parse_size(v)?,
            "promotion-count" => p.promotion_count = num(k, v, 1, 65535)?,
            _ => {
                return Err(unknown(
                    k,
                    "seq-cutoff",
                    "policy, threshold, promotion-count",
                ));
            }
        }
    }
    Ok(p)
}

pub(crate) fn num(k: &str, v: &str, lo: u32, hi: u32) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| format!("{k} = '{v}': want a whole number from {lo} to {hi}"))
}

/// A time parameter counted in `unit` (a second or a millisecond): `v` with a unit (`30s`,
/// `1m`, `500ms`, as `get-param` prints it) or a bare number of `unit`; a whole number of
/// `unit` from `lo` to `hi`.
fn time(k: &str, v: &str, unit: Duration, lo: u32, hi: u32) -> Result<u32, String> {
    let per = unit.as_nanos().max(1);
    crate::device::parse_time(v, unit)
        .filter(|d| d.as_nanos().is_multiple_of(per))
        .map(|d| d.as_nanos() / per)
        .filter(|n| (u128::from(lo)..=u128::from(hi)).contains(n))
        .map(|n| n as u32)
        .ok_or_else(|| {
            let name = if unit >= Duration::from_secs(1) {
                "seconds"
            } else {
                "milliseconds"
            };
            format!(
                "{k} = '{v}': want a time from {} to {} in whole {name} (e.g. {}; a bare number is {name})",
                show_time(unit, lo),
                show_time(unit, hi),
                show_time(unit, hi / 2),
            )
        })
}

/// A time parameter counted in `unit`, as [`time`] reads it back (`30s`, `1m`, `500ms`).
fn show_time(unit: Duration, n: u32) -> String {
    crate::device::format_time(unit * n)
}

/// A percentage parameter: `50` or `50%`, from `lo` to `hi`.
fn pct(k: &str, v: &str, lo: u32, hi: u32) -> Result<u32, String> {
    num(k, v.strip_suffix('%').unwrap_or(v), lo, hi)
        .map_err(|_| format!("{k} = '{v}': want a percentage from {lo}% to {hi}%"))
}

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

pub(crate) fn unknown(k: &str, group: &str, known: &str) -> String {
    format!("unknown parameter '{k}' for {group} (known: {known})")
}

/// The parameter group of mode `wl`'s writeback pacing (`tiercache_core::wl::pace`):
/// `background-fill` (percent of the log), `idle` (ms), `expire` (s), `depth` (writes to the
/// core in flight).
pub const WL_WRITEBACK: &str = "wl-writeback";

/// The error of a parameter group `set-param`/`get-param` do not know.
fn unknown_group(name: &str) -> String {
    format!(
        "unknown parameter group '{name}' (want seq-cutoff, cleaning, cleaning-alru, cleaning-acp, promotion, promotion-nhit or {WL_WRITEBACK})"
    )
}

/// The error of a `wl-writeback` parameter asked of a cache in another mode.
fn not_wl(cache_id: u16) -> String {
    format!("cache {cache_id} is not in mode wl: {WL_WRITEBACK} is a write-log parameter")
}

/// `set-param`.
pub fn set_param(
    reg: &Registry,
    cache_id: u16,
    core_id: Option<u16>,
    name: &str,
    values: &[(String, String)],
) -> Result<Value, String> {
    let e = reg.engine(cache_id)?;
    if name == WL_WRITEBACK {
        // Mode `wl`: when the log's writeback runs. Kept in memory (and in the config
        // file's [cache.params], which the daemon applies at start), not on the device.
        e.with_machine(|m| -> Result<(), String> {
            let w = m.wl_mut().ok_or_else(|| not_wl(cache_id))?;
            let mut p = w.pacing();
            for (k, v) in values {
                match k.as_str() {
                    "background-fill" => p.background_fill_pct = pct(k, v, 0, 100)? as u8,
                    "idle" => p.idle = Nanos::from_ms(time(k, v, MS, 0, 3_600_000)? as u64),
                    "expire" => p.expire = Nanos::from_secs(time(k, v, SEC, 0, 86_400)? as u64),
                    "depth" => p.depth = num(k, v, 1, Pacing::DEPTH_MAX)?,
                    _ => return Err(unknown(k, name, "background-fill, idle, expire, depth")),
                }
            }
            w.set_pacing(p)
        })?;
        return get_param(reg, cache_id, core_id, name);
    }
    e.with_cache(|c| -> Result<(), String> {
        let cfg = c.config().clone();
        match name {
            "seq-cutoff" | "seq-detect" => {
                let cores: Vec<CoreId> = match core_id {
                    Some(k) => vec![CoreId(k)],
                    None => (0..=CORE_ID_MAX)
                        .map(CoreId)
                        .filter(|k| c.core(*k).is_some())
                        .collect(),
                };
                // Check every core first, so nothing changes on an error.
                let mut new = Vec::new();
                for k in &cores {
                    let cur = c
                        .core(*k)
                        .ok_or_else(|| format!("cache {cache_id} has no core {}", k.0))?
                        .cutoff
                        .params();
                    new.push((*k, apply_cutoff(cur, values)?));
                }
                for (k, p) in new {
                    c.set_cutoff(k, p).map_err(|e| e.to_string())?;
                }
            }
            "cleaning" => {
                let mut pol = cfg.cleaning;
                for (k, v) in values {
                    match k.as_str() {
                        "policy" => {
                            pol = match v.as_str() {
                                "alru" => CleaningPolicy::Alru,
                                "acp" => CleaningPolicy::Acp,
                                "nop" => CleaningPolicy::Nop,
                                _ => {
                                    return Err(format!(
                                        "cleaning policy '{v}' (want alru, acp or nop)"
                                    ));
                                }
                            }
                        }
                        _ => return Err(unknown(k, name, "policy")),
                    }
                }
                c.set_cleaning(pol, cfg.alru, cfg.acp);
            }
            "cleaning-alru" => {
                let mut a = cfg.alru;
                for (k, v) in values {
                    match k.as_str() {
                        "wake-up" => a.wake_up_s = time(k, v, SEC, 0, 3600)?,
                        "staleness-time" => a.staleness_time_s = time(k, v, SEC, 1, 3600)?,
                        "flush-max-buffers" => a.flush_max_buffers = num(k, v, 1, 10000)?,
                        "activity-threshold" => {
                            a.activity_threshold_ms = time(k, v, MS, 0, 1_000_000)?
                        }
                        _ => {
                            return Err(unknown(
                                k,
                                name,
                                "wake-up, staleness-time, flush-max-buffers, activity-threshold",
                            ));
                        }
                    }
                }
                c.set_cleaning(cfg.cleaning, a, cfg.acp);
            }
            "cleaning-acp" => {
                let mut a = cfg.acp;
                for (k, v) in values {
                    match k.as_str() {
                        "wake-up" => a.wake_up_ms = time(k, v, MS, 0, 10000)?,
                        "flush-max-buffers" => a.flush_max_buffers = num(k, v, 1, 10000)?,
                        _ => return Err(unknown(k, name, "wake-up, flush-max-buffers")),
                    }
                }
                c.set_cleaning(cfg.cleaning, cfg.alru, a);
            }
            "promotion" => {
                let mut pol = cfg.promotion;
                for (k, v) in values {
                    match k.as_str() {
                        "policy" => {
                            pol = match v.as_str() {
                                "always" => PromotionPolicy::Always,
                                "nhit" => PromotionPolicy::Nhit,
                                _ => {
                                    return Err(format!(
                                        "promotion policy '{v}' (want always or nhit)"
                                    ));
                                }
                            }
                        }
                        _ => return Err(unknown(k, name, "policy")),
                    }
                }
                c.set_promotion(pol, cfg.nhit);
            }
            "promotion-nhit" => {
                let mut n = cfg.nhit;
                for (k, v) in values {
                    match k.as_str() {
                        "threshold" | "insertion-threshold" => n.threshold = num(k, v, 2, 1000)?,
                        "trigger" | "trigger-threshold" => n.trigger_pct = pct(k, v, 0, 100)?,
                        _ => return Err(unknown(k, name, "threshold, trigger")),
                    }
                }
                c.set_promotion(cfg.promotion, n);
            }
            _ => {
                return Err(unknown_group(name));
            }
        }
        Ok(())
    })?;
    e.wait(|c| c.tables_durable());
    get_param(reg, cache_id, core_id, name)
}

/// `get-param`.
/// A `get-param` JSON entry as text, as `set-param` reads it back: the unit moves from the key
/// into the value (`wake_up_ms: 500` is `wake-up: 500ms`, `threshold_bytes: 1048576` is
/// `threshold: 1MiB`, `trigger_pct: 80` is `trigger: 80%`) and `_` becomes `-` (`core_id`
/// stays). Other values are printed as they are (strings without quotes).
pub fn param_text(key: &str, v: &Value) -> (String, String) {
    let n = v.as_u64();
    let (name, text) = match (key, n) {
        ("core_id", _) => return (key.into(), v.to_string()),
        (k, Some(n)) if k.ends_with("_bytes") => (&k[..k.len() - 6], crate::device::format_size(n)),
        (k, Some(n)) if k.ends_with("_ms") => (
            &k[..k.len() - 3],
            crate::device::format_time(Duration::from_millis(n)),
        ),
        (k, Some(n)) if k.ends_with("_s") => (
            &k[..k.len() - 2],
            crate::device::format_time(Duration::from_secs(n)),
        ),
        (k, Some(n)) if k.ends_with("_pct") => (&k[..k.len() - 4], format!("{n}%")),
        (k, _) => (k, v.as_str().map_or_else(|| v.to_string(), str::to_string)),
    };
    (name.replace('_', "-"), text)
}

/// A parameter group's values (`get-param`'s answer, and `set-param`'s): JSON numbers with the
/// unit in the key (`wake_up_ms`, `threshold_bytes`, `trigger_pct`); [`param_text`] gives the
/// text `get-param` prints without `--json`.
pub fn get_param(
    reg: &Registry,
    cache_id: u16,
    core_id: Option<u16>,
    name: &str,
) -> Result<Value, String> {
    if name == WL_WRITEBACK {
        let p = reg
            .engine(cache_id)?
            .with_machine(|m| m.wl().map(|w| w.pacing()))
            .ok_or_else(|| not_wl(cache_id))?;
        return Ok(json!({"background_fill_pct": p.background_fill_pct,
            "idle_ms": p.idle.0 / 1_000_000,
            "expire_s": p.expire.0 / 1_000_000_000,
            "depth": p.depth}));
    }
    reg.with_cache(cache_id, |c| {
        let cfg = c.config();
        Ok(match name {
            "seq-cutoff" | "seq-detect" => {
                let mut v = Vec::new();
                for k in (0..=CORE_ID_MAX).map(CoreId) {
                    if core_id.is_some_and(|x| x != k.0) {
                        continue;
                    }
                    if let Some(s) = c.core(k) {
                        let p = s.cutoff.params();
                        let pol = match p.policy {
                            CutoffPolicy::Always => "always",
                            CutoffPolicy::Full => "full",
                            CutoffPolicy::Never => "never",
                        };
                        v.push(json!({"core_id": k.0, "policy": pol,
                            "threshold_bytes": p.threshold_bytes,
                            "promotion_count": p.promotion_count}));
                    }
                }
                if let Some(k) = core_id
                    && v.is_empty()
                {
                    return Err(format!("cache {cache_id} has no core {k}"));
                }
                json!(v)
            }
            "cleaning" => json!({"policy": match cfg.cleaning {
                CleaningPolicy::Alru => "alru", CleaningPolicy::Acp => "acp", CleaningPolicy::Nop => "nop"}}),
            "cleaning-alru" => json!({"wake_up_s": cfg.alru.wake_up_s,
                "staleness_time_s": cfg.alru.staleness_time_s,
                "flush_max_buffers": cfg.alru.flush_max_buffers,
                "activity_threshold_ms": cfg.alru.activity_threshold_ms}),
            "cleaning-acp" => json!({"wake_up_ms": cfg.acp.wake_up_ms,
                "flush_max_buffers": cfg.acp.flush_max_buffers}),
            "promotion" => json!({"policy": match cfg.promotion {
                PromotionPolicy::Always => "always", PromotionPolicy::Nhit => "nhit"}}),
            "promotion-nhit" => json!({"threshold": cfg.nhit.threshold,
                "trigger_pct": cfg.nhit.trigger_pct}),
            _ => {
                return Err(unknown_group(name));
            }
        })
    })
}
