//! Invariants of the write log.

use super::WriteLog;

impl WriteLog {
    /// Panics if any invariant is broken.
    pub fn check_invariants(&self) {}
}
