//! Textbook LRU miss-ratio curves in one pass (Mattson's stack distances, counted with a
//! Fenwick tree over access times), exact or on a spatially sampled trace (SHARDS with a
//! fixed rate: a line is in the sample when a hash of its number falls below the rate, and
//! sampled distances are scaled by 1 / rate). A request is in the sample when any of its lines
//! is, weighted by the inverse of that probability; the sample is corrected as SHARDS-adj
//! does: the difference between the trace's requests and the sample's weight is counted at
//! distance 0.
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
/// line distance at each value (prefix sums after the pass). Counts are weights: a sampled
/// request stands for 1 / P(sampled) requests (a request of k lines is in the sample with
/// probability 1 − (1 − rate)^k, so long requests would otherwise be over-represented).
#[derive(Default, Clone, Debug)]
struct OpHist {
    n: f64,
    full: Vec<f64>,
    any: Vec<f64>,
}

fn bump(v: &mut Vec<f64>, d: u64, x: f64) {
    let d = d as usize;
    if v.len() <= d {
        v.resize(d + 1, 0.0);
    }
    v[d] += x;
}

fn to_prefix(v: &mut Vec<f64>) {
    let mut s = 0.0;
    for x in v.iter_mut() {
        let y = *x;
        *x = s;
        s += y;
    }
    v.push(s);
}

/// Weight of prefix-summed `v` at values below `t`.
fn below(v: &[f64], t: f64) -> f64 {
    let i = (t.ceil().max(0.0) as usize).min(v.len() - 1);
    v[i]
}

/// `total × (part + adj) / (whole + adj)`, rounded: the share of a sampled weight in the
/// whole trace, with SHARDS-adj's correction `adj` (0 when exact, where it is `part`).
fn scale(total: u64, part: f64, whole: f64, adj: f64) -> u64 {
    if adj == 0.0 && whole == total as f64 {
        return part.round() as u64;
    }
    let w = whole + adj;
    if w <= 0.0 {
        return 0;
    }
    (total as f64 * ((part + adj) / w).clamp(0.0, 1.0)).round() as u64
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
    read_bytes: Vec<f64>,
    sampled_read_bytes: f64,
    /// Whole-trace totals (the sample is scaled to them).
    mix: Mix,
    /// Line accesses walked (sampled ones).
    pub accesses: u64,
    /// Distinct lines seen (sampled ones).
    pub distinct: u64,
}

/// Walks the trace once. `rate` in (0, 1]: 1 is exact, below samples lines (SHARDS). The
/// sampled line accesses must be fewer than 2^32 (callers check; the time index is a `u32`).
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
        sampled_read_bytes: 0.0,
        mix: Mix::default(),
        accesses: n as u64,
        distinct: 0,
    };
    let mut t = 0u32;
    for r in reqs.iter().filter(|r| counted(r)) {
        let is_read = r.op == Op::Read;
        p.mix.count(r);
        let (first, cnt) = lines_of(r, line_bytes);
        let weight = 1.0 / (1.0 - (1.0 - p.rate).powi(cnt.min(i32::MAX as u64) as i32));
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
                p.sampled_read_bytes += (hi - lo) as f64;
                if d != u64::MAX {
                    bump(&mut p.read_bytes, d, (hi - lo) as f64);
                }
            }
        }
        if !any {
            continue;
        }
        let h = if is_read { &mut p.read } else { &mut p.write };
        h.n += weight;
        if dmax != u64::MAX {
            bump(&mut h.full, dmax, weight);
        }
        if dmin != u64::MAX {
            bump(&mut h.any, dmin, weight);
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
        // SHARDS-adj: the requests the sample misses (or has too many of: a few very hot
        // lines in or out of it) count as hits at distance 0.
        let adj = |total: u64, h: &OpHist| {
            if self.rate < 1.0 {
                total as f64 - h.n
            } else {
                0.0
            }
        };
        let (m, r, w) = (&self.mix, &self.read, &self.write);
        let rh = scale(m.reads, below(&r.full, t), r.n, adj(m.reads, r));
        let wh = scale(m.writes, below(&w.full, t), w.n, adj(m.writes, w));
        let partial = scale(m.reads, below(&r.any, t), r.n, adj(m.reads, r)).saturating_sub(rh)
            + scale(m.writes, below(&w.any, t), w.n, adj(m.writes, w)).saturating_sub(wh);
        let bytes_adj = if self.rate < 1.0 {
            m.read_bytes as f64 * self.rate - self.sampled_read_bytes
        } else {
            0.0
        };
        let read_hit_bytes = scale(
            m.read_bytes,
            below(&self.read_bytes, t),
            self.sampled_read_bytes,
            bytes_adj,
        );
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
