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
//! index (256 entries, linear probing, backward-shift deletion) keyed by the next expected
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

/// One stream.
#[derive(Copy, Clone, Debug, Default)]
struct Stream {
    bytes: u64,
    requests: u32,
    /// Recency list (slot ids): towards more and less recently used.
    newer: u8,
    older: u8,
}

/// Index slots (twice the streams: probe runs stay short).
const INDEX: usize = 2 * STREAMS_MAX;
const NO_SLOT: u8 = u8::MAX;

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
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % INDEX
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
    }

    #[test]
    fn random_and_single_large_requests_are_not_streams() {
        let mut c = cut(CutoffPolicy::Always, 16);
        let mut x = 12345u64;
        for _ in 0..1000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            assert!(!c.check(x & 1 == 0, Lba((x >> 20) % (1 << 30) * 8), 8, false));
        }
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
    }

    #[test]
    fn oldest_stream_is_recycled_beyond_the_limit() {
        let mut c = cut(CutoffPolicy::Always, 8);
        // Stream A, then 128 other streams, then A continues: A was recycled, so no cut.
        c.check(false, Lba(0), 8, false);
        for s in 0..STREAMS_MAX as u64 {
            c.check(false, Lba((s + 1) << 20), 8, false);
        }
        assert!(!c.check(false, Lba(8), 8, false));
        // With 127 others A survives.
        let mut c = cut(CutoffPolicy::Always, 8);
        c.check(false, Lba(0), 8, false);
        for s in 0..STREAMS_MAX as u64 - 1 {
            c.check(false, Lba((s + 1) << 20), 8, false);
        }
        assert!(c.check(false, Lba(8), 8, false));
    }

    #[test]
    fn full_never_and_direction() {
        let mut c = cut(CutoffPolicy::Full, 8);
        c.check(true, Lba(0), 8, false);
        assert!(
            !c.check(true, Lba(8), 8, false),
            "full: not cut while the cache has room"
        );
        assert!(c.check(true, Lba(16), 8, true), "full: cut when full");
        assert!(
            !c.check(false, Lba(24), 8, true),
            "a read does not continue a write stream"
        );
        let mut n = cut(CutoffPolicy::Never, 4);
        for i in 0..10 {
            assert!(!n.check(false, Lba(i * 8), 8, true));
        }
        let mut p = cut(CutoffPolicy::Never, 4);
        p.set_params(CutoffParams {
            policy: CutoffPolicy::Always,
            ..p.params()
        });
        p.check(false, Lba(0), 8, false);
        assert!(p.check(false, Lba(8), 8, false));
    }
}
