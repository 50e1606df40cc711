//! The per-512-byte-block oracle of the tests that load the real daemon and crash it
//! (`sigkill.rs`, `soak.rs`): what each version of a block holds, and which versions a block may
//! legally hold while running and after a crash (SPEC durability contract, docs/SAFETY.md).
//!
//! Include it with `#[path = "common/oracle.rs"] mod oracle;`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;

/// The unit of the durability contract.
pub const SECTOR: usize = 512;

/// The seeded generator (the same seed gives the same choices) and its hash.
pub use tiercache_testkit::rng::{SplitMix as Rng, mix};

/// The 512 bytes that version `v` of sector `s` holds (version 0: zeros, the initial content
/// and what a TRIM or WRITE_ZEROES leaves).
pub fn fill(s: usize, v: u64, out: &mut [u8]) {
    if v == 0 {
        out.fill(0);
        return;
    }
    out[..8].copy_from_slice(&(s as u64).to_le_bytes());
    out[8..16].copy_from_slice(&v.to_le_bytes());
    let mut h = mix(v ^ ((s as u64) << 20));
    for c in out[16..].chunks_mut(8) {
        h = mix(h);
        c.copy_from_slice(&h.to_le_bytes());
    }
}

/// The version a sector's bytes are: a write's (see [`fill`]), or a content [`merge`] made.
pub fn decode(s: usize, b: &[u8]) -> Option<u64> {
    decode_fill(s, b).or_else(|| {
        let m = MERGED.lock().unwrap();
        m.as_ref()?.by_content.get(&(s, b.to_vec())).copied()
    })
}

/// Contents of sectors that an unaligned write, TRIM or WRITE_ZEROES covered in part: the
/// server merged the new bytes into what the sector held (read-modify-write). Each distinct
/// content gets a version of its own, above every write's.
#[derive(Default)]
struct Merged {
    by_id: HashMap<u64, Vec<u8>>,
    by_content: HashMap<(usize, Vec<u8>), u64>,
}

static MERGED: Mutex<Option<Merged>> = Mutex::new(None);

/// The version sector `s` holds once bytes `[lo, hi)` of version `new` (0: zeros) are merged
/// into version `old` (what it holds now): a write's version if the result is exactly one,
/// else the merged content's own.
pub fn merge(s: usize, old: u64, new: u64, lo: usize, hi: usize) -> u64 {
    let mut b = vec![0u8; SECTOR];
    let mut n = vec![0u8; SECTOR];
    let mut g = MERGED.lock().unwrap();
    let m = g.get_or_insert_with(Merged::default);
    match m.by_id.get(&old) {
        Some(c) => b.copy_from_slice(c),
        None => fill(s, old, &mut b),
    }
    fill(s, new, &mut n);
    b[lo..hi].copy_from_slice(&n[lo..hi]);
    if let Some(v) = decode_fill(s, &b) {
        return v;
    }
    if let Some(&v) = m.by_content.get(&(s, b.clone())) {
        return v;
    }
    let v = (1 << 63) | m.by_id.len() as u64;
    m.by_id.insert(v, b.clone());
    m.by_content.insert((s, b), v);
    v
}

/// The version a sector's bytes are if they are exactly a write's bytes ([`fill`]).
fn decode_fill(s: usize, b: &[u8]) -> Option<u64> {
    if b.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let v = u64::from_le_bytes(b[8..16].try_into().unwrap());
    let mut want = [0u8; SECTOR];
    fill(s, v, &mut want);
    (want[..] == *b).then_some(v)
}

/// What became of a write (or TRIM / WRITE_ZEROES, version 0) of a sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Sent, no reply (yet): the daemon may have done it or not.
    InFlight,
    /// Replied to with success.
    Acked,
    /// Replied to with an error: the sector holds the old or the new data.
    Failed,
}

/// One sector, written by one client at a time (at most one request on it in flight).
///
/// - After a crash the sector may hold `floor` (the last flushed or settled version) or any
///   version in `later` (written after it: acknowledged, failed, or in flight at the crash).
/// - While running, a read must return one of `now`: the newest acknowledged version, plus the
///   versions of the writes that failed since (old or new data, SAFETY "Failed writes"). What a
///   read returned is then the only legal value until the next write (no flip-flop).
#[derive(Clone, Debug)]
pub struct Sector {
    pub floor: u64,
    pub later: Vec<(u64, Fate)>,
    pub now: Vec<u64>,
    /// The last events on this sector, for the report of a violation.
    pub history: Vec<String>,
}

impl Default for Sector {
    fn default() -> Sector {
        Sector {
            floor: 0,
            later: Vec::new(),
            now: vec![0],
            history: Vec::new(),
        }
    }
}

impl Sector {
    pub fn note(&mut self, round: usize, what: &str, v: u64) {
        if self.history.len() >= 12 {
            self.history.remove(0);
        }
        self.history.push(format!("r{round}:{what}:{v}"));
    }

    /// Version `v` is about to be sent: from here it is legal after a crash.
    pub fn issue(&mut self, v: u64) {
        self.later.push((v, Fate::InFlight));
    }

    fn mark(&mut self, v: u64, f: Fate) -> usize {
        let i = self
            .later
            .iter()
            .rposition(|&(x, g)| x == v && g == Fate::InFlight)
            .expect("the version was issued");
        self.later[i].1 = f;
        i
    }

    /// The write of `v` succeeded; with `fua` it is durable (nothing older is legal any more).
    pub fn acked(&mut self, v: u64, fua: bool) {
        let i = self.mark(v, Fate::Acked);
        self.now = vec![v];
        if fua {
            self.floor = v;
            self.later.drain(..=i);
        }
    }

    /// The write of `v` failed: old or new data from now on.
    pub fn failed(&mut self, v: u64) {
        self.mark(v, Fate::Failed);
        if !self.now.contains(&v) {
            self.now.push(v);
        }
    }

    /// A flush covering this sector's completed writes succeeded: the last acknowledged one is
    /// the new floor (failed writes after it stay legal, older ones do not).
    pub fn flushed(&mut self) {
        if let Some(i) = self.later.iter().rposition(|&(_, f)| f == Fate::Acked) {
            self.floor = self.later[i].0;
            self.later.drain(..=i);
        }
    }

    /// Whether anything was written since the floor.
    pub fn unflushed(&self) -> bool {
        !self.later.is_empty()
    }

    /// The newest acknowledged version (a read while running returns it unless a write failed).
    pub fn newest(&self) -> u64 {
        self.now[0]
    }

    /// A read while running returned `got` (`None`: bytes of no write).
    pub fn check_read(&mut self, s: usize, got: Option<u64>) -> Result<(), String> {
        match got {
            Some(v) if self.now.contains(&v) => {
                self.now = vec![v];
                Ok(())
            }
            _ => Err(format!(
                "sector {s} returned {got:?}; legal now: {:?} (newest acknowledged first); history {:?}",
                self.now, self.history
            )),
        }
    }

    /// After a crash (or a restart), the sector holds `got`: legal?
    pub fn check_crash(&self, s: usize, got: Option<u64>) -> Result<u64, String> {
        let Some(v) = got else {
            return Err(format!(
                "sector {s} holds bytes of no write (torn inside the block or damaged); floor {}, later {:?}, history {:?}",
                self.floor, self.later, self.history
            ));
        };
        if v != self.floor && !self.later.iter().any(|&(x, _)| x == v) {
            return Err(format!(
                "sector {s} holds version {v}; legal: floor {} (flushed) or later {:?}; history {:?}",
                self.floor, self.later, self.history
            ));
        }
        Ok(v)
    }

    /// The value the sector settled on after a restart: it must survive every later crash
    /// until the sector is written again.
    pub fn settle(&mut self, round: usize, v: u64) {
        if self.floor != v || !self.later.is_empty() {
            self.note(round, "settled", v);
        }
        self.floor = v;
        self.later.clear();
        self.now = vec![v];
    }
}
