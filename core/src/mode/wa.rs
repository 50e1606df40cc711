//! `wa`, write-around. Reads as `wt`. A write whose lines are all mapped is handled as
//! write-through (the cache stays coherent without inserting anything); any other write goes to
//! the core only, invalidating whatever the cache held of it.

use super::{CacheMode, ModeRules, WriteRule};

/// Rules of `wa`.
pub const RULES: ModeRules = ModeRules {
    mode: CacheMode::Wa,
    name: "wa",
    lazy: false,
    read_clean_from_cache: true,
    read_promotes: true,
    reclassifies: true,
    write: WriteRule::AroundIfMapped,
};
