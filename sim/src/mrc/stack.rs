//! Textbook LRU miss-ratio curves in one pass (Mattson's stack distances, counted with a
//! Fenwick tree over access times), exact or on a spatially sampled trace (SHARDS with a
//! fixed rate: a line is in the sample when a hash of its number falls below the rate, and
//! sampled distances are scaled by 1 / rate). The sample is corrected as SHARDS-adj does:
//! the difference between the expected and the actual number of sampled requests (which a
//! few very hot lines in or out of the sample make large) is counted at distance 0.
//!
//! The stack distance of a line access is the number of distinct other lines accessed since
//! the same line was last accessed (infinite the first time); an LRU cache of C lines hits
//! exactly the accesses with distance < C. A request's lines are accessed in address order,
//! reads and writes alike (a write hit refreshes recency, as in textbook LRU and Open CAS).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::{Mix, Point, counted, lines_of};
use crate::trace::{Op, Request};

/// A fast hasher for line numbers (multiply-rotate; the keys are not adversarial).
#[derive(Default)]
pub struct LineHasher(u64);

impl Hasher for LineHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Line number → value.
pub type LineMap = HashMap<u64, u32, BuildHasherDefault<LineHasher>>;

/// SHARDS's sampling hash: a line is sampled when `mix(line) % 2^24 < rate × 2^24`.
fn sampled(line: u64, threshold: u64) -> bool {
    let mut z = line.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z & 0xff_ffff < threshold
}

/// A Fenwick tree of 0/1 marks over access times.
struct Fenwick(Vec<i32>);

impl Fenwick {
    fn add(&mut self, i: usize, v: i32) {
        let mut i = i + 1;
        while i < self.0.len() {
            self.0[i] += v;
            i += i & i.wrapping_neg();
        }
    }
    /// Sum over `[0, i)`.
    fn prefix(&self, i: usize) -> i64 {
        let (mut i, mut s) = (i, 0i64);
        while i > 0 {
            s += self.0[i] as i64;
            i &= i - 1;
        }
        s
    }
}

/// Per operation: requests, and how many had their largest (`full`) and smallest (`any`)
/// line distance at each value (prefix sums after [`Profile::finish`]).
#[derive(Default, Clone, Debug)]
struct OpHist {
    n: u64,
    /// Requests expected in the sample (Σ 1 − (1 − rate)^lines).
    expected: f64,
    full: Vec<u64>,
    any: Vec<u64>,
}

fn bump(v: &mut Vec<u64>, d: u64, x: u64) {
    let d = d as usize;
    if v.len() <= d {
        v.resize(d + 1, 0);
    }
    v[d] += x;
}

fn to_prefix(v: &mut Vec<u64>) {
    let mut s = 0;
    for x in v.iter_mut() {
        let y = *x;
        *x = s;
        s += y;
    }
    v.push(s);
}

/// Entries of prefix-summed `v` with value below `t`.
fn below(v: &[u64], t: f64) -> u64 {
    let i = (t.ceil().max(0.0) as usize).min(v.len() - 1);
    v[i]
}

/// `total × part / whole`, rounded (exact when `whole == total`).
fn scale(total: u64, part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    ((total as u128 * part as u128 * 2 + whole as u128) / (2 * whole as u128)) as u64
}

/// The distance histograms of one pass; [`Profile::point`] evaluates any cache size.
#[derive(Clone, Debug)]
pub struct Profile {
    /// Sampling rate (1.0: exact).
    pub rate: f64,
    line_bytes: u64,
    read: OpHist,
    write: OpHist,
    /// Read bytes by line distance (prefix-summed), and the sampled read bytes.
    read_bytes: Vec<u64>,
    sampled_read_bytes: u64,
    /// Whole-trace totals (the sample is scaled to them).
    mix: Mix,
    /// Line accesses walked (sampled ones).
    pub accesses: u64,
    /// Distinct lines seen (sampled ones).
    pub distinct: u64,
}

/// Walks the trace once. `rate` in (0, 1]: 1 is exact, below samples lines (SHARDS).
pub fn profile(reqs: &[Request], line_bytes: u64, rate: f64) -> Profile {
    let threshold = ((rate.clamp(0.0, 1.0) * (1u64 << 24) as f64).round() as u64).max(1);
    let exact = threshold >= 1 << 24;
    let take = |l: u64| exact || sampled(l, threshold);
    // Size the tree: sampled line accesses.
    let mut n = 0usize;
    for r in reqs.iter().filter(|r| counted(r)) {
        let (first, cnt) = lines_of(r, line_bytes);
        n += if exact {
            cnt as usize
        } else {
            (first..first + cnt).filter(|&l| take(l)).count()
        };
    }
    let mut bit = Fenwick(vec![0; n + 1]);
    let mut last = LineMap::default();
    let mut p = Profile {
        rate: if exact { 1.0 } else { rate },
        line_bytes,
        read: OpHist::default(),
        write: OpHist::default(),
        read_bytes: Vec::new(),
        sampled_read_bytes: 0,
        mix: Mix::default(),
        accesses: n as u64,
        distinct: 0,
    };
    let mut t = 0u32;
    for r in reqs.iter().filter(|r| counted(r)) {
        let is_read = r.op == Op::Read;
        p.mix.count(r);
        let (first, cnt) = lines_of(r, line_bytes);
        let expect = 1.0 - (1.0 - p.rate).powi(cnt.min(i32::MAX as u64) as i32);
        if is_read {
            p.read.expected += expect;
        } else {
            p.write.expected += expect;
        }
        let (mut dmin, mut dmax, mut any) = (u64::MAX, 0u64, false);
        for l in first..first + cnt {
            if !take(l) {
                continue;
            }
            any = true;
            let d = match last.insert(l, t) {
                Some(prev) => {
                    let d = bit.prefix(t as usize) - bit.prefix(prev as usize + 1);
                    bit.add(prev as usize, -1);
                    d as u64
                }
                None => u64::MAX,
            };
            bit.add(t as usize, 1);
            t += 1;
            dmin = dmin.min(d);
            dmax = dmax.max(d);
            if is_read {
                let lo = r.offset.max(l * line_bytes);
                let hi = r.end().min((l + 1) * line_bytes);
                p.sampled_read_bytes += hi - lo;
                if d != u64::MAX {
                    bump(&mut p.read_bytes, d, hi - lo);
                }
            }
        }
        if !any {
            continue;
        }
        let h = if is_read { &mut p.read } else { &mut p.write };
        h.n += 1;
        if dmax != u64::MAX {
            bump(&mut h.full, dmax, 1);
        }
        if dmin != u64::MAX {
            bump(&mut h.any, dmin, 1);
        }
    }
    p.distinct = last.len() as u64;
    for v in [
        &mut p.read.full,
        &mut p.read.any,
        &mut p.write.full,
        &mut p.write.any,
        &mut p.read_bytes,
    ] {
        to_prefix(v);
    }
    p
}

impl Profile {
    /// The result for an LRU cache of `lines` lines.
    pub fn point(&self, lines: u64) -> Point {
        // Sampled distance d stands for d / rate: a hit when d / rate < lines.
        let t = lines as f64 * self.rate;
        // SHARDS-adj: the missing (or surplus) sampled requests count as hits at distance 0.
        let adj = |h: &OpHist| {
            if self.rate < 1.0 {
                h.expected - h.n as f64
            } else {
                0.0
            }
        };
        let frac = |x: u64, h: &OpHist| {
            let n = h.n as f64 + adj(h);
            if n <= 0.0 {
                0.0
            } else {
                ((x as f64 + adj(h)) / n).clamp(0.0, 1.0)
            }
        };
        let hits = |total: u64, h: &OpHist| {
            if self.rate < 1.0 {
                (total as f64 * frac(below(&h.full, t), h)).round() as u64
            } else {
                scale(total, below(&h.full, t), h.n)
            }
        };
        let any = |total: u64, h: &OpHist| {
            if self.rate < 1.0 {
                (total as f64 * frac(below(&h.any, t), h)).round() as u64
            } else {
                scale(total, below(&h.any, t), h.n)
            }
        };
        let (rh, wh) = (
            hits(self.mix.reads, &self.read),
            hits(self.mix.writes, &self.write),
        );
        let partial = any(self.mix.reads, &self.read).saturating_sub(rh)
            + any(self.mix.writes, &self.write).saturating_sub(wh);
        let hit_bytes = below(&self.read_bytes, t);
        let missing = if self.rate < 1.0 {
            (self.mix.read_bytes as f64 * self.rate - self.sampled_read_bytes as f64).max(0.0)
        } else {
            0.0
        };
        let read_hit_bytes = if self.rate < 1.0 {
            let whole = self.sampled_read_bytes as f64 + missing;
            if whole <= 0.0 {
                0
            } else {
                (self.mix.read_bytes as f64 * ((hit_bytes as f64 + missing) / whole).min(1.0))
                    as u64
            }
        } else {
            scale(self.mix.read_bytes, hit_bytes, self.sampled_read_bytes)
        };
        Point {
            bytes: lines * self.line_bytes,
            lines,
            reads: self.mix.reads,
            writes: self.mix.writes,
            read_hits: rh,
            write_hits: wh,
            partial_hits: partial,
            core_read_bytes: self.mix.read_bytes - read_hit_bytes,
            core_write_bytes: self.mix.write_bytes,
            writeback_bytes: 0,
        }
    }
}
