//! `nhit` promotion (stub; being written).
use crate::policy::NhitParams;
use crate::policy::promotion::Promotion;
use crate::units::CoreId;

/// nhit.
pub struct Nhit;
impl Nhit {
    /// New.
    pub fn new(_p: NhitParams, _lines: u32) -> Nhit {
        Nhit
    }
}
impl Promotion for Nhit {
    fn name(&self) -> &'static str {
        "nhit"
    }
    fn admit(&mut self, _core: CoreId, _first: u64, _count: u32, _used: u32, _total: u32) -> bool {
        true
    }
    fn on_inserted(&mut self, _core: CoreId, _first: u64, _count: u32) {}
    fn heap_bytes(&self) -> usize {
        0
    }
}
