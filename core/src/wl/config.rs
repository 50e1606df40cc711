//! The write log's configuration and ring geometry.

use super::pace::Pacing;
use crate::config::Config;
use crate::units::Lba;
use tiercache_format::wlog::RING_OFFSET_BLOCKS;

/// Configuration of a write log.
#[derive(Clone, Debug)]
pub struct WlConfig {
    /// The cache's identity, written into every entry and superblock.
    pub cache_id: [u8; 16],
    /// First block of the log region on the cache device.
    pub log_start: Lba,
    /// Blocks of the log region (superblocks + ring).
    pub log_blocks: u64,
    /// A generation ends after this many entries ...
    pub gen_max_writes: u32,
    /// ... or this many blocks.
    pub gen_max_blocks: u64,
    /// Staging slots for writeback (each `read_cache.pool_slot_blocks` long).
    pub staging_slots: u32,
    /// When writeback runs ([`pace`]).
    pub pacing: Pacing,
    /// The read cache: its mode is forced to `wa`, and its `data_offset` must place its lines
    /// outside the log region. With `persist` set it keeps the cache device's superblock and
    /// tables (configuration, core table with each core's identity) and its clean lines, as
    /// any persistent `wa` cache does; without, it restarts cold.
    pub read_cache: Config,
}

impl WlConfig {
    pub(super) fn ring_start(&self) -> u64 {
        self.log_start.0 + RING_OFFSET_BLOCKS
    }

    pub(super) fn ring_blocks(&self) -> u64 {
        self.log_blocks - RING_OFFSET_BLOCKS
    }

    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), String> {
        if self.log_blocks < RING_OFFSET_BLOCKS + 64 {
            return Err(format!(
                "the write log needs at least {} blocks, this one has {}",
                RING_OFFSET_BLOCKS + 64,
                self.log_blocks
            ));
        }
        let rc = &self.read_cache;
        let rc_start = rc.data_offset.0;
        let rc_end = rc_start + rc.lines as u64 * rc.line_size.blocks() as u64;
        let (ls, le) = (self.log_start.0, self.log_start.0 + self.log_blocks);
        if rc_start < le && ls < rc_end {
            return Err("the read cache's lines overlap the write log".into());
        }
        if self.staging_slots == 0 || self.gen_max_writes == 0 || self.gen_max_blocks == 0 {
            return Err("staging slots and generation limits must be positive".into());
        }
        self.pacing.validate()?;
        Ok(())
    }
}

/// The cache-device block of virtual ring position `pos`.
pub(super) fn ext_src_lba(cfg: &WlConfig, pos: u64) -> u64 {
    cfg.ring_start() + pos % cfg.ring_blocks()
}
