//! The record frame: every journal entry, checkpoint chunk and table tiercache writes is one.
//!
//! ```text
//! offset size field
//!      0    4 magic    b"tcRC"
//!      4    2 kind     what the payload is (RecordKind)
//!      6    2 version  oldest format version that reads the payload (1, or 2 for a journal
//!                      entry with an intent op and a checkpoint chunk with proven flags)
//!      8    4 length   payload bytes (at most RECORD_PAYLOAD_MAX)
//!     12    4 crc      CRC32C of bytes 0..12 followed by the payload
//!     16    …  payload
//! ```
//!
//! A torn write (a prefix of the record on disk) fails the checksum; a record from another
//! place (stale sector) fails the magic or checksum; a newer tiercache's record says so by
//! version.

use crate::codec::Reader;
use crate::crc::{crc32c, crc32c_update};
use crate::{DecodeError, FORMAT_VERSION};

/// Record magic.
pub const RECORD_MAGIC: [u8; 4] = *b"tcRC";
/// Header bytes.
pub const RECORD_HEADER: usize = 16;
/// Largest payload a record may carry (64 MiB): a bound for decoders, far above any real one.
pub const RECORD_PAYLOAD_MAX: u32 = 64 << 20;

/// What a record's payload is. Kinds are never reused; an unknown kind is reported, not
/// guessed at.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum RecordKind {
    /// The cache configuration (mode, policies, parameters).
    Config = 1,
    /// The core table: ids, identities, sizes, per-core settings.
    CoreTable = 2,
    /// A journal entry: line state changes since the last checkpoint.
    Journal = 3,
    /// A checkpoint chunk: the full state of a range of lines.
    Checkpoint = 4,
    /// A `wl` log entry header.
    LogEntry = 5,
    /// The `wl` log superblock.
    LogSuper = 6,
}

impl RecordKind {
    /// The kind with code `v`.
    pub fn from_u16(v: u16) -> Option<RecordKind> {
        Some(match v {
            1 => RecordKind::Config,
            2 => RecordKind::CoreTable,
            3 => RecordKind::Journal,
            4 => RecordKind::Checkpoint,
            5 => RecordKind::LogEntry,
            6 => RecordKind::LogSuper,
            _ => return None,
        })
    }
}

/// A decoded record.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Its kind.
    pub kind: RecordKind,
    /// The format version that wrote it.
    pub version: u16,
    /// The payload.
    pub payload: &'a [u8],
}

/// Encodes a record of `kind` with `payload`, framed as format version 1 (every structure
/// version 2 left unchanged).
///
/// # Panics
/// If the payload is larger than [`RECORD_PAYLOAD_MAX`] (a bug in the caller, not input).
pub fn encode(kind: RecordKind, payload: &[u8]) -> Vec<u8> {
    encode_versioned(kind, 1, payload)
}

/// Encodes a record of `kind` with `payload`, framed as format `version` (the oldest version
/// whose readers understand the payload: 2 for a journal entry with an intent op or a
/// checkpoint chunk with proven flags, 1 for everything else).
///
/// # Panics
/// If the payload is larger than [`RECORD_PAYLOAD_MAX`], or `version` is 0 or newer than
/// [`FORMAT_VERSION`] (bugs in the caller, not input).
pub fn encode_versioned(kind: RecordKind, version: u16, payload: &[u8]) -> Vec<u8> {
    encode_with(kind, version, payload.len(), 1, |p| {
        p.copy_from_slice(payload)
    })
}

/// [`encode_versioned`] with a payload of `len` bytes that `fill` writes in place (it gets
/// them zeroed), the whole record zero-padded to a multiple of `align` bytes: one buffer, no
/// copy of the payload. Same bytes as `encode_versioned` and padding.
///
/// # Panics
/// As [`encode_versioned`], and if `align` is 0.
pub fn encode_with(
    kind: RecordKind,
    version: u16,
    len: usize,
    align: usize,
    fill: impl FnOnce(&mut [u8]),
) -> Vec<u8> {
    assert!(
        (1..=FORMAT_VERSION).contains(&version),
        "record version {version}"
    );
    let len32 = u32::try_from(len)
        .ok()
        .filter(|&l| l <= RECORD_PAYLOAD_MAX)
        .expect("record payload over RECORD_PAYLOAD_MAX");
    let mut out = vec![0u8; (RECORD_HEADER + len).next_multiple_of(align)];
    fill(&mut out[RECORD_HEADER..RECORD_HEADER + len]);
    out[0..4].copy_from_slice(&RECORD_MAGIC);
    out[4..6].copy_from_slice(&(kind as u16).to_le_bytes());
    out[6..8].copy_from_slice(&version.to_le_bytes());
    out[8..12].copy_from_slice(&len32.to_le_bytes());
    let crc = crc32c_update(crc32c(&out[..12]), &out[RECORD_HEADER..RECORD_HEADER + len]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes the record at the start of `buf`; returns it and the bytes it occupies.
pub fn decode(buf: &[u8]) -> Result<(Record<'_>, usize), DecodeError> {
    const WHAT: &str = "record";
    let mut r = Reader::new(buf, WHAT);
    let head = r.take(12)?;
    if head[0..4] != RECORD_MAGIC {
        return Err(DecodeError::BadMagic { what: WHAT });
    }
    let mut h = Reader::new(&head[4..], WHAT);
    let kind = h.u16()?;
    let version = h.u16()?;
    let len = h.u32()?;
    let crc = r.u32()?;
    if version > FORMAT_VERSION {
        return Err(DecodeError::TooNew {
            what: WHAT,
            version,
        });
    }
    if len > RECORD_PAYLOAD_MAX {
        return Err(DecodeError::BadField {
            what: WHAT,
            detail: format!("payload length {len} over the maximum"),
        });
    }
    let payload = r.take(len as usize)?;
    if crc32c_update(crc32c(head), payload) != crc {
        return Err(DecodeError::BadChecksum { what: WHAT });
    }
    let kind = RecordKind::from_u16(kind).ok_or_else(|| DecodeError::BadField {
        what: WHAT,
        detail: format!("unknown record kind {kind}"),
    })?;
    Ok((
        Record {
            kind,
            version,
            payload,
        },
        r.pos(),
    ))
}
