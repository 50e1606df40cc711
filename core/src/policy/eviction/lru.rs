//! LRU eviction: one list per IO class, most recently used at the front; a victim is the
//! least recently used line of its class that no request holds.
//!
//! A held line the walk meets is parked (see the module docs of [`crate::policy::eviction`])
//! and comes back at the back of its list when released, or at the front if touched first.
//!
//! Open CAS keeps LRU lists per partition too (its `ocf_lru`); the difference is that ours share
//! the per-line links with the cleaning policy (see [`crate::lists`]), so LRU adds no per-line
//! bytes of its own.

use crate::lists::{ListArena, ListId, TAG_EVICTION};
use crate::policy::eviction::{Eviction, OFF, Parked};
use crate::policy::{IO_CLASSES_MAX, LineView};
use crate::units::LineId;

/// Least-recently-used eviction, per IO class.
pub struct Lru {
    lists: Vec<ListId>,
    lens: Vec<u32>,
    parked: Parked,
}

impl Lru {
    /// Creates one list per IO class in `lists`.
    pub fn new(lists: &mut ListArena) -> Lru {
        Lru {
            lists: (0..IO_CLASSES_MAX).map(|_| lists.new_list()).collect(),
            lens: vec![0; IO_CLASSES_MAX],
            parked: Parked::new(lists),
        }
    }
}

impl Eviction for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, lists: &mut ListArena, line: LineId, class: u8, _key: u64) {
        lists.push_front(self.lists[class as usize], line.0);
        self.lens[class as usize] += 1;
    }

    fn touch(&mut self, lists: &mut ListArena, line: LineId, class: u8) {
        debug_assert!(lists.is_linked(line.0));
        self.parked.take(lists, line.0);
        lists.move_to_front(self.lists[class as usize], line.0);
    }

    fn remove(&mut self, lists: &mut ListArena, line: LineId, class: u8) {
        debug_assert!(lists.is_linked(line.0));
        self.parked.take(lists, line.0);
        lists.unlink(line.0);
        self.lens[class as usize] -= 1;
    }

    fn release(&mut self, lists: &mut ListArena, line: LineId, class: u8) {
        if self.parked.take(lists, line.0) {
            lists.push_back(self.lists[class as usize], line.0);
        }
    }

    fn parked(&self) -> u32 {
        self.parked.len()
    }

    fn evict(&mut self, lists: &mut ListArena, class: u8, view: &dyn LineView) -> Option<LineId> {
        let list = self.lists[class as usize];
        let mut cur = lists.back(list);
        while let Some(n) = cur {
            cur = lists.next_towards_back(list, n);
            if view.evictable(lists, LineId(n)) {
                lists.unlink(n);
                self.lens[class as usize] -= 1;
                debug_assert_eq!(lists.field(n, TAG_EVICTION) & OFF, 0);
                return Some(LineId(n));
            }
            if view.busy(LineId(n)) {
                self.parked.park(lists, n);
            }
        }
        None
    }

    fn len(&self, class: u8) -> u32 {
        self.lens[class as usize]
    }

    fn heap_bytes(&self) -> usize {
        self.lists.capacity() * std::mem::size_of::<ListId>() + self.lens.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::CoreId;

    struct View(Vec<bool>, std::cell::Cell<u32>);
    impl LineView for View {
        fn busy(&self, line: LineId) -> bool {
            self.1.set(self.1.get() + 1);
            self.0[line.0 as usize]
        }
        fn position(&self, line: LineId) -> (CoreId, u64) {
            (CoreId(0), line.0 as u64)
        }
        fn key(&self, line: LineId) -> u64 {
            line.0 as u64
        }
    }

    #[test]
    fn evicts_least_recent_not_busy_per_class() {
        let mut a = ListArena::new(8);
        let mut p = Lru::new(&mut a);
        for l in 0..4 {
            p.insert(&mut a, LineId(l), 0, 0);
        }
        p.insert(&mut a, LineId(5), 1, 0);
        p.touch(&mut a, LineId(0), 0);
        let mut v = View(vec![false; 8], Default::default());
        v.0[1] = true;
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(2)));
        assert!(!a.is_linked(2));
        assert_eq!(p.len(0), 3);
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(3)));
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(0)));
        assert_eq!(p.evict(&mut a, 0, &v), None, "only a busy line is left");
        assert_eq!(p.len(0), 1);
        p.remove(&mut a, LineId(1), 0);
        assert_eq!(p.len(0), 0);
        assert_eq!(p.evict(&mut a, 1, &v), Some(LineId(5)));
    }

    #[test]
    fn a_held_line_is_walked_past_once_and_returns_to_the_back_when_released() {
        let mut a = ListArena::new(16);
        let mut p = Lru::new(&mut a);
        for l in 0..12 {
            p.insert(&mut a, LineId(l), 0, 0);
        }
        // The eight oldest lines are held (a backlog of requests in flight on them).
        let mut v = View(vec![false; 16], Default::default());
        (0..8).for_each(|l| v.0[l] = true);
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(8)));
        assert_eq!(p.parked(), 8);
        let walked = v.1.get();
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(9)));
        assert_eq!(
            v.1.get() - walked,
            1,
            "the next walk starts past the parked lines"
        );
        assert_eq!(p.len(0), 10, "parked lines are still the policy's");
        // Line 3 is released: it goes to the back and is the next victim.
        v.0[3] = false;
        p.release(&mut a, LineId(3), 0);
        p.release(&mut a, LineId(10), 0); // not parked: nothing happens
        assert_eq!(p.parked(), 7);
        // Line 5 is touched while held (a hit completing): front of the list, not parked.
        p.touch(&mut a, LineId(5), 0);
        assert_eq!(p.parked(), 6);
        v.0[5] = false;
        p.release(&mut a, LineId(5), 0);
        // A parked line can be removed (it became dirty or was freed).
        p.remove(&mut a, LineId(6), 0);
        assert_eq!(p.parked(), 5);
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(3)));
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(10)));
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(11)));
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(5)));
        assert_eq!(p.evict(&mut a, 0, &v), None, "only held lines are left");
        for l in [0, 1, 2, 4, 7] {
            v.0[l] = false;
            p.release(&mut a, LineId(l as u32), 0);
        }
        assert_eq!(p.parked(), 0);
        let got: Vec<u32> = std::iter::from_fn(|| p.evict(&mut a, 0, &v).map(|l| l.0)).collect();
        assert_eq!(
            got,
            [7, 4, 2, 1, 0],
            "released lines come back at the back, in turn"
        );
        assert_eq!(p.len(0), 0);
    }
}
