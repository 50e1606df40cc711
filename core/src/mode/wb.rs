//! `wb`, write-back. Reads as `wt`. Writes: mapped and written to the cache only; acknowledged
//! once the cache has them (durable at the next flush, or at once with FUA); the cleaner writes
//! them back later. If lines cannot be mapped the write is handled as write-invalidate.

use super::{CacheMode, ModeRules, WriteRule};

/// Rules of `wb`.
pub const RULES: ModeRules = ModeRules {
    mode: CacheMode::Wb,
    name: "wb",
    lazy: true,
    read_clean_from_cache: true,
    read_promotes: true,
    reclassifies: true,
    write: WriteRule::Back,
};
