//! `alru` cleaning (Open CAS's default): write back the least recently dirtied lines once they
//! are older than `staleness_time`, `flush_max_buffers` at a time, but only while the cache has
//! been idle for `activity_threshold`; with nothing to do, sleep `wake_up`.
//!
//! Open CAS keeps a timestamp per line (4 bytes) for the staleness test. We keep none: the one
//! dirty list (most recently dirtied at the front) is interleaved with **time markers**, extra
//! list nodes stamped with the time they were inserted. A marker goes in front of the list at
//! most once per *granularity* (`staleness_time / 32`, at least 1 ms), so every line behind a
//! marker stamped `t` was dirtied before `t`, and a line is certainly stale once the first
//! marker in front of it is older than `staleness_time`. The cost is that a line may be
//! written back up to one granularity late — never early — and a few hundred list nodes.
//!
//! If markers ever run short (at most [`MARKERS_MAX`], used only when lines stay dirty for
//! hours), every second one is dropped and the granularity doubles: dropping a marker only makes
//! the lines behind it look younger, so the rule "never early" still holds.

use std::collections::VecDeque;

use crate::lists::{ListArena, ListId};
use crate::policy::cleaning::Cleaning;
use crate::policy::{AlruParams, LineView};
use crate::units::{LineId, Nanos};

/// Most time markers one policy holds.
pub const MARKERS_MAX: usize = 1024;

/// Approximately-LRU, idle-gated cleaning.
pub struct Alru {
    params: AlruParams,
    list: ListId,
    /// Markers on the list, oldest (backmost) first: (node, time stamped).
    markers: VecDeque<(u32, Nanos)>,
    /// Marker nodes not on the list, for reuse.
    spare: Vec<u32>,
    /// Marker nodes ever allocated from the arena.
    allocated: usize,
    granularity: Nanos,
    last_io: Option<Nanos>,
}

impl Alru {
    /// Creates the policy's list in `lists`.
    pub fn new(params: AlruParams, lists: &mut ListArena) -> Alru {
        let g = Nanos::from_secs(params.staleness_time_s as u64).0 / 32;
        Alru {
            params,
            list: lists.new_list(),
            markers: VecDeque::new(),
            spare: Vec::new(),
            allocated: 0,
            granularity: Nanos(g.max(Nanos::from_ms(1).0)),
            last_io: None,
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> AlruParams {
        self.params
    }

    /// Markers on the list now (for tests).
    pub fn markers(&self) -> usize {
        self.markers.len()
    }

    fn staleness(&self) -> Nanos {
        Nanos::from_secs(self.params.staleness_time_s as u64)
    }

    fn wake_up(&self) -> Nanos {
        Nanos::from_secs(self.params.wake_up_s as u64).max(Nanos::from_ms(1))
    }

    /// Puts a marker stamped `now` at the front of the list, if the newest is old enough.
    fn mark(&mut self, lists: &mut ListArena, now: Nanos) {
        if self
            .markers
            .back()
            .is_some_and(|&(_, t)| now.since(t) < self.granularity)
        {
            return;
        }
        if lists.front(self.list).is_some_and(|n| !lists.is_line(n)) {
            // The newest node is a marker with no line in front of it: restamp it instead.
            let last = self
                .markers
                .back_mut()
                .expect("a marker node is on the deque");
            last.1 = now;
            return;
        }
        let node = match self.spare.pop() {
            Some(n) => n,
            None if self.allocated < MARKERS_MAX => {
                self.allocated += 1;
                lists.new_node()
            }
            None => {
                self.thin(lists);
                self.spare.pop().expect("thinning frees markers")
            }
        };
        lists.push_front(self.list, node);
        self.markers.push_back((node, now));
    }

    /// Drops every second marker (keeping the newest) and doubles the granularity.
    fn thin(&mut self, lists: &mut ListArena) {
        let n = self.markers.len();
        let mut kept = VecDeque::with_capacity(n / 2 + 1);
        for (i, m) in self.markers.drain(..).enumerate() {
            if (n - 1 - i).is_multiple_of(2) {
                kept.push_back(m);
            } else {
                lists.unlink(m.0);
                self.spare.push(m.0);
            }
        }
        self.markers = kept;
        self.granularity = Nanos(self.granularity.0.saturating_mul(2));
    }

    /// Removes markers with no line behind them.
    fn trim_back(&mut self, lists: &mut ListArena) {
        while let Some(n) = lists.back(self.list) {
            if lists.is_line(n) {
                break;
            }
            let (m, _) = self
                .markers
                .pop_front()
                .expect("marker on list is on the deque");
            debug_assert_eq!(m, n);
            lists.unlink(n);
            self.spare.push(n);
        }
    }
}

impl Cleaning for Alru {
    fn name(&self) -> &'static str {
        "alru"
    }

    fn on_dirty(&mut self, lists: &mut ListArena, line: LineId, now: Nanos, _v: &dyn LineView) {
        lists.unlink(line.0);
        self.mark(lists, now);
        lists.push_front(self.list, line.0);
    }

    fn on_clean(&mut self, lists: &mut ListArena, line: LineId, _v: &dyn LineView) {
        lists.unlink(line.0);
    }

    fn on_client_io(&mut self, now: Nanos) {
        self.last_io = Some(now);
    }

    fn pick(
        &mut self,
        now: Nanos,
        lists: &mut ListArena,
        view: &dyn LineView,
        max: usize,
        force: bool,
        out: &mut Vec<LineId>,
    ) -> Option<Nanos> {
        self.trim_back(lists);
        if !force && let Some(t) = self.last_io {
            let quiet = t.plus(Nanos::from_ms(self.params.activity_threshold_ms as u64));
            if now < quiet {
                return Some(quiet);
            }
        }
        let staleness = self.staleness();
        let start = out.len();
        // Index in `markers` of the first marker in front of the current node.
        let mut k = 0;
        let mut cur = lists.back(self.list);
        while let Some(n) = cur {
            cur = lists.next_towards_back(self.list, n);
            if !lists.is_line(n) {
                k += 1;
                continue;
            }
            let stale = match self.markers.get(k) {
                Some(&(_, t)) => t.plus(staleness) <= now,
                None => staleness.0 == 0,
            };
            if !stale && !force {
                break;
            }
            if view.busy(LineId(n)) {
                continue;
            }
            lists.unlink(n);
            out.push(LineId(n));
            if out.len() - start >= max {
                break;
            }
        }
        self.trim_back(lists);
        if out.len() > start {
            Some(now)
        } else {
            Some(now.plus(self.wake_up()))
        }
    }

    fn batch_max(&self) -> usize {
        self.params.flush_max_buffers.max(1) as usize
    }

    fn heap_bytes(&self) -> usize {
        self.markers.capacity() * std::mem::size_of::<(u32, Nanos)>() + self.spare.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::CoreId;

    struct Idle;
    impl LineView for Idle {
        fn busy(&self, line: LineId) -> bool {
            line.0 == 3
        }
        fn position(&self, line: LineId) -> (CoreId, u64) {
            (CoreId(0), line.0 as u64)
        }
        fn key(&self, line: LineId) -> u64 {
            line.0 as u64
        }
    }

    fn params() -> AlruParams {
        AlruParams {
            wake_up_s: 20,
            staleness_time_s: 10,
            flush_max_buffers: 100,
            activity_threshold_ms: 1000,
        }
    }

    #[test]
    fn cleans_only_stale_lines_when_idle_never_early() {
        let mut a = ListArena::new(16);
        let mut p = Alru::new(params(), &mut a);
        let s = Nanos::SECOND.0;
        for l in 0..8u32 {
            p.on_dirty(&mut a, LineId(l), Nanos(l as u64 * s), &Idle);
        }
        p.on_client_io(Nanos(7 * s));
        let mut out = Vec::new();
        // Busy client: come back when idle.
        assert_eq!(
            p.pick(Nanos(7 * s), &mut a, &Idle, 100, false, &mut out),
            Some(Nanos(8 * s))
        );
        assert!(out.is_empty());
        // At 13 s: lines dirtied at 0..=2 s are stale (3 is busy); nothing younger than 10 s.
        let next = p.pick(Nanos(13 * s), &mut a, &Idle, 100, false, &mut out);
        assert_eq!(out, vec![LineId(0), LineId(1), LineId(2)]);
        assert_eq!(next, Some(Nanos(13 * s)));
        for &l in &out {
            assert!(!a.is_linked(l.0));
        }
        out.clear();
        // A rewrite refreshes a line's age.
        p.on_dirty(&mut a, LineId(4), Nanos(13 * s), &Idle);
        let next = p.pick(Nanos(16 * s), &mut a, &Idle, 100, false, &mut out);
        // Line 5 (dirtied at 5 s) is stale at 15 s; line 6 is too at 16 s, but the first marker
        // in front of it says 7 s, so it waits (late by up to a marker interval, never early).
        assert_eq!(out, vec![LineId(5)]);
        assert_eq!(next, Some(Nanos(16 * s)));
        out.clear();
        // Forced: everything not busy, in age order.
        p.pick(Nanos(16 * s), &mut a, &Idle, 100, true, &mut out);
        assert_eq!(out, vec![LineId(6), LineId(7), LineId(4)]);
        out.clear();
        p.on_clean(&mut a, LineId(3), &Idle);
        assert_eq!(
            p.pick(Nanos(17 * s), &mut a, &Idle, 100, false, &mut out),
            Some(Nanos(37 * s))
        );
        assert_eq!(
            p.markers(),
            0,
            "markers with no lines behind them are dropped"
        );
    }

    #[test]
    fn marker_thinning_keeps_lines_from_going_early() {
        let mut a = ListArena::new(4000);
        let mut p = Alru::new(params(), &mut a);
        let g = p.granularity.0;
        // More marker intervals than MARKERS_MAX, one line each.
        for l in 0..3000u32 {
            p.on_dirty(&mut a, LineId(l), Nanos(l as u64 * g), &Idle);
        }
        assert!(p.markers() <= MARKERS_MAX);
        let now = Nanos(3000 * g);
        let mut out = Vec::new();
        p.pick(now, &mut a, &Idle, usize::MAX, false, &mut out);
        assert!(!out.is_empty());
        for l in &out {
            let dirtied = l.0 as u64 * g;
            assert!(
                dirtied + p.staleness().0 <= now.0,
                "line {} cleaned early",
                l.0
            );
        }
        // Every line stale by more than twice the (final) granularity went.
        let horizon = now.0 - p.staleness().0 - 2 * p.granularity.0;
        for l in 0..3000u32 {
            if (l as u64 * g) < horizon && l != 3 {
                assert!(
                    out.contains(&LineId(l)),
                    "line {} should have been cleaned",
                    l
                );
            }
        }
    }
}
