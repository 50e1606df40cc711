//! Cleaning: which dirty lines to write back, and when.
//!
//! Contract shared by every policy:
//! - A dirty line is on exactly one of the policy's lists in the shared [`ListArena`] unless it
//!   is being written back. The cache calls [`Cleaning::on_dirty`] when a line becomes dirty or
//!   a dirty line is written again (the policy refreshes its age), and [`Cleaning::on_clean`]
//!   when it stops being dirty (written back or invalidated) — `on_clean` is a no-op for an
//!   unlinked line.
//! - [`Cleaning::pick`] MUST unlink every line it returns (the cache writes it back; if the line
//!   is still dirty afterwards, the cache calls `on_dirty` again), MUST skip lines for which
//!   `view.busy` is true (leaving them linked), and returns the time at which it wants to be
//!   asked again.
//! - `force` asks for lines regardless of the policy's gating (activity, staleness, wake-up):
//!   the cache uses it for `writeback` commands, stop, mode switches and the rate controller.
//!   `nop` still returns lines when forced.

pub mod acp;
pub mod alru;
pub mod nop;
pub mod rate;

use super::{AcpParams, AlruParams, CleaningPolicy, LineView};
use crate::lists::ListArena;
use crate::units::{LineId, Nanos};

/// A cleaning policy.
pub trait Cleaning: Send {
    /// The policy's name as the CLI shows it.
    fn name(&self) -> &'static str;
    /// `line` became dirty, or a dirty line was written again, at `now`. `view` gives its
    /// position (ACP groups lines by core chunk).
    fn on_dirty(&mut self, lists: &mut ListArena, line: LineId, now: Nanos, view: &dyn LineView);
    /// `line` is no longer dirty. `view` still reports the line's position.
    fn on_clean(&mut self, lists: &mut ListArena, line: LineId, view: &dyn LineView);
    /// A client request reached the cache at `now` (ALRU's activity threshold).
    fn on_client_io(&mut self, now: Nanos);
    /// Up to `max` lines to write back now, appended to `out` and unlinked. Returns when to be
    /// asked again (`None`: only when something changes).
    fn pick(
        &mut self,
        now: Nanos,
        lists: &mut ListArena,
        view: &dyn LineView,
        max: usize,
        force: bool,
        out: &mut Vec<LineId>,
    ) -> Option<Nanos>;
    /// Lines per iteration this policy wants (its `flush_max_buffers`).
    fn batch_max(&self) -> usize;
    /// Heap bytes held (for the RAM-per-line figure).
    fn heap_bytes(&self) -> usize;
}

/// Builds the policy `which`.
pub fn build(
    which: CleaningPolicy,
    alru: AlruParams,
    acp: AcpParams,
    lists: &mut ListArena,
    blocks_per_line: u32,
) -> Box<dyn Cleaning> {
    match which {
        CleaningPolicy::Alru => Box::new(alru::Alru::new(alru, lists)),
        CleaningPolicy::Acp => Box::new(acp::Acp::new(acp, lists, blocks_per_line)),
        CleaningPolicy::Nop => Box::new(nop::Nop::new(lists)),
    }
}
