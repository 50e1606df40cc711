//! Sequential cutoff (stub; being written).
use crate::policy::CutoffParams;
use crate::units::Lba;

/// Streams tracked per core.
pub const STREAMS_MAX: usize = 128;

/// Per-core detector.
pub struct SeqCutoff {
    params: CutoffParams,
}
impl SeqCutoff {
    /// New.
    pub fn new(params: CutoffParams) -> SeqCutoff {
        SeqCutoff { params }
    }
    /// Parameters.
    pub fn params(&self) -> CutoffParams {
        self.params
    }
    /// Change parameters.
    pub fn set_params(&mut self, p: CutoffParams) {
        self.params = p;
    }
    /// Record and decide.
    pub fn check(&mut self, _is_write: bool, _lba: Lba, _blocks: u32, _cache_full: bool) -> bool {
        false
    }
    /// Heap bytes.
    pub fn heap_bytes(&self) -> usize {
        0
    }
}
