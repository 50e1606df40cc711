//! Requests waiting for line locks: one FIFO queue per locked core line, so that a wake-up
//! retries only the requests the released lines could unblock (docs/ARCHITECTURE.md,
//! "Concurrency inside the core").
//!
//! The rules are those of a single arrival-ordered list: a waiting request starts when its
//! lines can be locked and no earlier waiting request overlaps it, and requests start in queue
//! order. Every waiting request has a place in that order (`seq`); it stands in the queue of
//! each core line it covers, and "no earlier waiting request overlaps it" is "it is at the
//! front of every one of its queues". Which requests can have become startable since the last
//! retry is known from the lock table: a request becomes lockable only when one of its lines
//! is unlocked or its writeback ends ([`LockTable::take_released`] names those lines while
//! anyone waits), and it becomes the front of its queues only when the request before it
//! starts, which happens during a retry and is followed there. A retry therefore looks at the
//! fronts of the released lines' queues, in queue order, and costs what it starts, not the
//! length of the queue (it was a scan of the whole list on every wake-up: quadratic when
//! clients outrun a slow core).
//!
//! [`LockTable::take_released`]: super::lock::LockTable::take_released

use super::lock::lock_key;
use crate::hash::FxHashMap;
use crate::units::{CoreId, ReqId};
use std::collections::VecDeque;

/// A waiting request's place in the queue order and the core lines it covers.
#[derive(Clone, Copy, Debug)]
struct Place {
    seq: u64,
    core: CoreId,
    first: u64,
    last: u64,
}

impl Place {
    fn new(seq: u64, core: CoreId, first: u64, last: u64) -> Place {
        Place {
            seq,
            core,
            first,
            last,
        }
    }
}

/// The lock-wait queues (see the module docs).
#[derive(Debug)]
pub(crate) struct WaitQueues {
    /// Per lock key, the waiting requests covering that line, in queue order.
    lines: FxHashMap<u64, VecDeque<(u64, ReqId)>>,
    /// Every waiting request.
    places: FxHashMap<ReqId, Place>,
    /// The next place at the back, and the last one given at the front (they grow apart from
    /// the middle of the range, so both ends have room for any run).
    back: u64,
    front: u64,
}

impl Default for WaitQueues {
    fn default() -> Self {
        WaitQueues {
            lines: FxHashMap::default(),
            places: FxHashMap::default(),
            back: 1 << 63,
            front: 1 << 63,
        }
    }
}

impl WaitQueues {
    /// Whether nobody waits.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// Whether a waiting request covers core lines `first..=last` of `core` (an arriving
    /// request overlapping one must queue behind it).
    pub(crate) fn overlaps(&self, core: CoreId, first: u64, last: u64) -> bool {
        !self.is_empty() && (first..=last).any(|cl| self.lines.contains_key(&lock_key(core, cl)))
    }

    /// Queues `id` (covering `first..=last` of `core`) behind every waiting request.
    pub(crate) fn push_back(&mut self, id: ReqId, core: CoreId, first: u64, last: u64) {
        let seq = self.back;
        self.back += 1;
        self.insert(id, Place::new(seq, core, first, last), false);
    }

    /// Queues `id` ahead of every waiting request.
    pub(crate) fn push_front(&mut self, id: ReqId, core: CoreId, first: u64, last: u64) {
        self.front -= 1;
        self.insert(id, Place::new(self.front, core, first, last), true);
    }

    fn insert(&mut self, id: ReqId, p: Place, front: bool) {
        let old = self.places.insert(id, p);
        assert!(old.is_none(), "request {id:?} queued twice");
        for cl in p.first..=p.last {
            let q = self.lines.entry(lock_key(p.core, cl)).or_default();
            if front {
                q.push_front((p.seq, id));
            } else {
                q.push_back((p.seq, id));
            }
        }
    }

    /// The first request in the queue of lock key `key`, with its place.
    #[inline]
    pub(crate) fn front_of(&self, key: u64) -> Option<(u64, ReqId)> {
        self.lines.get(&key).and_then(|q| q.front().copied())
    }

    /// The place of waiting request `id`.
    #[inline]
    pub(crate) fn seq(&self, id: ReqId) -> Option<u64> {
        self.places.get(&id).map(|p| p.seq)
    }

    /// Whether `id` waits and no earlier waiting request overlaps it.
    pub(crate) fn is_first(&self, id: ReqId) -> bool {
        let Some(p) = self.places.get(&id) else {
            return false;
        };
        (p.first..=p.last).all(|cl| self.front_of(lock_key(p.core, cl)).map(|f| f.1) == Some(id))
    }

    /// Takes `id`, which [`WaitQueues::is_first`], out of the queues; the requests that come
    /// first in its lines' queues now go to `next`.
    pub(crate) fn remove_first(&mut self, id: ReqId, next: &mut impl FnMut(u64, ReqId)) {
        let p = self.places.remove(&id).expect("a waiting request");
        for cl in p.first..=p.last {
            let key = lock_key(p.core, cl);
            let q = self.lines.get_mut(&key).expect("a queue per covered line");
            let head = q.pop_front();
            assert_eq!(head.map(|h| h.1), Some(id), "removed from the front only");
            match q.front() {
                Some(&(s, r)) => next(s, r),
                None => {
                    self.lines.remove(&key);
                }
            }
        }
    }

    /// The waiting requests, in no order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = ReqId> + '_ {
        self.places.keys().copied()
    }

    /// Checks the queues against each other (tests: after every event).
    pub(crate) fn check(&self) {
        let mut seen = 0usize;
        for (key, q) in &self.lines {
            assert!(!q.is_empty(), "an empty queue is dropped");
            for w in q.iter().zip(q.iter().skip(1)) {
                assert!(w.0.0 < w.1.0, "queue {key:#x} out of order");
            }
            for &(s, id) in q {
                let p = self.places.get(&id).expect("a queued request has a place");
                assert_eq!(p.seq, s, "place of {id:?}");
                seen += 1;
            }
        }
        let want: u64 = self.places.values().map(|p| p.last - p.first + 1).sum();
        assert_eq!(
            seen as u64, want,
            "each request stands once in each of its lines"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn firsts(w: &WaitQueues, ids: &[u64]) -> Vec<u64> {
        ids.iter()
            .copied()
            .filter(|&i| w.is_first(ReqId(i)))
            .collect()
    }

    #[test]
    fn fronts_follow_arrival_order_per_line() {
        let c = CoreId(0);
        let mut w = WaitQueues::default();
        w.push_back(ReqId(1), c, 0, 1); // lines 0-1
        w.push_back(ReqId(2), c, 1, 2); // behind 1 on line 1
        w.push_back(ReqId(3), c, 2, 2); // behind 2 on line 2: may not overtake it
        w.push_back(ReqId(4), c, 5, 5); // alone
        w.check();
        assert!(w.overlaps(c, 2, 3) && !w.overlaps(c, 3, 4));
        assert!(!w.overlaps(CoreId(1), 0, 9), "other cores are other lines");
        assert_eq!(firsts(&w, &[1, 2, 3, 4]), [1, 4]);
        let mut next = Vec::new();
        w.remove_first(ReqId(1), &mut |s, id| next.push((s, id.0)));
        assert_eq!(next.iter().map(|n| n.1).collect::<Vec<_>>(), [2]);
        assert_eq!(firsts(&w, &[2, 3, 4]), [2, 4]);
        // A request sent back to the front goes ahead of everything on its lines.
        w.push_front(ReqId(5), c, 2, 2);
        w.check();
        assert_eq!(firsts(&w, &[2, 3, 4, 5]), [4, 5]);
        assert!(w.seq(ReqId(5)) < w.seq(ReqId(2)));
        next.clear();
        w.remove_first(ReqId(5), &mut |s, id| next.push((s, id.0)));
        assert_eq!(next.iter().map(|n| n.1).collect::<Vec<_>>(), [2]);
        w.remove_first(ReqId(2), &mut |_, _| {});
        w.remove_first(ReqId(3), &mut |_, _| {});
        w.remove_first(ReqId(4), &mut |_, _| {});
        w.check();
        assert!(w.is_empty() && w.lines.is_empty());
        assert_eq!(w.seq(ReqId(1)), None);
    }

    #[test]
    #[should_panic(expected = "front only")]
    fn only_the_first_leaves() {
        let c = CoreId(0);
        let mut w = WaitQueues::default();
        w.push_back(ReqId(1), c, 0, 0);
        w.push_back(ReqId(2), c, 0, 0);
        w.remove_first(ReqId(2), &mut |_, _| {});
    }
}
