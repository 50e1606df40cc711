//! Turning a planned request into device IOs: the runs of its parts (contiguous pieces of one
//! device, merged as they are added) and the reads and writes that carry them. Part of the
//! request path (`request.rs`).

use super::request::Request;
use super::{Cache, IoKind, IoOwner};
use crate::event::{Action, BufRef, Dev};
use crate::units::{BlockMask, Lba, LineId, mask_runs};

/// Which way a request's device IO goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    Read,
    Write { fua: bool },
}

/// A contiguous device IO being assembled from parts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub(crate) dev: Dev,
    pub(crate) lba: u64,
    pub(crate) buf_off: u32,
    pub(crate) blocks: u32,
}

/// Two run builders (cache and core) that merge contiguous pieces.
pub(crate) struct Runs {
    cache: Option<Run>,
    core: Option<Run>,
    out: Vec<Run>,
}

impl Runs {
    /// A builder writing into `out` (cleared).
    pub(crate) fn new(mut out: Vec<Run>) -> Runs {
        out.clear();
        Runs {
            cache: None,
            core: None,
            out,
        }
    }

    pub(crate) fn add(&mut self, run: Run) {
        let slot = if run.dev == Dev::Cache {
            &mut self.cache
        } else {
            &mut self.core
        };
        if let Some(cur) = slot
            && cur.lba + cur.blocks as u64 == run.lba
            && cur.buf_off + cur.blocks == run.buf_off
        {
            cur.blocks += run.blocks;
            return;
        }
        if let Some(prev) = slot.replace(run) {
            self.out.push(prev);
        }
    }
    pub(crate) fn finish(mut self) -> Vec<Run> {
        self.out.extend(self.cache.take());
        self.out.extend(self.core.take());
        self.out
    }
}

impl Cache {
    /// Buffer offset (blocks into the request's buffer) of block `b` of core line `cl`.
    #[inline]
    fn buf_off(&self, r: &Request, cl: u64, b: u32) -> u32 {
        ((cl << self.shift) + b as u64 - r.lba) as u32
    }

    /// Adds the runs of `mask` in part `i` of `r` to `runs`, for `dev`.
    pub(crate) fn add_runs(
        &self,
        r: &Request,
        i: usize,
        mask: BlockMask,
        dev: Dev,
        runs: &mut Runs,
    ) {
        let cl = r.first + i as u64;
        for (b, n) in mask_runs(mask) {
            let lba = match dev {
                Dev::Cache => self.cache_lba(r.parts[i].line.expect("mapped"), b).0,
                Dev::Core(_) => (cl << self.shift) + b as u64,
            };
            runs.add(Run {
                dev,
                lba,
                buf_off: self.buf_off(r, cl, b),
                blocks: n,
            });
        }
    }

    /// Issues the device IOs of `runs` (then keeps the vector for the next plan).
    pub(crate) fn issue_runs(
        &mut self,
        r: &mut Request,
        runs: Vec<Run>,
        dir: Dir,
        actions: &mut Vec<Action>,
    ) {
        for &run in &runs {
            self.issue(r, run, dir, actions);
        }
        self.runs_buf = runs;
    }

    /// Issues one device IO of `r`.
    #[inline]
    pub(crate) fn issue(&mut self, r: &mut Request, run: Run, dir: Dir, actions: &mut Vec<Action>) {
        let kind = match (dir, run.dev) {
            (Dir::Read, Dev::Cache) => IoKind::CacheRead,
            (Dir::Read, Dev::Core(_)) => IoKind::CoreRead,
            (Dir::Write { .. }, Dev::Cache) => IoKind::CacheWrite,
            (Dir::Write { .. }, Dev::Core(_)) => IoKind::CoreWrite,
        };
        let io = self.new_io(IoOwner::Req { req: r.id, kind });
        let c = &mut self.counters;
        *match (dir, run.dev) {
            (Dir::Read, Dev::Cache) => &mut c.cache_blocks_read,
            (Dir::Read, Dev::Core(_)) => &mut c.core_blocks_read,
            (Dir::Write { .. }, Dev::Cache) => &mut c.cache_blocks_written,
            (Dir::Write { .. }, Dev::Core(_)) => &mut c.core_blocks_written,
        } += run.blocks as u64;
        let buf = BufRef::Req {
            req: r.id,
            offset: run.buf_off,
        };
        actions.push(match dir {
            Dir::Read => Action::Read {
                io,
                dev: run.dev,
                lba: Lba(run.lba),
                blocks: run.blocks,
                buf,
            },
            Dir::Write { fua } => Action::Write {
                io,
                dev: run.dev,
                lba: Lba(run.lba),
                blocks: run.blocks,
                buf,
                fua,
            },
        });
        r.pending += 1;
    }

    /// The one cache IO of a request within one mapped line whose blocks `mask` (contiguous,
    /// as every part's mask is) all go to or come from the cache: what the run builder would
    /// produce, without it.
    #[inline]
    pub(crate) fn single_cache_run(&self, r: &Request, line: LineId, mask: BlockMask) -> Run {
        let b = mask.trailing_zeros();
        Run {
            dev: Dev::Cache,
            lba: self.cache_lba(line, b).0,
            buf_off: self.buf_off(r, r.first, b),
            blocks: mask.count_ones(),
        }
    }
}
