//! Planning a new cache: its configuration and the space it needs on a device of a given size.

use super::*;
use tiercache_core::units::BLOCK_BYTES;

/// Metadata RAM per line (measured by `tiercache bench core`, rounded up) and the staging pool.
pub(super) const RAM_PER_LINE: u64 = 20;

/// A new cache's configuration on a device of `bytes`.
pub fn plan_cache(
    bytes: u64,
    ls: LineSize,
    mode: CacheMode,
    volatile: bool,
) -> Result<(Config, Value), String> {
    let mut cfg;
    let meta_bytes;
    if volatile {
        let lines = u32::try_from(bytes / ls.bytes()).map_err(|_| "too many lines".to_string())?;
        cfg = Config::new(lines, ls);
        cfg.volatile = true;
        meta_bytes = 0;
    } else {
        let (layout, lines) = Layout::plan(
            bytes,
            ls.bytes() as u32,
            journal_bytes_for(bytes),
        )
        .ok_or_else(|| {
            format!(
                "the cache device ({bytes} bytes) is too small for its metadata and one {ls} line"
            )
        })?;
        cfg = Config::new(lines, ls);
        cfg.data_offset = Lba(layout.data.offset / BLOCK_BYTES);
        cfg.persist = Some(Persist::new_cache(new_uuid(), bytes, ls, lines, layout));
        meta_bytes = layout.data.offset;
    }
    cfg.mode = mode;
    cfg.validate()?;
    let ram = cfg.lines as u64 * RAM_PER_LINE
        + cfg.pool_slots as u64 * cfg.pool_slot_blocks as u64 * BLOCK_BYTES;
    let space = json!({
        "lines": cfg.lines,
        "line_size": ls.bytes(),
        "data_bytes": cfg.lines as u64 * ls.bytes(),
        "metadata_bytes_on_device": meta_bytes,
        "ram_bytes": ram,
    });
    Ok((cfg, space))
}

/// A new `wl` cache on a device of `bytes`: half of it (in MiB) is the write log, the rest
/// the read cache's metadata and lines.
pub fn plan_wl_cache(bytes: u64, ls: LineSize) -> Result<(WlConfig, Value), String> {
    let log_bytes = (bytes / 2) & !((1 << 20) - 1);
    let (layout, lines) =
        Layout::plan_wl(bytes, ls.bytes() as u32, journal_bytes_for(bytes / 2), log_bytes)
            .ok_or_else(|| {
                format!(
                    "the cache device ({bytes} bytes) is too small for a write log, its read cache's metadata and one {ls} line"
                )
            })?;
    let mut rc = Config::new(lines, ls);
    rc.mode = CacheMode::Wa;
    rc.data_offset = Lba(layout.data.offset / BLOCK_BYTES);
    rc.persist = Some(Persist::new_cache(new_uuid(), bytes, ls, lines, layout));
    rc.validate()?;
    let cfg = WlConfig::on_device(rc)?;
    cfg.validate()?;
    let rc = &cfg.read_cache;
    let ram = rc.lines as u64 * RAM_PER_LINE
        + (rc.pool_slots + cfg.staging_slots) as u64 * rc.pool_slot_blocks as u64 * BLOCK_BYTES;
    let space = json!({
        "lines": rc.lines,
        "line_size": ls.bytes(),
        "data_bytes": rc.lines as u64 * ls.bytes(),
        "log_bytes": layout.log.bytes,
        "metadata_bytes_on_device": layout.data.offset - layout.log.bytes,
        "ram_bytes": ram,
    });
    Ok((cfg, space))
}
