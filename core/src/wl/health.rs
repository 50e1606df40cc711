//! The log device's health: error episodes, problems, and data at risk.

use super::WriteLog;
use crate::cache::health::IoClass;
use crate::cache::{DeviceErrors, Health, HealthState, Problem};
use crate::event::IoError;
use crate::units::{CoreId, Nanos};

/// An episode of log IO errors: from the first error until an IO of the kinds that failed
/// succeeds (a write or flush once a write or flush failed: reads that work do not make a log
/// that cannot write healthy).
#[derive(Clone, Copy, Debug)]
pub(super) struct LogEpisode {
    pub(super) since: Nanos,
    pub(super) errors: u64,
    pub(super) write_failed: bool,
}

impl WriteLog {
    /// Errors of the log's own IOs on the cache device (log writes, reads of logged data,
    /// flushes, log superblocks), by kind of IO and of error; the read cache counts its own
    /// ([`Cache::faults`]).
    pub fn log_device_errors(&self) -> &DeviceErrors {
        &self.log_device
    }

    /// Episodes of log IO errors so far.
    pub fn log_episodes(&self) -> u64 {
        self.log_episodes
    }

    /// [`Problem::LogDevice`] while the log's IOs fail: from the first error until an IO of
    /// the kinds that failed succeeds (a write or flush, once one of those failed).
    pub fn log_problem(&self) -> Option<Problem> {
        self.log_failing.map(|ep| Problem::LogDevice {
            since: ep.since,
            last_error: self.log_device.last.map_or(IoError::Io, |x| x.0),
            errors: ep.errors,
        })
    }

    /// Whether any problem is open: the log's or the read cache's (cheap).
    pub fn is_degraded(&self) -> bool {
        self.log_failing.is_some() || self.inner.is_degraded()
    }

    /// The health of the `wl` cache: the log device's problem and the read cache's (the cache
    /// device, a core failing, writeback to a core failing). While degraded, every block of
    /// logged data not yet written back is at risk: it exists only in the log, and the log is
    /// written back in order, so one failing core holds back every later generation.
    pub fn health(&self) -> Health {
        let mut h = self.inner.health();
        if let Some(p) = self.log_problem() {
            h.problems.insert(0, p);
        }
        self.log_risk(h, None)
    }

    /// The health of one core: the cache-wide problems (the log device, the cache device) and
    /// the core's own, with its logged blocks not yet written back at risk while degraded.
    /// `None`: no such core.
    pub fn core_health(&self, core: CoreId) -> Option<Health> {
        let mut h = self.inner.core_health(core)?;
        if let Some(p) = self.log_problem() {
            h.problems.insert(0, p);
        }
        Some(self.log_risk(h, Some(core)))
    }

    fn log_risk(&self, mut h: Health, core: Option<CoreId>) -> Health {
        if h.problems.is_empty() {
            h.state = HealthState::Running;
            h.dirty_at_risk_blocks = 0;
        } else {
            h.state = HealthState::Degraded;
            h.dirty_at_risk_blocks = self.pending(core).1;
        }
        h
    }

    /// Counts an own IO's result towards the log device's health.
    pub(super) fn note_log_io(&mut self, class: IoClass, result: Result<(), IoError>) {
        let writes = class != IoClass::Read;
        match result {
            Err(e) => {
                self.log_device.count(class, e, self.now);
                let now = self.now;
                let episodes = &mut self.log_episodes;
                let ep = self.log_failing.get_or_insert_with(|| {
                    *episodes += 1;
                    LogEpisode {
                        since: now,
                        errors: 0,
                        write_failed: false,
                    }
                });
                ep.errors += 1;
                ep.write_failed |= writes;
            }
            Ok(()) => {
                if self
                    .log_failing
                    .is_some_and(|ep| writes || !ep.write_failed)
                {
                    self.log_failing = None;
                }
            }
        }
    }
}
