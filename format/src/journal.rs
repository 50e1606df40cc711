//! Journal entries: line-state changes since the last checkpoint, many per entry (group
//! commit), carried in a [`crate::record`] frame of kind `Journal`. Replaying entries in
//! sequence order over the current checkpoint gives the state at the last entry written.
//!
//! Entry payload:
//!
//! ```text
//! offset size field
//!      0    8 sequence number (consecutive; the superblock names the oldest still needed)
//!      8    4 line size (bytes; sizes the masks below)
//!     12    4 op count
//!     16    …  ops, each a tag byte then its fields:
//!             1 map    line u32, core u8, core line u64, class u8
//!             2 unmap  line u32
//!             3 state  line u32, valid n bytes, dirty n bytes (n = blocks per line / 8)
//!             4 class  line u32, class u8
//!             5 intent line u32, count u32 (format version 2): the clean state of lines
//!                      line..line+count is not proven equal to the core from here on
//! ```
//!
//! An entry holding an intent op is framed as format version 2 ([`Entry::version`]); every
//! other entry keeps version 1, so an older tiercache reads the journals it could always read.

use crate::DecodeError;
use crate::checkpoint::{CLASSES, UNMAPPED};
use crate::codec::{Reader, Writer};

/// One change.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LineOp {
    /// `line` now holds `core_line` of `core`, in `class`, with no valid block yet.
    Map {
        /// Cache line.
        line: u32,
        /// Core id.
        core: u8,
        /// Core line.
        core_line: u64,
        /// IO class.
        class: u8,
    },
    /// `line` is free.
    Unmap {
        /// Cache line.
        line: u32,
    },
    /// `line`'s valid and dirty blocks.
    State {
        /// Cache line.
        line: u32,
        /// Valid blocks.
        valid: u128,
        /// Dirty blocks (a subset of `valid`).
        dirty: u128,
    },
    /// `line` moved to `class`.
    Class {
        /// Cache line.
        line: u32,
        /// IO class.
        class: u8,
    },
    /// Write intent (format version 2): the cache or core copy of lines `line..line + count`
    /// may change from here on, so their clean state recorded earlier (checkpoint or journal)
    /// no longer proves them equal to the core after a crash.
    Intent {
        /// First cache line.
        line: u32,
        /// Lines.
        count: u32,
    },
}

/// A journal entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Sequence number.
    pub seq: u64,
    /// Line size of the cache (bytes).
    pub line_size: u32,
    /// The changes, in order.
    pub ops: Vec<LineOp>,
}

fn geometry(line_size: u32) -> Option<(usize, u128)> {
    if !(4096..=65536).contains(&line_size) || !line_size.is_power_of_two() {
        return None;
    }
    let blocks = line_size / 512;
    let mask = if blocks == 128 {
        u128::MAX
    } else {
        (1u128 << blocks) - 1
    };
    Some(((blocks as usize).div_ceil(8), mask))
}

impl Entry {
    /// The format version an entry is framed with: 2 if it holds an intent op, else 1.
    pub fn version(&self) -> u16 {
        if self.ops.iter().any(|o| matches!(o, LineOp::Intent { .. })) {
            2
        } else {
            1
        }
    }

    /// The entry's payload.
    ///
    /// # Panics
    /// On an op no cache produces (a bug in the caller): dirty not valid, bits beyond the line,
    /// core 255, class over 33, or a bad line size.
    pub fn encode(&self) -> Vec<u8> {
        let (n, lmask) = geometry(self.line_size).expect("valid line size");
        let mut w = Writer::new();
        w.u64(self.seq)
            .u32(self.line_size)
            .u32(u32::try_from(self.ops.len()).expect("ops"));
        for op in &self.ops {
            match *op {
                LineOp::Map {
                    line,
                    core,
                    core_line,
                    class,
                } => {
                    assert!(core != UNMAPPED && class < CLASSES);
                    w.u8(1).u32(line).u8(core).u64(core_line).u8(class);
                }
                LineOp::Unmap { line } => {
                    w.u8(2).u32(line);
                }
                LineOp::State { line, valid, dirty } => {
                    assert!(
                        dirty & !valid == 0 && valid & !lmask == 0,
                        "impossible line state"
                    );
                    w.u8(3)
                        .u32(line)
                        .bytes(&valid.to_le_bytes()[..n])
                        .bytes(&dirty.to_le_bytes()[..n]);
                }
                LineOp::Class { line, class } => {
                    assert!(class < CLASSES);
                    w.u8(4).u32(line).u8(class);
                }
                LineOp::Intent { line, count } => {
                    assert!(count > 0, "empty intent");
                    w.u8(5).u32(line).u32(count);
                }
            }
        }
        w.buf
    }

    /// Decodes a payload.
    pub fn decode(payload: &[u8]) -> Result<Entry, DecodeError> {
        const WHAT: &str = "journal entry";
        let bad = |detail: String| DecodeError::BadField { what: WHAT, detail };
        let mut r = Reader::new(payload, WHAT);
        let seq = r.u64()?;
        let line_size = r.u32()?;
        let count = r.u32()?;
        let (n, lmask) =
            geometry(line_size).ok_or_else(|| bad(format!("line size {line_size}")))?;
        // Every op takes at least 5 bytes: a count the payload cannot hold is a lie.
        if count as usize > payload.len() / 5 {
            return Err(bad(format!("{count} ops in {} bytes", payload.len())));
        }
        let mut ops = Vec::with_capacity(count as usize);
        for i in 0..count {
            let op = match r.u8()? {
                1 => {
                    let (line, core, core_line, class) = (r.u32()?, r.u8()?, r.u64()?, r.u8()?);
                    if core == UNMAPPED || class >= CLASSES {
                        return Err(bad(format!("op {i}: map to core {core}, class {class}")));
                    }
                    LineOp::Map {
                        line,
                        core,
                        core_line,
                        class,
                    }
                }
                2 => LineOp::Unmap { line: r.u32()? },
                3 => {
                    let line = r.u32()?;
                    let mut m = [0u8; 16];
                    m[..n].copy_from_slice(r.take(n)?);
                    let valid = u128::from_le_bytes(m);
                    m[..n].copy_from_slice(r.take(n)?);
                    let dirty = u128::from_le_bytes(m);
                    if dirty & !valid != 0 || valid & !lmask != 0 {
                        return Err(bad(format!("op {i}: impossible state for line {line}")));
                    }
                    LineOp::State { line, valid, dirty }
                }
                4 => {
                    let (line, class) = (r.u32()?, r.u8()?);
                    if class >= CLASSES {
                        return Err(bad(format!("op {i}: class {class}")));
                    }
                    LineOp::Class { line, class }
                }
                5 => {
                    let (line, count) = (r.u32()?, r.u32()?);
                    if count == 0 || line.checked_add(count).is_none() {
                        return Err(bad(format!("op {i}: intent for lines {line}+{count}")));
                    }
                    LineOp::Intent { line, count }
                }
                t => return Err(bad(format!("op {i}: unknown tag {t}"))),
            };
            ops.push(op);
        }
        if r.pos() != payload.len() {
            return Err(bad(format!(
                "{} bytes after the last op",
                payload.len() - r.pos()
            )));
        }
        Ok(Entry {
            seq,
            line_size,
            ops,
        })
    }
}
