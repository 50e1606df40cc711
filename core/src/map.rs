//! The mapping: (core, core line) → cache line, and back.
//!
//! Set-less and fully associative, like Open CAS: any core line can live in any cache line.
//! The forward map is an open-addressing hash table of `u32` slots with linear probing and
//! backward-shift deletion (no tombstones), sized at 1.125 slots per line; the reverse map is one
//! 5-byte record per line (core line, core id). Keys are never stored twice: a slot holds a line id in
//! its low bits and, in the bits a line id does not need, a **fingerprint** of the key's hash
//! (8 bits at 16M lines). A probe reads the reverse map only when the fingerprint matches, so a
//! lookup costs about one cache miss in the table and one in the reverse map instead of one per
//! probed slot. Memory: 5 (reverse) + 4.5 (table) bytes per line.
//!
//! A core line number is `u32`, so a core can have at most 2^32 lines (16 TiB with 4 KiB lines,
//! 256 TiB with 64 KiB lines); `Cache::add_core` refuses bigger cores with a message naming the
//! line size that would fit.
//!
//! Invariant: line `l` is mapped iff its reverse record's core is not `UNMAPPED`, and then
//! exactly one slot holds `l` and `lookup(position(l)) == Some(l)`.

use crate::policy::position_key;
use crate::units::{CoreId, LineId};

const EMPTY: u32 = u32::MAX;
/// Reverse-map core id of an unmapped line.
pub const UNMAPPED: u8 = u8::MAX;

/// The mapping.
#[derive(Clone, Debug)]
pub struct Mapping {
    slots: Vec<u32>,
    /// Bits of a slot that hold the line id; the rest hold the fingerprint.
    id_bits: u32,
    /// Reverse map, one 5-byte record per line: core line (`u32`, little endian), core id.
    /// One record, one memory access: verifying a fingerprint match costs a single miss.
    rev: Vec<u8>,
    mapped: u32,
}

const REV: usize = 5;

impl Mapping {
    /// A mapping for `lines` cache lines, all unmapped.
    pub fn new(lines: u32) -> Mapping {
        let cap = (lines as usize + lines as usize / 8 + 1).max(2);
        // Line ids are < 2^id_bits - 1, so no slot can equal EMPTY (all ones).
        let id_bits = 32 - lines.leading_zeros();
        Mapping {
            slots: vec![EMPTY; cap],
            id_bits,
            rev: [0, 0, 0, 0, UNMAPPED].repeat(lines as usize),
            mapped: 0,
        }
    }

    #[inline]
    fn rev_core(&self, l: usize) -> u8 {
        self.rev[l * REV + 4]
    }

    #[inline]
    fn rev_line(&self, l: usize) -> u32 {
        let r = &self.rev[l * REV..l * REV + 4];
        u32::from_le_bytes([r[0], r[1], r[2], r[3]])
    }

    #[inline]
    fn set_rev(&mut self, l: usize, core: u8, core_line: u32) {
        let r = &mut self.rev[l * REV..l * REV + REV];
        r[..4].copy_from_slice(&core_line.to_le_bytes());
        r[4] = core;
    }

    /// Home slot and fingerprint (already shifted into place) of a key.
    #[inline]
    fn home(&self, core: CoreId, core_line: u32) -> (usize, u32) {
        let h = position_key(core, core_line as u64);
        let i = ((h as u128 * self.slots.len() as u128) >> 64) as usize;
        // The home index uses the hash's high bits; the fingerprint its low ones.
        let fp = (h as u32).checked_shl(self.id_bits).unwrap_or(0);
        (i, fp)
    }

    #[inline]
    fn id_mask(&self) -> u32 {
        1u32.checked_shl(self.id_bits).map_or(u32::MAX, |b| b - 1)
    }

    /// Hints the CPU to start loading the table slot `lookup(core, core_line)` will read first,
    /// so the miss overlaps other work (the caller looks up a little later). No effect on
    /// results; a nothing off x86-64.
    #[inline]
    pub fn prefetch(&self, core: CoreId, core_line: u64) {
        if let Ok(cl) = u32::try_from(core_line) {
            crate::hint::prefetch(&self.slots, self.home(core, cl).0);
        }
    }

    /// The cache line holding `core_line` of `core`, if any.
    #[inline]
    pub fn lookup(&self, core: CoreId, core_line: u64) -> Option<LineId> {
        self.lookup_hinted(core, core_line, |_| {})
    }

    /// [`Mapping::lookup`], calling `candidate(line)` for a slot whose fingerprint matches
    /// before its reverse record is read — so the caller can start loading that line's other
    /// state (a prefetch) while the key is verified.
    #[inline]
    pub fn lookup_hinted(
        &self,
        core: CoreId,
        core_line: u64,
        candidate: impl Fn(u32),
    ) -> Option<LineId> {
        let Ok(cl) = u32::try_from(core_line) else {
            return None;
        };
        let n = self.slots.len();
        let (mut i, fp) = self.home(core, cl);
        let mask = self.id_mask();
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            let l = s & mask;
            if s & !mask == fp
                && {
                    candidate(l);
                    true
                }
                && self.rev_line(l as usize) == cl
                && self.rev_core(l as usize) as u16 == core.0
            {
                return Some(LineId(l));
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
            self.rev_core(line.0 as usize),
            UNMAPPED,
            "line {line:?} already mapped"
        );
        self.set_rev(line.0 as usize, core.0 as u8, cl);
        let n = self.slots.len();
        let (mut i, fp) = self.home(core, cl);
        while self.slots[i] != EMPTY {
            i += 1;
            if i == n {
                i = 0;
            }
        }
        self.slots[i] = fp | line.0;
        self.mapped += 1;
    }

    /// [`Mapping::insert`] for metadata read from a device, which may be damaged: refuses
    /// (returns false, changing nothing) when `core_line` of `core` is already mapped. One probe
    /// run does both the check and the insert, which halves the cost of a load.
    pub fn insert_checked(&mut self, line: LineId, core: CoreId, core_line: u64) -> bool {
        let Ok(cl) = u32::try_from(core_line) else {
            return false;
        };
        if core.0 >= UNMAPPED as u16 || self.rev_core(line.0 as usize) != UNMAPPED {
            return false;
        }
        let n = self.slots.len();
        let mask = self.id_mask();
        let (mut i, fp) = self.home(core, cl);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                break;
            }
            let l = (s & mask) as usize;
            if s & !mask == fp && self.rev_line(l) == cl && self.rev_core(l) as u16 == core.0 {
                return false;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
        self.set_rev(line.0 as usize, core.0 as u8, cl);
        self.slots[i] = fp | line.0;
        self.mapped += 1;
        true
    }

    /// Unmaps `line`, which must be mapped.
    pub fn remove(&mut self, line: LineId) {
        let l = line.0 as usize;
        assert_ne!(self.rev_core(l), UNMAPPED, "line {line:?} not mapped");
        let core = CoreId(self.rev_core(l) as u16);
        let cl = self.rev_line(l);
        let n = self.slots.len();
        let mask = self.id_mask();
        let (mut i, _) = self.home(core, cl);
        while self.slots[i] == EMPTY || self.slots[i] & mask != line.0 {
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
            let sl = (s & mask) as usize;
            let (h, _) = self.home(CoreId(self.rev_core(sl) as u16), self.rev_line(sl));
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
        self.set_rev(l, UNMAPPED, 0);
        self.mapped -= 1;
    }

    /// Whether `line` is mapped.
    #[inline]
    pub fn is_mapped(&self, line: LineId) -> bool {
        self.rev_core(line.0 as usize) != UNMAPPED
    }

    /// The position of mapped `line`.
    #[inline]
    pub fn position(&self, line: LineId) -> (CoreId, u64) {
        let l = line.0 as usize;
        debug_assert_ne!(self.rev_core(l), UNMAPPED);
        (CoreId(self.rev_core(l) as u16), self.rev_line(l) as u64)
    }

    /// Mapped lines.
    pub fn mapped(&self) -> u32 {
        self.mapped
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * 4 + self.rev.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_lookup_remove_many() {
        // Sizes around powers of two exercise the line-id / fingerprint split of a slot.
        for lines in [1u32, 2, 3, 1000, 1023, 1024, 1025] {
            churn(lines);
        }
    }

    #[test]
    fn insert_checked_refuses_duplicates() {
        let mut m = Mapping::new(1000);
        for l in 0..900u32 {
            assert!(m.insert_checked(LineId(l), CoreId((l % 3) as u16), l as u64 * 7));
        }
        for l in 0..900u32 {
            assert_eq!(
                m.lookup(CoreId((l % 3) as u16), l as u64 * 7),
                Some(LineId(l))
            );
            // The same key again, into a free line: refused, nothing changed.
            assert!(!m.insert_checked(LineId(950), CoreId((l % 3) as u16), l as u64 * 7));
            // A mapped line again: refused.
            assert!(!m.insert_checked(LineId(l), CoreId(5), 1));
        }
        assert!(!m.is_mapped(LineId(950)));
        assert!(!m.insert_checked(LineId(951), CoreId(0), u64::MAX));
        assert!(!m.insert_checked(LineId(951), CoreId(UNMAPPED as u16), 1));
        assert!(m.insert_checked(LineId(950), CoreId(0), 1));
    }

    fn churn(lines: u32) {
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
        for _ in 0..100_000 {
            let core = (next() % 3) as u16;
            let cl = next() % (2 * lines as u64 + 2);
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
