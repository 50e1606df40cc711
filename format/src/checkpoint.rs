//! Checkpoint chunks: the full persistent state of a range of cache lines, one fixed-size record
//! per line, carried in a [`crate::record`] frame of kind `Checkpoint`.
//!
//! Chunk payload:
//!
//! ```text
//! offset size field
//!      0    4 first line
//!      4    4 line count
//!      8    4 line size (bytes)
//!     12    8 checkpoint sequence: the journal sequence number replay starts from with this
//!             checkpoint (the superblock naming it says the same; a chunk left over from an
//!             older or newer checkpoint in the same region does not match)
//!     20    …  count × line record
//! ```
//!
//! Line record ([`crate::superblock::checkpoint_bytes_per_line`] bytes):
//!
//! ```text
//!      0    8 core line
//!      8    1 core id (255: line unmapped)
//!      9    1 IO class
//!     10    n valid bits, one per 512-byte block (n = blocks per line / 8)
//!   10+n    n dirty bits
//!  10+2n    1 flags (format version 2; zero in version 1): bit 0 `proven` — the line's clean
//!             blocks were equal to the core when captured and every change since is covered by
//!             a later journal intent op, so they survive a crash; other bits zero
//!  11+2n    …  zero to the record size
//! ```
//!
//! A chunk with a nonzero flags byte is framed as format version 2
//! ([`chunk_version`]); [`decode_chunk_proven`] takes the frame's version and refuses flags in
//! a version-1 chunk.
//!
//! The decoder checks what an encoder guarantees: an unmapped line has no state, dirty blocks
//! are valid, no bit beyond the line's blocks, a class below 34.

use crate::DecodeError;
use crate::codec::Reader;
use crate::superblock::checkpoint_bytes_per_line;

/// Core id of an unmapped line.
pub const UNMAPPED: u8 = u8::MAX;
/// IO classes (ids below this).
pub const CLASSES: u8 = 34;

/// One line's persistent state.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct LineRecord {
    /// Core id, or `None` if the line is unmapped.
    pub core: Option<u8>,
    /// Core line number.
    pub core_line: u64,
    /// IO class.
    pub class: u8,
    /// Valid blocks.
    pub valid: u128,
    /// Dirty blocks (a subset of `valid`).
    pub dirty: u128,
}

fn mask_bytes(line_size: u32) -> usize {
    (line_size as usize / 512).div_ceil(8)
}

fn check_line_size(line_size: u32) -> Result<(), DecodeError> {
    if (4096..=65536).contains(&line_size) && line_size.is_power_of_two() {
        Ok(())
    } else {
        Err(DecodeError::BadField {
            what: "checkpoint",
            detail: format!("line size {line_size}"),
        })
    }
}

/// Bytes of the chunk header before the line records.
pub const CHUNK_HEADER: usize = 20;

/// Encodes a chunk payload for lines `first..first + lines.len()` of the checkpoint whose
/// journal replay starts at `seq`.
///
/// # Panics
/// On a record an encoder must never produce (dirty not valid, bits beyond the line, an
/// unmapped line with state) or a bad line size: those are bugs in the caller.
pub fn encode_chunk(first: u32, seq: u64, lines: &[LineRecord], line_size: u32) -> Vec<u8> {
    encode_chunk_proven(first, seq, lines, &[], line_size)
}

/// The format version a chunk with these proven flags is framed with.
pub fn chunk_version(proven: &[bool]) -> u16 {
    if proven.iter().any(|&p| p) { 2 } else { 1 }
}

/// [`encode_chunk`] with a proven flag per line (`proven[i]` for `lines[i]`; missing: false).
///
/// # Panics
/// As [`encode_chunk`], and on a proven flag for an unmapped line.
pub fn encode_chunk_proven(
    first: u32,
    seq: u64,
    lines: &[LineRecord],
    proven: &[bool],
    line_size: u32,
) -> Vec<u8> {
    assert!(proven.len() <= lines.len(), "more flags than lines");
    let count = u32::try_from(lines.len()).expect("chunk too long");
    encode_chunk_with(first, seq, count, line_size, |i| {
        (
            lines[i as usize],
            proven.get(i as usize).copied().unwrap_or(false),
        )
    })
}

/// [`encode_chunk_proven`] for `count` lines whose records (and proven flags) `line(i)` makes
/// one at a time, `i` from 0: no vector of records in between (a checkpoint encodes every
/// line of the cache, 16M at 16M lines). Same bytes.
///
/// # Panics
/// As [`encode_chunk_proven`].
pub fn encode_chunk_with(
    first: u32,
    seq: u64,
    count: u32,
    line_size: u32,
    line: impl FnMut(u32) -> (LineRecord, bool),
) -> Vec<u8> {
    let mut out = vec![0u8; chunk_payload_bytes(count, line_size)];
    encode_chunk_into(&mut out, first, seq, count, line_size, line);
    out
}

/// Payload bytes of a chunk of `count` lines of `line_size` bytes.
///
/// # Panics
/// On a bad line size (a bug in the caller).
pub fn chunk_payload_bytes(count: u32, line_size: u32) -> usize {
    check_line_size(line_size).expect("valid line size");
    CHUNK_HEADER + count as usize * checkpoint_bytes_per_line(line_size) as usize
}

/// A whole checkpoint record (frame and chunk payload, zero-padded to a multiple of `align`
/// bytes) for `count` lines made by `line(i)`, framed as format `version` (see
/// [`chunk_version`]: 2 if any proven flag is set). The payload is encoded in place in the
/// record's one buffer. Same bytes as framing [`encode_chunk_with`]'s payload.
///
/// # Panics
/// As [`encode_chunk_proven`], and on a proven flag in a version-1 record.
pub fn encode_chunk_record(
    first: u32,
    seq: u64,
    count: u32,
    line_size: u32,
    version: u16,
    align: usize,
    line: impl FnMut(u32) -> (LineRecord, bool),
) -> Vec<u8> {
    let len = chunk_payload_bytes(count, line_size);
    crate::record::encode_with(
        crate::record::RecordKind::Checkpoint,
        version,
        len,
        align,
        |p| {
            let any = encode_chunk_into(p, first, seq, count, line_size, line);
            assert!(version >= 2 || !any, "proven flag in a version-1 chunk");
        },
    )
}

/// Encodes the chunk into `out` (exactly [`chunk_payload_bytes`] long, zeroed). Returns whether
/// any proven flag was set.
fn encode_chunk_into(
    out: &mut [u8],
    first: u32,
    seq: u64,
    count: u32,
    line_size: u32,
    line: impl FnMut(u32) -> (LineRecord, bool),
) -> bool {
    assert_eq!(out.len(), chunk_payload_bytes(count, line_size));
    out[0..4].copy_from_slice(&first.to_le_bytes());
    out[4..8].copy_from_slice(&count.to_le_bytes());
    out[8..12].copy_from_slice(&line_size.to_le_bytes());
    out[12..20].copy_from_slice(&seq.to_le_bytes());
    let recs = &mut out[CHUNK_HEADER..];
    // One loop per mask width, so each mask is a fixed-size store (a copy of a run-time length
    // is a `memcpy` call per record).
    match mask_bytes(line_size) {
        1 => records::<1, 16>(recs, count, line),
        2 => records::<2, 16>(recs, count, line),
        4 => records::<4, 24>(recs, count, line),
        8 => records::<8, 32>(recs, count, line),
        16 => records::<16, 48>(recs, count, line),
        n => unreachable!("mask of {n} bytes"),
    }
}

/// Writes `count` line records of masks of `N` bytes, `PER` bytes apart, into `recs` (zeroed).
fn records<const N: usize, const PER: usize>(
    recs: &mut [u8],
    count: u32,
    mut line: impl FnMut(u32) -> (LineRecord, bool),
) -> bool {
    debug_assert_eq!(PER, (10 + 2 * N + 1).div_ceil(8) * 8);
    let blocks_mask = u128::MAX >> (128 - 8 * N);
    let mut any = false;
    for (i, rec) in (0..count).zip(recs.chunks_exact_mut(PER)) {
        let rec: &mut [u8; PER] = rec.try_into().expect("PER bytes");
        let (l, flag) = line(i);
        assert!(!flag || l.core.is_some(), "proven flag on an unmapped line");
        assert_eq!(l.dirty & !l.valid, 0, "dirty blocks must be valid");
        assert_eq!(l.valid & !blocks_mask, 0, "bits beyond the line");
        assert!(l.class < CLASSES, "class {}", l.class);
        match l.core {
            Some(c) => {
                assert_ne!(c, UNMAPPED, "core id 255 is reserved");
                rec[..8].copy_from_slice(&l.core_line.to_le_bytes());
                rec[8] = c;
                rec[9] = l.class;
            }
            None => {
                assert!(
                    l.valid == 0 && l.core_line == 0 && l.class == 0,
                    "unmapped line with state"
                );
                rec[8] = UNMAPPED;
            }
        }
        let v: [u8; 16] = l.valid.to_le_bytes();
        let d: [u8; 16] = l.dirty.to_le_bytes();
        rec[10..10 + N].copy_from_slice(&v[..N]);
        rec[10 + N..10 + 2 * N].copy_from_slice(&d[..N]);
        rec[10 + 2 * N] = flag as u8;
        any |= flag;
    }
    any
}

/// Decodes the line records of masks of `N` bytes, `PER` bytes apart (`recs` is a whole number
/// of records), of a chunk whose first line is `first`, framed as format `version`.
fn decode_records<const N: usize, const PER: usize>(
    recs: &[u8],
    first: u32,
    version: u16,
) -> Result<(Vec<LineRecord>, Vec<bool>), String> {
    debug_assert_eq!(PER, (10 + 2 * N + 1).div_ceil(8) * 8);
    let blocks_mask = u128::MAX >> (128 - 8 * N);
    let count = recs.len() / PER;
    let mut out = Vec::with_capacity(count);
    let mut flags = Vec::with_capacity(count);
    for (i, rec) in recs.chunks_exact(PER).enumerate() {
        let rec: &[u8; PER] = rec.try_into().expect("PER bytes");
        let line = first + i as u32;
        let core_line = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
        let (core, class) = (rec[8], rec[9]);
        let mut m = [0u8; 16];
        m[..N].copy_from_slice(&rec[10..10 + N]);
        let valid = u128::from_le_bytes(m);
        m[..N].copy_from_slice(&rec[10 + N..10 + 2 * N]);
        let dirty = u128::from_le_bytes(m);
        let flag = rec[10 + 2 * N];
        if rec[11 + 2 * N..].iter().any(|&b| b != 0) {
            return Err(format!("line {line}: padding not zero"));
        }
        if flag > 1 || (flag != 0 && version < 2) {
            return Err(format!(
                "line {line}: flags {flag:#x} in a version {version} chunk"
            ));
        }
        if dirty & !valid != 0 || valid & !blocks_mask != 0 {
            return Err(format!(
                "line {line}: dirty blocks not valid, or bits beyond the line"
            ));
        }
        if class >= CLASSES {
            return Err(format!("line {line}: IO class {class}"));
        }
        let core = if core == UNMAPPED {
            if core_line != 0 || class != 0 || valid != 0 || flag != 0 {
                return Err(format!("line {line}: unmapped but has state"));
            }
            None
        } else {
            Some(core)
        };
        out.push(LineRecord {
            core,
            core_line,
            class,
            valid,
            dirty,
        });
        flags.push(flag == 1);
    }
    Ok((out, flags))
}

/// Decodes a chunk payload: the first line, the checkpoint sequence and the records (a
/// version-1 chunk: no proven flags).
pub fn decode_chunk(payload: &[u8]) -> Result<(u32, u64, Vec<LineRecord>), DecodeError> {
    decode_chunk_proven(payload, 1).map(|(f, s, r, _)| (f, s, r))
}

/// A decoded chunk: first line, checkpoint sequence, records, proven flags.
pub type ChunkProven = (u32, u64, Vec<LineRecord>, Vec<bool>);

/// Decodes a chunk payload framed as format `version`: the first line, the checkpoint
/// sequence, the records and each line's proven flag (all false in a version-1 chunk, where a
/// flag is refused as damage).
pub fn decode_chunk_proven(payload: &[u8], version: u16) -> Result<ChunkProven, DecodeError> {
    const WHAT: &str = "checkpoint";
    let bad = |detail: String| DecodeError::BadField { what: WHAT, detail };
    let mut r = Reader::new(payload, WHAT);
    let first = r.u32()?;
    let count = r.u32()?;
    let line_size = r.u32()?;
    check_line_size(line_size)?;
    let seq = r.u64()?;
    let n = mask_bytes(line_size);
    let per = checkpoint_bytes_per_line(line_size) as usize;
    let need = (count as usize)
        .checked_mul(per)
        .ok_or_else(|| bad(format!("{count} lines")))?;
    if payload.len() - r.pos() != need {
        return Err(bad(format!(
            "{} bytes of records for {count} lines of {per}",
            payload.len() - r.pos()
        )));
    }
    if first.checked_add(count).is_none() {
        return Err(bad(format!("lines {first}+{count} overflow")));
    }
    // The length was checked above: fixed offsets into each record, no reader per field, and
    // one loop per mask width so each mask is a fixed-size load (a load decodes 16M of these
    // at 16M lines).
    let recs = &payload[payload.len() - need..];
    let (out, flags) = match n {
        1 => decode_records::<1, 16>(recs, first, version),
        2 => decode_records::<2, 16>(recs, first, version),
        4 => decode_records::<4, 24>(recs, first, version),
        8 => decode_records::<8, 32>(recs, first, version),
        16 => decode_records::<16, 48>(recs, first, version),
        n => unreachable!("mask of {n} bytes"),
    }
    .map_err(bad)?;
    Ok((first, seq, out, flags))
}
