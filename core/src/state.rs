//! Per-line state: which blocks are valid and dirty, the line's IO class, and two flags.
//!
//! The masks are one flat array of per-line records — valid bits, then dirty bits — so a 4 KiB
//! line costs 2 bytes here and one memory access reads both (a lookup in a 16M-line cache is
//! bound by cache misses, not instructions). Larger lines cost more bits per line but the same
//! per 4 KiB of cache.
//!
//! The **class byte** (IO class in the low 6 bits, the two flags above) lives in the line's tag
//! beside its list links ([`crate::lists::TAG_STATE`]), where it costs no byte of its own; its
//! accessors are below, as methods of [`ListArena`]. A line keeps its class byte while it moves
//! between lists, and [`LineStates::reset`] clears it when the line is unmapped.
//!
//! Invariant: `dirty ⊆ valid` for every line; an unmapped line has `valid == dirty == 0`.

use crate::lists::{ListArena, TAG_STATE};
use crate::units::{BlockMask, LineId};

/// Bit in the class byte: the line has been dirty since it was mapped (coverage accounting).
const FLAG_WAS_DIRTY: u8 = 0x80;
/// Bit in the class byte: the persistent metadata may still say this line holds dirty data, so
/// its slot must not be reused for other data until a durable journal entry says otherwise.
const FLAG_DURABLE_DIRTY: u8 = 0x40;
const CLASS_MASK: u8 = 0x3f;

/// Valid/dirty masks of every line.
#[derive(Clone, Debug)]
pub struct LineStates {
    /// Per line: `mask_bytes` of valid bits, then `mask_bytes` of dirty bits.
    data: Vec<u8>,
    mask_bytes: usize,
    stride: usize,
}

impl LineStates {
    /// State for `lines` lines of `blocks_per_line` blocks (8, 16, 32, 64 or 128: the line
    /// sizes).
    pub fn new(lines: u32, blocks_per_line: u32) -> LineStates {
        let mask_bytes = (blocks_per_line / 8) as usize;
        assert!(
            matches!(mask_bytes, 1 | 2 | 4 | 8 | 16),
            "{blocks_per_line} blocks per line"
        );
        let stride = 2 * mask_bytes;
        LineStates {
            data: vec![0; lines as usize * stride],
            mask_bytes,
            stride,
        }
    }

    /// One mask of `n` bytes (1, 2, 4, 8 or 16) at `at`. Each width is its own fixed-size load:
    /// a copy of a run-time length became a `memcpy` call on every hit and every checkpoint
    /// record.
    #[inline(always)]
    fn get(v: &[u8], at: usize, n: usize) -> BlockMask {
        fn word<const N: usize>(v: &[u8], at: usize) -> [u8; N] {
            v[at..at + N].try_into().expect("N bytes")
        }
        match n {
            1 => v[at] as u128,
            2 => u16::from_le_bytes(word(v, at)) as u128,
            4 => u32::from_le_bytes(word(v, at)) as u128,
            8 => u64::from_le_bytes(word(v, at)) as u128,
            16 => u128::from_le_bytes(word(v, at)),
            _ => unreachable!("mask of {n} bytes"),
        }
    }

    #[inline(always)]
    fn put(v: &mut [u8], at: usize, n: usize, m: BlockMask) {
        match n {
            1 => v[at] = m as u8,
            2 => v[at..at + 2].copy_from_slice(&(m as u16).to_le_bytes()),
            4 => v[at..at + 4].copy_from_slice(&(m as u32).to_le_bytes()),
            8 => v[at..at + 8].copy_from_slice(&(m as u64).to_le_bytes()),
            16 => v[at..at + 16].copy_from_slice(&m.to_le_bytes()),
            _ => unreachable!("mask of {n} bytes"),
        }
    }

    /// Hints the CPU to start loading `line`'s record (see `Mapping::lookup_hinted`).
    #[inline]
    pub fn prefetch(&self, line: u32) {
        crate::hint::prefetch(&self.data, line as usize * self.stride);
    }

    /// Valid blocks of `line`.
    #[inline]
    pub fn valid(&self, line: LineId) -> BlockMask {
        Self::get(&self.data, line.0 as usize * self.stride, self.mask_bytes)
    }

    /// Dirty blocks of `line`.
    #[inline]
    pub fn dirty(&self, line: LineId) -> BlockMask {
        Self::get(
            &self.data,
            line.0 as usize * self.stride + self.mask_bytes,
            self.mask_bytes,
        )
    }

    /// Sets both masks (and the was-dirty flag in `lists` if `dirty` is not empty); asserts
    /// `dirty ⊆ valid`.
    #[inline]
    pub fn set(&mut self, lists: &mut ListArena, line: LineId, valid: BlockMask, dirty: BlockMask) {
        assert_eq!(dirty & !valid, 0, "dirty blocks must be valid ({line:?})");
        let at = line.0 as usize * self.stride;
        Self::put(&mut self.data, at, self.mask_bytes, valid);
        Self::put(&mut self.data, at + self.mask_bytes, self.mask_bytes, dirty);
        if dirty != 0 {
            let c = lists.field(line.0, TAG_STATE);
            if c & FLAG_WAS_DIRTY == 0 {
                lists.set_field(line.0, TAG_STATE, c | FLAG_WAS_DIRTY);
            }
        }
    }

    /// Clears masks, class and flags (the line is being unmapped).
    #[inline]
    pub fn reset(&mut self, lists: &mut ListArena, line: LineId) {
        let at = line.0 as usize * self.stride;
        self.data[at..at + self.stride].fill(0);
        lists.set_field(line.0, TAG_STATE, 0);
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.data.capacity()
    }
}

/// The class byte of a line, kept in its list tag (see the module docs).
impl ListArena {
    /// The IO class of `line`.
    #[inline]
    pub fn class(&self, line: LineId) -> u8 {
        self.field(line.0, TAG_STATE) & CLASS_MASK
    }

    /// Sets the IO class of `line`, keeping its flags.
    #[inline]
    pub fn set_class(&mut self, line: LineId, class: u8) {
        assert!(class <= CLASS_MASK);
        let c = self.field(line.0, TAG_STATE);
        self.set_field(line.0, TAG_STATE, (c & !CLASS_MASK) | class);
    }

    /// Whether `line` has been dirty since it was last reset.
    #[inline]
    pub fn was_dirty(&self, line: LineId) -> bool {
        self.field(line.0, TAG_STATE) & FLAG_WAS_DIRTY != 0
    }

    /// Whether the persistent metadata may still show dirty data in `line` (see
    /// `cache/meta.rs`).
    #[inline]
    pub fn durable_dirty(&self, line: LineId) -> bool {
        self.field(line.0, TAG_STATE) & FLAG_DURABLE_DIRTY != 0
    }

    /// Sets or clears the durable-dirty flag of `line`.
    #[inline]
    pub fn set_durable_dirty(&mut self, line: LineId, on: bool) {
        let c = self.field(line.0, TAG_STATE);
        let c = if on {
            c | FLAG_DURABLE_DIRTY
        } else {
            c & !FLAG_DURABLE_DIRTY
        };
        self.set_field(line.0, TAG_STATE, c);
    }
}
