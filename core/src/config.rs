//! Cache configuration: geometry, mode and policy choices, and the bounds of the core's
//! staging pool. Fixed at creation except where a management call changes it.

use crate::mode::CacheMode;
use crate::policy::{
    AcpParams, AlruParams, CleaningPolicy, EvictionPolicy, NhitParams, PromotionPolicy, RateParams,
};
use crate::units::{Lba, LineSize};

/// Largest client request, in blocks (32 MiB). Drivers split or refuse larger ones.
pub const REQUEST_BLOCKS_MAX: u32 = 65536;

/// Configuration of a cache.
#[derive(Clone, Debug)]
pub struct Config {
    /// Cache lines.
    pub lines: u32,
    /// Line size.
    pub line_size: LineSize,
    /// First block of line 0 on the cache device (metadata lives before it).
    pub data_offset: Lba,
    /// Initial mode.
    pub mode: CacheMode,
    /// The cache device is volatile (`ram:`): lazy modes are refused.
    pub volatile: bool,
    /// Eviction policy.
    pub eviction: EvictionPolicy,
    /// Promotion policy.
    pub promotion: PromotionPolicy,
    /// `nhit` parameters.
    pub nhit: NhitParams,
    /// Cleaning policy.
    pub cleaning: CleaningPolicy,
    /// `alru` parameters.
    pub alru: AlruParams,
    /// `acp` parameters.
    pub acp: AcpParams,
    /// Rate controller parameters.
    pub rate: RateParams,
    /// Staging slots (writeback extents in flight at once).
    pub pool_slots: u32,
    /// Blocks per staging slot (the longest merged writeback extent).
    pub pool_slot_blocks: u32,
    /// Persistent metadata on the cache device; `None`: nothing is persisted (a volatile cache,
    /// benchmarks, the simulator's performance runs).
    pub persist: Option<Persist>,
}

/// Where and how a cache persists its metadata (see `cache/meta.rs`).
#[derive(Clone, Copy, Debug)]
pub struct Persist {
    /// The superblock in force on the device (for a new cache: the one to write; the core
    /// owns its generation, state, checkpoint and journal fields from here on).
    pub superblock: tiercache_format::superblock::Superblock,
    /// The copy (0 or 1) that holds it; for a new cache 1, so the first write goes to copy 0.
    pub superblock_copy: usize,
}

impl Persist {
    /// Persistence for a new cache with this identity and layout: the core zeroes the journal
    /// and writes the first superblock before it serves anything.
    pub fn new_cache(
        cache_id: [u8; 16],
        device_bytes: u64,
        line_size: LineSize,
        lines: u32,
        layout: tiercache_format::superblock::Layout,
    ) -> Persist {
        Persist {
            superblock: tiercache_format::superblock::Superblock {
                version: tiercache_format::superblock::SUPERBLOCK_VERSION,
                generation: 0,
                cache_id,
                device_bytes,
                line_size: line_size.bytes() as u32,
                lines,
                state: tiercache_format::superblock::CacheState::Running,
                checkpoint: 0,
                has_checkpoint: false,
                journal_seq: 1,
                layout,
            },
            superblock_copy: 1,
        }
    }
}

impl Config {
    /// A configuration with Open CAS defaults (`wt`, `always`, `alru`) and our eviction.
    pub fn new(lines: u32, line_size: LineSize) -> Config {
        Config {
            lines,
            line_size,
            data_offset: Lba(0),
            mode: CacheMode::Wt,
            volatile: false,
            eviction: EvictionPolicy::S3Fifo,
            promotion: PromotionPolicy::Always,
            nhit: NhitParams::default(),
            cleaning: CleaningPolicy::Alru,
            alru: AlruParams::default(),
            acp: AcpParams::default(),
            rate: RateParams::default(),
            pool_slots: 64,
            pool_slot_blocks: 2048,
            persist: None,
        }
    }

    /// Checks the configuration, saying what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.lines < 16 {
            return Err(format!(
                "a cache needs at least 16 lines, this one has {}",
                self.lines
            ));
        }
        if self.lines >= u32::MAX / 2 {
            return Err(format!(
                "{} lines is too many; use a larger line size",
                self.lines
            ));
        }
        if self.volatile && self.mode.is_lazy() {
            return Err(format!(
                "mode {} keeps dirty data and is refused on a volatile (ram:) cache device",
                self.mode
            ));
        }
        if self.pool_slots == 0 {
            return Err("pool_slots must be at least 1".into());
        }
        if self.pool_slot_blocks < self.line_size.blocks() {
            return Err("a staging slot must hold at least one line".into());
        }
        if let Some(p) = &self.persist {
            let sb = &p.superblock;
            if self.volatile {
                return Err("a volatile (ram:) cache device cannot persist metadata".into());
            }
            if sb.line_size as u64 != self.line_size.bytes() || sb.lines != self.lines {
                return Err("the superblock's geometry does not match the configuration".into());
            }
            if self.data_offset.0 * 512 != sb.layout.data.offset {
                return Err("data_offset must be the superblock's data region".into());
            }
            sb.layout.validate(sb.device_bytes)?;
        }
        Ok(())
    }
}
