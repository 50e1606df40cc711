//! VMware vscsi traces (the CloudPhysics format libCacheSim reads), binary, little-endian, two
//! record layouts told apart by a version byte:
//!
//! - v1, 32 bytes: `sn u32, len u32, nSG u32, cmd u16, ver u16, lbn u64, ts u64`
//! - v2, 40 bytes: `cmd u16, ver u16, sn u32, len u32, nSG u32, lbn u64, ts u64, rt u64`
//!
//! `ver >> 8` is the version; `len` is bytes, `lbn` 512-byte sectors, `ts` µs. `cmd` is the
//! SCSI opcode: READ(6/10/12/16) `0x08 0x28 0xa8 0x88`, WRITE `0x0a 0x2a 0xaa 0x8a`, UNMAP
//! `0x42` (a trim; its range is in the data, so the record's lbn/len are used as given),
//! SYNCHRONIZE CACHE `0x35 0x91` (flushes). Other commands are ignored. One device per file.

use super::{Line, Op, Raw};

/// Record layout.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Version {
    /// 32-byte records.
    V1,
    /// 40-byte records.
    V2,
}

impl Version {
    /// Bytes per record.
    pub fn record_size(self) -> usize {
        match self {
            Version::V1 => 32,
            Version::V2 => 40,
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The version, from the first record's header (as libCacheSim tests it), when the file
/// holds whole records of that size.
pub fn version(bytes: &[u8]) -> Option<Version> {
    [Version::V2, Version::V1].into_iter().find(|&v| {
        let size = v.record_size();
        let at = if v == Version::V1 { 14 } else { 2 };
        bytes.len() >= size
            && bytes.len().is_multiple_of(size)
            && u16_at(bytes, at) >> 8 == v as u16 + 1
    })
}

/// Parses one record of `v`'s size.
pub fn parse(v: Version, r: &[u8]) -> Result<Line<'static>, String> {
    let (cmd, ver, len, lbn, ts) = match v {
        Version::V1 => (
            u16_at(r, 12),
            u16_at(r, 14),
            u32_at(r, 4),
            u64_at(r, 16),
            u64_at(r, 24),
        ),
        Version::V2 => (
            u16_at(r, 0),
            u16_at(r, 2),
            u32_at(r, 8),
            u64_at(r, 16),
            u64_at(r, 24),
        ),
    };
    if ver >> 8 != v as u16 + 1 {
        return Err(format!(
            "version byte {} where {} was expected",
            ver >> 8,
            v as u16 + 1
        ));
    }
    let op = match cmd {
        0x08 | 0x28 | 0xa8 | 0x88 => Op::Read,
        0x0a | 0x2a | 0xaa | 0x8a => Op::Write,
        0x42 => Op::Trim,
        0x35 | 0x91 => Op::Flush,
        _ => return Ok(Line::Ignore),
    };
    Ok(Line::Req(Raw {
        time_us: ts,
        dev: "".into(),
        op,
        offset: lbn.checked_mul(512).ok_or("lbn overflows")?,
        len: len as u64,
        stage: 0,
    }))
}
