//! Line locks: the core's concurrency control between client requests and writeback.
//!
//! Keyed by (core, core line), not by cache line, because unmapped lines need ordering too
//! (a pass-through write and a read miss of the same core line). Only lines that are locked or
//! being written back have an entry, so this costs nothing per cache line.
//!
//! Rules (see docs/ARCHITECTURE.md, "Concurrency inside the core"):
//! - A full-hit read takes the lines shared; every other request takes them exclusive.
//! - Writeback does not take the lock. It marks the line `wb` and records in `wb_mask` the
//!   dirty blocks it is copying to the core. A client write landing on the cache meanwhile
//!   clears its blocks from `wb_mask` *when it is submitted*, so writeback never marks a block
//!   clean whose cache copy may differ from what reached the core.
//! - A request that writes the core (write-through, write-invalidate, trim, write-zeroes) waits
//!   until no writeback is in flight on its lines, so an older writeback can never overtake it
//!   on the core (SPEC durability point 4).

use crate::hash::FxHashMap;
use crate::units::{BlockMask, CoreId};
use std::collections::hash_map::Entry;

/// Lock table key for (core, core line).
#[inline]
pub fn lock_key(core: CoreId, core_line: u64) -> u64 {
    ((core.0 as u64) << 48) | core_line
}

/// The state of one locked or written-back core line.
#[derive(Clone, Copy, Debug, Default)]
pub struct LockEntry {
    /// Requests holding the line shared.
    pub readers: u32,
    /// A request holds the line exclusive.
    pub writer: bool,
    /// A writeback of this line is in flight.
    pub wb: bool,
    /// Blocks the in-flight writeback may mark clean.
    pub wb_mask: BlockMask,
}

impl LockEntry {
    fn unused(&self) -> bool {
        self.readers == 0 && !self.writer && !self.wb
    }
}

/// The lock table.
#[derive(Default, Debug)]
pub struct LockTable {
    map: FxHashMap<u64, LockEntry>,
    /// While requests wait for locks: the keys released since they were last retried (an
    /// unlock or the end of a writeback; duplicates allowed). See `wait.rs`.
    released: Vec<u64>,
    recording: bool,
}

/// How a request wants its lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// Shared (full-hit reads).
    Shared,
    /// Exclusive, cache only: may overlap a writeback in flight.
    Exclusive,
    /// Exclusive and no writeback in flight (requests that write the core).
    ExclusiveNoWb,
}

impl LockTable {
    /// The entry for `key`, if any.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&LockEntry> {
        self.map.get(&key)
    }

    /// The entry for `key`, created if absent.
    #[inline]
    pub fn entry(&mut self, key: u64) -> &mut LockEntry {
        self.map.entry(key).or_default()
    }

    /// Drops the entry for `key` if nothing holds it.
    #[inline]
    pub fn tidy(&mut self, key: u64) {
        if self.map.get(&key).is_some_and(|e| e.unused()) {
            self.map.remove(&key);
        }
    }

    /// Whether core lines `first..=last` of `core` can be taken as `kind`.
    pub fn can_lock(&self, core: CoreId, first: u64, last: u64, kind: LockKind) -> bool {
        (first..=last).all(|cl| {
            self.map
                .get(&lock_key(core, cl))
                .is_none_or(|e| Self::allows(e, kind))
        })
    }

    /// Whether an entry allows taking its line as `kind`.
    #[inline]
    fn allows(e: &LockEntry, kind: LockKind) -> bool {
        match kind {
            LockKind::Shared => !e.writer,
            LockKind::Exclusive => !e.writer && e.readers == 0,
            LockKind::ExclusiveNoWb => !e.writer && e.readers == 0 && !e.wb,
        }
    }

    /// Marks an entry taken as `kind` (which it must allow).
    #[inline]
    fn take(e: &mut LockEntry, kind: LockKind) {
        match kind {
            LockKind::Shared => {
                assert!(!e.writer);
                e.readers += 1;
            }
            LockKind::Exclusive | LockKind::ExclusiveNoWb => {
                assert!(!e.writer && e.readers == 0);
                e.writer = true;
            }
        }
    }

    /// Takes core lines `first..=last` of `core` as `kind`; `can_lock` must hold.
    pub fn lock(&mut self, core: CoreId, first: u64, last: u64, kind: LockKind) {
        for cl in first..=last {
            Self::take(self.entry(lock_key(core, cl)), kind);
        }
    }

    /// `can_lock` and, if it holds, `lock`: true if the lines were taken. A request within
    /// one line (the common case) costs one probe of the table instead of two.
    #[inline]
    pub fn try_lock(&mut self, core: CoreId, first: u64, last: u64, kind: LockKind) -> bool {
        if first != last {
            if !self.can_lock(core, first, last, kind) {
                return false;
            }
            self.lock(core, first, last, kind);
            return true;
        }
        match self.map.entry(lock_key(core, first)) {
            Entry::Vacant(v) => {
                Self::take(v.insert(LockEntry::default()), kind);
                true
            }
            Entry::Occupied(mut o) => {
                let e = o.get_mut();
                if !Self::allows(e, kind) {
                    return false;
                }
                Self::take(e, kind);
                true
            }
        }
    }

    /// Releases core lines `first..=last` of `core` taken as `kind` (one probe per line; the
    /// entry goes when nothing holds it any more).
    pub fn unlock(&mut self, core: CoreId, first: u64, last: u64, kind: LockKind) {
        for cl in first..=last {
            let Entry::Occupied(mut o) = self.map.entry(lock_key(core, cl)) else {
                panic!("unlock of a line not locked");
            };
            let e = o.get_mut();
            match kind {
                LockKind::Shared => {
                    assert!(e.readers > 0);
                    e.readers -= 1;
                }
                LockKind::Exclusive | LockKind::ExclusiveNoWb => {
                    assert!(e.writer);
                    e.writer = false;
                }
            }
            if e.unused() {
                o.remove();
            }
            if self.recording {
                self.released.push(lock_key(core, cl));
            }
        }
    }

    /// Ends the writeback of line `key`: returns the blocks it may mark clean.
    pub fn end_wb(&mut self, key: u64) -> BlockMask {
        let e = self.entry(key);
        let mask = e.wb_mask;
        e.wb = false;
        e.wb_mask = 0;
        self.tidy(key);
        if self.recording {
            self.released.push(key);
        }
        mask
    }

    /// Records released keys (while requests wait) or stops and forgets them.
    #[inline]
    pub(crate) fn record_releases(&mut self, on: bool) {
        if self.recording != on {
            self.recording = on;
            if !on {
                self.released.clear();
            }
        }
    }

    /// Names `key` as released (a retry will look at its queue).
    pub(crate) fn note_released(&mut self, key: u64) {
        if self.recording {
            self.released.push(key);
        }
    }

    /// The keys released since the last call, moved to `into` (cleared first).
    pub(crate) fn take_released(&mut self, into: &mut Vec<u64>) {
        into.clear();
        std::mem::swap(into, &mut self.released);
    }

    /// Whether any writeback is in flight on core lines `first..=last` of `core`.
    pub fn any_wb(&self, core: CoreId, first: u64, last: u64) -> bool {
        (first..=last).any(|cl| self.map.get(&lock_key(core, cl)).is_some_and(|e| e.wb))
    }

    /// Whether the line is held or written back (a policy must not pick it).
    #[inline]
    pub fn busy(&self, key: u64) -> bool {
        self.map.get(&key).is_some_and(|e| !e.unused())
    }

    /// Entries in the table.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
