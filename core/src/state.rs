//! Per-line state: which blocks are valid and dirty, the line's IO class, and one flag.
//!
//! Stored as flat arrays (structure of arrays) so a 4 KiB line costs 3 bytes here: one byte of
//! valid bits, one of dirty bits, one for class and flag. Larger lines cost more bits per line
//! but the same per 4 KiB of cache.
//!
//! Invariant: `dirty ⊆ valid` for every line; an unmapped line has `valid == dirty == 0`.

use crate::units::{BlockMask, LineId};

/// Bit in the class byte: the line has been dirty since it was mapped (coverage accounting).
const FLAG_WAS_DIRTY: u8 = 0x80;
const CLASS_MASK: u8 = 0x3f;

/// Valid/dirty masks, class and flag of every line.
#[derive(Clone, Debug)]
pub struct LineStates {
    valid: Vec<u8>,
    dirty: Vec<u8>,
    class: Vec<u8>,
    mask_bytes: usize,
}

impl LineStates {
    /// State for `lines` lines of `blocks_per_line` blocks (8..=128).
    pub fn new(lines: u32, blocks_per_line: u32) -> LineStates {
        let mask_bytes = (blocks_per_line / 8) as usize;
        assert!((1..=16).contains(&mask_bytes));
        LineStates {
            valid: vec![0; lines as usize * mask_bytes],
            dirty: vec![0; lines as usize * mask_bytes],
            class: vec![0; lines as usize],
            mask_bytes,
        }
    }

    #[inline]
    fn get(v: &[u8], at: usize, n: usize) -> BlockMask {
        let mut b = [0u8; 16];
        b[..n].copy_from_slice(&v[at..at + n]);
        u128::from_le_bytes(b)
    }

    #[inline]
    fn put(v: &mut [u8], at: usize, n: usize, m: BlockMask) {
        v[at..at + n].copy_from_slice(&m.to_le_bytes()[..n]);
    }

    /// Valid blocks of `line`.
    #[inline]
    pub fn valid(&self, line: LineId) -> BlockMask {
        Self::get(
            &self.valid,
            line.0 as usize * self.mask_bytes,
            self.mask_bytes,
        )
    }

    /// Dirty blocks of `line`.
    #[inline]
    pub fn dirty(&self, line: LineId) -> BlockMask {
        Self::get(
            &self.dirty,
            line.0 as usize * self.mask_bytes,
            self.mask_bytes,
        )
    }

    /// Sets both masks; asserts `dirty ⊆ valid`.
    #[inline]
    pub fn set(&mut self, line: LineId, valid: BlockMask, dirty: BlockMask) {
        assert_eq!(dirty & !valid, 0, "dirty blocks must be valid ({line:?})");
        let at = line.0 as usize * self.mask_bytes;
        Self::put(&mut self.valid, at, self.mask_bytes, valid);
        Self::put(&mut self.dirty, at, self.mask_bytes, dirty);
        if dirty != 0 {
            self.class[line.0 as usize] |= FLAG_WAS_DIRTY;
        }
    }

    /// The IO class of `line`.
    #[inline]
    pub fn class(&self, line: LineId) -> u8 {
        self.class[line.0 as usize] & CLASS_MASK
    }

    /// Sets the IO class of `line`, keeping its flag.
    #[inline]
    pub fn set_class(&mut self, line: LineId, class: u8) {
        assert!(class <= CLASS_MASK);
        let c = &mut self.class[line.0 as usize];
        *c = (*c & !CLASS_MASK) | class;
    }

    /// Whether `line` has been dirty since it was last reset.
    #[inline]
    pub fn was_dirty(&self, line: LineId) -> bool {
        self.class[line.0 as usize] & FLAG_WAS_DIRTY != 0
    }

    /// Clears masks, class and flag (the line is being unmapped).
    #[inline]
    pub fn reset(&mut self, line: LineId) {
        let at = line.0 as usize * self.mask_bytes;
        Self::put(&mut self.valid, at, self.mask_bytes, 0);
        Self::put(&mut self.dirty, at, self.mask_bytes, 0);
        self.class[line.0 as usize] = 0;
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.valid.capacity() + self.dirty.capacity() + self.class.capacity()
    }
}
