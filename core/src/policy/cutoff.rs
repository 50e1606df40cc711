//! Sequential cutoff: detect sequential streams per core and pass them through, so a backup or
//! a copy does not flush the cache's working set (Open CAS semantics, `ocf_seq_cutoff.c`).
//!
//! Each core tracks up to [`STREAMS_MAX`] streams: the next expected block with the direction
//! (reads and writes are separate streams), the bytes and requests seen, and a place in a
//! recency list for LRU recycling. The exact rule, per [`SeqCutoff::check`]:
//!
//! 1. `never`: return false; nothing is tracked.
//! 2. The request **continues** a stream iff some stream has its direction and expects its
//!    first block (`lba == stream end`). Then `bytes += request bytes`, `requests += 1`, the
//!    stream's end moves to the request's end and the stream becomes the most recently used.
//! 3. Otherwise the request **starts** a stream in the least recently used slot (`bytes` =
//!    the request's bytes, `requests` = 1), replacing whatever was there. A direction change
//!    is such a new stream: a read at a write stream's end starts a read stream from zero bytes
//!    and leaves the write stream as it was.
//! 4. The request is cut off (goes pass-through) iff it **continued** a stream, the stream's
//!    bytes *including this request* are ≥ `threshold_bytes`, and the policy allows it:
//!    `always` always, `full` only when the caller says the cache is full (Open CAS: free lines
//!    ≤ 512 + the request's lines). So the first request of a stream is never cut, however
//!    large (Open CAS requires a tracked stream too); with a 16 KiB threshold and 4 KiB
//!    sequential requests the 4th request is the first cut.
//! 5. If another stream expected the same next block (one stream caught up with another),
//!    that other stream is forgotten and its slot is reused first.
//!
//! `promotion_count` is accepted and kept for Open CAS compatibility. In Open CAS it moves a
//! stream from a per-queue detector (64 streams) to the per-core one (128) after that many
//! requests; tiercache's core is single-threaded and keeps one detector per core, so every
//! stream is visible at once and the count changes no decision.
//!
//! Lookup is O(1): the slots are a fixed array allocated once, found through an open-addressing
//! index (1024 entries, linear probing, backward-shift deletion) keyed by the next expected
//! block, and recycled through an intrusive doubly linked recency list.

use crate::policy::{CutoffParams, CutoffPolicy};
use crate::units::{BLOCK_BYTES, Lba};

/// Streams tracked per core (Open CAS: 128 per core).
pub const STREAMS_MAX: usize = 128;

/// Key bit for writes: a stream's key is its next expected block with the direction on top.
const WRITE_BIT: u64 = 1 << 63;
/// Highest block a key holds (so no key is [`EMPTY`]).
const LBA_MAX: u64 = WRITE_BIT - 2;
/// Key of an unused slot.
const EMPTY: u64 = u64::MAX;

/// One stream (its next expected block and direction are its key, kept apart for the index).
#[derive(Copy, Clone, Debug, Default)]
struct Stream {
    /// Bytes of the requests that made up the stream.
    bytes: u64,
    /// Requests that made up the stream (kept for Open CAS's `promotion_count`, see above).
    requests: u32,
    /// Recency list (slot ids): towards more and less recently used.
    newer: u8,
    older: u8,
}

/// Index entries, a power of two: eight per stream, so the home entry of a key that is not
/// tracked (every random request looks up two such keys) is almost always empty, and probe and
/// backward-shift runs are rarely longer than one entry. At two per stream the check was the
/// largest single cost of a cache hit (`tiercache bench core`).
const INDEX_BITS: u32 = 10;
const INDEX: usize = 1 << INDEX_BITS;
/// An empty index entry or the end of the recency list.
const NO_SLOT: u8 = u8::MAX;
const _: () = assert!(STREAMS_MAX < NO_SLOT as usize && INDEX >= 8 * STREAMS_MAX);

/// A core's sequential-stream detector and cutoff decision.
#[derive(Clone, Debug)]
pub struct SeqCutoff {
    params: CutoffParams,
    /// Per slot: next expected block with the direction in the top bit; `EMPTY` if unused.
    keys: Box<[u64; STREAMS_MAX]>,
    streams: Box<[Stream; STREAMS_MAX]>,
    /// Key → slot: open addressing with linear probing over `INDEX` entries, so a request
    /// finds its stream in a probe or two instead of scanning all of them.
    index: Box<[u8; INDEX]>,
    /// Most and least recently used slots.
    newest: u8,
    oldest: u8,
}

impl SeqCutoff {
    /// A detector with `params` and no streams.
    pub fn new(params: CutoffParams) -> SeqCutoff {
        SeqCutoff {
            params,
            keys: Box::new([EMPTY; STREAMS_MAX]),
            streams: Box::new([Stream::default(); STREAMS_MAX]),
            index: Box::new([NO_SLOT; INDEX]),
            newest: 0,
            oldest: 0,
        }
        .with_recency_chain()
    }

    /// Links every slot into the recency list, slot 0 newest.
    fn with_recency_chain(mut self) -> Self {
        for i in 0..STREAMS_MAX {
            self.streams[i].newer = if i == 0 { NO_SLOT } else { (i - 1) as u8 };
            self.streams[i].older = if i + 1 == STREAMS_MAX {
                NO_SLOT
            } else {
                (i + 1) as u8
            };
        }
        self.newest = 0;
        self.oldest = (STREAMS_MAX - 1) as u8;
        self
    }

    /// Makes `slot` the most recently used.
    fn touch(&mut self, slot: usize) {
        if self.newest as usize == slot {
            return;
        }
        let (newer, older) = (self.streams[slot].newer, self.streams[slot].older);
        // Unlink (slot is not the newest, so `newer` is a slot).
        self.streams[newer as usize].older = older;
        if older == NO_SLOT {
            self.oldest = newer;
        } else {
            self.streams[older as usize].newer = newer;
        }
        // Link at the front.
        self.streams[slot].newer = NO_SLOT;
        self.streams[slot].older = self.newest;
        self.streams[self.newest as usize].newer = slot as u8;
        self.newest = slot as u8;
    }

    /// Makes `slot` the least recently used (the next one a new stream takes).
    fn demote(&mut self, slot: usize) {
        if self.oldest as usize == slot {
            return;
        }
        let (newer, older) = (self.streams[slot].newer, self.streams[slot].older);
        // Unlink (slot is not the oldest, so `older` is a slot).
        self.streams[older as usize].newer = newer;
        if newer == NO_SLOT {
            self.newest = older;
        } else {
            self.streams[newer as usize].older = older;
        }
        // Link at the back.
        self.streams[slot].older = NO_SLOT;
        self.streams[slot].newer = self.oldest;
        self.streams[self.oldest as usize].older = slot as u8;
        self.oldest = slot as u8;
    }

    #[inline]
    fn home(key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - INDEX_BITS)) as usize
    }

    /// The slot whose key is `key`.
    fn find(&self, key: u64) -> Option<usize> {
        let mut i = Self::home(key);
        loop {
            let s = self.index[i];
            if s == NO_SLOT {
                return None;
            }
            if self.keys[s as usize] == key {
                return Some(s as usize);
            }
            i = (i + 1) % INDEX;
        }
    }

    fn index_insert(&mut self, slot: usize) {
        let mut i = Self::home(self.keys[slot]);
        while self.index[i] != NO_SLOT {
            i = (i + 1) % INDEX;
        }
        self.index[i] = slot as u8;
    }

    /// Removes `slot`'s entry (keyed by its current key) with backward-shift deletion.
    fn index_remove(&mut self, slot: usize) {
        let mut i = Self::home(self.keys[slot]);
        while self.index[i] as usize != slot {
            debug_assert_ne!(self.index[i], NO_SLOT, "stream missing from its index");
            i = (i + 1) % INDEX;
        }
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) % INDEX;
            let s = self.index[j];
            if s == NO_SLOT {
                break;
            }
            let h = Self::home(self.keys[s as usize]);
            let stays = if hole <= j {
                h > hole && h <= j
            } else {
                h > hole || h <= j
            };
            if !stays {
                self.index[hole] = s;
                hole = j;
            }
        }
        self.index[hole] = NO_SLOT;
    }

    /// The parameters in force.
    pub fn params(&self) -> CutoffParams {
        self.params
    }

    /// Changes the parameters; tracked streams are kept.
    pub fn set_params(&mut self, p: CutoffParams) {
        self.params = p;
    }

    /// Records a read or write of `blocks` blocks at `lba` and says whether to cut it off.
    pub fn check(&mut self, is_write: bool, lba: Lba, blocks: u32, cache_full: bool) -> bool {
        if self.params.policy == CutoffPolicy::Never {
            return false;
        }
        let dir = if is_write { WRITE_BIT } else { 0 };
        // Addresses are clamped below the direction bit (and below `EMPTY`); no real device
        // reaches 2^63 blocks.
        let key = lba.0.min(LBA_MAX) | dir;
        let next = lba.0.saturating_add(blocks as u64).min(LBA_MAX) | dir;
        let bytes = blocks as u64 * BLOCK_BYTES;
        let continues = self.find(key);
        let slot = match continues {
            Some(i) => {
                let s = &mut self.streams[i];
                s.bytes = s.bytes.saturating_add(bytes);
                s.requests = s.requests.saturating_add(1);
                i
            }
            None => {
                // A new stream replaces the least recently used one.
                let i = self.oldest as usize;
                self.streams[i].bytes = bytes;
                self.streams[i].requests = 1;
                i
            }
        };
        if self.keys[slot] != EMPTY {
            self.index_remove(slot);
        }
        self.keys[slot] = next;
        if let Some(other) = self.find(next) {
            // Two streams now expect the same block (one caught up with the other): keep the
            // one just extended, forget the other and make its slot the next to be reused.
            self.index_remove(other);
            self.keys[other] = EMPTY;
            self.demote(other);
        }
        self.index_insert(slot);
        self.touch(slot);
        let over = continues.is_some() && self.streams[slot].bytes >= self.params.threshold_bytes;
        match self.params.policy {
            CutoffPolicy::Always => over,
            CutoffPolicy::Full => over && cache_full,
            CutoffPolicy::Never => false,
        }
    }

    /// Streams currently tracked (at most [`STREAMS_MAX`]).
    pub fn tracked(&self) -> usize {
        self.keys.iter().filter(|&&k| k != EMPTY).count()
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        STREAMS_MAX * (8 + std::mem::size_of::<Stream>()) + INDEX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(policy: CutoffPolicy, kib: u64) -> SeqCutoff {
        SeqCutoff::new(CutoffParams {
            policy,
            threshold_bytes: kib << 10,
            promotion_count: 8,
        })
    }

    #[test]
    fn cuts_from_the_request_that_reaches_the_threshold() {
        let mut c = cut(CutoffPolicy::Always, 16);
        let got: Vec<bool> = (0..6)
            .map(|i| c.check(false, Lba(i * 8), 8, false))
            .collect();
        // 4, 8, 12, 16 KiB: the 4th request reaches 16 KiB.
        assert_eq!(got, vec![false, false, false, true, true, true]);
        assert_eq!(c.tracked(), 1);
        // Uneven sizes: 2 + 6 + 7 = 15 KiB, then 16.5 KiB.
        let mut c = cut(CutoffPolicy::Always, 16);
        let mut at = 1000;
        let got: Vec<bool> = [4u32, 12, 14, 3]
            .iter()
            .map(|&b| {
                let r = c.check(true, Lba(at), b, false);
                at += b as u64;
                r
            })
            .collect();
        assert_eq!(got, vec![false, false, false, true]);
    }

    #[test]
    fn random_and_single_large_requests_are_not_streams() {
        let mut c = cut(CutoffPolicy::Always, 16);
        let mut x = 12345u64;
        for _ in 0..1000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            assert!(!c.check(x & 1 == 0, Lba((x >> 20) % (1 << 30) * 8), 8, false));
        }
        assert_eq!(c.tracked(), STREAMS_MAX);
        assert!(
            !c.check(false, Lba(1 << 40), 2048, false),
            "one 1 MiB request is not a stream"
        );
    }

    #[test]
    fn interleaved_streams_are_each_detected() {
        let mut c = cut(CutoffPolicy::Always, 16);
        let bases = [0u64, 1 << 20, 2 << 20, 3 << 20];
        for round in 0..6u64 {
            for (j, b) in bases.iter().enumerate() {
                let got = c.check(j % 2 == 1, Lba(b + round * 8), 8, false);
                assert_eq!(got, round >= 3, "stream {j} round {round}");
            }
        }
        assert_eq!(c.tracked(), 4);
    }

    #[test]
    fn oldest_stream_is_recycled_beyond_the_limit() {
        let mut c = cut(CutoffPolicy::Always, 8);
        // Stream A, then 128 other streams, then A continues: A was recycled, so no cut.
        c.check(false, Lba(0), 8, false);
        for s in 0..STREAMS_MAX as u64 {
            c.check(false, Lba((s + 1) << 20), 8, false);
        }
        assert_eq!(c.tracked(), STREAMS_MAX);
        assert!(!c.check(false, Lba(8), 8, false));
        // With 127 others A survives.
        let mut c = cut(CutoffPolicy::Always, 8);
        c.check(false, Lba(0), 8, false);
        for s in 0..STREAMS_MAX as u64 - 1 {
            c.check(false, Lba((s + 1) << 20), 8, false);
        }
        assert!(c.check(false, Lba(8), 8, false));
        // A continuing stream is recent again: A, then 127 others, A continues, 127 more: A
        // is still there (the oldest were the first others).
        let mut c = cut(CutoffPolicy::Always, 12);
        c.check(false, Lba(0), 8, false);
        for s in 0..STREAMS_MAX as u64 - 1 {
            c.check(false, Lba((s + 1) << 20), 8, false);
        }
        assert!(!c.check(false, Lba(8), 8, false), "8 KiB of 12");
        for s in 0..STREAMS_MAX as u64 - 1 {
            c.check(false, Lba((s + 1000) << 20), 8, false);
        }
        assert!(c.check(false, Lba(16), 8, false), "12 KiB: A survived");
    }

    #[test]
    fn full_only_when_the_cache_is_full_and_never_never() {
        let mut c = cut(CutoffPolicy::Full, 8);
        c.check(true, Lba(0), 8, false);
        assert!(
            !c.check(true, Lba(8), 8, false),
            "full: not cut while the cache has room"
        );
        assert!(c.check(true, Lba(16), 8, true), "full: cut when full");
        assert!(
            !c.check(true, Lba(24), 8, false),
            "and not once room is back"
        );
        let mut a = cut(CutoffPolicy::Always, 8);
        a.check(true, Lba(0), 8, true);
        assert!(
            a.check(true, Lba(8), 8, false),
            "always: regardless of room"
        );
        let mut n = cut(CutoffPolicy::Never, 4);
        for i in 0..10 {
            assert!(!n.check(false, Lba(i * 8), 8, true));
        }
        assert_eq!(n.tracked(), 0, "never tracks nothing");
        // set_params switches the policy and keeps streams.
        let mut p = cut(CutoffPolicy::Never, 4);
        p.set_params(CutoffParams {
            policy: CutoffPolicy::Always,
            ..p.params()
        });
        assert_eq!(p.params().policy, CutoffPolicy::Always);
        p.check(false, Lba(0), 8, false);
        assert!(p.check(false, Lba(8), 8, false));
        p.set_params(CutoffParams {
            threshold_bytes: 64 << 10,
            ..p.params()
        });
        assert!(
            !p.check(false, Lba(16), 8, false),
            "12 KiB of 64: kept, not cut"
        );
    }

    #[test]
    fn a_direction_change_starts_from_zero() {
        let mut c = cut(CutoffPolicy::Always, 12);
        assert!(!c.check(true, Lba(0), 8, false));
        assert!(!c.check(true, Lba(8), 8, false));
        assert!(c.check(true, Lba(16), 8, false), "writes reach 12 KiB");
        // Reads carry on where the writes ended: a new read stream, counted from zero.
        assert!(!c.check(false, Lba(24), 8, false));
        assert!(!c.check(false, Lba(32), 8, false));
        assert!(
            c.check(false, Lba(40), 8, false),
            "reads reach 12 KiB on their own"
        );
        // Reads and writes are tracked separately: the write stream is still there.
        assert!(
            c.check(true, Lba(24), 8, false),
            "writes resume, still over"
        );
        assert_eq!(c.tracked(), 2);
    }

    #[test]
    fn a_stream_catching_up_with_another_absorbs_it() {
        let mut c = cut(CutoffPolicy::Always, 20);
        // B: 16.. (4 KiB), A: 0..16 (8 KiB); A now expects 16, B expects 24.
        c.check(false, Lba(16), 8, false);
        c.check(false, Lba(0), 8, false);
        c.check(false, Lba(8), 8, false);
        assert_eq!(c.tracked(), 2);
        // A reads 16..24 and now expects 24 like B: B is forgotten, A goes on (12 KiB).
        assert!(!c.check(false, Lba(16), 8, false));
        assert_eq!(c.tracked(), 1);
        assert!(!c.check(false, Lba(24), 8, false), "16 KiB");
        assert!(c.check(false, Lba(32), 8, false), "20 KiB");
    }

    #[test]
    fn edge_addresses_and_sizes() {
        let mut c = cut(CutoffPolicy::Always, 0);
        // Zero-length requests continue a stream without moving it.
        c.check(false, Lba(5), 0, false);
        assert!(c.check(false, Lba(5), 0, false));
        // Addresses near the top of the range do not wrap or collide with empty slots.
        for i in 0..4u64 {
            c.check(true, Lba(u64::MAX - 3 + i), 1, false);
            c.check(false, Lba((1 << 63) + i), 1, false);
        }
        assert!(c.tracked() <= STREAMS_MAX);
        assert!(
            c.check(true, Lba(u64::MAX), 1, false),
            "clamped: the same stream"
        );
    }

    #[test]
    fn matches_a_linear_scan_model() {
        // Reference: the same rule with a plain scan over 128 (key, bytes, age) entries.
        struct Model {
            keys: Vec<u64>,
            bytes: Vec<u64>,
            age: Vec<i64>,
            clock: i64,
            low: i64,
        }
        impl Model {
            fn check(
                &mut self,
                p: CutoffParams,
                w: bool,
                lba: u64,
                blocks: u32,
                full: bool,
            ) -> bool {
                let dir = if w { WRITE_BIT } else { 0 };
                let key = lba.min(LBA_MAX) | dir;
                let next = lba.saturating_add(blocks as u64).min(LBA_MAX) | dir;
                let found = self.keys.iter().position(|&k| k == key);
                let slot = match found {
                    Some(i) => {
                        self.bytes[i] += blocks as u64 * 512;
                        i
                    }
                    None => {
                        let i = (0..STREAMS_MAX).min_by_key(|&i| self.age[i]).unwrap();
                        self.bytes[i] = blocks as u64 * 512;
                        i
                    }
                };
                self.keys[slot] = EMPTY;
                if let Some(o) = self.keys.iter().position(|&k| k == next) {
                    self.keys[o] = EMPTY;
                    self.low -= 1;
                    self.age[o] = self.low;
                }
                self.keys[slot] = next;
                self.clock += 1;
                self.age[slot] = self.clock;
                let over = found.is_some() && self.bytes[slot] >= p.threshold_bytes;
                match p.policy {
                    CutoffPolicy::Always => over,
                    CutoffPolicy::Full => over && full,
                    CutoffPolicy::Never => false,
                }
            }
        }
        for (seed, policy) in [(1u64, CutoffPolicy::Always), (2, CutoffPolicy::Full)] {
            let p = CutoffParams {
                policy,
                threshold_bytes: 32 << 10,
                promotion_count: 8,
            };
            let mut c = SeqCutoff::new(p);
            let mut m = Model {
                keys: vec![EMPTY; STREAMS_MAX],
                bytes: vec![0; STREAMS_MAX],
                age: (0..STREAMS_MAX as i64).map(|i| -i).collect(),
                clock: 0,
                low: -(STREAMS_MAX as i64),
            };
            // Up to 160 sequential streams (more than the table holds), requests just ahead of
            // them and random ones.
            let mut next = vec![0u64; 160];
            for (i, n) in next.iter_mut().enumerate() {
                *n = (i as u64) << 24;
            }
            let mut x = seed;
            let mut cuts = 0;
            for step in 0..200_000u32 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let live = if step < 100_000 { 40 } else { 160 };
                let s = (x % live) as usize;
                let blocks = [8u32, 8, 16, 1, 0, 256][(x >> 8) as usize % 6];
                let w = s.is_multiple_of(3);
                let lba = if (x >> 16) % 8 == 0 {
                    (x >> 20) % (1 << 36)
                } else if (x >> 16) % 8 == 1 {
                    // Just ahead of another stream, which will catch up with it.
                    next[(s + 1) % live as usize] + 8 * ((x >> 24) % 4)
                } else {
                    let l = next[s];
                    next[s] += blocks as u64;
                    l
                };
                let full = (x >> 40) & 1 == 1;
                let got = c.check(w, Lba(lba), blocks, full);
                assert_eq!(got, m.check(p, w, lba, blocks, full), "step {step}");
                cuts += got as u32;
            }
            assert!(
                cuts > 10_000,
                "{cuts} cuts: the model test exercises cutting"
            );
            assert_eq!(c.tracked(), m.keys.iter().filter(|&&k| k != EMPTY).count());
        }
    }

    #[test]
    fn memory_is_fixed() {
        let c = cut(CutoffPolicy::Full, 1024);
        assert_eq!(c.heap_bytes(), STREAMS_MAX * 24 + INDEX);
    }
}
