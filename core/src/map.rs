//! The mapping: (core, core line) → cache line, and back.
//!
//! Set-less and fully associative, like Open CAS: any core line can live in any cache line.
//! The forward map is an open-addressing hash table of `u32` slots with linear probing and
//! backward-shift deletion (no tombstones), sized at 1.125 slots per line; the reverse map is one
//! `u32` per line, the line's **position**. Keys are never stored twice: a slot holds a line id in
//! its low bits and, in the bits a line id does not need, a **fingerprint** of the key's hash
//! (7 bits at 16M lines). A probe reads the reverse map only when the fingerprint matches, so a
//! lookup costs about one cache miss in the table and one in the reverse map instead of one per
//! probed slot. Memory: 4 (reverse) + 4.5 (table) bytes per line.
//!
//! **Positions.** Each attached core owns a contiguous range of a 32-bit position space: core
//! line `cl` of a core whose range starts at `base` is position `base + cl`. So a line's reverse
//! record needs no core id (it would cost a fifth byte per line): the core is the range the
//! position falls in, found by a binary search over at most 255 ranges (one compare with one
//! core). Ranges are given out first-fit when a core is attached, grow in place when a core grows
//! and the space after it is free, and move otherwise (rewriting the positions of that core's
//! lines, an O(lines) pass at a resize). The price is a limit: the cores of one cache have at
//! most `2^32 - 1` lines **together** (16 TiB of cores at 4 KiB lines, 256 TiB at 64 KiB lines);
//! `Cache::add_core` and `Cache::resize_core` refuse more with a message naming the line size
//! that would fit.
//!
//! Invariant: line `l` is mapped iff its position is not `UNMAPPED`, and then its position lies
//! in the range of a core, exactly one slot holds `l` and `lookup(position(l)) == Some(l)`.

use crate::policy::position_key;
use crate::units::{CoreId, LineId};

const EMPTY: u32 = u32::MAX;
/// How many slots ahead [`Mapping::remove`] starts loading a probe-run member's reverse record.
const REMOVE_PREFETCH: usize = 8;
/// Reverse-map position of an unmapped line (never inside a core's range).
pub const UNMAPPED: u32 = u32::MAX;
/// Positions available to the cores of one cache together (`0..POSITIONS`).
pub const POSITIONS: u64 = UNMAPPED as u64;

/// A core's range of positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    base: u32,
    len: u32,
}

/// The mapping.
#[derive(Clone, Debug)]
pub struct Mapping {
    slots: Vec<u32>,
    /// Bits of a slot that hold the line id; the rest hold the fingerprint.
    id_bits: u32,
    /// Reverse map: each line's position, or `UNMAPPED`.
    rev: Vec<u32>,
    /// Per core id: its range of positions, if attached.
    ranges: Vec<Option<Range>>,
    /// `(base, core)` of every range, sorted by base (position → core).
    by_base: Vec<(u32, u16)>,
    mapped: u32,
}

impl Mapping {
    /// A mapping for `lines` cache lines, all unmapped.
    pub fn new(lines: u32) -> Mapping {
        let cap = (lines as usize + lines as usize / 8 + 1).max(2);
        // Line ids are < 2^id_bits - 1, so no slot can equal EMPTY (all ones).
        let id_bits = 32 - lines.leading_zeros();
        Mapping {
            slots: vec![EMPTY; cap],
            id_bits,
            rev: vec![UNMAPPED; lines as usize],
            ranges: Vec::new(),
            by_base: Vec::new(),
            mapped: 0,
        }
    }

    /// The range of `core`, if attached.
    #[inline]
    fn range(&self, core: CoreId) -> Option<Range> {
        self.ranges.get(core.0 as usize).copied().flatten()
    }

    /// The position of `core_line` of `core`, if the core is attached and has that line.
    #[inline]
    fn pos(&self, core: CoreId, core_line: u32) -> Option<u32> {
        let r = self.range(core)?;
        (core_line < r.len).then(|| r.base + core_line)
    }

    /// The core and core line at position `p` (which lies in some core's range).
    #[inline]
    fn at(&self, p: u32) -> (CoreId, u32) {
        let i = match self.by_base.as_slice() {
            [_] => 0,
            b => b.partition_point(|&(base, _)| base <= p) - 1,
        };
        let (base, core) = self.by_base[i];
        (CoreId(core), p - base)
    }

    /// Gives `core` a range of `lines` positions (first fit). False, changing nothing, if the
    /// space has no gap that large.
    pub fn add_core(&mut self, core: CoreId, lines: u64) -> bool {
        assert!(
            self.range(core).is_none(),
            "core {core:?} already has a range"
        );
        let Some(base) = self.find_gap(lines, None) else {
            return false;
        };
        self.place(core, base, lines as u32);
        true
    }

    /// Changes the size of `core`'s range to `lines`. Shrinking is the caller's business (no
    /// mapped line may lie past the new end); growing stays in place when the positions after
    /// the range are free, and otherwise moves the range, rewriting the positions of the
    /// core's lines. False, changing nothing, if no gap is large enough.
    pub fn resize_core(&mut self, core: CoreId, lines: u64) -> bool {
        let r = self.range(core).expect("resize of a core with no range");
        let len = (lines.max(1)).min(u32::MAX as u64) as u32;
        if lines.max(1) <= r.len as u64 + self.gap_after(r) {
            self.ranges[core.0 as usize] = Some(Range { base: r.base, len });
            return true;
        }
        let Some(base) = self.find_gap(lines, Some(core)) else {
            return false;
        };
        self.unplace(core);
        self.place(core, base, lines as u32);
        for p in self.rev.iter_mut() {
            if *p != UNMAPPED && *p >= r.base && *p - r.base < r.len {
                *p = *p - r.base + base;
            }
        }
        true
    }

    /// Frees `core`'s range; the core must have no mapped line.
    pub fn remove_core(&mut self, core: CoreId) {
        self.unplace(core);
    }

    fn place(&mut self, core: CoreId, base: u32, lines: u32) {
        let i = core.0 as usize;
        if self.ranges.len() <= i {
            self.ranges.resize(i + 1, None);
        }
        self.ranges[i] = Some(Range {
            base,
            len: lines.max(1),
        });
        let at = self.by_base.partition_point(|&(b, _)| b < base);
        self.by_base.insert(at, (base, core.0));
    }

    fn unplace(&mut self, core: CoreId) {
        if let Some(slot) = self.ranges.get_mut(core.0 as usize) {
            *slot = None;
        }
        self.by_base.retain(|&(_, c)| c != core.0);
    }

    /// Free positions right after range `r`.
    fn gap_after(&self, r: Range) -> u64 {
        let next = self
            .by_base
            .iter()
            .map(|&(b, _)| b as u64)
            .find(|&b| b > r.base as u64)
            .unwrap_or(POSITIONS);
        next - (r.base as u64 + r.len as u64)
    }

    /// The first base with `lines` (at least 1) free positions after it, ignoring the range of
    /// `except`.
    fn find_gap(&self, lines: u64, except: Option<CoreId>) -> Option<u32> {
        let need = lines.max(1);
        let mut start = 0u64;
        for &(b, c) in &self.by_base {
            if Some(CoreId(c)) == except {
                continue;
            }
            if b as u64 - start >= need {
                return Some(start as u32);
            }
            let r = self.ranges[c as usize].expect("listed range");
            start = b as u64 + r.len as u64;
        }
        (POSITIONS - start >= need).then_some(start as u32)
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

    /// Walks the probe run of `core_line` of `core` (home slot `i`, fingerprint `fp`) to its
    /// first empty slot and returns the first line whose slot's fingerprint matches and which
    /// `accept` takes.
    #[inline]
    fn first_match(
        &self,
        mut i: usize,
        fp: u32,
        mut accept: impl FnMut(u32) -> bool,
    ) -> Option<u32> {
        let n = self.slots.len();
        let mask = self.id_mask();
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if s & !mask == fp && accept(s & mask) {
                return Some(s & mask);
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    /// The line the first slot whose fingerprint matches `core_line` of `core` names, without
    /// checking that line's reverse record (it starts loading it): usually the line
    /// [`Mapping::lookup`] finds, but possibly another (a fingerprint collision). For hints
    /// only (one table read instead of two).
    #[inline]
    pub fn candidate(&self, core: CoreId, core_line: u64) -> Option<LineId> {
        let cl = u32::try_from(core_line).ok()?;
        self.pos(core, cl)?;
        let (i, fp) = self.home(core, cl);
        self.first_match(i, fp, |l| {
            // Start loading the reverse record `lookup` will check.
            crate::hint::prefetch(&self.rev, l as usize);
            true
        })
        .map(LineId)
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
        let p = self.pos(core, cl)?;
        let (i, fp) = self.home(core, cl);
        self.first_match(i, fp, |l| {
            candidate(l);
            self.rev[l as usize] == p
        })
        .map(LineId)
    }

    /// Maps unmapped `line` to `core_line` of `core`, which must not be mapped and must lie in
    /// the core's range.
    pub fn insert(&mut self, line: LineId, core: CoreId, core_line: u64) {
        let cl = u32::try_from(core_line).expect("core line fits u32 (checked at add_core)");
        let p = self
            .pos(core, cl)
            .expect("core line inside its core's range");
        debug_assert!(self.lookup(core, core_line).is_none());
        assert_eq!(
            self.rev[line.0 as usize], UNMAPPED,
            "line {line:?} already mapped"
        );
        self.rev[line.0 as usize] = p;
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
        let Some(p) = self.pos(core, cl) else {
            return false;
        };
        if self.rev[line.0 as usize] != UNMAPPED {
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
            if s & !mask == fp && self.rev[l] == p {
                return false;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
        self.rev[line.0 as usize] = p;
        self.slots[i] = fp | line.0;
        self.mapped += 1;
        true
    }

    /// Unmaps `line`, which must be mapped.
    pub fn remove(&mut self, line: LineId) {
        let l = line.0 as usize;
        assert_ne!(self.rev[l], UNMAPPED, "line {line:?} not mapped");
        let (core, cl) = self.at(self.rev[l]);
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
        // Backward-shift deletion: pull later members of the probe run into the hole. Each
        // member's home needs its reverse record, a cache miss of its own in a large cache
        // (the run is ~40 slots at this table's 0.89 load), so the record of the member
        // `REMOVE_PREFETCH` slots ahead starts loading now and the misses overlap. Slots past
        // `j` are not moved before `j` reaches them, so the one read ahead is the one used.
        let ahead = |j: usize| {
            let mut k = j + REMOVE_PREFETCH;
            while k >= n {
                k -= n;
            }
            k
        };
        for k in 1..REMOVE_PREFETCH {
            let s = self.slots[(i + k) % n];
            if s != EMPTY {
                crate::hint::prefetch(&self.rev, (s & mask) as usize);
            }
        }
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
            let next = self.slots[ahead(j)];
            if next != EMPTY {
                crate::hint::prefetch(&self.rev, (next & mask) as usize);
            }
            let sl = (s & mask) as usize;
            let (c, cl) = self.at(self.rev[sl]);
            let (h, _) = self.home(c, cl);
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
        self.rev[l] = UNMAPPED;
        self.mapped -= 1;
    }

    /// Whether `line` is mapped.
    #[inline]
    pub fn is_mapped(&self, line: LineId) -> bool {
        self.rev[line.0 as usize] != UNMAPPED
    }

    /// The position of mapped `line`.
    #[inline]
    pub fn position(&self, line: LineId) -> (CoreId, u64) {
        let l = line.0 as usize;
        debug_assert_ne!(self.rev[l], UNMAPPED);
        let (c, cl) = self.at(self.rev[l]);
        (c, cl as u64)
    }

    /// Mapped lines.
    pub fn mapped(&self) -> u32 {
        self.mapped
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * 4
            + self.rev.capacity() * 4
            + self.ranges.capacity() * std::mem::size_of::<Option<Range>>()
            + self.by_base.capacity() * std::mem::size_of::<(u32, u16)>()
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
        for c in 0..3 {
            assert!(m.add_core(CoreId(c), 7 * 900));
        }
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
        assert!(
            !m.insert_checked(LineId(951), CoreId(5), 1),
            "core 5 has no range"
        );
        assert!(
            !m.insert_checked(LineId(951), CoreId(0), 7 * 900),
            "past the core's range"
        );
        assert!(m.insert_checked(LineId(950), CoreId(0), 1));
    }

    /// Times [`Mapping::remove`] on a full table (the eviction path: every insert follows a
    /// remove). Run by hand: `cargo test --release -p tiercache-core --lib remove_timing --
    /// --ignored --nocapture`.
    #[test]
    #[ignore]
    fn remove_timing() {
        for lines in [100 << 10, 1 << 22] {
            let mut m = Mapping::new(lines);
            assert!(m.add_core(CoreId(0), 1 << 31));
            // Distinct keys: an odd multiplier is a bijection modulo 2^31.
            let key = |c: u64| c.wrapping_mul(2_654_435_761) % (1 << 31);
            for l in 0..lines {
                m.insert(LineId(l), CoreId(0), key(l as u64));
            }
            let mut next_key = lines as u64;
            let mut rng = 99u64;
            let mut batch = Vec::with_capacity(1024);
            let (mut ns, mut removes) = (0u128, 0u64);
            for _ in 0..2000 {
                batch.clear();
                while batch.len() < 1024 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let l = (rng % lines as u64) as u32;
                    if m.is_mapped(LineId(l)) {
                        batch.push(l);
                        let t = std::time::Instant::now();
                        m.remove(LineId(l));
                        ns += t.elapsed().as_nanos();
                        removes += 1;
                    }
                }
                for &l in &batch {
                    m.insert(LineId(l), CoreId(0), key(next_key));
                    next_key += 1;
                }
            }
            println!(
                "{lines} lines, full: {:.0} ns per remove ({removes} removes)",
                ns as f64 / removes as f64
            );
        }
    }

    fn churn(lines: u32) {
        let mut m = Mapping::new(lines);
        for c in 0..3 {
            assert!(m.add_core(CoreId(c), 2 * lines as u64 + 2));
        }
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

    #[test]
    fn ranges_first_fit_grow_move_and_refuse() {
        let mut m = Mapping::new(64);
        assert!(m.add_core(CoreId(0), 100));
        assert!(m.add_core(CoreId(3), 50));
        assert!(
            m.add_core(CoreId(1), 0),
            "an empty core still gets a position"
        );
        for cl in 0..10 {
            m.insert(LineId(cl as u32), CoreId(0), cl * 10);
            m.insert(LineId(20 + cl as u32), CoreId(3), cl * 5);
        }
        // Core 0 cannot grow in place (core 3 follows it): it moves, and its lines with it.
        assert!(m.resize_core(CoreId(0), 1000));
        // Core 3 grows (into the space core 0 left, at position 0), then shrinks in place.
        assert!(m.resize_core(CoreId(3), 60));
        assert_eq!(m.range(CoreId(3)), Some(Range { base: 0, len: 60 }));
        assert!(m.resize_core(CoreId(3), 46));
        for cl in 0..10u64 {
            assert_eq!(m.lookup(CoreId(0), cl * 10), Some(LineId(cl as u32)));
            assert_eq!(m.position(LineId(cl as u32)), (CoreId(0), cl * 10));
            assert_eq!(m.lookup(CoreId(3), cl * 5), Some(LineId(20 + cl as u32)));
            assert_eq!(m.position(LineId(20 + cl as u32)), (CoreId(3), cl * 5));
        }
        assert_eq!(m.lookup(CoreId(3), 46), None, "past the shrunk range");
        // The whole space is shared: a core as big as all of it no longer fits.
        assert!(!m.add_core(CoreId(2), POSITIONS));
        assert!(!m.resize_core(CoreId(3), POSITIONS));
        assert_eq!(m.position(LineId(25)), (CoreId(3), 25));
        // Used now: core 3 at 0..46, core 1 at 150..151, core 0 at 151..1151.
        assert!(m.add_core(CoreId(2), POSITIONS - 1151));
        assert!(!m.add_core(CoreId(5), 105));
        assert!(m.add_core(CoreId(5), 104));
        // Removing a core frees its positions for the next one.
        for cl in 0..10u32 {
            m.remove(LineId(cl));
        }
        m.remove_core(CoreId(0));
        assert!(m.add_core(CoreId(4), 900));
        m.insert(LineId(0), CoreId(4), 899);
        assert_eq!(m.position(LineId(0)), (CoreId(4), 899));
        assert_eq!(m.lookup(CoreId(3), 0), Some(LineId(20)));
    }
}
