//! Policies: small, swappable decision makers the cache core consults. Each lives in its own
//! file, holds no data bytes, reads no clock and does no IO.
//!
//! | policy | question it answers | implementations |
//! |---|---|---|
//! | [`eviction`] | which clean line to reuse | `lru`, `s3fifo` |
//! | [`promotion`] | should a miss be inserted | `always`, `nhit` |
//! | [`cutoff`] | is this request part of a sequential stream to pass through | `always`/`full`/`never` |
//! | [`ioclass`] | which IO class a request belongs to, and that class's rules | Open CAS CSV |
//! | [`cleaning`] | which dirty lines to write back, and when | `alru`, `acp`, `nop`, plus the rate controller |
//!
//! Parameter structs live here (not in the policy files) because the cache, the CLI and the
//! on-disk configuration all name them.

pub mod cleaning;
pub mod cutoff;
pub mod eviction;
pub mod ioclass;
pub mod promotion;

use crate::lists::ListArena;
use crate::units::{CoreId, LineId};

/// What a policy may ask the cache about a line.
pub trait LineView {
    /// The line is locked by a request or being written back: a policy must not choose it now.
    fn busy(&self, line: LineId) -> bool;
    /// The line may be evicted now: not busy, and its slot not held by persistent metadata that
    /// may still name it (see `cache/meta.rs`; that flag is in the line's tag in `lists`).
    /// Eviction policies ask this, cleaning asks `busy`.
    fn evictable(&self, lists: &ListArena, line: LineId) -> bool {
        let _ = lists;
        !self.busy(line)
    }
    /// Where the line's data belongs: its core and core line number (core LBA / blocks per line).
    fn position(&self, line: LineId) -> (CoreId, u64);
    /// A well-mixed 64-bit hash of [`LineView::position`], for ghost lists and sketches.
    fn key(&self, line: LineId) -> u64;
}

/// Hashes a (core, core line) position into a well-mixed 64-bit key. Every policy that keeps
/// keys (ghost lists, nhit counters) uses this, so keys agree across policies.
#[inline]
pub fn position_key(core: CoreId, core_line: u64) -> u64 {
    // splitmix64 finaliser over (core, line); cheap and well mixed.
    let mut z = core_line ^ ((core.0 as u64) << 48) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// IO classes per cache (ids `0..IO_CLASSES_MAX`), as in Open CAS (class 0 is `unclassified`).
pub const IO_CLASSES_MAX: usize = 34;

/// A policy choice and its name: the daemon's `set-param`/`get-param` (and so its config
/// file's `[cache.params]`) parse and print it with this list, `bench core` parses with it,
/// `sim mrc` parses with it, and a CLI unit test checks the command line's choices against it
/// (the simulator's scenario files still match their own names).
pub trait Named: Copy + PartialEq + 'static {
    /// Every choice with its name.
    fn names() -> &'static [(&'static str, Self)];
    /// The choice's name.
    fn name(self) -> &'static str {
        Self::names()
            .iter()
            .find(|(_, v)| *v == self)
            .map(|(n, _)| *n)
            .expect("every choice is named")
    }
    /// The choice named `s`.
    fn parse(s: &str) -> Option<Self> {
        Self::names().iter().find(|(n, _)| *n == s).map(|(_, v)| *v)
    }
    /// The names for an error message: "a, b or c".
    fn one_of() -> String {
        let n: Vec<&str> = Self::names().iter().map(|(n, _)| *n).collect();
        match n.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => n.join(""),
        }
    }
}

impl Named for CleaningPolicy {
    fn names() -> &'static [(&'static str, Self)] {
        &[
            ("alru", CleaningPolicy::Alru),
            ("acp", CleaningPolicy::Acp),
            ("nop", CleaningPolicy::Nop),
        ]
    }
}

impl Named for PromotionPolicy {
    fn names() -> &'static [(&'static str, Self)] {
        &[
            ("always", PromotionPolicy::Always),
            ("nhit", PromotionPolicy::Nhit),
        ]
    }
}

impl Named for CutoffPolicy {
    fn names() -> &'static [(&'static str, Self)] {
        &[
            ("always", CutoffPolicy::Always),
            ("full", CutoffPolicy::Full),
            ("never", CutoffPolicy::Never),
        ]
    }
}

impl Named for EvictionPolicy {
    fn names() -> &'static [(&'static str, Self)] {
        &[
            ("lru", EvictionPolicy::Lru),
            ("s3fifo", EvictionPolicy::S3Fifo),
        ]
    }
}

/// Cleaning policy choice.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CleaningPolicy {
    /// Approximately-LRU, idle-gated (Open CAS default).
    Alru,
    /// Aggressive: dirtiest 100 MiB chunk first, ignores activity.
    Acp,
    /// No background cleaning.
    Nop,
}

/// `alru` parameters with Open CAS names and defaults.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AlruParams {
    /// Sleep after an idle wake-up, seconds (0–3600, default 20).
    pub wake_up_s: u32,
    /// A dirty line must be older than this to be written back, seconds (1–3600, default 120).
    pub staleness_time_s: u32,
    /// Lines written back per iteration (1–10000, default 100).
    pub flush_max_buffers: u32,
    /// No cleaning if client IO happened within this window, ms (0–1000000, default 10000).
    pub activity_threshold_ms: u32,
}

impl Default for AlruParams {
    fn default() -> Self {
        AlruParams {
            wake_up_s: 20,
            staleness_time_s: 120,
            flush_max_buffers: 100,
            activity_threshold_ms: 10_000,
        }
    }
}

/// `acp` parameters with Open CAS names and defaults.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AcpParams {
    /// Sleep between iterations, ms (0–10000, default 10).
    pub wake_up_ms: u32,
    /// Lines written back per iteration (1–10000, default 128).
    pub flush_max_buffers: u32,
}

impl Default for AcpParams {
    fn default() -> Self {
        AcpParams {
            wake_up_ms: 10,
            flush_max_buffers: 128,
        }
    }
}

/// Writeback-rate controller parameters (ours; no Open CAS equivalent).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RateParams {
    /// Whether the controller runs. Off, the cleaning policy alone decides.
    pub enabled: bool,
    /// Dirty share of the cache the controller steers towards, percent (1–99, default 50).
    pub dirty_target_pct: u32,
    /// Longest delay added to one client write that needs a new dirty line, ms (default 200).
    pub throttle_max_ms: u32,
}

impl Default for RateParams {
    fn default() -> Self {
        RateParams {
            enabled: true,
            dirty_target_pct: 50,
            throttle_max_ms: 200,
        }
    }
}

/// Promotion policy choice.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PromotionPolicy {
    /// Insert every miss (default).
    Always,
    /// Insert a core line after it was missed `threshold` times, once occupancy reaches `trigger`.
    Nhit,
}

/// `nhit` parameters with Open CAS names and defaults.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NhitParams {
    /// Insertion threshold (2–1000, default 3).
    pub threshold: u32,
    /// Occupancy at which the policy engages, percent (0–100, default 80).
    pub trigger_pct: u32,
}

impl Default for NhitParams {
    fn default() -> Self {
        NhitParams {
            threshold: 3,
            trigger_pct: 80,
        }
    }
}

/// Sequential cutoff policy.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CutoffPolicy {
    /// Cut off every stream over the threshold.
    Always,
    /// Cut off only when the cache is full (default).
    Full,
    /// Never cut off.
    Never,
}

/// Sequential cutoff parameters (per core), Open CAS names and Open CAS Linux defaults.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CutoffParams {
    /// Policy (default `full`).
    pub policy: CutoffPolicy,
    /// Stream length at which requests are cut off, bytes (default 1 MiB).
    pub threshold_bytes: u64,
    /// Requests a stream needs before it is shared/trusted (1–65535, default 8).
    pub promotion_count: u32,
}

impl Default for CutoffParams {
    fn default() -> Self {
        CutoffParams {
            policy: CutoffPolicy::Full,
            threshold_bytes: 1 << 20,
            promotion_count: 8,
        }
    }
}

/// Eviction policy choice.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Least recently used (Open CAS behaviour).
    Lru,
    /// S3-FIFO: a small probationary FIFO, a main FIFO with reinsertion, and a ghost filter.
    /// Scan resistant; the default.
    S3Fifo,
}
