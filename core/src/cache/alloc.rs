//! Line allocation: the free list first, then eviction of a clean line by IO-class rules.
//!
//! Eviction order (Open CAS `ocf_space.c`): if the requester's class is at its allocation cap it
//! may only evict its own lines; otherwise classes over their cap go first (even pinned ones),
//! then classes whose priority number is >= the requester's, least important first, then the
//! requester's own class. Pinned classes are never evicted for another class below its cap.
//! Only clean lines are ever evicted (dirty lines are not on eviction lists), and lines locked by
//! a request or being written back are skipped.

use super::lock::{LockKind, lock_key};
use super::{Cache, View};
use crate::lists::TAG_EVICTION;
use crate::policy::{IO_CLASSES_MAX, position_key};
use crate::units::{CoreId, LineId};

impl Cache {
    /// The allocation share of `class` in percent (a class missing from the table: 100).
    pub(crate) fn class_allocation(&self, class: u8) -> u32 {
        self.classes
            .class(class)
            .map_or(100, |c| c.allocation_pct as u32)
    }

    /// The cap of `class` in lines.
    fn class_cap(&self, class: u8) -> u32 {
        ((self.cfg.lines as u64 * self.class_allocation(class) as u64) / 100) as u32
    }

    /// The priority of `class` (0 most important); pinned classes report `None`.
    fn class_priority(&self, class: u8) -> Option<u8> {
        match self.classes.class(class) {
            Some(c) => c.priority,
            None => Some(255),
        }
    }

    /// Recomputes the eviction order after the IO class table changed.
    pub(crate) fn rebuild_evict_order(&mut self) {
        let mut order: Vec<(u8, u8)> = (0..IO_CLASSES_MAX as u8)
            .filter_map(|c| self.class_priority(c).map(|p| (p, c)))
            .collect();
        // Least important (highest number) first; ties by class id, highest first.
        order.sort_by(|a, b| b.cmp(a));
        self.evict_order = order.into_iter().map(|(_, c)| c).collect();
    }

    /// Maps a line for `core_line` of `core` in `class`, evicting if needed. `None` if no line
    /// can be had; the caller goes pass-through and on-demand cleaning is requested.
    pub(crate) fn alloc_line(&mut self, class: u8, core: CoreId, core_line: u64) -> Option<LineId> {
        let line = match self.lists.back(self.free) {
            Some(l) if self.class_lines[class as usize] < self.class_cap(class) => {
                self.lists.unlink(l);
                LineId(l)
            }
            _ => match self.evict_for(class) {
                // A victim whose region has no durable write intent yet waits in limbo; this
                // allocation fails (pass-through) and a later one gets a line.
                Some(l) if self.intent_limbo(l) => {
                    self.intent_refused_alloc();
                    return None;
                }
                Some(l) => l,
                None => {
                    self.ondemand_clean = self.ondemand_clean.max(128);
                    return None;
                }
            },
        };
        self.map.insert(line, core, core_line);
        self.state.set(&mut self.lists, line, 0, 0);
        self.lists.set_class(line, class);
        self.class_lines[class as usize] += 1;
        self.eviction
            .insert(&mut self.lists, line, class, position_key(core, core_line));
        Some(line)
    }

    /// Evicts a clean line for a requester of `class` and returns it unmapped and unlinked.
    fn evict_for(&mut self, class: u8) -> Option<LineId> {
        #[cfg(feature = "canary-broken-eviction")]
        if let Some(l) = self.canary_evict_any() {
            return Some(l);
        }
        let own_only = self.class_lines[class as usize] >= self.class_cap(class);
        let mut candidates: Vec<u8> = Vec::new();
        if own_only {
            candidates.push(class);
        } else {
            for c in 0..IO_CLASSES_MAX as u8 {
                if c != class && self.class_lines[c as usize] > self.class_cap(c) {
                    candidates.push(c);
                }
            }
            let mine = self.class_priority(class).unwrap_or(0);
            for &c in &self.evict_order {
                if c != class
                    && self.class_priority(c).is_some_and(|p| p >= mine)
                    && !candidates.contains(&c)
                {
                    candidates.push(c);
                }
            }
            candidates.push(class);
        }
        for c in candidates {
            if self.class_lines[c as usize] == 0 {
                continue;
            }
            let view = View {
                map: &self.map,
                locks: &self.locks,
            };
            if let Some(l) = self.eviction.evict(&mut self.lists, c, &view) {
                debug_assert_eq!(self.state.dirty(l), 0, "eviction returned a dirty line");
                self.counters.evictions += 1;
                if self.lists.was_dirty(l) {
                    self.counters.evictions_formerly_dirty += 1;
                }
                self.unmap_line(l);
                return Some(l);
            }
        }
        None
    }

    /// Planted bug: evict whatever mapped, unlocked line the hand points at, dirty or not.
    #[cfg(feature = "canary-broken-eviction")]
    fn canary_evict_any(&mut self) -> Option<LineId> {
        for _ in 0..self.cfg.lines {
            self.canary_hand = (self.canary_hand + 1) % self.cfg.lines;
            let l = LineId(self.canary_hand);
            if self.map.is_mapped(l)
                && !crate::policy::LineView::busy(
                    &View {
                        map: &self.map,
                        locks: &self.locks,
                    },
                    l,
                )
            {
                let class = self.lists.class(l);
                if self.state.dirty(l) != 0 {
                    self.note_clean(l);
                } else {
                    self.eviction.remove(&mut self.lists, l, class);
                }
                self.counters.evictions += 1;
                self.unmap_line(l);
                return Some(l);
            }
        }
        None
    }

    /// Unmaps an unlinked line: mapping, state and class count. The line stays unlinked.
    fn unmap_line(&mut self, line: LineId) {
        self.intent_unmapping(line);
        let class = self.lists.class(line);
        self.class_lines[class as usize] -= 1;
        self.map.remove(line);
        self.state.reset(&mut self.lists, line);
        self.lists.set_field(line.0, TAG_EVICTION, 0);
    }

    /// Releases core lines `first..=last` of `core` taken as `kind`, and gives the eviction
    /// policy back any of their lines it parked while they were held.
    pub(crate) fn unlock_lines(&mut self, core: CoreId, first: u64, last: u64, kind: LockKind) {
        self.locks.unlock(core, first, last, kind);
        self.unpark(core, first, last);
    }

    /// Core lines `first..=last` of `core` were released (a lock or a writeback): each clean
    /// line of them that nothing holds any more goes back on its eviction list if it was
    /// parked (see `policy/eviction/mod.rs`). Costs nothing while no line is parked.
    pub(crate) fn unpark(&mut self, core: CoreId, first: u64, last: u64) {
        if self.eviction.parked() == 0 {
            return;
        }
        for cl in first..=last {
            if self.locks.busy(lock_key(core, cl)) {
                continue;
            }
            if let Some(l) = self.map.lookup(core, cl)
                && self.state.dirty(l) == 0
            {
                let class = self.lists.class(l);
                self.eviction.release(&mut self.lists, l, class);
            }
        }
    }

    /// Frees a mapped, clean line the caller holds: off its eviction list, unmapped, onto the
    /// free list.
    pub(crate) fn free_line(&mut self, line: LineId) {
        debug_assert_eq!(self.state.dirty(line), 0, "freeing a dirty line");
        let class = self.lists.class(line);
        let durable_dirty = self.lists.durable_dirty(line);
        self.eviction.remove(&mut self.lists, line, class);
        self.unmap_line(line);
        // A slot the persistent metadata may still name waits in limbo before reuse.
        if !self.meta_limbo(line, durable_dirty) && !self.intent_limbo(line) {
            self.lists.push_back(self.free, line.0);
        }
    }
}
