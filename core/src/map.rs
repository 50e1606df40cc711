//! The mapping: (core, core line) → cache line, and back.
//!
//! Set-less and fully associative, like Open CAS: any core line can live in any cache line.
//! The forward map is an open-addressing hash table of `u32` line ids with linear probing and
//! backward-shift deletion (no tombstones), sized at 1.25 slots per line; the reverse map is two
//! per-line arrays (core id, core line). Keys are never stored twice: a slot holds only a line
//! id and the key is read from the reverse map. Memory: 5 (reverse) + 5 (table) bytes per line.
//!
//! A core line number is `u32`, so a core can have at most 2^32 lines (16 TiB with 4 KiB lines,
//! 256 TiB with 64 KiB lines); `Cache::add_core` refuses bigger cores with a message naming the
//! line size that would fit.
//!
//! Invariant: line `l` is mapped iff `core[l] != UNMAPPED`, and then exactly one slot holds `l`
//! and `lookup(core[l], core_line[l]) == Some(l)`.

use crate::policy::position_key;
use crate::units::{CoreId, LineId};

const EMPTY: u32 = u32::MAX;
/// Reverse-map core id of an unmapped line.
pub const UNMAPPED: u8 = u8::MAX;

/// The mapping.
#[derive(Clone, Debug)]
pub struct Mapping {
    slots: Vec<u32>,
    core: Vec<u8>,
    core_line: Vec<u32>,
    mapped: u32,
}

impl Mapping {
    /// A mapping for `lines` cache lines, all unmapped.
    pub fn new(lines: u32) -> Mapping {
        let cap = (lines as usize + lines as usize / 4 + 1).max(2);
        Mapping {
            slots: vec![EMPTY; cap],
            core: vec![UNMAPPED; lines as usize],
            core_line: vec![0; lines as usize],
            mapped: 0,
        }
    }

    #[inline]
    fn home(&self, core: CoreId, core_line: u32) -> usize {
        let h = position_key(core, core_line as u64);
        ((h as u128 * self.slots.len() as u128) >> 64) as usize
    }

    /// The cache line holding `core_line` of `core`, if any.
    #[inline]
    pub fn lookup(&self, core: CoreId, core_line: u64) -> Option<LineId> {
        let Ok(cl) = u32::try_from(core_line) else {
            return None;
        };
        let n = self.slots.len();
        let mut i = self.home(core, cl);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if self.core_line[s as usize] == cl && self.core[s as usize] as u16 == core.0 {
                return Some(LineId(s));
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    /// Maps unmapped `line` to `core_line` of `core`, which must not be mapped.
    pub fn insert(&mut self, line: LineId, core: CoreId, core_line: u64) {
        let cl = u32::try_from(core_line).expect("core line fits u32 (checked at add_core)");
        assert!(core.0 < UNMAPPED as u16);
        debug_assert!(self.lookup(core, core_line).is_none());
        assert_eq!(
            self.core[line.0 as usize], UNMAPPED,
            "line {line:?} already mapped"
        );
        self.core[line.0 as usize] = core.0 as u8;
        self.core_line[line.0 as usize] = cl;
        let n = self.slots.len();
        let mut i = self.home(core, cl);
        while self.slots[i] != EMPTY {
            i += 1;
            if i == n {
                i = 0;
            }
        }
        self.slots[i] = line.0;
        self.mapped += 1;
    }

    /// Unmaps `line`, which must be mapped.
    pub fn remove(&mut self, line: LineId) {
        let l = line.0 as usize;
        assert_ne!(self.core[l], UNMAPPED, "line {line:?} not mapped");
        let core = CoreId(self.core[l] as u16);
        let cl = self.core_line[l];
        let n = self.slots.len();
        let mut i = self.home(core, cl);
        while self.slots[i] != line.0 {
            assert_ne!(self.slots[i], EMPTY, "mapped line missing from table");
            i += 1;
            if i == n {
                i = 0;
            }
        }
        // Backward-shift deletion: pull later members of the probe run into the hole.
        let mut hole = i;
        let mut j = i;
        loop {
            j += 1;
            if j == n {
                j = 0;
            }
            let s = self.slots[j];
            if s == EMPTY {
                break;
            }
            let h = self.home(
                CoreId(self.core[s as usize] as u16),
                self.core_line[s as usize],
            );
            // Can `s` (home h, now at j) move to `hole`? Only if h is not in (hole, j].
            let in_range = if hole <= j {
                h > hole && h <= j
            } else {
                h > hole || h <= j
            };
            if !in_range {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.core[l] = UNMAPPED;
        self.mapped -= 1;
    }

    /// Whether `line` is mapped.
    #[inline]
    pub fn is_mapped(&self, line: LineId) -> bool {
        self.core[line.0 as usize] != UNMAPPED
    }

    /// The position of mapped `line`.
    #[inline]
    pub fn position(&self, line: LineId) -> (CoreId, u64) {
        let l = line.0 as usize;
        debug_assert_ne!(self.core[l], UNMAPPED);
        (CoreId(self.core[l] as u16), self.core_line[l] as u64)
    }

    /// Mapped lines.
    pub fn mapped(&self) -> u32 {
        self.mapped
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * 4 + self.core.capacity() + self.core_line.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_lookup_remove_many() {
        let lines = 1000u32;
        let mut m = Mapping::new(lines);
        let mut rng = 12345u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut model: std::collections::HashMap<(u16, u64), u32> = Default::default();
        let mut free: Vec<u32> = (0..lines).collect();
        for _ in 0..200_000 {
            let core = (next() % 3) as u16;
            let cl = next() % 2000;
            match model.get(&(core, cl)) {
                Some(&l) => {
                    assert_eq!(m.lookup(CoreId(core), cl), Some(LineId(l)));
                    if next() % 2 == 0 {
                        m.remove(LineId(l));
                        model.remove(&(core, cl));
                        free.push(l);
                    }
                }
                None => {
                    assert_eq!(m.lookup(CoreId(core), cl), None);
                    if let Some(l) = free.pop() {
                        m.insert(LineId(l), CoreId(core), cl);
                        model.insert((core, cl), l);
                    }
                }
            }
        }
        assert_eq!(m.mapped() as usize, model.len());
        for (&(c, cl), &l) in &model {
            assert_eq!(m.lookup(CoreId(c), cl), Some(LineId(l)));
            assert_eq!(m.position(LineId(l)), (CoreId(c), cl));
        }
    }
}
