//! `nhit` promotion (Open CAS semantics, `src/promotion/nhit/nhit.c`).
//!
//! The rule, as Open CAS applies it with **one deviation** (the free-line rule below):
//! - **Below the trigger** (`used × 100 < trigger_pct × total`, i.e. `used < ⌈trigger_pct ×
//!   total / 100⌉`) every request is admitted and **nothing is counted** (Open CAS returns before
//!   touching its hash).
//! - **Free lines (the deviation)**: a request whose lines all fit in the cache's free (unmapped)
//!   lines (`used + count ≤ total`) is admitted and nothing is counted, whatever the occupancy:
//!   filling a free line evicts nothing, so keeping a miss out gains nothing and costs its next
//!   hit. Open CAS applies the threshold from the trigger on even with free lines left, so a
//!   cache as large as the footprint never fills: on issue 30's public trace (4 KiB-split
//!   CloudPhysics vscsi, a cache of the whole footprint) Open CAS's rule mapped 225,908 of
//!   269,210 lines and missed 0.2910 of requests against 0.2554 for `always`; with the free-line
//!   rule `nhit` fills it and equals `always` (docs/SIZING.md, "`nhit` promotion").
//! - **At or above the trigger, when admitting would evict** (`used + count > total`), every
//!   core line of the request gets one more miss counted (all of them, even after one is found
//!   short), and the request is admitted iff **every** line's count, this miss included, is ≥
//!   `threshold`. With the default threshold 3 a line is let in on its third miss. A request of
//!   zero lines is admitted. Since a full cache is always at or above any trigger ≤ 100%, the
//!   trigger now decides only for a request larger than the free lines left while the cache is
//!   below the trigger (it is admitted, evicting); it keeps Open CAS's range, default and
//!   `set-param` meaning ("occupancy from which the threshold applies").
//! - `used` counts mapped lines of the whole cache; an IO class at its own cap evicts within
//!   the class even when the cache has free lines, and the free-line rule does not see that
//!   (the class cap, not promotion, keeps such a class small).
//! - A request that already has some lines mapped is admitted by the caller without asking
//!   (Open CAS does the same, to avoid pass-through plus invalidation).
//! - [`Promotion::on_inserted`] **purges** the inserted lines' counts, as Open CAS does, so a
//!   line that is evicted later needs `threshold` fresh misses to come back.
//!
//! Open CAS keeps an exact hash of 2 × (cache lines) entries with a ring buffer (about 30 bytes
//! per cache line). We keep a **count-min sketch**: two rows of saturating counters, indexed by
//! the low and high 32 bits of [`position_key`]; a line's count is the smaller of its two
//! counters, and increments are conservative (only counters equal to that minimum grow), which
//! keeps collisions from inflating counts. Purging subtracts the line's count from both of its
//! counters, which clears it without zeroing what other lines sharing a counter put there.
//!
//! Sizing: each row has `max(lines, 4096)` counters. Counters are 4 bits (two per byte) when
//! `threshold` ≤ 15, 8 bits when it is ≤ 255 and 16 bits above (Open CAS allows up to 1000), so
//! the threshold is always honoured exactly; the default costs one byte per cache line.
//! [`Nhit::set_params`] reallocates (dropping counts) only when the counter width must change.
//!
//! Aging: after every `width` increments (one row's worth: `max(lines, 4096)`) every counter is
//! halved, as in TinyLFU, so lines that stopped being missed fade. A line therefore needs its
//! `threshold` misses within roughly a cache's worth of counted misses (Open CAS: within the
//! last 2 × lines distinct missed lines). The period is tied to the row width on purpose: it
//! bounds the load at about one miss per counter, which keeps a stream of one-time misses (a
//! scan) from being admitted through collisions. Measured with 65,536 lines and threshold 3
//! (`nhit_periods`, ignored test): a 1M-miss scan leaks 1.1% of its misses into the cache, and a
//! line re-missed every `lines / 2` misses is admitted on its 3rd or 4th miss. An `8 × lines`
//! period would leak 80% of the scan: the sketch would admit nearly everything.
//!
//! A sketch can only over-count (a line sharing both counters with others), which admits a line
//! early — never a correctness issue, only a line of cache spent.

use crate::policy::promotion::Promotion;
use crate::policy::{NhitParams, position_key};
use crate::units::CoreId;

/// Smallest row, in counters.
const ROW_MIN: usize = 4096;

/// The counters of both rows (row 0 then row 1), in the narrowest width that holds `threshold`.
#[derive(Clone, Debug)]
enum Cells {
    /// 4-bit counters, two per byte (`threshold` ≤ 15).
    Nibbles(Vec<u8>),
    /// 8-bit counters (`threshold` ≤ 255).
    Bytes(Vec<u8>),
    /// 16-bit counters (larger thresholds).
    Words(Vec<u16>),
}

impl Cells {
    /// Zeroed cells for `counters` counters wide enough to count to `threshold`.
    fn for_threshold(threshold: u32, counters: usize) -> Cells {
        if threshold <= 15 {
            Cells::Nibbles(vec![0; counters.div_ceil(2)])
        } else if threshold <= 255 {
            Cells::Bytes(vec![0; counters])
        } else {
            Cells::Words(vec![0; counters])
        }
    }

    /// Bits per counter.
    fn bits(&self) -> u32 {
        match self {
            Cells::Nibbles(_) => 4,
            Cells::Bytes(_) => 8,
            Cells::Words(_) => 16,
        }
    }

    /// The largest count a counter holds (it saturates there).
    fn max(&self) -> u32 {
        (1u32 << self.bits()) - 1
    }

    #[inline]
    fn get(&self, i: usize) -> u32 {
        match self {
            Cells::Nibbles(c) => ((c[i / 2] >> ((i % 2) * 4)) & 0xf) as u32,
            Cells::Bytes(c) => c[i] as u32,
            Cells::Words(c) => c[i] as u32,
        }
    }

    /// Sets counter `i` to `v` (≤ [`Cells::max`]).
    #[inline]
    fn set(&mut self, i: usize, v: u32) {
        match self {
            Cells::Nibbles(c) => {
                let shift = (i % 2) * 4;
                let b = &mut c[i / 2];
                *b = (*b & !(0xf << shift)) | (((v & 0xf) as u8) << shift);
            }
            Cells::Bytes(c) => c[i] = v as u8,
            Cells::Words(c) => c[i] = v as u16,
        }
    }

    /// Halves every counter.
    fn halve(&mut self) {
        match self {
            // Both nibbles at once: shift, then clear the bit that crossed from high to low.
            Cells::Nibbles(c) => c.iter_mut().for_each(|b| *b = (*b >> 1) & 0x77),
            Cells::Bytes(c) => c.iter_mut().for_each(|b| *b >>= 1),
            Cells::Words(c) => c.iter_mut().for_each(|w| *w >>= 1),
        }
    }

    /// Heap bytes held.
    fn heap_bytes(&self) -> usize {
        match self {
            Cells::Nibbles(c) | Cells::Bytes(c) => c.capacity(),
            Cells::Words(c) => c.capacity() * 2,
        }
    }
}

/// `nhit`: admit a line after `threshold` misses once the cache is `trigger_pct` full and
/// admitting it would evict (a free line is always filled).
#[derive(Clone, Debug)]
pub struct Nhit {
    params: NhitParams,
    lines: u32,
    /// Counters per row.
    width: usize,
    cells: Cells,
    /// Increments since the last aging.
    increments: u64,
    /// Increments between agings (`width`).
    period: u64,
}

impl Nhit {
    /// A policy for a cache of `lines` lines.
    pub fn new(params: NhitParams, lines: u32) -> Nhit {
        let width = (lines as usize).max(ROW_MIN);
        Nhit {
            params,
            lines,
            width,
            cells: Cells::for_threshold(params.threshold, 2 * width),
            increments: 0,
            period: width as u64,
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> NhitParams {
        self.params
    }

    /// Changes the parameters. Counts are kept unless the new threshold needs a different
    /// counter width (4, 8 or 16 bits), in which case the sketch starts empty.
    pub fn set_params(&mut self, p: NhitParams) {
        if Cells::for_threshold(p.threshold, 0).bits() != self.cells.bits() {
            *self = Nhit::new(p, self.lines);
        } else {
            self.params = p;
        }
    }

    /// Bits per counter: 4, 8 or 16, the narrowest that holds the threshold.
    pub fn counter_bits(&self) -> u32 {
        self.cells.bits()
    }

    /// The line's current miss count (an upper bound: the sketch may over-count).
    pub fn count(&self, core: CoreId, core_line: u64) -> u32 {
        let [a, b] = self.slots(core, core_line);
        self.cells.get(a).min(self.cells.get(b))
    }

    /// The line's counter in each row: the low and high halves of its key, mapped onto a row
    /// by multiply-shift (no division).
    #[inline]
    fn slots(&self, core: CoreId, core_line: u64) -> [usize; 2] {
        let k = position_key(core, core_line);
        let w = self.width as u64;
        [
            (((k & 0xffff_ffff) * w) >> 32) as usize,
            self.width + (((k >> 32) * w) >> 32) as usize,
        ]
    }

    /// Counts one miss of the line (conservative update) and returns its new count.
    fn bump(&mut self, core: CoreId, core_line: u64) -> u32 {
        let [a, b] = self.slots(core, core_line);
        let (ca, cb) = (self.cells.get(a), self.cells.get(b));
        let n = (ca.min(cb) + 1).min(self.cells.max());
        if ca < n {
            self.cells.set(a, n);
        }
        if cb < n {
            self.cells.set(b, n);
        }
        self.increments += 1;
        if self.increments >= self.period {
            self.increments = 0;
            self.cells.halve();
        }
        n
    }
}

impl Promotion for Nhit {
    fn name(&self) -> &'static str {
        "nhit"
    }

    fn admit(&mut self, core: CoreId, first: u64, count: u32, used: u32, total: u32) -> bool {
        if (used as u64) * 100 < self.params.trigger_pct as u64 * total as u64 {
            return true;
        }
        // The one deviation from Open CAS: room for every line means nothing is evicted.
        if used as u64 + count as u64 <= total as u64 {
            return true;
        }
        let threshold = self.params.threshold.min(self.cells.max());
        let mut all = true;
        for cl in first..first.saturating_add(count as u64) {
            all &= self.bump(core, cl) >= threshold;
        }
        all
    }

    fn on_inserted(&mut self, core: CoreId, first: u64, count: u32) {
        for cl in first..first.saturating_add(count as u64) {
            let [a, b] = self.slots(core, cl);
            let (ca, cb) = (self.cells.get(a), self.cells.get(b));
            let m = ca.min(cb);
            if m > 0 {
                self.cells.set(a, ca - m);
                self.cells.set(b, cb - m);
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        self.cells.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nhit(threshold: u32, trigger_pct: u32, lines: u32) -> Nhit {
        Nhit::new(
            NhitParams {
                threshold,
                trigger_pct,
            },
            lines,
        )
    }

    /// Deterministic well-spread core lines.
    fn scatter(i: u64) -> u64 {
        position_key(CoreId(7), i) >> 20
    }

    #[test]
    fn below_the_trigger_everything_is_admitted_and_nothing_counted() {
        let mut n = nhit(3, 80, 1000);
        for _ in 0..5 {
            assert!(n.admit(CoreId(0), 5, 4, 799, 1000));
        }
        assert_eq!(
            n.count(CoreId(0), 5),
            0,
            "Open CAS does not count below the trigger"
        );
        assert!(
            !n.admit(CoreId(0), 6, 1, 1000, 1000),
            "full (so at the trigger): a first miss waits"
        );
        // trigger 100: engaged only when full; trigger 0: engaged whenever admitting evicts.
        let mut full = nhit(3, 100, 1000);
        assert!(full.admit(CoreId(0), 1, 1, 999, 1000));
        assert!(!full.admit(CoreId(0), 1, 1, 1000, 1000));
        let mut zero = nhit(3, 0, 1000);
        assert!(!zero.admit(CoreId(0), 1, 1, 1000, 1000));
        // Below the trigger a request larger than the free lines is admitted (and evicts).
        assert!(n.admit(CoreId(0), 9, 300, 799, 1000));
    }

    #[test]
    fn free_lines_are_always_filled_and_not_counted() {
        // The deviation from Open CAS: above the trigger, a request that fits in the free lines
        // evicts nothing and is admitted on its first miss.
        for trigger in [0, 50, 80, 100] {
            let mut n = nhit(3, trigger, 1000);
            let c = CoreId(0);
            assert!(n.admit(c, 1, 1, 850, 1000), "trigger {trigger}: free line");
            assert!(
                n.admit(c, 2, 4, 996, 1000),
                "trigger {trigger}: 4 free, 4 asked"
            );
            assert_eq!(
                n.count(c, 2),
                0,
                "admitted into free lines: nothing counted"
            );
            // One line short of room: admitting would evict, so the threshold applies (at
            // trigger 100 the cache is below the trigger: admitted, as in Open CAS).
            let below = trigger == 100;
            assert_eq!(n.admit(c, 10, 5, 996, 1000), below, "trigger {trigger}");
            assert_eq!(n.count(c, 10), !below as u32);
            // Full: a once-seen line stays out, the third miss gets in.
            assert!(!n.admit(c, 20, 1, 1000, 1000));
            assert!(!n.admit(c, 20, 1, 1000, 1000));
            assert!(
                n.admit(c, 20, 1, 1000, 1000),
                "trigger {trigger}: third miss"
            );
        }
    }

    #[test]
    fn admitted_on_the_threshold_th_miss_then_purged() {
        let mut n = nhit(3, 0, 1000);
        let c = CoreId(1);
        assert!(!n.admit(c, 42, 1, 1000, 1000));
        assert!(!n.admit(c, 42, 1, 1000, 1000));
        assert!(n.admit(c, 42, 1, 1000, 1000), "third miss");
        n.on_inserted(c, 42, 1);
        assert_eq!(n.count(c, 42), 0, "purged on insertion");
        assert!(
            !n.admit(c, 42, 1, 1000, 1000),
            "evicted later: counts start again"
        );
        // A request needs every line over the threshold; every line is counted.
        for _ in 0..2 {
            n.admit(c, 100, 1, 1000, 1000);
        }
        assert!(!n.admit(c, 100, 2, 1000, 1000), "line 101 has one miss");
        assert_eq!(n.count(c, 100), 3);
        assert_eq!(n.count(c, 101), 1);
        assert!(!n.admit(c, 100, 2, 1000, 1000));
        assert!(n.admit(c, 100, 2, 1000, 1000), "both lines at 3 or more");
        assert!(n.admit(c, 7, 0, 1000, 1000), "an empty request");
        // Cores are distinct positions.
        assert_eq!(n.count(CoreId(2), 100), 0);
    }

    #[test]
    fn distinct_lines_rarely_interfere() {
        let c = CoreId(0);
        // 1000 lines missed twice each: none is due yet, but a line whose two counters both
        // carry another line's misses looks due. Below 1% once the cache is a few times larger
        // than the set of missed lines; the smallest sketch (4096 counters a row, 1000 lines)
        // measures 1.5%.
        for (lines, max_early) in [(4096u32, 30), (16384, 10), (1 << 16, 10)] {
            let mut n = nhit(3, 0, lines);
            let mut early = 0;
            for _pass in 0..2 {
                for i in 0..1000u64 {
                    early += n.admit(c, scatter(i), 1, 1, 1) as u32;
                }
            }
            assert!(
                early < max_early,
                "{lines} lines: {early} of 1000 admitted before their 3rd miss"
            );
            // Each is admitted on its third.
            let due = (0..1000u64)
                .filter(|&i| n.admit(c, scatter(i), 1, 1, 1))
                .count();
            assert!(
                due >= 990,
                "{lines} lines: {due} of 1000 admitted on their 3rd miss"
            );
        }
    }

    #[test]
    fn a_scan_of_one_time_misses_stays_out() {
        // A million one-time misses: aging keeps counters sparse, so collisions admit few
        // (measured 1.1%).
        let lines = 1 << 16;
        let mut n = nhit(3, 80, lines);
        let c = CoreId(3);
        let misses = 16 * lines as u64;
        let admitted = (0..misses)
            .filter(|&i| n.admit(c, 1 << 40 | i, 1, lines, lines))
            .count() as u64;
        assert!(
            admitted * 50 < misses,
            "{admitted} of {misses} one-time misses admitted"
        );
        // Meanwhile a line missed three times in quick succession still gets in.
        assert!(!n.admit(c, 5, 1, lines, lines));
        assert!(!n.admit(c, 5, 1, lines, lines));
        assert!(n.admit(c, 5, 1, lines, lines));
    }

    #[test]
    fn counts_fade_with_age() {
        let lines = 4096;
        let mut n = nhit(3, 0, lines);
        let c = CoreId(0);
        n.admit(c, 1, 1, 1, 1);
        n.admit(c, 1, 1, 1, 1);
        assert_eq!(n.count(c, 1), 2);
        // One period of increments (of a few other lines) halves everything.
        for i in 0..n.period {
            n.admit(c, 1_000_000 + i % 16, 1, 1, 1);
        }
        assert_eq!(n.count(c, 1), 1);
        for i in 0..n.period {
            n.admit(c, 1_000_000 + i % 16, 1, 1, 1);
        }
        assert_eq!(n.count(c, 1), 0, "a stale line is forgotten");
        assert!(!n.admit(c, 1, 1, 1, 1));
    }

    #[test]
    fn memory_is_a_byte_per_line() {
        let n = nhit(3, 80, 1 << 20);
        assert_eq!(n.heap_bytes(), 1 << 20, "one byte per line");
        assert_eq!(n.counter_bits(), 4);
        let small = nhit(3, 80, 100);
        assert_eq!(
            small.heap_bytes(),
            ROW_MIN,
            "4096 counters per row at least"
        );
        assert_eq!(nhit(200, 80, 1 << 20).heap_bytes(), 2 << 20);
        assert_eq!(nhit(1000, 80, 1 << 20).heap_bytes(), 4 << 20);
    }

    #[test]
    fn large_thresholds_are_exact() {
        for (threshold, bits) in [(15, 4), (16, 8), (100, 8), (255, 8), (256, 16), (1000, 16)] {
            let mut w = nhit(threshold, 0, 1 << 20);
            assert_eq!(w.counter_bits(), bits, "threshold {threshold}");
            for i in 1..threshold {
                assert!(!w.admit(CoreId(0), 9, 1, 1, 1), "miss {i} of {threshold}");
            }
            assert!(w.admit(CoreId(0), 9, 1, 1, 1), "miss {threshold}");
        }
    }

    #[test]
    fn set_params_keeps_counts_unless_the_width_changes() {
        let mut s = nhit(3, 0, 4096);
        s.admit(CoreId(0), 1, 1, 1, 1);
        s.admit(CoreId(0), 1, 1, 1, 1);
        s.set_params(NhitParams {
            threshold: 2,
            trigger_pct: 50,
        });
        assert_eq!(s.params().trigger_pct, 50);
        assert_eq!(s.count(CoreId(0), 1), 2, "same width: counts kept");
        s.set_params(NhitParams {
            threshold: 20,
            trigger_pct: 0,
        });
        assert_eq!(s.counter_bits(), 8);
        assert_eq!(s.count(CoreId(0), 1), 0, "new width: a fresh sketch");
        assert_eq!(s.heap_bytes(), 2 * 4096, "two rows of 4096 bytes");
    }

    /// Measures false admissions under a scan for several aging periods (run by hand:
    /// `cargo test -p tiercache-core --lib nhit_periods -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn nhit_periods() {
        let lines = 1u32 << 16;
        for eighths in [4u64, 6, 8, 12, 64] {
            let mut n = nhit(3, 0, lines);
            n.period = lines as u64 * eighths / 8;
            let misses = 16 * lines as u64;
            let scan = (0..misses)
                .filter(|&i| n.admit(CoreId(0), 1 << 40 | i, 1, 1, 1))
                .count();
            // Hot lines missed every `gap` scan misses: on which miss are they admitted?
            let mut third = Vec::new();
            let mut mean = Vec::new();
            for gap in [
                lines as u64 / 8,
                lines as u64 / 4,
                lines as u64 / 2,
                lines as u64,
            ] {
                let (mut ok3, mut total) = (0, 0u64);
                for h in 0..100u64 {
                    let line = 1 << 41 | h << 20 | gap;
                    let mut k = 1;
                    while k <= 12 {
                        let got = n.admit(CoreId(0), line, 1, 1, 1);
                        for j in 0..gap {
                            n.admit(
                                CoreId(0),
                                1 << 42 | h << 30 | gap << 20 | k << 16 | j,
                                1,
                                1,
                                1,
                            );
                        }
                        if got {
                            break;
                        }
                        k += 1;
                    }
                    ok3 += (k <= 3) as u32;
                    total += k;
                }
                third.push(ok3);
                mean.push(format!("{:.1}", total as f64 / 100.0));
            }
            println!(
                "period {}/8 lines: scan {:.3}%, hot by 3rd miss (of 100) at gaps \
                 lines/8,/4,/2,1: {third:?}, mean miss # (cap 13): {mean:?}",
                eighths,
                scan as f64 * 100.0 / misses as f64
            );
        }
    }
}
