//! `pt`, pass-through. Reads come from the core and are never inserted; blocks still dirty in the
//! cache (left from a lazy mode) are read from the cache, which Open CAS does by cleaning first.
//! Writes are handled as write-invalidate.

use super::{CacheMode, ModeRules, WriteRule};

/// Rules of `pt`.
pub const RULES: ModeRules = ModeRules {
    mode: CacheMode::Pt,
    name: "pt",
    lazy: false,
    read_clean_from_cache: false,
    read_promotes: false,
    reclassifies: false,
    write: WriteRule::Invalidate,
};
