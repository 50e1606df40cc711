//! When the write log's writeback runs: the `wl` counterpart of Linux's background writeback
//! (`dirty_background_ratio`, `dirty_expire_centisecs`) and of Open CAS ALRU's activity
//! threshold.
//!
//! Writeback to the core competes with the clients for what the log exists to save them: the
//! core's queue and, on the same host, CPU (librbd's messenger threads; on a single-node
//! Ceph also the OSD's). So while the clients are busy and the log has room, writeback
//! **holds**: nothing new starts (what is in flight finishes, a generation whose entries are
//! all written back is still flushed and retired). It **goes**, as fast as the core allows,
//! as soon as any of these holds:
//!
//! - the log is at least `background_fill_pct` full (0: writeback never holds);
//! - the clients have sent no request for `idle`;
//! - the oldest entry in the log is `expire` old (a bound on how stale the core gets);
//! - writes wait for room in the log, or a drain was asked for (`tiercache writeback`,
//!   leaving the mode, removing a core).
//!
//! When it goes, at most `depth` entries are in writeback at once (writes to the core in
//! flight; 48 by default): with the log full, client writes wait for the oldest of them.
//!
//! When it goes, the writeback also closes the open generation if nothing older is left, as
//! it always did; while it holds, the open generation grows (up to the generation limits),
//! so the writeback that follows moves big generations: one core flush and one superblock
//! write for many entries instead of a few.
//!
//! Pure: a function of the policy, the time and a few facts about the log.

use crate::units::Nanos;

/// Default writeback depth (writes to the core in flight).
pub const DEPTH: u32 = 48;

/// The policy (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// Log fill, in percent of the ring, at and above which writeback goes whatever the
    /// clients do; 0: writeback never holds.
    pub background_fill_pct: u8,
    /// Writeback goes once the clients have sent no request for this long ...
    pub idle: Nanos,
    /// ... and once the oldest entry in the log is this old.
    pub expire: Nanos,
    /// Entries in writeback at most, i.e. writes to the core in flight. The core (an RBD
    /// image: its OSDs) takes writes at its own rate; past that, a deeper queue only makes
    /// each write wait longer there, and with the log full, client writes wait for the
    /// oldest entry in writeback to finish (room comes back in log order).
    pub depth: u32,
}

impl Pacing {
    /// The defaults: half the ring (PWL's retire high-water), 500 ms idle, 30 s (Linux's
    /// `dirty_expire_centisecs`), 48 writes in flight (on the single-node Ceph of
    /// docs/CEPH.md as fast as 128, with half the full-log tail latency).
    pub const DEFAULT: Pacing = Pacing {
        background_fill_pct: 50,
        idle: Nanos::from_ms(500),
        expire: Nanos::from_secs(30),
        depth: DEPTH,
    };

    /// Writeback that never holds (the behaviour before pacing existed).
    pub const ALWAYS: Pacing = Pacing {
        background_fill_pct: 0,
        idle: Nanos(0),
        expire: Nanos(0),
        depth: DEPTH,
    };

    /// The largest `depth` accepted.
    pub const DEPTH_MAX: u32 = 4096;

    /// Checks the policy.
    pub fn validate(&self) -> Result<(), String> {
        if self.background_fill_pct > 100 {
            return Err(format!(
                "the write log's background fill is a percentage (0-100), not {}",
                self.background_fill_pct
            ));
        }
        if self.depth == 0 || self.depth > Self::DEPTH_MAX {
            return Err(format!(
                "the write log's writeback depth is 1-{} writes in flight, not {}",
                Self::DEPTH_MAX,
                self.depth
            ));
        }
        Ok(())
    }
}

/// What the log looks like to the policy.
#[derive(Clone, Copy, Debug)]
pub struct LogState {
    /// Ring blocks in use, and the ring's size.
    pub used: u64,
    pub ring: u64,
    /// When the last client request arrived (reads too: they compete as well).
    pub last_request: Nanos,
    /// When the oldest live entry was logged (`None`: the log is empty).
    pub oldest: Option<Nanos>,
    /// Writes wait for room, or a drain was asked for.
    pub urgent: bool,
}

/// The decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// Start writeback as fast as the core allows.
    Go,
    /// Start nothing new until `until` (or until the state changes).
    Hold { until: Nanos },
}

/// Whether writeback goes now.
pub fn pace(p: &Pacing, now: Nanos, s: &LogState) -> Pace {
    let Some(oldest) = s.oldest else {
        // Nothing to write back: nothing to hold either.
        return Pace::Go;
    };
    if p.background_fill_pct == 0
        || s.urgent
        || s.used.saturating_mul(100) >= s.ring.saturating_mul(p.background_fill_pct as u64)
    {
        return Pace::Go;
    }
    let until = s.last_request.plus(p.idle).min(oldest.plus(p.expire));
    if now >= until {
        Pace::Go
    } else {
        Pace::Hold { until }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn state(used: u64, last: u64, oldest: Option<u64>, urgent: bool) -> LogState {
        LogState {
            used,
            ring: 1000,
            last_request: Nanos(last * MS),
            oldest: oldest.map(|o| Nanos(o * MS)),
            urgent,
        }
    }

    #[test]
    fn holds_while_busy_below_the_background_fill() {
        let p = Pacing::DEFAULT;
        // Busy (a request 1 ms ago), 10% full, oldest entry 2 s old: hold until the clients
        // have been idle 500 ms.
        assert_eq!(
            pace(
                &p,
                Nanos(10_000 * MS),
                &state(100, 9_999, Some(8_000), false)
            ),
            Pace::Hold {
                until: Nanos(10_499 * MS)
            }
        );
    }

    #[test]
    fn goes_at_the_background_fill_idle_expiry_or_when_urgent() {
        let p = Pacing {
            background_fill_pct: 25,
            ..Pacing::DEFAULT
        };
        let now = Nanos(100_000 * MS);
        // 25% full exactly.
        assert_eq!(
            pace(&p, now, &state(250, 99_999, Some(99_000), false)),
            Pace::Go
        );
        // 24.9% full: holds.
        assert!(matches!(
            pace(&p, now, &state(249, 99_999, Some(99_000), false)),
            Pace::Hold { .. }
        ));
        // Idle for 500 ms.
        assert_eq!(
            pace(&p, now, &state(10, 99_500, Some(99_000), false)),
            Pace::Go
        );
        // The oldest entry is 30 s old although the clients are busy.
        assert_eq!(
            pace(&p, now, &state(10, 99_999, Some(70_000), false)),
            Pace::Go
        );
        // Expiry comes before idleness: the hold ends at the expiry.
        assert_eq!(
            pace(&p, now, &state(10, 99_999, Some(70_001), false)),
            Pace::Hold {
                until: Nanos(100_001 * MS)
            }
        );
        // Writes wait for room / a drain was asked for.
        assert_eq!(
            pace(&p, now, &state(10, 99_999, Some(99_000), true)),
            Pace::Go
        );
    }

    #[test]
    fn an_empty_log_or_the_always_policy_never_holds() {
        assert_eq!(
            pace(&Pacing::DEFAULT, Nanos(5 * MS), &state(0, 5, None, false)),
            Pace::Go
        );
        assert_eq!(
            pace(&Pacing::ALWAYS, Nanos(5 * MS), &state(1, 5, Some(5), false)),
            Pace::Go
        );
        assert!(
            Pacing {
                background_fill_pct: 101,
                ..Pacing::DEFAULT
            }
            .validate()
            .is_err()
        );
        for depth in [0, Pacing::DEPTH_MAX + 1] {
            assert!(
                Pacing {
                    depth,
                    ..Pacing::DEFAULT
                }
                .validate()
                .is_err()
            );
        }
        assert!(Pacing::DEFAULT.validate().is_ok() && Pacing::ALWAYS.validate().is_ok());
    }
}
