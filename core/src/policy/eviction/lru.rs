//! LRU eviction (stub; being written).
use crate::lists::ListArena;
use crate::policy::LineView;
use crate::policy::eviction::Eviction;
use crate::units::LineId;

/// LRU.
pub struct Lru;
impl Lru {
    /// New.
    pub fn new(_lists: &mut ListArena) -> Lru {
        Lru
    }
}
impl Eviction for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn insert(&mut self, _l: &mut ListArena, _line: LineId, _class: u8, _key: u64) {}
    fn touch(&mut self, _l: &mut ListArena, _line: LineId, _class: u8) {}
    fn remove(&mut self, _l: &mut ListArena, _line: LineId, _class: u8) {}
    fn evict(&mut self, _l: &mut ListArena, _class: u8, _v: &dyn LineView) -> Option<LineId> {
        None
    }
    fn len(&self, _class: u8) -> u32 {
        0
    }
    fn heap_bytes(&self) -> usize {
        0
    }
}
