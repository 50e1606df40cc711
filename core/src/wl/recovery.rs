//! Recovery: reading the log superblock and the entries from its tail, and telling the end of
//! the log from damage.

use super::WlConfig;
use crate::units::Lba;
use tiercache_format::crc::crc32c;
use tiercache_format::wlog::{LOG_BLOCK, LogHeader, LogKind, LogSuper};

/// State a log scan found (see [`scan`]); what [`WriteLog::open`] starts from.
#[derive(Clone, Debug)]
pub struct Recovered {
    /// The superblock in force and its copy index.
    pub sb: LogSuper,
    /// Which copy it was.
    pub sb_copy: usize,
    /// Valid entries from the tail, in order.
    pub entries: Vec<LogHeader>,
    /// Virtual ring position after the last valid entry.
    pub head_pos: u64,
}

/// The most blocks one entry spans (a header and 32 MiB of data, the largest NBD request).
const MAX_ENTRY_SPAN: u64 = 1 + (32 << 20) / 512;

/// The scan ended at ring position `pos` where entry `seq` should be: the end of the log, or
/// damage? An entry the log had made durable cannot be missing after a crash (a power cut
/// loses or tears only what no flush covered), so it is damage if the log superblock says
/// `seq` was durable, or if a later entry of this log — looked for in the blocks an entry
/// `seq` could span, and the one after it — says so in its header.
fn check_end(
    cfg: &WlConfig,
    sb: &LogSuper,
    pos: u64,
    seq: u64,
    read: &mut ReadFn<'_>,
) -> Result<(), String> {
    let ring = sb.ring_blocks;
    let damaged = |by: String| {
        Err(format!(
            "the write log is damaged: entry {seq} (ring block {}) cannot be read, but {by} says it was made durable; refusing to load what would lose flushed writes (run tiercache check)",
            pos % ring
        ))
    };
    if sb.durable_seq > seq {
        return damaged("the log superblock".into());
    }
    let end = (pos + 2 * MAX_ENTRY_SPAN).min(sb.tail_pos + ring);
    let mut p = pos + 1;
    let mut buf = Vec::new();
    while p < end {
        // Read up to 1 MiB at a time, not across the ring's end.
        let phys = p % ring;
        let n = (end - p).min(ring - phys).min(2048);
        buf.resize(n as usize * LOG_BLOCK, 0);
        if read(Lba(cfg.ring_start() + phys), &mut buf).is_err() {
            return Ok(()); // unreadable: no evidence either way
        }
        for (i, b) in buf.chunks(LOG_BLOCK).enumerate() {
            if let Ok(h) = LogHeader::decode(b)
                && h.cache_id == cfg.cache_id
                && h.epoch <= sb.epoch
                && h.seq > seq
                && h.durable_seq > seq
            {
                return damaged(format!("entry {} at ring block {}", h.seq, phys + i as u64));
            }
        }
        p += n;
    }
    Ok(())
}

/// How [`scan`] reads the cache device: blocks at an LBA into a buffer.
pub type ReadFn<'a> = dyn FnMut(Lba, &mut [u8]) -> Result<(), String> + 'a;

/// Reads a write log from the cache device: the superblock in force, then every entry from
/// its tail while each one is valid (framed, checksummed, of this cache, next in sequence,
/// of a non-decreasing epoch no newer than the superblock's, with its data's checksum). The
/// first entry that fails any of these ends the log: everything after it was never covered
/// by a completed flush (a flush waits for every earlier entry).
pub fn scan(cfg: &WlConfig, read: &mut ReadFn<'_>) -> Result<Recovered, String> {
    let mut c0 = vec![0u8; LOG_BLOCK];
    let mut c1 = vec![0u8; LOG_BLOCK];
    read(cfg.log_start, &mut c0)?;
    read(Lba(cfg.log_start.0 + 1), &mut c1)?;
    let (sb, sb_copy) = LogSuper::pick(&c0, &c1)
        .map_err(|e| format!("the write log's superblock is damaged ({e}); run tiercache check"))?;
    if sb.cache_id != cfg.cache_id {
        return Err("the write log belongs to another cache".into());
    }
    if sb.ring_blocks != cfg.ring_blocks() {
        return Err(format!(
            "the write log's ring is {} blocks, the configuration says {}",
            sb.ring_blocks,
            cfg.ring_blocks()
        ));
    }
    let ring = sb.ring_blocks;
    let mut pos = sb.tail_pos;
    let mut seq = sb.tail_seq;
    let mut epoch = 0;
    let mut gen_ = sb.tail_gen;
    let mut entries = Vec::new();
    let mut hdr = vec![0u8; LOG_BLOCK];
    let mut data = Vec::new();
    while pos - sb.tail_pos < ring {
        let phys = pos % ring;
        if read(Lba(cfg.ring_start() + phys), &mut hdr).is_err() {
            break;
        }
        let Ok(h) = LogHeader::decode(&hdr) else {
            break;
        };
        if h.cache_id != cfg.cache_id
            || h.seq != seq
            || h.epoch < epoch
            || h.epoch > sb.epoch
            || h.gen_ < gen_
        {
            break;
        }
        let after = match h.kind {
            LogKind::Write | LogKind::Pad | LogKind::Void => h.blocks as u64,
            LogKind::Trim | LogKind::Zero => 0,
        };
        if phys + 1 + after > ring || (h.kind == LogKind::Pad && phys + 1 + after != ring) {
            break;
        }
        if pos + 1 + after - sb.tail_pos > ring {
            break;
        }
        if h.kind == LogKind::Write {
            data.resize(h.blocks as usize * 512, 0);
            if read(Lba(cfg.ring_start() + phys + 1), &mut data).is_err()
                || crc32c(&data) != h.data_crc
            {
                break;
            }
        }
        epoch = h.epoch;
        gen_ = h.gen_;
        seq += 1;
        pos += 1 + after;
        entries.push(h);
    }
    if pos - sb.tail_pos < ring {
        check_end(cfg, &sb, pos, seq, read)?;
    }
    Ok(Recovered {
        sb,
        sb_copy,
        entries,
        head_pos: pos,
    })
}
