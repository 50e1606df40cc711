//! The log index: for each core, which log entry holds the newest data of each block range.
//!
//! Extents never overlap inside a core. Inserting a newer entry cuts older extents around it;
//! retiring an entry removes only the parts that still point at it (a newer entry may have
//! replaced the rest).

use std::collections::BTreeMap;

/// Where an extent's data is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Src {
    /// In the ring, starting at this virtual ring position (blocks).
    Log {
        /// Virtual ring position of the extent's first block.
        data_pos: u64,
    },
    /// Zeros (a TRIM or WRITE_ZEROES).
    Zero,
}

/// One extent of the index.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Ext {
    /// First block after the extent.
    pub end: u64,
    /// Sequence number of the entry.
    pub seq: u64,
    /// Virtual ring position of the entry's header (what a reader pins).
    pub hdr_pos: u64,
    /// Where the data is.
    pub src: Src,
}

impl Ext {
    /// This extent with its first `by` blocks cut off.
    fn advanced(self, by: u64) -> Ext {
        Ext {
            src: match self.src {
                Src::Log { data_pos } => Src::Log {
                    data_pos: data_pos + by,
                },
                Src::Zero => Src::Zero,
            },
            ..self
        }
    }
}

/// A piece of a lookup: `len` blocks at `offset` from the start of the range looked up.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset from the start of the range looked up.
    pub offset: u64,
    /// Length in blocks.
    pub len: u64,
    /// Entry sequence number.
    pub seq: u64,
    /// Entry header position (for pinning).
    pub hdr_pos: u64,
    /// Where this piece's data is.
    pub src: Src,
}

/// The index over every core.
#[derive(Default, Debug)]
pub struct Index {
    cores: Vec<BTreeMap<u64, Ext>>,
    blocks: u64,
}

impl Index {
    fn core(&mut self, core: u16) -> &mut BTreeMap<u64, Ext> {
        let i = core as usize;
        if self.cores.len() <= i {
            self.cores.resize_with(i + 1, BTreeMap::new);
        }
        &mut self.cores[i]
    }

    /// Blocks covered by the index.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Every extent: (core, first block, extent), by core and block (for the invariant
    /// checks).
    pub(super) fn extents(&self) -> impl Iterator<Item = (u16, u64, &Ext)> + '_ {
        self.cores
            .iter()
            .enumerate()
            .flat_map(|(c, m)| m.iter().map(move |(&s, x)| (c as u16, s, x)))
    }

    /// Removes every part of `[start, end)` from the core's map, returning the removed pieces'
    /// extents (start, ext) so a caller can filter what it puts back.
    fn cut(&mut self, core: u16, start: u64, end: u64) -> Vec<(u64, Ext)> {
        let m = self.core(core);
        let mut hit: Vec<u64> = Vec::new();
        if let Some((&s, e)) = m.range(..start).next_back()
            && e.end > start
        {
            hit.push(s);
        }
        hit.extend(m.range(start..end).map(|(&s, _)| s));
        let mut removed = Vec::new();
        let mut freed = 0;
        for s in hit {
            let e = m.remove(&s).expect("present");
            // Keep what lies outside [start, end).
            if s < start {
                m.insert(s, Ext { end: start, ..e });
            }
            if e.end > end {
                m.insert(end, e.advanced(end - s));
            }
            let (a, b) = (s.max(start), e.end.min(end));
            freed += b - a;
            removed.push((a, Ext { end: b, ..e }.advanced(a - s)));
        }
        self.blocks -= freed;
        removed
    }

    /// Makes `[start, end)` point at a new entry.
    pub fn insert(&mut self, core: u16, start: u64, end: u64, seq: u64, hdr_pos: u64, src: Src) {
        debug_assert!(start < end);
        for (_, old) in self.cut(core, start, end) {
            debug_assert!(old.seq < seq, "an older entry replaced a newer one");
        }
        self.core(core).insert(
            start,
            Ext {
                end,
                seq,
                hdr_pos,
                src,
            },
        );
        self.blocks += end - start;
    }

    /// Removes the parts of `[start, end)` that still point at entry `seq`.
    pub fn retire(&mut self, core: u16, start: u64, end: u64, seq: u64) {
        for (s, e) in self.cut(core, start, end) {
            if e.seq != seq {
                let len = e.end - s;
                self.core(core).insert(s, e);
                self.blocks += len;
            }
        }
    }

    /// The pieces of `[start, end)` the index covers, in order.
    pub fn lookup(&self, core: u16, start: u64, end: u64) -> Vec<Piece> {
        let Some(m) = self.cores.get(core as usize) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let first = m
            .range(..start)
            .next_back()
            .filter(|(_, e)| e.end > start)
            .map(|(&s, &e)| (s, e));
        for (s, e) in first
            .into_iter()
            .chain(m.range(start..end).map(|(&s, &e)| (s, e)))
        {
            let (a, b) = (s.max(start), e.end.min(end));
            let e = e.advanced(a - s);
            out.push(Piece {
                offset: a - start,
                len: b - a,
                seq: e.seq,
                hdr_pos: e.hdr_pos,
                src: e.src,
            });
        }
        out
    }

    /// Drops everything of one core (invalidate).
    pub fn clear_core(&mut self, core: u16) -> u64 {
        let m = self.core(core);
        let n: u64 = m.iter().map(|(&s, e)| e.end - s).sum();
        m.clear();
        self.blocks -= n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(p: u64) -> Src {
        Src::Log { data_pos: p }
    }

    #[test]
    fn insert_cut_retire_lookup() {
        let mut ix = Index::default();
        ix.insert(0, 10, 20, 1, 100, log(101));
        ix.insert(0, 15, 18, 2, 200, Src::Zero);
        assert_eq!(ix.blocks(), 10);
        let p = ix.lookup(0, 0, 30);
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].offset, p[0].len, p[0].src), (10, 5, log(101)));
        assert_eq!((p[1].offset, p[1].len, p[1].src), (15, 3, Src::Zero));
        assert_eq!((p[2].offset, p[2].len, p[2].src), (18, 2, log(109)));
        // Lookup starting inside an extent.
        let p = ix.lookup(0, 12, 16);
        assert_eq!((p[0].offset, p[0].len, p[0].src), (0, 3, log(103)));
        assert_eq!((p[1].offset, p[1].len), (3, 1));
        // Retiring entry 1 leaves entry 2's part.
        ix.retire(0, 10, 20, 1);
        let p = ix.lookup(0, 0, 30);
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].offset, p[0].len, p[0].seq), (15, 3, 2));
        assert_eq!(ix.blocks(), 3);
        ix.retire(0, 15, 18, 2);
        assert_eq!(ix.blocks(), 0);
        assert!(ix.lookup(0, 0, 100).is_empty());
        assert!(ix.lookup(7, 0, 100).is_empty());
    }
}
