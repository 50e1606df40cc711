//! `nop` cleaning (stub; being written).
use crate::lists::ListArena;
use crate::policy::LineView;
use crate::policy::cleaning::Cleaning;
use crate::units::{LineId, Nanos};

/// nop.
pub struct Nop;
impl Nop {
    /// New.
    pub fn new(_lists: &mut ListArena) -> Nop {
        Nop
    }
}
impl Cleaning for Nop {
    fn name(&self) -> &'static str {
        "nop"
    }
    fn on_dirty(&mut self, _l: &mut ListArena, _line: LineId, _now: Nanos, _v: &dyn LineView) {}
    fn on_clean(&mut self, _l: &mut ListArena, _line: LineId) {}
    fn on_client_io(&mut self, _now: Nanos) {}
    fn pick(
        &mut self,
        _now: Nanos,
        _l: &mut ListArena,
        _v: &dyn LineView,
        _max: usize,
        _force: bool,
        _out: &mut Vec<LineId>,
    ) -> Option<Nanos> {
        None
    }
    fn batch_max(&self) -> usize {
        100
    }
    fn heap_bytes(&self) -> usize {
        0
    }
}
