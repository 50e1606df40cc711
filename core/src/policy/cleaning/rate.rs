//! The writeback-rate controller: keeps the dirty share of the cache near a target under a
//! write load the core cannot absorb, without the cliff Open CAS users hit when dirty data fills
//! the cache and every write suddenly waits for a cleaning round (opencas.md §10, pain 2).
//!
//! It has two arms, both engaged only inside a band around the target:
//! - **Writeback speeds up**: from `target − band` dirty, the cleaner is forced to run at full
//!   speed (every free staging slot), whatever the cleaning policy's own gating says.
//! - **New dirty data is paced to writeback**: a write that needs lines that are not dirty yet
//!   gets a delay from a virtual clock that admits new dirty lines at `g × C` lines per second,
//!   where `C` is the measured writeback rate (an exponential average over 100 ms windows) and
//!   `g` falls linearly from 2 at `target − band` through 1 at the target to ¼ at
//!   `target + band`. Inflow equals outflow exactly at the target, which is therefore where the
//!   dirty share settles; the pacing makes the slowdown proportional, not a cliff. The delay is
//!   capped at `throttle_max_ms`, so no write waits longer than that for the controller.
//!
//! Writes that only touch lines that are already dirty are never delayed (the caller does not
//! ask). The controller is a pure function of the events it is fed: no clock, no IO.

use crate::policy::RateParams;
use crate::units::Nanos;

/// Measurement window for the writeback rate.
const WINDOW: Nanos = Nanos(100_000_000);
/// Weight of the newest window in the average, in 1/8ths.
const EWMA_NEW_EIGHTHS: f64 = 3.0;

/// The controller.
#[derive(Debug, Clone)]
pub struct RateController {
    params: RateParams,
    dirty: u64,
    total: u64,
    /// Lines cleaned in the current window, and when it began.
    window_cleaned: u64,
    window_start: Nanos,
    /// Writeback rate, lines per second (0 until measured).
    clean_rate: f64,
    /// Virtual clock: when the next new dirty line may be admitted.
    next_free: Nanos,
}

impl RateController {
    /// A controller with `params`.
    pub fn new(params: RateParams) -> RateController {
        RateController {
            params,
            dirty: 0,
            total: 0,
            window_cleaned: 0,
            window_start: Nanos(0),
            clean_rate: 0.0,
            next_free: Nanos(0),
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> RateParams {
        self.params
    }

    /// Changes the parameters (the rate measurement is kept).
    pub fn set_params(&mut self, p: RateParams) {
        self.params = p;
    }

    /// The measured writeback rate, lines per second.
    pub fn clean_rate(&self) -> f64 {
        self.clean_rate
    }

    fn target(&self) -> f64 {
        self.total as f64 * self.params.dirty_target_pct.clamp(1, 99) as f64 / 100.0
    }

    fn band(&self) -> f64 {
        (self.total as f64 * 0.02).max(1.0)
    }

    /// Whether the controller is engaged (dirty inside or above the band).
    fn engaged(&self) -> bool {
        self.params.enabled && self.total > 0 && self.dirty as f64 >= self.target() - self.band()
    }

    /// Feeds the cache's state; called after every event.
    pub fn update(&mut self, now: Nanos, dirty_lines: u64, total_lines: u64) {
        self.dirty = dirty_lines;
        self.total = total_lines;
        let elapsed = now.since(self.window_start);
        if elapsed >= WINDOW {
            let sample = self.window_cleaned as f64 * 1e9 / elapsed.0 as f64;
            self.clean_rate = if self.clean_rate == 0.0 {
                sample
            } else {
                (self.clean_rate * (8.0 - EWMA_NEW_EIGHTHS) + sample * EWMA_NEW_EIGHTHS) / 8.0
            };
            self.window_cleaned = 0;
            self.window_start = now;
        }
    }

    /// `lines` dirty lines were written back and are clean now.
    pub fn on_cleaned(&mut self, _now: Nanos, lines: u32) {
        self.window_cleaned += lines as u64;
    }

    /// Whether the cleaner should run at full speed now.
    pub fn wants_writeback(&self) -> bool {
        self.engaged()
    }

    /// How long to hold a write that makes `new_dirty_lines` lines newly dirty.
    pub fn throttle_delay(&mut self, now: Nanos, new_dirty_lines: u32) -> Nanos {
        if !self.engaged() || new_dirty_lines == 0 {
            return Nanos(0);
        }
        let max = Nanos::from_ms(self.params.throttle_max_ms as u64);
        let e = (self.dirty as f64 - self.target()) / self.band();
        let g = (1.0 - e).clamp(0.25, 2.0);
        let allowed = self.clean_rate * g;
        let start = self.next_free.max(now);
        let cost = if allowed > 0.0 {
            Nanos((new_dirty_lines as f64 * 1e9 / allowed).min(max.0 as f64) as u64)
        } else {
            max
        };
        self.next_free = start.plus(cost).min(now.plus(max));
        start.since(now).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctl() -> RateController {
        RateController::new(RateParams {
            enabled: true,
            dirty_target_pct: 50,
            throttle_max_ms: 50,
        })
    }

    #[test]
    fn idle_below_the_band_and_disabled() {
        let mut c = ctl();
        c.update(Nanos(0), 100, 1000);
        assert!(!c.wants_writeback());
        assert_eq!(c.throttle_delay(Nanos(0), 1), Nanos(0));
        let mut off = RateController::new(RateParams {
            enabled: false,
            ..c.params()
        });
        off.update(Nanos(0), 999, 1000);
        assert!(!off.wants_writeback());
        assert_eq!(off.throttle_delay(Nanos(0), 1), Nanos(0));
    }

    #[test]
    fn paces_new_dirty_lines_to_the_writeback_rate_and_caps_the_delay() {
        let mut c = ctl();
        // 1000 lines/s cleaned for a second.
        for ms in 0..=1000u64 {
            c.on_cleaned(Nanos::from_ms(ms), 1);
            c.update(Nanos::from_ms(ms), 500, 1000);
        }
        assert!((c.clean_rate() - 1000.0).abs() < 50.0, "{}", c.clean_rate());
        assert!(c.wants_writeback());
        // At the target, 1 line per ms: ten writes at once get delays 0, 1, 2, … ms.
        let now = Nanos::from_ms(1000);
        for i in 0..10u64 {
            let d = c.throttle_delay(now, 1);
            assert!(
                d.0.abs_diff(i * 1_000_000) <= 50_000,
                "write {i}: delay {d:?}"
            );
        }
        // Far above the target: slower, and never more than the cap.
        c.update(now, 900, 1000);
        for _ in 0..100 {
            assert!(c.throttle_delay(now, 4) <= Nanos::from_ms(50));
        }
    }
}
