//! Block status of a core (NBD `NBD_CMD_BLOCK_STATUS`, `base:allocation`): which of its blocks
//! are holes that read as zeros, as far as the cache and the core device know.
//!
//! The cache does not track holes or zeros itself: trims and write-zeroes go to the core (and
//! drop the cache's copy), so the core device's own allocation ([`Backend::extents`]:
//! `SEEK_HOLE`/`SEEK_DATA` for a file core; "all allocated" for the others) says where they
//! are. What the core does not have yet is the cache's dirty data: a block dirty in a lazy mode
//! (`wb`, `wo`) is reported allocated whatever the core says, and in mode `wl` a core with
//! anything in the log is reported allocated whole (the log's index is not asked).
//!
//! Order matters: the dirty blocks are read first, the core's holes second. A block not dirty
//! at the first look is on the core, and only a later client write can change that (which
//! the client ordered itself); were the core asked first, a writeback finishing in between
//! could land data in a hole and clean the block, and the hole would be reported over data.

use crate::Engine;
use tiercache_core::Machine;
use tiercache_core::event::ReqError;
use tiercache_core::units::BLOCK_BYTES;
use tiercache_core::units::{CoreId, mask_runs};
use tiercache_io::{Backend, Extent};

/// Most cache lines looked at in one query while the cache holds dirty data; a longer query
/// is answered for its first part (the client asks again from there).
const MAX_LINES: u64 = 1 << 16;

/// Dirty block runs `(first, end)` of `[lba, lba + blocks)`, in order, or `None` if the
/// whole range is to be taken as dirty; with the end of the range looked at.
type Dirty = (Option<Vec<(u64, u64)>>, u64);

fn dirty_runs(m: &Machine, core: CoreId, lba: u64, blocks: u64) -> Dirty {
    let end = lba + blocks;
    let c = match m {
        Machine::Wl(w) if w.dirty_blocks() > 0 => return (None, end),
        Machine::Wl(_) => return (Some(Vec::new()), end),
        Machine::Cache(c) => c,
    };
    if c.dirty_lines() == 0 {
        return (Some(Vec::new()), end);
    }
    let per_line = c.config().line_size.bytes() / BLOCK_BYTES;
    let first_line = lba / per_line;
    let last_line = (end - 1) / per_line;
    let stop_line = last_line.min(first_line + MAX_LINES - 1);
    let end = end.min((stop_line + 1) * per_line);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for line in first_line..=stop_line {
        let Some((_, _, dirty)) = c.line_state(core, line) else {
            continue;
        };
        for (start, len) in mask_runs(dirty) {
            let a = (line * per_line + start as u64).max(lba);
            let b = (line * per_line + (start + len) as u64).min(end);
            if a >= b {
                continue;
            }
            match runs.last_mut() {
                Some(r) if r.1 == a => r.1 = b,
                _ => runs.push((a, b)),
            }
        }
    }
    (Some(runs), end)
}

/// `ext` (runs from `lba`) with every block in `dirty` made allocated.
fn overlay(lba: u64, ext: &[Extent], dirty: &[(u64, u64)]) -> Vec<Extent> {
    let mut out = Vec::with_capacity(ext.len());
    let mut d = dirty.iter().peekable();
    let mut pos = lba;
    for e in ext {
        let end = pos + e.blocks;
        if !e.hole {
            Extent::push(&mut out, e.blocks, false);
            pos = end;
            continue;
        }
        while pos < end {
            // Dirty runs wholly before `pos` are done with.
            while d.peek().is_some_and(|r| r.1 <= pos) {
                d.next();
            }
            match d.peek() {
                Some(&&(a, b)) if a < end => {
                    let a = a.max(pos);
                    Extent::push(&mut out, a - pos, true);
                    let b = b.min(end);
                    Extent::push(&mut out, b - a, false);
                    pos = b;
                }
                _ => {
                    Extent::push(&mut out, end - pos, true);
                    pos = end;
                }
            }
        }
    }
    out
}

impl Engine {
    /// The allocation of blocks `[lba, lba + blocks)` of core `core`: consecutive runs from
    /// `lba`, covering at least its first block and at most `blocks` (a long query over a
    /// cache with dirty data, or over a very fragmented core file, is answered for its first
    /// part). A run marked [`Extent::hole`] reads as zeros and holds nothing the cache has not
    /// yet written to the core; where nothing is known, allocated (always correct). An error
    /// of the core's allocation query is answered as "allocated", not as an error.
    pub fn extents(&self, core: CoreId, lba: u64, blocks: u64) -> Result<Vec<Extent>, ReqError> {
        let dev = self.core_device(core).ok_or(ReqError::NoSuchCore)?;
        if lba.checked_add(blocks).is_none_or(|e| e > dev.blocks()) {
            return Err(ReqError::OutOfRange);
        }
        if blocks == 0 {
            return Ok(Vec::new());
        }
        // First what the cache holds that the core does not (see the module docs).
        let (dirty, end) = self.with_machine(|m| dirty_runs(m, core, lba, blocks));
        let Some(dirty) = dirty else {
            return Ok(Extent::allocated(blocks));
        };
        let ext = match dev.extents(lba, end - lba) {
            Ok(e) if !e.is_empty() => e,
            _ => Extent::allocated(end - lba),
        };
        Ok(overlay(lba, &ext, &dirty))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(blocks: u64, hole: bool) -> Extent {
        Extent { blocks, hole }
    }

    #[test]
    fn dirty_blocks_are_never_holes() {
        let ext = [e(10, true), e(5, false), e(10, true)];
        // Nothing dirty: as the core says.
        assert_eq!(overlay(100, &ext, &[]), ext.to_vec());
        // Dirty inside the first hole, across the data, and at the very end.
        let got = overlay(100, &ext, &[(102, 104), (108, 117), (124, 125)]);
        assert_eq!(
            got,
            vec![
                e(2, true),
                e(2, false),
                e(4, true),
                e(9, false), // 108..117, merged with the core's data 110..115
                e(7, true),
                e(1, false)
            ]
        );
        assert_eq!(got.iter().map(|x| x.blocks).sum::<u64>(), 25);
        // A dirty run covering everything.
        assert_eq!(overlay(100, &ext, &[(0, 1000)]), vec![e(25, false)]);
    }
}
