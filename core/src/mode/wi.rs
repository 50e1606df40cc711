//! `wi`, write-invalidate. Reads as `wt`. Writes go to the core only, and the written blocks
//! are invalidated in the cache (dirty blocks only after the core's copy is durable).

use super::{CacheMode, ModeRules, WriteRule};

/// Rules of `wi`.
pub const RULES: ModeRules = ModeRules {
    mode: CacheMode::Wi,
    name: "wi",
    lazy: false,
    read_clean_from_cache: true,
    read_promotes: true,
    reclassifies: true,
    write: WriteRule::Invalidate,
};
