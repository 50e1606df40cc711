//! `always`: every miss is inserted (Open CAS default).
use crate::policy::promotion::Promotion;
use crate::units::CoreId;

/// Insert every miss.
pub struct Always;

impl Promotion for Always {
    fn name(&self) -> &'static str {
        "always"
    }
    fn admit(&mut self, _core: CoreId, _first: u64, _count: u32, _used: u32, _total: u32) -> bool {
        true
    }
    fn on_inserted(&mut self, _core: CoreId, _first: u64, _count: u32) {}
    fn heap_bytes(&self) -> usize {
        0
    }
}
