//! Writeback-rate controller (stub; being written).
use crate::policy::RateParams;
use crate::units::Nanos;

/// Rate controller.
pub struct RateController {
    params: RateParams,
}
impl RateController {
    /// New.
    pub fn new(params: RateParams) -> RateController {
        RateController { params }
    }
    /// Parameters.
    pub fn params(&self) -> RateParams {
        self.params
    }
    /// Change parameters.
    pub fn set_params(&mut self, p: RateParams) {
        self.params = p;
    }
    /// Feed state.
    pub fn update(&mut self, _now: Nanos, _dirty_lines: u64, _total_lines: u64) {}
    /// Lines were cleaned.
    pub fn on_cleaned(&mut self, _now: Nanos, _lines: u32) {}
    /// Whether the controller wants writeback now.
    pub fn wants_writeback(&self) -> bool {
        false
    }
    /// Delay for a write that needs new dirty lines.
    pub fn throttle_delay(&mut self, _now: Nanos, _new_dirty_lines: u32) -> Nanos {
        Nanos(0)
    }
}
