//! The superblock: what a cache device is, where its regions are, and whether it was stopped
//! cleanly. Two copies; the newest valid one wins.
//!
//! Each copy is one 4 KiB block (one atomic write on every device we support):
//!
//! ```text
//! offset size field
//!      0    8 magic            b"tiercach"
//!      8    2 version          format version that wrote it
//!     10    2 used             bytes of the block covered by the checksum (from 0)
//!     12    4 crc              CRC32C of bytes 0..used with this field as zero
//!     16    8 generation       +1 at every superblock write; the newer valid copy wins
//!     24   16 cache_id         random at creation; every record region belongs to it
//!     40    8 device_bytes     cache device size at creation
//!     48    4 line_size        bytes (4096..65536)
//!     52    4 lines            cache lines
//!     56    1 state            1 = clean (stopped, everything persisted), 2 = running
//!     57    1 checkpoint       which checkpoint region is current (0 or 1)
//!     58    6 reserved         zero
//!     64    8 journal_seq      sequence number of the oldest journal entry still needed
//!     72  8×2 journal          region: offset, bytes
//!     88  8×2 checkpoint[0]    region
//!    104  8×2 checkpoint[1]    region
//!    120  8×2 data             region (cache lines)
//!    136    …  zero up to 4096
//! ```
//!
//! Copy A is at byte 0 and copy B at 64 KiB ([`SUPERBLOCK_OFFSETS`]): a tool that rewrites the
//! start of a device (a partition table, `mkfs` probing) usually stops before 64 KiB, and the
//! two copies never share a flash page or RAID stripe unit smaller than 64 KiB. Writers
//! alternate: a new superblock overwrites the older copy, so a torn superblock write always
//! leaves the other, complete one.

use crate::codec::{Reader, Writer};
use crate::crc::crc32c;
use crate::{DecodeError, FORMAT_VERSION};

/// Superblock magic.
pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"tiercach";
/// Bytes per superblock copy.
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Byte offsets of the two copies.
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [0, 64 << 10];
/// The version a superblock is written with: its layout is the same in format version 2 (which
/// changed journal entries and checkpoint chunks only, each framed with its own version).
pub const SUPERBLOCK_VERSION: u16 = 1;
/// Bytes of the header the checksum covers in this version.
const USED_V1: u16 = 136;
/// Bytes covered by the checksum of a superblock that names a write-log region (mode `wl`):
/// the log region follows the four regions of version 1.
const USED_WL: u16 = 152;
/// Byte offsets of the table areas that go with each superblock copy: the configuration and
/// core-table records written just before that copy (see [`TABLES_BYTES`]).
pub const TABLES_OFFSETS: [u64; 2] = [4 << 10, 68 << 10];
/// Bytes of each table area: up to the next copy (A) or a same-sized area (B).
pub const TABLES_BYTES: usize = 60 << 10;
/// Alignment of every region (and of the data region to a line, see [`Layout::plan`]).
pub const REGION_ALIGN: u64 = 1 << 20;

/// A byte range of the cache device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Region {
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub bytes: u64,
}

impl Region {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.bytes)
    }
    fn overlaps(&self, o: &Region) -> bool {
        self.offset < o.end() && o.offset < self.end()
    }
}

/// Where everything lives on a cache device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Layout {
    /// The metadata journal.
    pub journal: Region,
    /// The two checkpoint regions (alternating).
    pub checkpoint: [Region; 2],
    /// Cache lines.
    pub data: Region,
    /// The write log of mode `wl` (zero-length for every other cache).
    pub log: Region,
}

/// Bytes of checkpoint per line: mapping (core line `u64`, core `u8`), class `u8`, and the
/// valid and dirty masks (two bits per 512-byte block), rounded up to 8.
pub fn checkpoint_bytes_per_line(line_size: u32) -> u64 {
    let masks = 2 * (line_size as u64 / 512).div_ceil(8);
    (8 + 1 + 1 + masks).div_ceil(8) * 8
}

/// Bytes of one checkpoint chunk slot: each chunk record (frame and payload) is written into a
/// slot of this size, so chunk `i` lives at `i * CHECKPOINT_CHUNK_BYTES` in its region.
pub const CHECKPOINT_CHUNK_BYTES: u64 = 64 << 10;

/// The journal region a new cache gets on a device of `device_bytes` (`start-cache`'s plan):
/// 1/128 of the device, from 1 MiB to 64 MiB, in whole MiB. About twice a checkpoint at 4 KiB
/// lines (16 bytes a line), so a checkpoint (every line's record) comes once per half journal
/// of records, not more often than its own size in journal bytes. With 1/256, a 384 MiB
/// cache under 4K random writes wrote 69 checkpoints of 1.5 MiB for 220 MiB of client data.
pub fn journal_bytes_for(device_bytes: u64) -> u64 {
    (device_bytes / 128).clamp(1 << 20, 64 << 20) & !((1 << 20) - 1)
}

/// Lines per checkpoint chunk: as many records as fit in a slot with the frame and the chunk
/// header.
pub fn lines_per_chunk(line_size: u32) -> u32 {
    ((CHECKPOINT_CHUNK_BYTES
        - crate::record::RECORD_HEADER as u64
        - crate::checkpoint::CHUNK_HEADER as u64)
        / checkpoint_bytes_per_line(line_size)) as u32
}

/// Bytes a checkpoint of `lines` lines needs: one slot per chunk.
pub fn checkpoint_region_bytes(lines: u64, line_size: u32) -> Option<u64> {
    lines
        .div_ceil(lines_per_chunk(line_size) as u64)
        .checked_mul(CHECKPOINT_CHUNK_BYTES)
}

impl Layout {
    /// The smallest device for `lines` lines of `line_size` (tests, committed images, fuzzing):
    /// the superblock copies with their tables in the first 128 KiB, then the journal
    /// (`journal_bytes`), the write log (`log_bytes`; none when 0), two checkpoint regions and
    /// the lines, each region 4 KiB-aligned and packed without the 1 MiB alignment of
    /// [`Layout::plan`]. The device ends with the data region.
    pub fn compact(lines: u64, line_size: u32, journal_bytes: u64, log_bytes: u64) -> Layout {
        let align = |x: u64| x.div_ceil(4096) * 4096;
        let journal = Region {
            offset: 2 * SUPERBLOCK_OFFSETS[1],
            bytes: align(journal_bytes),
        };
        let log = Region {
            offset: journal.end(),
            bytes: align(log_bytes),
        };
        let cp = align(checkpoint_region_bytes(lines, line_size).expect("a small cache"));
        let c0 = Region {
            offset: log.end(),
            bytes: cp,
        };
        let c1 = Region {
            offset: c0.end(),
            bytes: cp,
        };
        let data = Region {
            offset: c1.end(),
            bytes: lines * line_size as u64,
        };
        Layout {
            journal,
            checkpoint: [c0, c1],
            data,
            log: if log_bytes == 0 {
                Region::default()
            } else {
                log
            },
        }
    }

    /// Plans a device of `device_bytes` for lines of `line_size`: superblocks, then the journal
    /// (`journal_bytes`, at least 1 MiB), then two checkpoints sized for every line, then as
    /// many lines as fit. Metadata goes first, together, so a metadata write never seeks across
    /// the data region on a device where that costs, and the data region's start is aligned to
    /// 1 MiB (and so to every line size and every flash erase unit we know). Returns `None` if
    /// not even one line fits.
    pub fn plan(device_bytes: u64, line_size: u32, journal_bytes: u64) -> Option<(Layout, u32)> {
        let align = |x: u64| x.div_ceil(REGION_ALIGN).checked_mul(REGION_ALIGN);
        let meta_start = align(SUPERBLOCK_OFFSETS[1] + SUPERBLOCK_BYTES as u64)?;
        let journal = Region {
            offset: meta_start,
            bytes: align(journal_bytes.max(REGION_ALIGN))?,
        };
        // Lines that could fit if metadata were free bounds the checkpoint size; then shrink.
        let mut lines = device_bytes.checked_sub(journal.end())? / line_size as u64;
        loop {
            let cp = align(checkpoint_region_bytes(lines, line_size)?.max(1))?;
            let c0 = Region {
                offset: journal.end(),
                bytes: cp,
            };
            let c1 = Region {
                offset: c0.end(),
                bytes: cp,
            };
            let data_off = c1.end();
            let fit = device_bytes.saturating_sub(data_off) / line_size as u64;
            if fit >= lines {
                let lines = u32::try_from(lines).ok().filter(|&l| l > 0)?;
                let data = Region {
                    offset: data_off,
                    bytes: lines as u64 * line_size as u64,
                };
                return Some((
                    Layout {
                        journal,
                        checkpoint: [c0, c1],
                        data,
                        log: Region::default(),
                    },
                    lines,
                ));
            }
            lines = fit;
        }
    }

    /// Plans a device for mode `wl`: as [`Layout::plan`], with a write-log region of
    /// `log_bytes` (rounded up to 1 MiB) right after the journal, before the checkpoints and
    /// the read cache's lines: the log is written at every client write, so it sits with the
    /// other metadata at the device's start.
    pub fn plan_wl(
        device_bytes: u64,
        line_size: u32,
        journal_bytes: u64,
        log_bytes: u64,
    ) -> Option<(Layout, u32)> {
        let log_len = log_bytes
            .max(REGION_ALIGN)
            .div_ceil(REGION_ALIGN)
            .checked_mul(REGION_ALIGN)?;
        let (mut l, lines) =
            Layout::plan(device_bytes.checked_sub(log_len)?, line_size, journal_bytes)?;
        let log = Region {
            offset: l.journal.end(),
            bytes: log_len,
        };
        l.checkpoint[0].offset += log_len;
        l.checkpoint[1].offset += log_len;
        l.data.offset += log_len;
        l.log = log;
        Some((l, lines))
    }

    /// Checks that the regions are in order, aligned, within the device and disjoint.
    pub fn validate(&self, device_bytes: u64) -> Result<(), String> {
        let sb_end = SUPERBLOCK_OFFSETS[1] + SUPERBLOCK_BYTES as u64;
        let mut regions = vec![
            ("journal", self.journal),
            ("checkpoint 0", self.checkpoint[0]),
            ("checkpoint 1", self.checkpoint[1]),
            ("data", self.data),
        ];
        if self.log != Region::default() {
            regions.push(("write log", self.log));
        }
        for (i, (name, r)) in regions.iter().enumerate() {
            if r.offset < sb_end || r.offset % 4096 != 0 || r.end() > device_bytes || r.bytes == 0 {
                return Err(format!(
                    "{name} region {r:?} is misplaced for a {device_bytes}-byte device"
                ));
            }
            for (other, o) in &regions[i + 1..] {
                if r.overlaps(o) {
                    return Err(format!("{name} region overlaps {other}"));
                }
            }
        }
        Ok(())
    }
}

/// How the cache was left.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// Stopped cleanly: the checkpoint is complete, the journal is empty.
    Clean = 1,
    /// Running (or crashed): replay the journal over the checkpoint.
    Running = 2,
}

/// A superblock.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// Format version that wrote it (decoded; [`Superblock::encode`] writes the current one).
    pub version: u16,
    /// Write counter.
    pub generation: u64,
    /// The cache's identity.
    pub cache_id: [u8; 16],
    /// Device size at creation.
    pub device_bytes: u64,
    /// Line size in bytes.
    pub line_size: u32,
    /// Lines.
    pub lines: u32,
    /// Clean or running.
    pub state: CacheState,
    /// Current checkpoint region (0 or 1).
    pub checkpoint: u8,
    /// Whether that checkpoint region holds a complete checkpoint. A new cache has none: every
    /// line is free and the journal alone says what changed.
    pub has_checkpoint: bool,
    /// Oldest journal entry still needed.
    pub journal_seq: u64,
    /// The regions.
    pub layout: Layout,
}

impl Superblock {
    /// The 4 KiB block for this superblock.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        let wl = self.layout.log != Region::default();
        let used = if wl { USED_WL } else { USED_V1 };
        w.bytes(&SUPERBLOCK_MAGIC)
            .u16(SUPERBLOCK_VERSION)
            .u16(used)
            .u32(0);
        w.u64(self.generation)
            .bytes(&self.cache_id)
            .u64(self.device_bytes);
        w.u32(self.line_size)
            .u32(self.lines)
            .u8(self.state as u8)
            .u8(self.checkpoint)
            .u8(self.has_checkpoint as u8);
        w.bytes(&[0; 5]).u64(self.journal_seq);
        for r in [
            self.layout.journal,
            self.layout.checkpoint[0],
            self.layout.checkpoint[1],
            self.layout.data,
        ] {
            w.u64(r.offset).u64(r.bytes);
        }
        if wl {
            w.u64(self.layout.log.offset).u64(self.layout.log.bytes);
        }
        debug_assert_eq!(w.buf.len(), used as usize);
        let crc = crc32c(&w.buf);
        w.buf[12..16].copy_from_slice(&crc.to_le_bytes());
        w.pad_to(SUPERBLOCK_BYTES);
        w.buf
    }

    /// Decodes one copy.
    pub fn decode(block: &[u8]) -> Result<Superblock, DecodeError> {
        const WHAT: &str = "superblock";
        let bad = |detail: String| DecodeError::BadField { what: WHAT, detail };
        let mut r = Reader::new(block, WHAT);
        if r.bytes::<8>()? != SUPERBLOCK_MAGIC {
            return Err(DecodeError::BadMagic { what: WHAT });
        }
        let version = r.u16()?;
        let used = r.u16()?;
        let crc = r.u32()?;
        if version > FORMAT_VERSION {
            return Err(DecodeError::TooNew {
                what: WHAT,
                version,
            });
        }
        if !(USED_V1 as usize..=SUPERBLOCK_BYTES).contains(&(used as usize)) {
            return Err(bad(format!("header length {used} out of range")));
        }
        let covered = Reader::new(block, WHAT).take(used as usize)?;
        let mut check = covered.to_vec();
        check[12..16].fill(0);
        if crc32c(&check) != crc {
            return Err(DecodeError::BadChecksum { what: WHAT });
        }
        let generation = r.u64()?;
        let cache_id = r.bytes::<16>()?;
        let device_bytes = r.u64()?;
        let line_size = r.u32()?;
        let lines = r.u32()?;
        let state = match r.u8()? {
            1 => CacheState::Clean,
            2 => CacheState::Running,
            s => return Err(bad(format!("state {s} unknown"))),
        };
        let checkpoint = r.u8()?;
        if checkpoint > 1 {
            return Err(bad(format!("checkpoint index {checkpoint}")));
        }
        let has_checkpoint = match r.u8()? {
            0 => false,
            1 => true,
            v => return Err(bad(format!("checkpoint flag {v}"))),
        };
        r.bytes::<5>()?;
        let journal_seq = r.u64()?;
        let mut regions = [Region::default(); 4];
        for reg in &mut regions {
            *reg = Region {
                offset: r.u64()?,
                bytes: r.u64()?,
            };
        }
        let log = if used >= USED_WL {
            let log = Region {
                offset: r.u64()?,
                bytes: r.u64()?,
            };
            if log == Region::default() {
                return Err(bad("a write-log region of zero bytes".into()));
            }
            log
        } else {
            Region::default()
        };
        if !(4096..=65536).contains(&line_size) || !line_size.is_power_of_two() {
            return Err(bad(format!("line size {line_size}")));
        }
        let layout = Layout {
            journal: regions[0],
            checkpoint: [regions[1], regions[2]],
            data: regions[3],
            log,
        };
        layout.validate(device_bytes).map_err(bad)?;
        if layout.data.bytes < lines as u64 * line_size as u64 {
            return Err(bad(format!("data region too small for {lines} lines")));
        }
        Ok(Superblock {
            version,
            generation,
            cache_id,
            device_bytes,
            line_size,
            lines,
            state,
            checkpoint,
            has_checkpoint,
            journal_seq,
            layout,
        })
    }

    /// Picks the superblock to trust from the two copies' decodings: the valid one with the
    /// higher generation. Both invalid: the error of copy A (the caller reports both).
    pub fn newest(
        a: Result<Superblock, DecodeError>,
        b: Result<Superblock, DecodeError>,
    ) -> Result<(Superblock, usize), (DecodeError, DecodeError)> {
        match (a, b) {
            (Ok(x), Ok(y)) => Ok(if y.generation > x.generation {
                (y, 1)
            } else {
                (x, 0)
            }),
            (Ok(x), Err(_)) => Ok((x, 0)),
            (Err(_), Ok(y)) => Ok((y, 1)),
            (Err(e), Err(f)) => Err((e, f)),
        }
    }

    /// The copy (0 or 1) the next write should overwrite: the older one.
    pub fn next_copy(current: usize) -> usize {
        1 - current
    }
}
