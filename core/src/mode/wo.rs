//! `wo`, write-only. Writes as `wb`. Reads: a full hit is served from the cache; anything else
//! is read from the core with the cache's valid blocks overlaid, and nothing is inserted or
//! reclassified.

use super::{CacheMode, ModeRules, WriteRule};

/// Rules of `wo`.
pub const RULES: ModeRules = ModeRules {
    mode: CacheMode::Wo,
    name: "wo",
    lazy: true,
    read_clean_from_cache: true,
    read_promotes: false,
    reclassifies: false,
    write: WriteRule::Back,
};
