//! The enumerated values of the command line, as `clap::ValueEnum`s: a value outside the list
//! is refused while the arguments are parsed, with the allowed values named, and shells
//! complete them. The daemon receives each as the word shown here.

use clap::ValueEnum;
use clap::builder::PossibleValuesParser;

/// The word a value is written as on the command line (and sent to the daemon as).
pub fn word<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// For an option kept as a word (a `String` field): takes only the words of `T`, refusing
/// any other while parsing with the list, and gives the word as typed.
pub fn words<T: ValueEnum>() -> PossibleValuesParser {
    PossibleValuesParser::new(
        T::value_variants()
            .iter()
            .filter_map(ValueEnum::to_possible_value),
    )
}

/// `--format` of a block trace: `auto` or one of the simulator's trace formats.
pub fn trace_formats() -> PossibleValuesParser {
    PossibleValuesParser::new(
        std::iter::once("auto").chain(tiercache_sim::trace::FORMATS.iter().map(|f| f.name())),
    )
}

/// Cache modes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Write-through: writes reach the core before they are acknowledged (the default).
    Wt,
    /// Write-back: writes are acknowledged once on the cache device; the cleaner copies them
    /// to the core later.
    Wb,
    /// Write-around: writes go to the core; lines already cached are updated, not inserted.
    Wa,
    /// Write-invalidate: writes go to the core and drop the lines they touch.
    Wi,
    /// Pass-through: reads and writes go to the core (blocks still dirty in the cache are
    /// read from it).
    Pt,
    /// Write-only: like wb, but reads are not inserted into the cache.
    Wo,
    /// Write log: writes appended to a checksummed log, written back in order (at creation
    /// only).
    Wl,
}

/// Cache line sizes, fixed when the cache is created.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineSize {
    /// 4 KiB (the default).
    #[value(name = "4k")]
    K4,
    /// 8 KiB.
    #[value(name = "8k")]
    K8,
    /// 16 KiB.
    #[value(name = "16k")]
    K16,
    /// 32 KiB.
    #[value(name = "32k")]
    K32,
    /// 64 KiB.
    #[value(name = "64k")]
    K64,
}

/// Sequential cutoff policies (`set-param seq-cutoff --policy`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutoffPolicy {
    /// Every sequential stream longer than the threshold bypasses the cache.
    Always,
    /// Only when the cache is full (the default).
    Full,
    /// Never: sequential streams are cached like any IO.
    Never,
}

/// Cleaning policies (`set-param cleaning --policy`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleaningPolicy {
    /// Approximately least recently used: writes back lines dirty for longer than the
    /// staleness time, when clients are idle.
    Alru,
    /// Aggressive cleaning: writes back all the time, LBA-sorted.
    Acp,
    /// No cleaning: dirty data stays until `writeback`, a mode switch or eviction needs it.
    Nop,
}

/// Promotion policies (`set-param promotion --policy`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromotionPolicy {
    /// Every miss is inserted into the cache (the default).
    Always,
    /// A line is inserted only after N misses (`promotion-nhit`).
    Nhit,
}

/// Daemon log levels (`daemon --log-level`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings.
    Warn,
    /// The default: starts, stops, state changes, warnings and errors.
    Info,
    /// Everything, each admin request too.
    Debug,
}

/// Eviction policies of the simulator and `bench core`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Least recently used.
    Lru,
    /// S3-FIFO: a small probationary queue in front of the main one.
    S3fifo,
}

/// Core devices of `bench`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreKind {
    /// Emulated HDDs on files (`--core-preset`).
    Emu,
    /// RBD images on a Ceph cluster.
    Rbd,
}

/// Load generators of `bench`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadGenerator {
    /// fio when installed, else tiercache's own.
    Auto,
    /// fio's nbd engine.
    Fio,
    /// tiercache's own load generator.
    Own,
}

/// NBD serving paths of `bench wb-hits`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NbdPath {
    /// An io_uring reactor per connection.
    Reactor,
    /// Worker threads.
    Threaded,
    /// One after the other.
    Both,
}

/// Methods of `sim mrc`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MrcMethod {
    /// stack for textbook LRU, else core.
    Auto,
    /// Exact textbook LRU, one pass.
    Stack,
    /// Sampled LRU (SHARDS).
    Shards,
    /// The real cache core, one run per size.
    Core,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_core::mode::CacheMode;
    use tiercache_core::policy;
    use tiercache_core::policy::Named;

    fn cli_words<T: ValueEnum>() -> Vec<String> {
        T::value_variants().iter().map(word).collect()
    }

    fn core_names<T: Named>() -> Vec<String> {
        T::names().iter().map(|(n, _)| n.to_string()).collect()
    }

    /// The command line lists the core's names, in the core's order: a policy or mode added,
    /// renamed or dropped in the core fails here until the CLI says the same.
    #[test]
    fn the_cli_offers_exactly_the_cores_names() {
        assert_eq!(
            cli_words::<CutoffPolicy>(),
            core_names::<policy::CutoffPolicy>()
        );
        assert_eq!(
            cli_words::<CleaningPolicy>(),
            core_names::<policy::CleaningPolicy>()
        );
        assert_eq!(
            cli_words::<PromotionPolicy>(),
            core_names::<policy::PromotionPolicy>()
        );
        assert_eq!(
            cli_words::<Eviction>(),
            core_names::<policy::EvictionPolicy>()
        );
        // The modes of the cache core, then the write log (a mode of its own engine).
        let mut modes: Vec<String> = CacheMode::ALL.iter().map(|m| m.to_string()).collect();
        modes.push("wl".into());
        assert_eq!(cli_words::<Mode>(), modes);
        for s in cli_words::<LineSize>() {
            assert!(tiercache_core::units::LineSize::parse(&s).is_some(), "{s}");
        }
        assert_eq!(cli_words::<LineSize>().len(), 5);
    }
}
