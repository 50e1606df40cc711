//! `wt`, write-through (Open CAS default). Reads: hits from the cache, misses from the core and
//! inserted. Writes: mapped (allocated if needed) and written to cache and core in parallel;
//! the cache copy is clean. If lines cannot be mapped the write is handled as write-invalidate.

use super::{CacheMode, ModeRules, WriteRule};

/// Rules of `wt`.
pub const RULES: ModeRules = ModeRules {
    mode: CacheMode::Wt,
    name: "wt",
    lazy: false,
    read_clean_from_cache: true,
    read_promotes: true,
    reclassifies: true,
    write: WriteRule::Through,
};
