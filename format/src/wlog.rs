//! The write log of mode `wl` (SPEC C9): a ring of entries on the cache device, and the log's
//! own superblock (two copies) that says where the ring's live part starts.
//!
//! ```text
//! log region (on the cache device)
//! block 0        log superblock, copy 0        (one block, a record padded to 512 B)
//! block 1        log superblock, copy 1
//! blocks 2..8    reserved (zero)
//! blocks 8..     the ring: entries, each a header block followed by its data blocks
//! ```
//!
//! An entry is one header block ([`LogHeader`], a record padded to 512 bytes) and, for a write,
//! its data right behind it. The header carries the CRC32C of the data, so a torn entry (header
//! or data) is detected; its sequence number and the run's *epoch* let a reader tell the live
//! entries from stale ones of an earlier lap or an earlier run. An entry never wraps: when the
//! space left before the end of the ring is too short, a [`LogKind::Pad`] entry fills it.

use crate::DecodeError;
use crate::codec::{Reader, Writer};
use crate::record::{self, RecordKind};

/// Bytes of a header or a superblock on the device: one 512-byte block.
pub const LOG_BLOCK: usize = 512;
/// Blocks before the ring inside the log region (two superblock copies, then reserved).
pub const RING_OFFSET_BLOCKS: u64 = 8;

/// What a log entry records.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LogKind {
    /// A write; its data follows the header.
    Write = 1,
    /// A TRIM of the range (reads back as zeros).
    Trim = 2,
    /// A WRITE_ZEROES of the range.
    Zero = 3,
    /// Filler up to the end of the ring; `blocks` counts the blocks after the header.
    Pad = 4,
    /// An entry whose write failed: skipped by writeback, kept only so the ring stays
    /// readable; `blocks` as the failed entry's.
    Void = 5,
}

impl LogKind {
    fn from_u8(v: u8) -> Option<LogKind> {
        Some(match v {
            1 => LogKind::Write,
            2 => LogKind::Trim,
            3 => LogKind::Zero,
            4 => LogKind::Pad,
            5 => LogKind::Void,
            _ => return None,
        })
    }

    /// Whether data blocks follow the header on the device.
    pub fn has_data(self) -> bool {
        matches!(self, LogKind::Write)
    }
}

/// A log entry's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogHeader {
    /// What the entry is.
    pub kind: LogKind,
    /// The cache it belongs to.
    pub cache_id: [u8; 16],
    /// The run (incremented at every open) that wrote it.
    pub epoch: u32,
    /// Position in the log: consecutive, never reused.
    pub seq: u64,
    /// Sync generation.
    pub gen_: u64,
    /// Core.
    pub core: u16,
    /// First block on the core.
    pub lba: u64,
    /// Length in blocks (for `Pad` and `Void`: blocks taken after the header).
    pub blocks: u32,
    /// CRC32C of the data blocks (`Write`), 0 otherwise.
    pub data_crc: u32,
    /// Every entry with a smaller sequence number was durable (a completed cache-device flush
    /// covered it) when this header was written: a reader that finds one of those entries
    /// unreadable knows the log is damaged, not torn at a crash. 0: no claim (also what a
    /// header written before the field existed decodes to).
    pub durable_seq: u64,
}

/// Payload bytes of a header before `durable_seq` existed (still decoded).
const HEADER_PAYLOAD_V1: usize = 1 + 16 + 4 + 8 + 8 + 2 + 8 + 4 + 4;
const HEADER_PAYLOAD: usize = HEADER_PAYLOAD_V1 + 8;

impl LogHeader {
    /// Encodes the header as one 512-byte block.
    pub fn encode(&self) -> [u8; LOG_BLOCK] {
        let mut w = Writer::new();
        w.u8(self.kind as u8)
            .bytes(&self.cache_id)
            .u32(self.epoch)
            .u64(self.seq)
            .u64(self.gen_)
            .u16(self.core)
            .u64(self.lba)
            .u32(self.blocks)
            .u32(self.data_crc)
            .u64(self.durable_seq);
        debug_assert_eq!(w.buf.len(), HEADER_PAYLOAD);
        let rec = record::encode(RecordKind::LogEntry, &w.buf);
        let mut out = [0u8; LOG_BLOCK];
        out[..rec.len()].copy_from_slice(&rec);
        out
    }

    /// Decodes a header block.
    pub fn decode(buf: &[u8]) -> Result<LogHeader, DecodeError> {
        const WHAT: &str = "log entry";
        let (rec, _) = record::decode(buf)?;
        if rec.kind != RecordKind::LogEntry {
            return Err(DecodeError::BadField {
                what: WHAT,
                detail: format!("record kind {:?}, not a log entry", rec.kind),
            });
        }
        let mut r = Reader::new(rec.payload, WHAT);
        let kind = r.u8()?;
        let kind = LogKind::from_u8(kind).ok_or_else(|| DecodeError::BadField {
            what: WHAT,
            detail: format!("unknown entry kind {kind}"),
        })?;
        let h = LogHeader {
            kind,
            cache_id: r.bytes::<16>()?,
            epoch: r.u32()?,
            seq: r.u64()?,
            gen_: r.u64()?,
            core: r.u16()?,
            lba: r.u64()?,
            blocks: r.u32()?,
            data_crc: r.u32()?,
            durable_seq: if rec.payload.len() >= HEADER_PAYLOAD {
                r.u64()?
            } else {
                0
            },
        };
        if h.lba.checked_add(h.blocks as u64).is_none() {
            return Err(DecodeError::BadField {
                what: WHAT,
                detail: "range overflows".into(),
            });
        }
        Ok(h)
    }
}

/// The log superblock: where the live part of the ring starts, and the current epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSuper {
    /// The cache it belongs to.
    pub cache_id: [u8; 16],
    /// Incremented at every write of a superblock; the valid copy with the larger one wins.
    pub sb_gen: u64,
    /// The current run; entries of a later epoch than this are impossible, entries written
    /// after this superblock carry exactly this epoch.
    pub epoch: u32,
    /// Blocks in the ring.
    pub ring_blocks: u64,
    /// The oldest entry not yet written back: its position in ring blocks since the log was
    /// created (virtual: the device position is `tail_pos % ring_blocks`).
    pub tail_pos: u64,
    /// Its sequence number.
    pub tail_seq: u64,
    /// Its sync generation.
    pub tail_gen: u64,
    /// Every entry with a smaller sequence number was durable when this superblock was
    /// written (a clean stop writes one with every entry durable): a scan that ends before it
    /// has found damage. 0: no claim (also what a superblock written before the field existed
    /// decodes to).
    pub durable_seq: u64,
}

/// Payload bytes of a superblock before `durable_seq` existed (still decoded).
const SUPER_PAYLOAD_V1: usize = 16 + 8 + 4 + 8 + 8 + 8 + 8;

impl LogSuper {
    /// Encodes the superblock as one 512-byte block.
    pub fn encode(&self) -> [u8; LOG_BLOCK] {
        let mut w = Writer::new();
        w.bytes(&self.cache_id)
            .u64(self.sb_gen)
            .u32(self.epoch)
            .u64(self.ring_blocks)
            .u64(self.tail_pos)
            .u64(self.tail_seq)
            .u64(self.tail_gen)
            .u64(self.durable_seq);
        let rec = record::encode(RecordKind::LogSuper, &w.buf);
        let mut out = [0u8; LOG_BLOCK];
        out[..rec.len()].copy_from_slice(&rec);
        out
    }

    /// Decodes a superblock copy.
    pub fn decode(buf: &[u8]) -> Result<LogSuper, DecodeError> {
        const WHAT: &str = "log superblock";
        let (rec, _) = record::decode(buf)?;
        if rec.kind != RecordKind::LogSuper {
            return Err(DecodeError::BadField {
                what: WHAT,
                detail: format!("record kind {:?}, not a log superblock", rec.kind),
            });
        }
        let mut r = Reader::new(rec.payload, WHAT);
        let s = LogSuper {
            cache_id: r.bytes::<16>()?,
            sb_gen: r.u64()?,
            epoch: r.u32()?,
            ring_blocks: r.u64()?,
            tail_pos: r.u64()?,
            tail_seq: r.u64()?,
            tail_gen: r.u64()?,
            durable_seq: if rec.payload.len() > SUPER_PAYLOAD_V1 {
                r.u64()?
            } else {
                0
            },
        };
        if s.ring_blocks == 0 {
            return Err(DecodeError::BadField {
                what: WHAT,
                detail: "empty ring".into(),
            });
        }
        Ok(s)
    }

    /// Of two copies (either may be damaged), the one in force: the valid one with the larger
    /// `sb_gen`. Returns it and its copy index, or the first copy's error when neither is valid.
    pub fn pick(copy0: &[u8], copy1: &[u8]) -> Result<(LogSuper, usize), DecodeError> {
        match (LogSuper::decode(copy0), LogSuper::decode(copy1)) {
            (Ok(a), Ok(b)) => Ok(if b.sb_gen > a.sb_gen { (b, 1) } else { (a, 0) }),
            (Ok(a), Err(_)) => Ok((a, 0)),
            (Err(_), Ok(b)) => Ok((b, 1)),
            (Err(e), Err(_)) => Err(e),
        }
    }
}
