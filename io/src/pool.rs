//! A bounded, preallocated pool of IO buffers.
//!
//! One arena of `2^k` 4 KiB pages is allocated when the pool is made; [`BufPool::try_get`]
//! carves an [`AlignedBuf`] out of it with a buddy allocator (blocks of `2^order` pages, split on
//! the way down, merged with their buddy on the way back). The buffer goes back to the pool when
//! it is dropped, wherever that happens, so a pool can never leak: the arena itself is freed
//! when the pool and every buffer taken from it are gone.
//!
//! The pool never allocates after it is made. When it has no block large enough,
//! [`BufPool::try_get`] returns `None` and the caller waits for buffers in use to come back (the
//! engine queues the IO). A request larger than the whole arena can never be served from it:
//! [`BufPool::fits`] tells the caller to allocate such a buffer on its own.
//!
//! The bytes of a buffer from the pool are whatever its last user left there (the arena starts
//! zeroed): a buffer is for a device read that fills it or a write that was copied into it.

use crate::aligned::{ALIGN, AlignedBuf};
use std::alloc::Layout;
use std::collections::BTreeSet;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Bytes of the smallest block (one page, the alignment `O_DIRECT` needs).
const PAGE: usize = ALIGN;

/// What a pool holds and has handed out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Size of the arena in bytes.
    pub bytes: u64,
    /// Bytes of the arena in buffers now (whole blocks: a 12 KiB buffer holds 16 KiB).
    pub in_use: u64,
    /// The most bytes in use at once.
    pub peak: u64,
    /// Buffers handed out.
    pub gets: u64,
    /// Requests that found no free block large enough (the caller waited).
    pub exhausted: u64,
}

struct Buddy {
    /// Per order: the first page of every free block of `2^order` pages.
    free: Vec<BTreeSet<u32>>,
    stats: PoolStats,
}

/// The memory of a pool; buffers taken from it keep it alive.
pub(crate) struct Arena {
    base: NonNull<u8>,
    bytes: usize,
    max_order: u32,
    buddy: Mutex<Buddy>,
}

// SAFETY: the arena's memory is only reached through buffers that own disjoint blocks of it
// (the buddy allocator, under its mutex, never hands a page out twice), and through `base`
// for offset arithmetic.
unsafe impl Send for Arena {}
// SAFETY: as above; the only shared state is the mutex-protected allocator.
unsafe impl Sync for Arena {}

impl Arena {
    fn lock(&self) -> std::sync::MutexGuard<'_, Buddy> {
        self.buddy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives back the block at `ptr` of `cap` bytes (a power-of-two number of pages).
    pub(crate) fn release(&self, ptr: NonNull<u8>, cap: usize) {
        let off = ptr.as_ptr() as usize - self.base.as_ptr() as usize;
        debug_assert!(off % PAGE == 0 && off + cap <= self.bytes);
        let mut page = (off / PAGE) as u32;
        let mut order = (cap / PAGE).trailing_zeros();
        let mut b = self.lock();
        b.stats.in_use -= cap as u64;
        while order < self.max_order {
            let buddy = page ^ (1 << order);
            if !b.free[order as usize].remove(&buddy) {
                break;
            }
            page = page.min(buddy);
            order += 1;
        }
        let fresh = b.free[order as usize].insert(page);
        assert!(
            fresh,
            "buffer pool: block {page} of order {order} freed twice"
        );
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: base is the start of a mapping of `bytes` made by BufPool::new, and no
        // buffer is left (each holds an Arc of the arena).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}

/// A bounded pool of aligned IO buffers, allocated once. Cheap to clone (shared).
#[derive(Clone)]
pub struct BufPool {
    arena: Arc<Arena>,
}

impl std::fmt::Debug for BufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufPool({:?})", self.stats())
    }
}

impl BufPool {
    /// A pool of at least `bytes` (rounded up to a power of two, at least one page). The
    /// address space is reserved now and never grows; its pages are zero until first used.
    ///
    /// The arena is an anonymous private mapping, which the kernel fills with zero pages as
    /// they are first touched: a 64 MiB pool costs nothing until IO uses it. (A page-aligned
    /// `alloc_zeroed` writes every byte first: 35 ms at every engine start on this machine.)
    pub fn new(bytes: usize) -> BufPool {
        let pages = bytes.div_ceil(PAGE).max(1).next_power_of_two();
        let max_order = pages.trailing_zeros();
        let bytes = pages * PAGE;
        let layout = Layout::from_size_align(bytes, PAGE).expect("BufPool: size overflow");
        // SAFETY: a new anonymous mapping (no address hint, no file); checked below.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(layout)
        }
        // Huge pages where the kernel has them (fewer faults and TLB misses); a refusal is fine.
        // SAFETY: the range is the mapping just made.
        unsafe { libc::madvise(raw, bytes, libc::MADV_HUGEPAGE) };
        let Some(base) = NonNull::new(raw.cast::<u8>()) else {
            std::alloc::handle_alloc_error(layout)
        };
        let mut free = vec![BTreeSet::new(); max_order as usize + 1];
        free[max_order as usize].insert(0);
        BufPool {
            arena: Arc::new(Arena {
                base,
                bytes,
                max_order,
                buddy: Mutex::new(Buddy {
                    free,
                    stats: PoolStats {
                        bytes: bytes as u64,
                        ..PoolStats::default()
                    },
                }),
            }),
        }
    }

    /// Whether a buffer of `len` bytes can ever come from this pool (it is no larger than the
    /// arena).
    pub fn fits(&self, len: usize) -> bool {
        len <= self.arena.bytes
    }

    /// A buffer of `len` bytes (aligned to 4096; its bytes are what the last user left), or
    /// `None` if no free block is large enough now (or ever: see [`BufPool::fits`]). A
    /// zero-length buffer takes nothing from the pool.
    pub fn try_get(&self, len: usize) -> Option<AlignedBuf> {
        if len == 0 {
            return Some(AlignedBuf::new(0));
        }
        if !self.fits(len) {
            return None;
        }
        let pages = len.div_ceil(PAGE).next_power_of_two();
        let want = pages.trailing_zeros();
        let mut b = self.arena.lock();
        let Some(mut order) =
            (want..=self.arena.max_order).find(|&o| !b.free[o as usize].is_empty())
        else {
            b.stats.exhausted += 1;
            return None;
        };
        let page = b.free[order as usize]
            .pop_first()
            .expect("the order was found non-empty");
        while order > want {
            order -= 1;
            b.free[order as usize].insert(page + (1 << order));
        }
        let cap = pages * PAGE;
        b.stats.in_use += cap as u64;
        b.stats.peak = b.stats.peak.max(b.stats.in_use);
        b.stats.gets += 1;
        drop(b);
        // SAFETY: page < pages of the arena, so the offset stays inside the allocation.
        let ptr = unsafe { self.arena.base.add(page as usize * PAGE) };
        Some(AlignedBuf::from_arena(ptr, len, cap, self.arena.clone()))
    }

    /// The first `max` bytes of the arena (all of it if smaller): where small buffers come
    /// from first (the allocator hands out the lowest free block), so the part worth
    /// registering with an io_uring ([`crate::Ring::register_pool`]).
    pub(crate) fn front(&self, max: usize) -> (NonNull<u8>, usize) {
        (self.arena.base, max.min(self.arena.bytes))
    }

    /// Whether at most half of the arena is in buffers now.
    pub fn mostly_free(&self) -> bool {
        let b = self.arena.lock();
        b.stats.in_use * 2 <= b.stats.bytes
    }

    /// What the pool holds now.
    pub fn stats(&self) -> PoolStats {
        self.arena.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_disjoint_and_come_back() {
        let p = BufPool::new(64 << 10);
        assert_eq!(p.stats().bytes, 64 << 10);
        let mut bufs: Vec<AlignedBuf> = (0..16).map(|_| p.try_get(4096).unwrap()).collect();
        assert!(p.try_get(1).is_none(), "16 pages of 16 are out");
        assert_eq!(p.stats().exhausted, 1);
        for (i, b) in bufs.iter_mut().enumerate() {
            assert!(AlignedBuf::is_aligned(b.as_ptr()));
            b.fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.iter().all(|&x| x == i as u8),
                "buffer {i} was overwritten"
            );
        }
        bufs.clear();
        let s = p.stats();
        assert_eq!((s.in_use, s.peak, s.gets), (0, 64 << 10, 16));
        // Everything merged back: the whole arena in one buffer.
        let all = p
            .try_get(64 << 10)
            .expect("the blocks merged back into one");
        assert_eq!(all.len(), 64 << 10);
    }

    #[test]
    fn sizes_round_up_to_power_of_two_pages() {
        let p = BufPool::new(1 << 20);
        let a = p.try_get(12 << 10).unwrap();
        assert_eq!(a.len(), 12 << 10);
        assert_eq!(p.stats().in_use, 16 << 10);
        let b = p.try_get(512).unwrap();
        assert_eq!(p.stats().in_use, 20 << 10);
        drop((a, b));
        assert_eq!(p.stats().in_use, 0);
        assert!(!p.fits((1 << 20) + 1));
        assert!(p.try_get((1 << 20) + 1).is_none());
        assert_eq!(p.try_get(0).unwrap().len(), 0);
        assert_eq!(p.stats().in_use, 0, "empty buffers take nothing");
    }

    #[test]
    fn buffers_outlive_the_pool_handle() {
        let p = BufPool::new(8 << 10);
        let mut b = p.try_get(8 << 10).unwrap();
        drop(p);
        b.fill(3);
        assert!(b.iter().all(|&x| x == 3));
    }

    /// Random gets and drops against a model of which pages are out: never two buffers on
    /// one page, and once everything is back the arena is whole again.
    #[test]
    fn random_gets_and_drops_never_overlap() {
        let p = BufPool::new(256 << 10);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut live: Vec<AlignedBuf> = Vec::new();
        for _ in 0..20_000 {
            if next() % 3 != 0 || live.is_empty() {
                let len = (next() % (80 << 10)) as usize + 1;
                if let Some(b) = p.try_get(len) {
                    live.push(b);
                }
            } else {
                let i = next() as usize % live.len();
                live.swap_remove(i);
            }
            let mut spans: Vec<(usize, usize)> = live
                .iter()
                .map(|b| (b.as_ptr() as usize, b.len().div_ceil(PAGE) * PAGE))
                .collect();
            spans.sort_unstable();
            for w in spans.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "two buffers share a page");
            }
        }
        live.clear();
        assert_eq!(p.stats().in_use, 0);
        assert!(p.try_get(256 << 10).is_some());
    }
}
