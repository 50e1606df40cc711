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

pub mod lru;
pub mod s3fifo;

use super::{EvictionPolicy, LineView};
use crate::lists::ListArena;
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
