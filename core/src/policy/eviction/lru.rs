//! LRU eviction: one list per IO class, most recently used at the front; a victim is the
//! least recently used line of its class that no request holds.
//!
//! Open CAS keeps LRU lists per partition too (its `ocf_lru`); the difference is that ours share
//! the per-line links with the cleaning policy (see [`crate::lists`]), so LRU adds no per-line
//! bytes of its own.

use crate::lists::{ListArena, ListId};
use crate::policy::eviction::Eviction;
use crate::policy::{IO_CLASSES_MAX, LineView};
use crate::units::LineId;

/// Least-recently-used eviction, per IO class.
pub struct Lru {
    lists: Vec<ListId>,
    lens: Vec<u32>,
}

impl Lru {
    /// Creates one list per IO class in `lists`.
    pub fn new(lists: &mut ListArena) -> Lru {
        Lru {
            lists: (0..IO_CLASSES_MAX).map(|_| lists.new_list()).collect(),
            lens: vec![0; IO_CLASSES_MAX],
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
        lists.move_to_front(self.lists[class as usize], line.0);
    }

    fn remove(&mut self, lists: &mut ListArena, line: LineId, class: u8) {
        debug_assert!(lists.is_linked(line.0));
        lists.unlink(line.0);
        self.lens[class as usize] -= 1;
    }

    fn evict(&mut self, lists: &mut ListArena, class: u8, view: &dyn LineView) -> Option<LineId> {
        let list = self.lists[class as usize];
        let mut cur = lists.back(list);
        while let Some(n) = cur {
            if view.evictable(lists, LineId(n)) {
                lists.unlink(n);
                self.lens[class as usize] -= 1;
                return Some(LineId(n));
            }
            cur = lists.next_towards_back(list, n);
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

    struct View(Vec<bool>);
    impl LineView for View {
        fn busy(&self, line: LineId) -> bool {
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
        let mut v = View(vec![false; 8]);
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
}
