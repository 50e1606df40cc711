//! The configuration and core-table records (kinds 1 and 2): what a cache is set to, and
//! which cores it serves — with each core's **identity**, so `--load` can refuse a core device
//! that is not the one the dirty data belongs to.
//!
//! Strings are a `u16` byte length and UTF-8 bytes. Enums are `u8` codes; an unknown code is
//! refused (a newer tiercache writes a newer format version).

use crate::DecodeError;
use crate::codec::{Reader, Writer};

/// Longest string field, bytes.
pub const STRING_MAX: usize = 4096;

fn put_str(w: &mut Writer, s: &str) {
    assert!(s.len() <= STRING_MAX, "string field over STRING_MAX");
    w.u16(s.len() as u16).bytes(s.as_bytes());
}

fn get_str(r: &mut Reader<'_>, what: &'static str) -> Result<String, DecodeError> {
    let n = r.u16()? as usize;
    if n > STRING_MAX {
        return Err(DecodeError::BadField {
            what,
            detail: format!("string of {n} bytes"),
        });
    }
    let b = r.take(n)?;
    String::from_utf8(b.to_vec()).map_err(|_| DecodeError::BadField {
        what,
        detail: "string is not UTF-8".into(),
    })
}

/// How a core device is recognised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreIdentity {
    /// A block device: its serial or WWN, as the kernel reports it.
    Block {
        /// Serial number or WWN.
        serial: String,
    },
    /// A regular file: its file system's UUID and its inode number.
    File {
        /// File system UUID.
        fs_uuid: [u8; 16],
        /// Inode.
        inode: u64,
    },
    /// A Ceph RBD image.
    Rbd {
        /// Pool id.
        pool_id: u64,
        /// Image id (not its name: names can be reused).
        image_id: String,
    },
    /// An NBD export of another server.
    Nbd {
        /// The URI.
        uri: String,
    },
}

impl CoreIdentity {
    /// Whether `other` (a device found now) is the device this record names. A file's
    /// `fs_uuid` holds the file system's `st_dev` (bytes 0–7) and `statfs`'s `f_fsid` (8–15);
    /// `st_dev` is a device number the kernel hands out at boot in discovery order, so a disk
    /// found in another order after a reboot has another one. Where both records have a
    /// file system id (ext4, XFS and btrfs derive it from the file system's UUID) the file is
    /// matched by that id and its inode; where either has none (zero), by all 16 bytes.
    pub fn same_device(&self, other: &CoreIdentity) -> bool {
        match (self, other) {
            (
                CoreIdentity::File {
                    fs_uuid: a,
                    inode: i,
                },
                CoreIdentity::File {
                    fs_uuid: b,
                    inode: j,
                },
            ) => {
                let fsid = |u: &[u8; 16]| u64::from_le_bytes(u[8..].try_into().expect("8 bytes"));
                i == j
                    && if fsid(a) != 0 && fsid(b) != 0 {
                        fsid(a) == fsid(b)
                    } else {
                        a == b
                    }
            }
            _ => self == other,
        }
    }
}

/// As shown to people: `file inode 12 on file system 0011…ff`, `block device serial X`,
/// `RBD image id X in pool 3`, `NBD export URI`.
impl std::fmt::Display for CoreIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CoreIdentity::Block { serial } => write!(f, "block device serial {serial}"),
            CoreIdentity::File { fs_uuid, inode } => {
                write!(f, "file inode {inode} on file system ")?;
                for (i, b) in fs_uuid.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
            CoreIdentity::Rbd { pool_id, image_id } => {
                write!(f, "RBD image id {image_id} in pool {pool_id}")
            }
            CoreIdentity::Nbd { uri } => write!(f, "NBD export {uri}"),
        }
    }
}

/// One core of the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreEntry {
    /// Core id within the cache (0–254).
    pub id: u8,
    /// Size in 512-byte blocks when added; a core of another size is not this core.
    pub size_blocks: u64,
    /// Identity.
    pub identity: CoreIdentity,
    /// The name it is exported under.
    pub export_name: String,
    /// Sequential cutoff: policy code (1 always, 2 full, 3 never), threshold bytes, promotion
    /// count.
    pub cutoff: (u8, u64, u32),
    /// The device string the core was attached with (a path, `emu:…`, `nbd:…`), so `--load`
    /// can attach it again (after checking its identity); empty when unknown.
    pub device: String,
}

/// Marks the optional device-string section after the last core (absent when every device
/// string is empty, so tables written before it existed decode unchanged).
const DEVICES_MARKER: u8 = 0x50;

/// Encodes the core table payload.
pub fn encode_cores(cores: &[CoreEntry]) -> Vec<u8> {
    let mut w = Writer::new();
    w.u16(u16::try_from(cores.len()).expect("at most 255 cores"));
    for c in cores {
        assert!(
            c.id != u8::MAX && (1..=3).contains(&c.cutoff.0),
            "bad core entry"
        );
        w.u8(c.id).u64(c.size_blocks);
        match &c.identity {
            CoreIdentity::Block { serial } => {
                w.u8(1);
                put_str(&mut w, serial);
            }
            CoreIdentity::File { fs_uuid, inode } => {
                w.u8(2).bytes(fs_uuid).u64(*inode);
            }
            CoreIdentity::Rbd { pool_id, image_id } => {
                w.u8(3).u64(*pool_id);
                put_str(&mut w, image_id);
            }
            CoreIdentity::Nbd { uri } => {
                w.u8(4);
                put_str(&mut w, uri);
            }
        }
        put_str(&mut w, &c.export_name);
        w.u8(c.cutoff.0).u64(c.cutoff.1).u32(c.cutoff.2);
    }
    if cores.iter().any(|c| !c.device.is_empty()) {
        w.u8(DEVICES_MARKER);
        for c in cores {
            put_str(&mut w, &c.device);
        }
    }
    w.buf
}

/// Decodes the core table payload. Ids must be unique.
pub fn decode_cores(payload: &[u8]) -> Result<Vec<CoreEntry>, DecodeError> {
    const WHAT: &str = "core table";
    let bad = |detail: String| DecodeError::BadField { what: WHAT, detail };
    let mut r = Reader::new(payload, WHAT);
    let n = r.u16()?;
    if n > 255 {
        return Err(bad(format!("{n} cores")));
    }
    let mut out: Vec<CoreEntry> = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let id = r.u8()?;
        if id == u8::MAX || out.iter().any(|c| c.id == id) {
            return Err(bad(format!("core id {id} reserved or repeated")));
        }
        let size_blocks = r.u64()?;
        let identity = match r.u8()? {
            1 => CoreIdentity::Block {
                serial: get_str(&mut r, WHAT)?,
            },
            2 => CoreIdentity::File {
                fs_uuid: r.bytes::<16>()?,
                inode: r.u64()?,
            },
            3 => CoreIdentity::Rbd {
                pool_id: r.u64()?,
                image_id: get_str(&mut r, WHAT)?,
            },
            4 => CoreIdentity::Nbd {
                uri: get_str(&mut r, WHAT)?,
            },
            k => return Err(bad(format!("core {id}: identity kind {k}"))),
        };
        let export_name = get_str(&mut r, WHAT)?;
        let cutoff = (r.u8()?, r.u64()?, r.u32()?);
        if !(1..=3).contains(&cutoff.0) {
            return Err(bad(format!("core {id}: cutoff policy {}", cutoff.0)));
        }
        out.push(CoreEntry {
            id,
            size_blocks,
            identity,
            export_name,
            cutoff,
            device: String::new(),
        });
    }
    if r.pos() < payload.len() {
        let m = r.u8()?;
        if m != DEVICES_MARKER {
            return Err(bad(format!("unknown section {m:#x} after the last core")));
        }
        for c in out.iter_mut() {
            c.device = get_str(&mut r, WHAT)?;
        }
    }
    if r.pos() != payload.len() {
        return Err(bad("bytes after the last core".into()));
    }
    Ok(out)
}

/// The cache configuration, as codes and numbers (the core crate maps them to its types).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigRecord {
    /// Mode code: 1 wt, 2 wb, 3 wa, 4 wi, 5 pt, 6 wo.
    pub mode: u8,
    /// Eviction code: 1 lru, 2 s3fifo.
    pub eviction: u8,
    /// Promotion code (1 always, 2 nhit), nhit threshold, nhit trigger percent.
    pub promotion: (u8, u32, u8),
    /// Cleaning code (1 alru, 2 acp, 3 nop).
    pub cleaning: u8,
    /// ALRU: wake-up s, staleness s, flush max buffers, activity threshold ms.
    pub alru: [u32; 4],
    /// ACP: wake-up ms, flush max buffers.
    pub acp: [u32; 2],
    /// Rate controller: enabled, target percent, throttle max ms.
    pub rate: (bool, u8, u32),
    /// The IO class table, as Open CAS CSV text.
    pub io_classes_csv: String,
}

/// Encodes the configuration payload.
pub fn encode_config(c: &ConfigRecord) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(c.mode)
        .u8(c.eviction)
        .u8(c.promotion.0)
        .u32(c.promotion.1)
        .u8(c.promotion.2);
    w.u8(c.cleaning);
    for v in c.alru.iter().chain(&c.acp) {
        w.u32(*v);
    }
    w.u8(c.rate.0 as u8).u8(c.rate.1).u32(c.rate.2);
    put_str(&mut w, &c.io_classes_csv);
    w.buf
}

/// Decodes the configuration payload (codes are checked for range; values are checked by the
/// cache when it applies them, as for any configuration change).
pub fn decode_config(payload: &[u8]) -> Result<ConfigRecord, DecodeError> {
    const WHAT: &str = "configuration";
    let bad = |detail: String| DecodeError::BadField { what: WHAT, detail };
    let mut r = Reader::new(payload, WHAT);
    let mode = r.u8()?;
    let eviction = r.u8()?;
    let promotion = (r.u8()?, r.u32()?, r.u8()?);
    let cleaning = r.u8()?;
    let mut alru = [0u32; 4];
    for v in &mut alru {
        *v = r.u32()?;
    }
    let acp = [r.u32()?, r.u32()?];
    let enabled = match r.u8()? {
        0 => false,
        1 => true,
        x => return Err(bad(format!("rate enabled flag {x}"))),
    };
    let rate = (enabled, r.u8()?, r.u32()?);
    let io_classes_csv = get_str(&mut r, WHAT)?;
    if !(1..=6).contains(&mode)
        || !(1..=2).contains(&eviction)
        || !(1..=2).contains(&promotion.0)
        || !(1..=3).contains(&cleaning)
    {
        return Err(bad(format!(
            "policy codes {mode}/{eviction}/{}/{cleaning}",
            promotion.0
        )));
    }
    if r.pos() != payload.len() {
        return Err(bad("bytes after the configuration".into()));
    }
    Ok(ConfigRecord {
        mode,
        eviction,
        promotion,
        cleaning,
        alru,
        acp,
        rate,
        io_classes_csv,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_matched_by_its_file_system_id_not_its_device_number() {
        let f = |dev: u64, fsid: u64, inode: u64| {
            let mut fs_uuid = [0u8; 16];
            fs_uuid[..8].copy_from_slice(&dev.to_le_bytes());
            fs_uuid[8..].copy_from_slice(&fsid.to_le_bytes());
            CoreIdentity::File { fs_uuid, inode }
        };
        // The disk came back as another device number (renumbered at boot): the same file.
        assert!(f(0x810, 0xabcd, 12).same_device(&f(0x820, 0xabcd, 12)));
        assert!(!f(0x810, 0xabcd, 12).same_device(&f(0x810, 0xabcd, 13)));
        assert!(!f(0x810, 0xabcd, 12).same_device(&f(0x810, 0xabce, 12)));
        // No file system id: the device number decides too.
        assert!(f(0x810, 0, 12).same_device(&f(0x810, 0, 12)));
        assert!(!f(0x810, 0, 12).same_device(&f(0x820, 0, 12)));
        let b = |s: &str| CoreIdentity::Block { serial: s.into() };
        assert!(b("WD-1").same_device(&b("WD-1")));
        assert!(!b("WD-1").same_device(&b("WD-2")));
        assert!(!b("WD-1").same_device(&f(1, 2, 3)));
    }
}
