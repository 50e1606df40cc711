//! A write log on a cache device: its configuration from the device's layout, and opening
//! whatever cache a device holds as a [`Machine`].
//!
//! A `wl` cache device is a persistent `wa` cache (superblock pair, tables, journal,
//! checkpoints, lines: the read cache) whose superblock also names a write-log region
//! (`Layout::log`). The read cache keeps the device's identity, configuration and core
//! table; the log keeps the data not yet written back.

use super::{WlConfig, WriteLog, scan};
use crate::cache::LoadReport;
use crate::config::Config;
use crate::machine::Machine;
use crate::units::Lba;

/// A generation ends after this many entries by default ...
pub const GEN_MAX_WRITES: u32 = 4096;
/// ... or this many blocks (64 MiB).
pub const GEN_MAX_BLOCKS: u64 = 128 * 1024;
/// Staging slots for writeback by default: the most entries (chunks) in writeback at once.
/// 64 since writes to an RBD core are asynchronous (no IO thread waits for each): with the log
/// full, writeback to a single-OSD Ceph on the 2-vCPU machine went from ~2,000-2,400 to
/// ~2,800-5,000 writes/s (16 slots with 16 blocking IO threads before). Earlier, with writeback
/// on blocking IO threads, 64 cost the clients CPU (not-full QD 16 1.4x -> 0.7x plain librbd).
pub const STAGING_SLOTS: u32 = 64;

impl WlConfig {
    /// The write log of a read cache whose persistence names a log region (a device planned
    /// by `Layout::plan_wl`), with the default generation limits and staging.
    pub fn on_device(read_cache: Config) -> Result<WlConfig, String> {
        let p = read_cache
            .persist
            .as_ref()
            .ok_or("a write log on a device needs a persistent read cache")?;
        let log = p.superblock.layout.log;
        if log.bytes == 0 {
            return Err("the device's layout has no write-log region".into());
        }
        Ok(WlConfig {
            cache_id: p.superblock.cache_id,
            log_start: Lba(log.offset / 512),
            log_blocks: log.bytes / 512,
            gen_max_writes: GEN_MAX_WRITES,
            gen_max_blocks: GEN_MAX_BLOCKS,
            staging_slots: STAGING_SLOTS,
            pacing: super::pace::Pacing::DEFAULT,
            read_cache,
        })
    }
}

/// How [`open_device`] reads the cache device: bytes at a byte offset.
pub type ByteReadFn<'a> = dyn FnMut(u64, &mut [u8]) -> Result<(), String> + 'a;

/// Opens the cache on a device (a clean load or a crash recovery): an Open CAS-style cache,
/// or — when the superblock names a write-log region — a write log, its read cache loaded and
/// its log scanned (every entry not yet written back is kept). `read(offset, buf)` reads bytes
/// at a byte offset.
pub fn open_device(
    base: &Config,
    read: &mut ByteReadFn<'_>,
) -> Result<(Machine, LoadReport), String> {
    let (cache, report) = crate::cache::open(base, read)?;
    if report.superblock.layout.log.bytes == 0 {
        return Ok((Machine::Cache(Box::new(cache)), report));
    }
    let cfg = WlConfig::on_device(cache.config().clone())?;
    let mut read_lba = |lba: Lba, buf: &mut [u8]| read(lba.0 * 512, buf);
    let rec = scan(&cfg, &mut read_lba)?;
    let wl = WriteLog::open_loaded(cfg, cache, rec)?;
    Ok((Machine::Wl(Box::new(wl)), report))
}
