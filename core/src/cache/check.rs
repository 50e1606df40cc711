//! Invariants, checked after every event in tests and with `strict-asserts`. Each failure names
//! the line and what is wrong. O(lines): meant for small test caches.

use super::Cache;
use crate::policy::IO_CLASSES_MAX;
use crate::units::LineId;

impl Cache {
    /// Panics if any invariant is broken.
    pub fn check_invariants(&self) {
        let mut mapped = 0u32;
        let mut dirty = 0u32;
        let mut dirty_per_core = vec![0u32; self.cores.len()];
        let mut per_class = [0u32; IO_CLASSES_MAX];
        for i in 0..self.cfg.lines {
            let l = LineId(i);
            let v = self.state.valid(l);
            let d = self.state.dirty(l);
            assert_eq!(d & !v, 0, "line {i}: dirty blocks that are not valid");
            if !self.map.is_mapped(l) {
                assert_eq!(v, 0, "line {i}: unmapped but has valid blocks");
                assert!(
                    self.lists.is_linked(i),
                    "line {i}: unmapped but not on the free list"
                );
                continue;
            }
            mapped += 1;
            per_class[self.lists.class(l) as usize] += 1;
            let (c, cl) = self.map.position(l);
            assert_eq!(
                self.map.lookup(c, cl),
                Some(l),
                "line {i}: mapping not consistent"
            );
            assert!(self.core(c).is_some(), "line {i}: mapped to a missing core");
            // A line holding no valid block is only mapped while a request that mapped it is
            // in flight (it frees it again if the request ends without filling it).
            assert!(
                v != 0 || self.locks.busy(super::lock::lock_key(c, cl)),
                "line {i}: mapped with no valid block and no request holding it"
            );
            if d != 0 {
                dirty += 1;
                dirty_per_core[c.0 as usize] += 1;
                let in_wb = self
                    .locks
                    .get(super::lock::lock_key(c, cl))
                    .is_some_and(|e| e.wb);
                assert!(
                    in_wb || self.lists.is_linked(i),
                    "line {i}: dirty but neither on a cleaning list nor being written back"
                );
            } else {
                assert!(
                    self.lists.is_linked(i),
                    "line {i}: clean and mapped but not evictable"
                );
            }
        }
        assert_eq!(mapped, self.map.mapped(), "mapped count");
        assert!(mapped <= self.cfg.lines, "occupancy above capacity");
        assert_eq!(dirty, self.dirty_lines, "dirty line count");
        for (i, c) in self.cores.iter().enumerate() {
            if let Some(c) = c {
                assert_eq!(c.dirty_lines, dirty_per_core[i], "dirty lines of core {i}");
            }
        }
        // Bypass only while the cache device is failing; a probe only then.
        let probes = self
            .ios
            .values()
            .filter(|o| matches!(o, super::IoOwner::Probe))
            .count();
        assert!(probes <= 1, "more than one probe in flight");
        assert_eq!(
            probes == 1,
            self.faults.cache.probe_in_flight,
            "probe bookkeeping"
        );
        assert!(
            !self.faults.cache.probe_in_flight || self.faults.cache.since.is_some(),
            "a probe of a device that is not failing"
        );
        assert_eq!(per_class, self.class_lines, "per-class line counts");
        for r in self.reqs.values() {
            if r.locked {
                assert!(
                    self.locks
                        .can_lock(r.core, r.first, r.last, super::lock::LockKind::Shared)
                        || r.lock != super::lock::LockKind::Shared,
                    "request {:?} holds a shared lock on a written line",
                    r.id
                );
            }
        }
        let slots_in_use: usize = self.jobs.values().map(|j| j.slots()).sum();
        assert_eq!(
            slots_in_use + self.free_slots.len(),
            self.cfg.pool_slots as usize,
            "staging slots leaked"
        );
        for c in self.cores.iter().flatten() {
            assert!(
                c.flush.durable_upto <= c.flush.writes_done,
                "core flush bookkeeping"
            );
        }
        // Every IO in flight belongs to a live request or job.
        for owner in self.ios.values() {
            match owner {
                super::IoOwner::Req { req, .. } => {
                    assert!(self.reqs.contains_key(req), "IO of a finished request")
                }
                super::IoOwner::Wb { job, .. } => {
                    assert!(self.jobs.contains_key(job), "IO of a finished job")
                }
                super::IoOwner::Meta { .. } | super::IoOwner::Probe => {}
            }
        }
        self.waits.check();
        for id in self.waits.ids() {
            assert!(
                self.reqs.contains_key(&id),
                "waiting request {id:?} has no record"
            );
        }
    }
}
