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
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the tables: [`Registry`], [`CacheEntry`], [`CoreEntry`]; small helpers |
//! | `plan.rs` | a new cache's configuration and space ([`plan_cache`], [`plan_wl_cache`]) |
//! | `start.rs` | `start-cache` (new or `--load`) |
//! | `attach.rs` | `add-core`, recorded cores not attached yet, device checks, IO timeouts |
//! | `writeback.rs` | `writeback`, its cancellation, stalls, the `wl` drain |
//! | `stop.rs` | `remove-core`, `stop-cache`, shutdown |
//! | `manage.rs` | `set-mode`, IO classes, `invalidate`, `reset-counters` |
//! | `exports.rs` | NBD export names → targets |
//! | `view.rs` | `list`, core and cache states, what stats and metrics read |
//! | `markers.rs` | RBD dirty markers (SPEC C18) |
//! | `params.rs` | `set-param` / `get-param` |

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
use tiercache_core::policy::{CutoffParams, CutoffPolicy, Named};
use tiercache_core::units::BLOCK_BYTES;
use tiercache_core::units::{CoreId, Lba, LineSize, Nanos};
use tiercache_core::wl::WlConfig;
use tiercache_core::wl::pace::Pacing;
use tiercache_core::{Config, config::Persist};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_format::superblock::{Layout, journal_bytes_for};
use tiercache_io::RbdBackend;

mod attach;
mod exports;
mod manage;
mod markers;
mod params;
mod plan;
mod start;
mod stop;
mod view;
mod writeback;

use attach::*;
use markers::*;
use view::*;

pub use params::{WL_WRITEBACK, apply_cutoff, get_param, param_text, set_param};
pub use plan::{plan_cache, plan_wl_cache};

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
        Some(w) => w.pending(None).1 * BLOCK_BYTES,
        None => m.cache().dirty_blocks() * BLOCK_BYTES,
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
        d.read(off / BLOCK_BYTES, buf).map_err(|e| e.to_string())
    };
    if let Ok((sb, _, _)) = tiercache_core::cache::read_superblock(&mut read) {
        return Holds::Cache(hex(&sb.cache_id));
    }
    let n = (dev.blocks().min(2048) * BLOCK_BYTES) as usize;
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
}
