//! Cache modes: what a read or a write does, per mode, as data.
//!
//! Each mode is one file holding one [`ModeRules`] constant and the Open CAS semantics it
//! follows. The cache's data path reads these rules; no mode-specific branches live elsewhere.
//! Semantics shared by all modes (Open CAS's "generic read" and mapping-failure rules):
//! - a request whose lines cannot all be mapped (no clean line to evict, promotion declined,
//!   IO class allocation 0, sequential cutoff) is served pass-through: reads from the core,
//!   writes to the core with the cache's copy invalidated (write-invalidate);
//! - blocks that are dirty in the cache are always read from the cache, in every mode, so a
//!   read never returns data older than the newest acknowledged write.

mod pt;
mod wa;
mod wb;
mod wi;
mod wo;
mod wt;

/// A cache mode.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CacheMode {
    /// Write-through.
    Wt,
    /// Write-back.
    Wb,
    /// Write-around.
    Wa,
    /// Write-invalidate.
    Wi,
    /// Pass-through.
    Pt,
    /// Write-only.
    Wo,
}

/// What writes do in a mode.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WriteRule {
    /// Map the lines, write cache and core, the cache copy stays clean.
    Through,
    /// Map the lines, write the cache only, the lines become dirty.
    Back,
    /// If every line is already mapped, as `Through` (without mapping); otherwise as `Invalidate`.
    AroundIfMapped,
    /// Write the core; invalidate the cache's copy of the written blocks.
    Invalidate,
}

/// The rules of one mode.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ModeRules {
    /// The mode.
    pub mode: CacheMode,
    /// Name on the CLI.
    pub name: &'static str,
    /// Acknowledges writes before the core has them (holds dirty data).
    pub lazy: bool,
    /// Serves valid clean blocks from the cache (otherwise only dirty blocks are read from it).
    pub read_clean_from_cache: bool,
    /// Inserts read misses into the cache (backfill).
    pub read_promotes: bool,
    /// Moves a hit line to the request's IO class.
    pub reclassifies: bool,
    /// Writes.
    pub write: WriteRule,
}

impl CacheMode {
    /// Every mode.
    pub const ALL: [CacheMode; 6] = [
        CacheMode::Wt,
        CacheMode::Wb,
        CacheMode::Wa,
        CacheMode::Wi,
        CacheMode::Pt,
        CacheMode::Wo,
    ];

    /// The mode's rules.
    pub const fn rules(self) -> &'static ModeRules {
        match self {
            CacheMode::Wt => &wt::RULES,
            CacheMode::Wb => &wb::RULES,
            CacheMode::Wa => &wa::RULES,
            CacheMode::Wi => &wi::RULES,
            CacheMode::Pt => &pt::RULES,
            CacheMode::Wo => &wo::RULES,
        }
    }

    /// Whether the mode holds dirty data (`wb`, `wo`).
    pub const fn is_lazy(self) -> bool {
        self.rules().lazy
    }

    /// Parses a CLI name (`wt`, `wb`, `wa`, `wi`, `pt`, `wo`).
    pub fn parse(s: &str) -> Option<CacheMode> {
        CacheMode::ALL
            .into_iter()
            .find(|m| m.rules().name == s.trim().to_ascii_lowercase())
    }
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.rules().name)
    }
}
