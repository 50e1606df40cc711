//! S3-FIFO eviction (Yang et al., SOSP 2023): scan resistant, with FIFO queues only.
//!
//! Per IO class there are two FIFO lists in the shared [`ListArena`]:
//! - **small** (probationary, about 10% of the class's lines): every new line enters here;
//! - **main**: lines that proved themselves.
//!
//! Each line has a 2-bit access counter (bumped by hits, saturating at 3). A victim is taken from
//! the small queue while it holds at least 10% of the class's lines: a line that was hit while
//! on probation moves to main; one that was not is evicted and its key remembered in the
//! **ghost** filter. A miss whose key is in the ghost filter (it was evicted too early) goes
//! straight to main. From main, a line with a nonzero counter is reinserted at the head with its
//! counter decremented (CLOCK-like second chance); one at zero is evicted.
//!
//! A one-time scan therefore flows through the small queue and out again without disturbing
//! the main queue, where the hot set lives. LRU, by contrast, lets a scan push out everything.
//!
//! A held line the walk meets is parked (see [`crate::policy::eviction`]) and comes back at the
//! back of its queue when released, to be judged by its counter at the next eviction, as it
//! would have been had it stayed there. A line that becomes dirty leaves its queue with its
//! counter and queue bit kept (a write hit counting as an access), and a writeback that makes
//! it clean again puts it back at the front of that queue with them: being dirty for a while
//! does not make a hot line look new (it used to come back on probation with a zero count).
//!
//! Memory: four bits per line (counter, queue bit, off-queue bit), kept in the line's tag beside its list
//! links ([`TAG_EVICTION`]: no array of its own, and no extra cache miss on a hit), plus the ghost filter, a direct-mapped table
//! of 8-bit key fingerprints with one slot per two cache lines (half a byte per line; the paper's
//! ghost queue remembers about as many keys as the main queue holds). The ghost filter is
//! approximate: a newer key overwrites an older one in the same slot (which ages the filter the
//! way the paper's FIFO ghost queue does), and a fingerprint collision (under 1 in 255) can send
//! a new line straight to main — a performance effect only, never a correctness one.

use crate::lists::{ListArena, ListId, TAG_EVICTION};
use crate::policy::eviction::{Eviction, OFF, Parked};
use crate::policy::{IO_CLASSES_MAX, LineView};
use crate::units::LineId;

const FREQ_MASK: u8 = 0b011;
const FREQ_MAX: u8 = 3;
const IN_SMALL: u8 = 0b100;
/// The small queue's share of a class's lines, percent.
const SMALL_PCT: u64 = 10;
/// Passes over the main queue one eviction may make (each pass decrements counters, which
/// saturate at [`FREQ_MAX`], so a pass beyond that finds a zero unless every line is busy).
const MAIN_PASSES_MAX: u32 = FREQ_MAX as u32 + 1;

/// S3-FIFO, per IO class.
pub struct S3Fifo {
    small: Vec<ListId>,
    main: Vec<ListId>,
    small_len: Vec<u32>,
    main_len: Vec<u32>,
    /// Ghost filter: 8-bit fingerprints (0 = empty slot).
    ghost: Vec<u8>,
    /// Slots of `ghost` in use: while none is (a new or just loaded cache, before its first
    /// eviction), an insert does not look (a cache miss per line saved: 16M at a load).
    ghost_used: u32,
    parked: Parked,
}

impl S3Fifo {
    /// Creates the per-class queues in `lists` for a cache of `lines` lines.
    pub fn new(lists: &mut ListArena, lines: u32) -> S3Fifo {
        let small = (0..IO_CLASSES_MAX).map(|_| lists.new_list()).collect();
        let main = (0..IO_CLASSES_MAX).map(|_| lists.new_list()).collect();
        S3Fifo {
            small,
            main,
            small_len: vec![0; IO_CLASSES_MAX],
            main_len: vec![0; IO_CLASSES_MAX],
            ghost: vec![0; (lines as usize / 2).max(64)],
            ghost_used: 0,
            parked: Parked::new(lists),
        }
    }

    #[inline]
    fn ghost_slot(&self, key: u64) -> (usize, u8) {
        let idx = ((key as u128 * self.ghost.len() as u128) >> 64) as usize;
        let fp = (key as u8).max(1);
        (idx, fp)
    }

    fn ghost_take(&mut self, key: u64) -> bool {
        if self.ghost_used == 0 {
            return false;
        }
        let (i, fp) = self.ghost_slot(key);
        if self.ghost[i] == fp {
            self.ghost[i] = 0;
            self.ghost_used -= 1;
            true
        } else {
            false
        }
    }

    fn ghost_put(&mut self, key: u64) {
        let (i, fp) = self.ghost_slot(key);
        if self.ghost[i] == 0 {
            self.ghost_used += 1;
        }
        self.ghost[i] = fp;
    }

    /// Lines of class `class` on the small queue (for tests and stats).
    pub fn small_len(&self, class: u8) -> u32 {
        self.small_len[class as usize]
    }

    /// The queue `line` belongs on, by its tag's queue bit.
    fn queue(&self, lists: &ListArena, line: u32, class: u8) -> ListId {
        if meta(lists, line) & IN_SMALL != 0 {
            self.small[class as usize]
        } else {
            self.main[class as usize]
        }
    }

    /// Counts `line` on the queue its tag names (or uncounts it).
    fn count(&mut self, lists: &ListArena, line: u32, class: u8, up: bool) {
        let c = class as usize;
        let n = if meta(lists, line) & IN_SMALL != 0 {
            &mut self.small_len[c]
        } else {
            &mut self.main_len[c]
        };
        if up {
            *n += 1;
        } else {
            *n -= 1;
        }
    }

    /// Unlinks `line` (a line this policy holds, maybe parked) and uncounts it.
    fn unlink(&mut self, lists: &mut ListArena, line: u32, class: u8) {
        debug_assert!(lists.is_linked(line));
        self.parked.take(lists, line);
        lists.unlink(line);
        self.count(lists, line, class, false);
    }
}

/// A line's bits: 0–1 access counter, 2 "on the small queue" (in its list tag).
#[inline]
fn meta(lists: &ListArena, line: u32) -> u8 {
    lists.field(line, TAG_EVICTION)
}

#[inline]
fn set_meta(lists: &mut ListArena, line: u32, m: u8) {
    lists.set_field(line, TAG_EVICTION, m);
}

impl Eviction for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    fn insert(&mut self, lists: &mut ListArena, line: LineId, class: u8, key: u64) {
        let c = class as usize;
        let m = meta(lists, line.0);
        if m & OFF != 0 {
            // Clean again after being dirty: back on its queue with its counter.
            set_meta(lists, line.0, m & !OFF);
            lists.push_front(self.queue(lists, line.0, class), line.0);
            self.count(lists, line.0, class, true);
            return;
        }
        if self.ghost_take(key) {
            set_meta(lists, line.0, 0);
            lists.push_front(self.main[c], line.0);
            self.main_len[c] += 1;
        } else {
            set_meta(lists, line.0, IN_SMALL);
            lists.push_front(self.small[c], line.0);
            self.small_len[c] += 1;
        }
    }

    fn touch(&mut self, lists: &mut ListArena, line: LineId, _class: u8) {
        let m = meta(lists, line.0);
        if m & FREQ_MASK < FREQ_MAX {
            set_meta(lists, line.0, m + 1);
        }
    }

    fn remove(&mut self, lists: &mut ListArena, line: LineId, class: u8) {
        self.unlink(lists, line.0, class);
        set_meta(lists, line.0, 0);
    }

    fn dirtied(&mut self, lists: &mut ListArena, line: LineId, class: u8, hit: bool) {
        self.unlink(lists, line.0, class);
        let m = meta(lists, line.0);
        let bump = (hit && m & FREQ_MASK < FREQ_MAX) as u8;
        set_meta(lists, line.0, (m + bump) | OFF);
    }

    fn release(&mut self, lists: &mut ListArena, line: LineId, class: u8) {
        if self.parked.take(lists, line.0) {
            // Still counted on its queue while parked.
            lists.push_back(self.queue(lists, line.0, class), line.0);
        }
    }

    fn parked(&self) -> u32 {
        self.parked.len()
    }

    fn evict(&mut self, lists: &mut ListArena, class: u8, view: &dyn LineView) -> Option<LineId> {
        let c = class as usize;
        let (small, main) = (self.small[c], self.main[c]);
        let mut cs = lists.back(small);
        let mut cm = lists.back(main);
        let mut main_passes = 0;
        loop {
            let total = (self.small_len[c] + self.main_len[c]) as u64;
            let small_over = self.small_len[c] as u64 * 100 >= total * SMALL_PCT;
            if let Some(n) = cs.filter(|_| small_over || cm.is_none()) {
                cs = lists.next_towards_back(small, n);
                if !view.evictable(lists, LineId(n)) {
                    if view.busy(LineId(n)) {
                        self.parked.park(lists, n);
                    }
                    continue;
                }
                lists.unlink(n);
                self.small_len[c] -= 1;
                if meta(lists, n) & FREQ_MASK > 0 {
                    // Hit while on probation: promote to main.
                    set_meta(lists, n, 0);
                    lists.push_front(main, n);
                    self.main_len[c] += 1;
                    if cm.is_none() {
                        cm = Some(n);
                    }
                    continue;
                }
                set_meta(lists, n, 0);
                self.ghost_put(view.key(LineId(n)));
                return Some(LineId(n));
            }
            let n = cm?;
            cm = lists.next_towards_back(main, n);
            if view.evictable(lists, LineId(n)) {
                let m = meta(lists, n);
                if m & FREQ_MASK == 0 {
                    lists.unlink(n);
                    self.main_len[c] -= 1;
                    return Some(LineId(n));
                }
                set_meta(lists, n, m - 1);
                lists.move_to_front(main, n);
            } else if view.busy(LineId(n)) {
                self.parked.park(lists, n);
            }
            if cm.is_none() && main_passes < MAIN_PASSES_MAX {
                main_passes += 1;
                cm = lists.back(main);
            }
        }
    }

    fn len(&self, class: u8) -> u32 {
        self.small_len[class as usize] + self.main_len[class as usize]
    }

    fn heap_bytes(&self) -> usize {
        self.ghost.capacity()
            + (self.small.capacity() + self.main.capacity()) * std::mem::size_of::<ListId>()
            + (self.small_len.capacity() + self.main_len.capacity()) * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::position_key;
    use crate::units::CoreId;

    /// Line `l` caches core line `pos[l]`.
    struct View {
        busy: Vec<bool>,
        pos: Vec<u64>,
    }
    impl LineView for View {
        fn busy(&self, line: LineId) -> bool {
            self.busy[line.0 as usize]
        }
        fn position(&self, line: LineId) -> (CoreId, u64) {
            (CoreId(0), self.pos[line.0 as usize])
        }
        fn key(&self, line: LineId) -> u64 {
            position_key(CoreId(0), self.pos[line.0 as usize])
        }
    }

    #[test]
    fn unhit_probationary_lines_go_first_and_into_the_ghost() {
        let mut a = ListArena::new(16);
        let mut p = S3Fifo::new(&mut a, 16);
        let mut v = View {
            busy: vec![false; 16],
            pos: (0..16).collect(),
        };
        for l in 0..10 {
            p.insert(&mut a, LineId(l), 0, position_key(CoreId(0), l as u64));
        }
        p.touch(&mut a, LineId(0), 0);
        v.busy[1] = true;
        // Line 0 was hit: promoted; line 1 busy: skipped; line 2 evicted.
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(2)));
        assert!(!a.is_linked(2));
        assert_eq!(p.len(0), 9);
        assert_eq!(p.small_len(0), 8);
        // Core line 2 comes back on line 11: it is in the ghost, so it goes to main.
        v.pos[11] = 2;
        p.insert(&mut a, LineId(11), 0, position_key(CoreId(0), 2));
        assert_eq!(p.small_len(0), 8);
        assert_eq!(p.len(0), 10);
        p.remove(&mut a, LineId(11), 0);
        p.remove(&mut a, LineId(0), 0);
        assert_eq!(p.len(0), 8);
        assert_eq!(p.small_len(0), 8);
    }

    #[test]
    fn drains_everything_not_busy_and_then_stops() {
        let mut a = ListArena::new(32);
        let mut p = S3Fifo::new(&mut a, 32);
        let mut v = View {
            busy: vec![false; 32],
            pos: (0..32).collect(),
        };
        for l in 0..32 {
            p.insert(&mut a, LineId(l), (l % 2) as u8, l as u64 * 7919);
            for _ in 0..(l % 5) {
                p.touch(&mut a, LineId(l), (l % 2) as u8);
            }
        }
        v.busy[4] = true;
        let mut got = Vec::new();
        while let Some(l) = p.evict(&mut a, 0, &v) {
            assert_eq!(l.0 % 2, 0);
            got.push(l.0);
        }
        assert_eq!(got.len(), 15, "every even line but the busy one");
        assert_eq!(p.len(0), 1);
        assert_eq!(p.len(1), 16);
    }

    fn view(n: usize) -> View {
        View {
            busy: vec![false; n],
            pos: (0..n as u64).collect(),
        }
    }

    #[test]
    fn held_lines_are_parked_once_and_judged_by_their_count_when_released() {
        let mut a = ListArena::new(32);
        let mut p = S3Fifo::new(&mut a, 32);
        let mut v = view(32);
        for l in 0..20 {
            p.insert(&mut a, LineId(l), 0, l as u64 * 7919);
        }
        (0..10).for_each(|l| v.busy[l] = true);
        p.touch(&mut a, LineId(2), 0);
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(10)));
        assert_eq!(p.parked(), 10);
        assert_eq!(
            (p.len(0), p.small_len(0)),
            (19, 19),
            "parked lines stay counted"
        );
        // Released lines go to the back of the small queue, the last released last in.
        for l in [2, 4] {
            v.busy[l] = false;
            p.release(&mut a, LineId(l as u32), 0);
        }
        assert_eq!(p.parked(), 8);
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(4)));
        // Line 2 was hit while held: to main, and the walk goes on to line 11.
        assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(11)));
        assert_eq!((p.len(0), p.small_len(0)), (17, 16));
        // A parked line that becomes dirty leaves the parked list.
        p.dirtied(&mut a, LineId(5), 0, true);
        assert_eq!((p.parked(), p.len(0)), (7, 16));
        // Held lines in main are parked too.
        v.busy[2] = true;
        while p.small_len(0) > p.parked() {
            p.evict(&mut a, 0, &v).unwrap();
        }
        assert_eq!(p.evict(&mut a, 0, &v), None, "every line left is held");
        assert_eq!(p.parked(), 8);
        v.busy.iter_mut().for_each(|b| *b = false);
        for l in [0, 1, 2, 3, 6, 7, 8, 9] {
            p.release(&mut a, LineId(l), 0);
        }
        assert_eq!(p.parked(), 0);
        assert_eq!(p.len(0), 8);
        let mut got: Vec<u32> =
            std::iter::from_fn(|| p.evict(&mut a, 0, &v).map(|l| l.0)).collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3, 6, 7, 8, 9]);
    }

    #[test]
    fn a_line_keeps_its_count_and_queue_while_dirty() {
        let mut a = ListArena::new(32);
        let mut p = S3Fifo::new(&mut a, 32);
        let v = view(32);
        for l in 0..10 {
            p.insert(&mut a, LineId(l), 0, l as u64 * 7919);
        }
        // Line 0 (the oldest, on probation) is read once, then a write hit dirties it.
        p.touch(&mut a, LineId(0), 0);
        p.dirtied(&mut a, LineId(0), 0, true);
        assert_eq!((p.len(0), p.small_len(0)), (9, 9));
        assert_eq!(meta(&a, 0) & FREQ_MASK, 2, "the write hit counted");
        // Written back: clean again, on probation with its count, at the front.
        p.insert(&mut a, LineId(0), 0, 0);
        assert_eq!((p.len(0), p.small_len(0)), (10, 10));
        for l in 10..15 {
            p.insert(&mut a, LineId(l), 0, l as u64 * 7919);
        }
        // Lines 1..9 go first; line 0 proves itself and moves to main, line 10 goes.
        for l in 1..=10 {
            assert_eq!(p.evict(&mut a, 0, &v), Some(LineId(l)));
        }
        assert_eq!((p.len(0), p.small_len(0)), (5, 4));
        // A main line dirtied by a write that is not a hit comes back to main.
        p.dirtied(&mut a, LineId(0), 0, false);
        assert_eq!(p.len(0), 4);
        p.insert(&mut a, LineId(0), 0, 0);
        assert_eq!((p.len(0), p.small_len(0)), (5, 4));
        assert_eq!(meta(&a, 0), 0, "main, count 0, on its queue");
        // `remove` forgets: the line's next life starts on probation.
        p.remove(&mut a, LineId(0), 0);
        p.insert(&mut a, LineId(0), 0, position_key(CoreId(0), 100));
        assert_eq!((p.len(0), p.small_len(0)), (5, 5));
    }
}
