//! `acp` cleaning (Open CAS's "aggressive cleaning policy"): keep writing back, ignoring client
//! activity, always from the dirtiest 100 MiB chunk of core space, `flush_max_buffers` lines
//! every `wake_up` milliseconds. Writing back a chunk at a time gives the core nearby LBAs, which
//! a hard disk serves far faster than ALRU's age order.
//!
//! Each chunk with dirty lines has its own list in the shared [`ListArena`] (so there are no
//! per-line bytes) and a dirty-line count; chunks sit in 11 buckets by dirtiness (0–9%, 10–19%,
//! …, 100%), and the cleaner takes from the fullest bucket. Chunks are created when their first
//! line becomes dirty and recycled when their last line is cleaned, so the policy's memory
//! follows the dirty data, not the size of the cores.

use crate::hash::FxHashMap;
use crate::lists::{ListArena, ListId};
use crate::policy::cleaning::Cleaning;
use crate::policy::{AcpParams, LineView};
use crate::units::{CoreId, LineId, Nanos};

/// Bytes of core space per chunk.
pub const CHUNK_BYTES: u64 = 100 << 20;
/// Dirtiness buckets.
pub const BUCKETS: usize = 11;

#[derive(Debug)]
struct Chunk {
    list: ListId,
    dirty: u32,
    bucket: u8,
    /// Index in its bucket's vector.
    pos: u32,
    key: (CoreId, u64),
}

/// Dirtiest-chunk-first cleaning.
pub struct Acp {
    params: AcpParams,
    chunk_lines: u64,
    index: FxHashMap<(CoreId, u64), u32>,
    chunks: Vec<Chunk>,
    free: Vec<u32>,
    buckets: [Vec<u32>; BUCKETS],
}

impl Acp {
    /// A policy for lines of `blocks_per_line` 512-byte blocks.
    pub fn new(params: AcpParams, _lists: &mut ListArena, blocks_per_line: u32) -> Acp {
        Acp {
            params,
            chunk_lines: CHUNK_BYTES / (blocks_per_line as u64 * 512),
            index: FxHashMap::default(),
            chunks: Vec::new(),
            free: Vec::new(),
            buckets: Default::default(),
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> AcpParams {
        self.params
    }

    /// Chunks holding dirty lines (for tests).
    pub fn active_chunks(&self) -> usize {
        self.index.len()
    }

    fn bucket_of(&self, dirty: u32) -> u8 {
        ((dirty as u64 * 10 / self.chunk_lines).min(10)) as u8
    }

    fn bucket_remove(&mut self, id: u32) {
        let (b, pos) = (
            self.chunks[id as usize].bucket as usize,
            self.chunks[id as usize].pos,
        );
        let v = &mut self.buckets[b];
        v.swap_remove(pos as usize);
        if let Some(&moved) = v.get(pos as usize) {
            self.chunks[moved as usize].pos = pos;
        }
    }

    fn bucket_add(&mut self, id: u32) {
        let b = self.bucket_of(self.chunks[id as usize].dirty);
        let c = &mut self.chunks[id as usize];
        c.bucket = b;
        c.pos = self.buckets[b as usize].len() as u32;
        self.buckets[b as usize].push(id);
    }

    /// Chunk `id`'s count changed: move it between buckets, or recycle it when empty.
    fn settle(&mut self, id: u32) {
        let (dirty, bucket, key) = {
            let c = &self.chunks[id as usize];
            (c.dirty, c.bucket, c.key)
        };
        if dirty == 0 {
            self.bucket_remove(id);
            self.index.remove(&key);
            self.free.push(id);
        } else if self.bucket_of(dirty) != bucket {
            self.bucket_remove(id);
            self.bucket_add(id);
        }
    }

    fn chunk_of(&self, view: &dyn LineView, line: LineId) -> (CoreId, u64) {
        let (c, cl) = view.position(line);
        (c, cl / self.chunk_lines)
    }
}

impl Cleaning for Acp {
    fn name(&self) -> &'static str {
        "acp"
    }

    fn on_dirty(&mut self, lists: &mut ListArena, line: LineId, _now: Nanos, view: &dyn LineView) {
        if lists.is_linked(line.0) {
            return; // a rewrite: ACP does not care about age
        }
        let key = self.chunk_of(view, line);
        let id = match self.index.get(&key) {
            Some(&id) => id,
            None => {
                let id = match self.free.pop() {
                    Some(id) => {
                        self.chunks[id as usize].key = key;
                        id
                    }
                    None => {
                        let list = lists.new_list();
                        self.chunks.push(Chunk {
                            list,
                            dirty: 0,
                            bucket: 0,
                            pos: 0,
                            key,
                        });
                        (self.chunks.len() - 1) as u32
                    }
                };
                self.index.insert(key, id);
                self.chunks[id as usize].dirty = 0;
                self.bucket_add(id);
                id
            }
        };
        lists.push_front(self.chunks[id as usize].list, line.0);
        self.chunks[id as usize].dirty += 1;
        self.settle(id);
    }

    fn on_clean(&mut self, lists: &mut ListArena, line: LineId, view: &dyn LineView) {
        if !lists.is_linked(line.0) {
            return;
        }
        lists.unlink(line.0);
        let key = self.chunk_of(view, line);
        let id = *self
            .index
            .get(&key)
            .expect("a linked dirty line's chunk exists");
        self.chunks[id as usize].dirty -= 1;
        self.settle(id);
    }

    fn on_client_io(&mut self, _now: Nanos) {}

    fn pick(
        &mut self,
        now: Nanos,
        lists: &mut ListArena,
        view: &dyn LineView,
        max: usize,
        _force: bool,
        out: &mut Vec<LineId>,
    ) -> Option<Nanos> {
        let start = out.len();
        let mut tried: Vec<u32> = Vec::new();
        'buckets: for b in (0..BUCKETS).rev() {
            let mut i = 0;
            while i < self.buckets[b].len() {
                let id = self.buckets[b][i];
                i += 1;
                if tried.contains(&id) {
                    continue;
                }
                tried.push(id);
                let list = self.chunks[id as usize].list;
                let mut cur = lists.back(list);
                let mut taken = 0;
                while let Some(n) = cur {
                    cur = lists.next_towards_back(list, n);
                    if view.busy(LineId(n)) {
                        continue;
                    }
                    lists.unlink(n);
                    out.push(LineId(n));
                    taken += 1;
                    if out.len() - start >= max {
                        break;
                    }
                }
                if taken > 0 {
                    self.chunks[id as usize].dirty -= taken;
                    self.settle(id);
                    // The chunk may have moved within or out of this bucket: rescan it.
                    i = 0;
                }
                if out.len() - start >= max {
                    break 'buckets;
                }
            }
        }
        let wake = Nanos::from_ms(self.params.wake_up_ms as u64);
        if out.len() > start {
            Some(now.plus(wake))
        } else {
            Some(now.plus(wake.max(Nanos::from_ms(1))))
        }
    }

    fn batch_max(&self) -> usize {
        self.params.flush_max_buffers.max(1) as usize
    }

    fn heap_bytes(&self) -> usize {
        self.index.capacity() * (std::mem::size_of::<((CoreId, u64), u32)>() + 1)
            + self.chunks.capacity() * std::mem::size_of::<Chunk>()
            + self.free.capacity() * 4
            + self.buckets.iter().map(|b| b.capacity() * 4).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Line `l` caches core line `pos[l]` of core 0.
    struct View {
        pos: Vec<u64>,
        busy: Vec<bool>,
    }
    impl LineView for View {
        fn busy(&self, line: LineId) -> bool {
            self.busy[line.0 as usize]
        }
        fn position(&self, line: LineId) -> (CoreId, u64) {
            (CoreId(0), self.pos[line.0 as usize])
        }
        fn key(&self, line: LineId) -> u64 {
            self.pos[line.0 as usize]
        }
    }

    #[test]
    fn dirtiest_chunk_first_and_chunks_recycled() {
        // 4 KiB lines: 25 600 lines per chunk.
        let mut a = ListArena::new(100);
        let mut p = Acp::new(
            AcpParams {
                wake_up_ms: 10,
                flush_max_buffers: 4,
            },
            &mut a,
            8,
        );
        assert_eq!(p.chunk_lines, 25_600);
        // Small chunks keep the test readable: 50 lines each.
        p.chunk_lines = 50;
        // Chunk 0: 3 lines; chunk 5: 6 lines; chunk 9: 1 line.
        let mut pos = vec![0u64; 100];
        let mut l = 0;
        for (chunk, n) in [(0u64, 3u64), (5, 6), (9, 1)] {
            for i in 0..n {
                pos[l] = chunk * 50 + i;
                l += 1;
            }
        }
        let mut v = View {
            pos,
            busy: vec![false; 100],
        };
        // Chunk 5 is 12% dirty (bucket 1); chunks 0 and 9 are in bucket 0.
        for l in 0..10 {
            p.on_dirty(&mut a, LineId(l), Nanos(0), &v);
        }
        assert_eq!(p.active_chunks(), 3);
        v.busy[4] = true;
        let mut out = Vec::new();
        let next = p.pick(Nanos(0), &mut a, &v, 4, false, &mut out);
        assert_eq!(next, Some(Nanos::from_ms(10)));
        // Lines 3..9 are chunk 5; line 4 busy.
        assert_eq!(out, vec![LineId(3), LineId(5), LineId(6), LineId(7)]);
        out.clear();
        p.pick(Nanos(0), &mut a, &v, 100, false, &mut out);
        assert_eq!(out.len(), 5, "{out:?}");
        assert_eq!(p.active_chunks(), 1, "only busy line 4's chunk is left");
        v.busy[4] = false;
        p.on_clean(&mut a, LineId(4), &v);
        assert_eq!(p.active_chunks(), 0);
        // A recycled chunk works.
        p.on_dirty(&mut a, LineId(0), Nanos(0), &v);
        out.clear();
        p.pick(Nanos(0), &mut a, &v, 100, false, &mut out);
        assert_eq!(out, vec![LineId(0)]);
    }
}
