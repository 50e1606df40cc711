//! Eviction: which clean line to reuse when a miss needs a line and none is free.
//!
//! Contract shared by every implementation:
//! - Only clean, mapped lines are ever on an eviction list. The cache calls [`Eviction::insert`]
//!   when a line becomes clean and mapped (filled, or written back), [`Eviction::remove`] when it
//!   stops being evictable (it became dirty, was invalidated, or changed class), and
//!   [`Eviction::touch`] on a hit to a line that is on a list.
//! - The caller guarantees `insert` is only called for an unlinked line and `remove`/`touch`
//!   only for a line this policy holds.
//! - [`Eviction::evict`] MUST return a line of the asked class that is `view.evictable`, and MUST
//!   unlink it before returning; it returns `None` only if the class has no such line.
//! - Lists live in the shared [`ListArena`]; the policy creates its lists at construction.
//!   A policy keeps per-class state so the cache can evict by IO-class priority.
//!
//! **Held lines are parked.** A line a request holds (or a writeback marks) stays where it is
//! on its list until an eviction walk meets it; the walk then takes it off its list onto the
//! policy's *parked* list ([`Parked`]) instead of stepping past it, and the cache calls
//! [`Eviction::release`] when the line's last holder lets go, which puts it back at the back
//! (the oldest end) of its list: where the walks had left it, since every line behind it was
//! passed too. So a walk visits each held line once per hold, not once per eviction: under a
//! deep backlog (thousands of requests in flight on a slow core, each holding a line) the old
//! walk past every held line on every miss took 96% of a timed replay. A touch of a parked
//! line puts it back at once where a touch puts a line (LRU: the front). A parked line still
//! counts in [`Eviction::len`], and [`Eviction::remove`] takes it off the parked list as well.

pub mod lru;
pub mod s3fifo;

use super::{EvictionPolicy, LineView};
use crate::lists::{ListArena, ListId, TAG_EVICTION};
use crate::units::LineId;

/// An eviction policy.
pub trait Eviction: Send {
    /// The policy's name as the CLI shows it.
    fn name(&self) -> &'static str;
    /// A clean line of class `class` with position hash `key` became evictable.
    fn insert(&mut self, lists: &mut ListArena, line: LineId, class: u8, key: u64);
    /// A clean line this policy holds was hit.
    fn touch(&mut self, lists: &mut ListArena, line: LineId, class: u8);
    /// A line this policy holds stops being evictable.
    fn remove(&mut self, lists: &mut ListArena, line: LineId, class: u8);
    /// A clean line this policy holds becomes dirty (`hit`: a write hit did it, which counts
    /// as an access). Like [`Eviction::remove`], except that a policy may keep the line's bits
    /// for the [`Eviction::insert`] that follows its writeback.
    fn dirtied(&mut self, lists: &mut ListArena, line: LineId, class: u8, hit: bool) {
        let _ = hit;
        self.remove(lists, line, class);
    }
    /// Nothing holds `line` any more: if the policy parked it, it goes back on its list.
    fn release(&mut self, lists: &mut ListArena, line: LineId, class: u8);
    /// Lines parked now (the cache skips [`Eviction::release`] calls while there are none).
    fn parked(&self) -> u32;
    /// Chooses, unlinks and returns a victim of class `class`. Per-line bits a policy keeps
    /// live in the line's tag in `lists` ([`crate::lists::TAG_EVICTION`]).
    fn evict(&mut self, lists: &mut ListArena, class: u8, view: &dyn LineView) -> Option<LineId>;
    /// Lines of class `class` this policy holds.
    fn len(&self, class: u8) -> u32;
    /// Heap bytes held, beyond the shared list arena (for the RAM-per-line figure).
    fn heap_bytes(&self) -> usize;
}

/// Builds the policy `which` for a cache of `lines` lines.
pub fn build(which: EvictionPolicy, lists: &mut ListArena, lines: u32) -> Box<dyn Eviction> {
    match which {
        EvictionPolicy::Lru => Box::new(lru::Lru::new(lists)),
        EvictionPolicy::S3Fifo => Box::new(s3fifo::S3Fifo::new(lists, lines)),
    }
}

/// The bit of [`TAG_EVICTION`] every policy keeps for "off its list": parked (a clean line) or,
/// for S3-FIFO, dirty with its bits kept for its return.
pub(crate) const OFF: u8 = 0b1000;

/// The parked list: held lines an eviction walk took off their lists (one list for every class
/// and queue: a line's class and tag say where it goes back).
pub(crate) struct Parked {
    list: ListId,
    n: u32,
}

impl Parked {
    pub(crate) fn new(lists: &mut ListArena) -> Parked {
        Parked {
            list: lists.new_list(),
            n: 0,
        }
    }

    /// Moves `line` from its list to the parked list and marks it [`OFF`].
    #[inline]
    pub(crate) fn park(&mut self, lists: &mut ListArena, line: u32) {
        lists.unlink(line);
        lists.push_back(self.list, line);
        let m = lists.field(line, TAG_EVICTION);
        lists.set_field(line, TAG_EVICTION, m | OFF);
        self.n += 1;
    }

    /// If `line` (a clean line the policy holds) is parked: unlinks and unmarks it, true.
    #[inline]
    pub(crate) fn take(&mut self, lists: &mut ListArena, line: u32) -> bool {
        let m = lists.field(line, TAG_EVICTION);
        if m & OFF == 0 {
            return false;
        }
        lists.unlink(line);
        lists.set_field(line, TAG_EVICTION, m & !OFF);
        self.n -= 1;
        true
    }

    /// Lines parked.
    pub(crate) fn len(&self) -> u32 {
        self.n
    }
}
