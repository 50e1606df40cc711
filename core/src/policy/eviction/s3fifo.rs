//! S3-FIFO eviction (stub; being written).
use crate::lists::ListArena;
use crate::policy::LineView;
use crate::policy::eviction::Eviction;
use crate::units::LineId;

/// S3-FIFO.
pub struct S3Fifo;
impl S3Fifo {
    /// New.
    pub fn new(_lists: &mut ListArena, _lines: u32) -> S3Fifo {
        S3Fifo
    }
}
impl Eviction for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
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
