//! Buffers: the IO buffer pool (an IO waits, oldest first, when it has no room) and the
//! places a core's [`BufRef`] names (a request's buffer, the staging pool, metadata).

use super::*;
use tiercache_io::BLOCK;

impl Shared {
    /// A buffer of `blocks` for IO action `a` from the pool; `None` if `a` was queued to wait
    /// for room (or behind IOs already waiting: they go first).
    pub(crate) fn io_buf(&self, g: &mut Inner, a: &Action, blocks: u32) -> Option<AlignedBuf> {
        if let Some(b) = g.handoff.take() {
            return Some(b);
        }
        let len = blocks as usize * BLOCK;
        if !g.bufs.fits(len) {
            g.stats.buffer_oversize += 1;
            return Some(AlignedBuf::new(len));
        }
        let b = if g.starved.is_empty() {
            g.bufs.try_get(len)
        } else {
            None
        };
        if b.is_none() {
            g.stats.buffer_waits += 1;
            g.starved.push_back(a.clone());
        }
        b
    }

    /// Starts the IOs waiting for buffers that now fit, oldest first.
    pub(crate) fn retry_starved(&self, g: &mut Inner, events: &mut VecDeque<Event>) {
        while let Some(a) = g.starved.front() {
            let blocks = match a {
                Action::Read { blocks, .. } | Action::Write { blocks, .. } => *blocks,
                _ => unreachable!("only reads and writes wait for buffers"),
            };
            if g.dead {
                g.starved.clear();
                return;
            }
            let Some(b) = g.bufs.try_get(blocks as usize * BLOCK) else {
                return;
            };
            let a = g.starved.pop_front().expect("front exists");
            g.handoff = Some(b);
            self.execute(g, a, events);
            debug_assert!(g.handoff.is_none(), "the IO took its buffer");
        }
    }
}

pub(crate) fn buf_ref(g: &Inner, b: BufRef, blocks: u32) -> &[u8] {
    let len = blocks as usize * BLOCK;
    match b {
        BufRef::Req { req, offset } => {
            // A request's buffer is a source only after data was written into it (a write's
            // payload; a read's data on its way to the cache), so it exists (`Slot::data`).
            let s = offset as usize * BLOCK;
            &g.reqs[&req].buf[s..s + len]
        }
        BufRef::Pool { slot, offset } => {
            let s = offset as usize * BLOCK;
            &g.pool[slot as usize][s..s + len]
        }
        BufRef::Meta { id, offset } => {
            let s = offset as usize * BLOCK;
            &g.m.meta_buf(id)[s..s + len]
        }
    }
}

pub(crate) fn buf_mut(g: &mut Inner, b: BufRef, blocks: u32) -> &mut [u8] {
    buf_mut_in(&mut g.reqs, &mut g.pool, b, blocks)
}

/// [`buf_mut`] from the two places a writable buffer lives (so a device can be borrowed from
/// the engine's state beside it).
pub(crate) fn buf_mut_in<'a>(
    reqs: &'a mut tiercache_core::hash::FxHashMap<ReqId, Slot>,
    pool: &'a mut [AlignedBuf],
    b: BufRef,
    blocks: u32,
) -> &'a mut [u8] {
    let len = blocks as usize * BLOCK;
    match b {
        BufRef::Req { req, offset } => {
            let s = offset as usize * BLOCK;
            &mut reqs.get_mut(&req).expect("buffer of a live request").data()[s..s + len]
        }
        BufRef::Pool { slot, offset } => {
            let s = offset as usize * BLOCK;
            &mut pool[slot as usize][s..s + len]
        }
        BufRef::Meta { .. } => unreachable!("metadata buffers are write sources only"),
    }
}
