//! tiercache's on-disk format, in one place: every byte the cache writes about itself (as
//! opposed to cached data) is encoded and decoded here. See `docs/FORMAT.md`.
//!
//! Rules every structure follows:
//! - **Framed**: a magic, a format version, a length and a CRC32C checksum, so a reader can tell
//!   "not ours", "newer than me", "torn" and "damaged" apart.
//! - **Little endian, fixed width**, no padding left to the compiler: encoders write field by
//!   field, so the bytes are the documentation (golden-bytes tests pin them).
//! - **Decoders never panic**: any input, of any length, gives a value or a [`DecodeError`]
//!   (tested by a seeded, structure-aware mutation loop).
//! - **Versioned**: a decoder accepts every version up to [`FORMAT_VERSION`] and refuses newer
//!   ones by name; the policy is in `docs/FORMAT.md` ("every newer tiercache loads every older
//!   format").
//!
//! | module | what |
//! |---|---|
//! | [`checkpoint`] | checkpoint chunks: one fixed-size record per cache line |
//! | [`crc`] | CRC32C (Castagnoli) |
//! | [`codec`] | bounds-checked little-endian reader and writer |
//! | [`journal`] | journal entries: line-state changes, grouped |
//! | [`record`] | the record frame: header + payload, checksummed |
//! | [`superblock`] | the superblock and the device layout it describes; two copies |
//! | [`tables`] | the configuration and the core table (with each core's identity) |
//! | [`wlog`] | the `wl` write log: entry headers and the log superblock |

pub mod checkpoint;
pub mod codec;
pub mod crc;
pub mod journal;
pub mod record;
pub mod superblock;
pub mod tables;
pub mod wlog;

/// The newest format version this build writes (and the newest it reads).
pub const FORMAT_VERSION: u16 = 2;

/// Why bytes could not be decoded. Every variant is a value, never a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the structure needs.
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes there.
        have: usize,
    },
    /// The magic is not ours: not a tiercache structure (or damaged beyond recognition).
    BadMagic {
        /// What was being read.
        what: &'static str,
    },
    /// Written by a newer tiercache.
    TooNew {
        /// What was being read.
        what: &'static str,
        /// Its version.
        version: u16,
    },
    /// The checksum does not match: damaged or torn.
    BadChecksum {
        /// What was being read.
        what: &'static str,
    },
    /// A field holds a value no encoder writes.
    BadField {
        /// What was being read.
        what: &'static str,
        /// Which field and why.
        detail: String,
    },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated { what, need, have } => {
                write!(f, "{what}: truncated ({have} bytes, need {need})")
            }
            DecodeError::BadMagic { what } => {
                write!(f, "{what}: not a tiercache structure (bad magic)")
            }
            DecodeError::TooNew { what, version } => write!(
                f,
                "{what}: format version {version} is newer than this tiercache (reads up to {FORMAT_VERSION}); upgrade tiercache"
            ),
            DecodeError::BadChecksum { what } => {
                write!(f, "{what}: checksum mismatch (damaged or torn)")
            }
            DecodeError::BadField { what, detail } => write!(f, "{what}: {detail}"),
        }
    }
}

impl std::error::Error for DecodeError {}
