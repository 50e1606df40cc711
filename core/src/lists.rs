//! Intrusive, circular, doubly linked lists over cache lines, sharing one pair of links per line.
//!
//! Why one arena: a clean line is on exactly one eviction list and a dirty line on exactly one
//! cleaning list, never both (eviction only ever sees clean lines). Sharing the `prev`/`next`
//! links between the eviction and cleaning policies costs one word per line instead of two, which
//! is most of the difference between our metadata footprint and Open CAS's (SPEC P7).
//!
//! Each list has a sentinel node, so a node can be unlinked without knowing which list it is on.
//! Node ids `0..lines` are cache lines; ids from `lines` up are sentinels and extra nodes
//! (for example the cleaning policy's time markers), allocated with [`ListArena::new_list`] and
//! [`ListArena::new_node`].
//!
//! **One 64-bit word per node.** `prev` and `next` are `w`-bit fields, `w` just wide enough for
//! every node id plus "none" (25 bits at 16M lines), and the bits above them hold the node's
//! **tag**: [`TAG_BITS`] bits of per-line state that would otherwise cost a byte array each —
//! the line's class byte (`state.rs`: IO class and two flags) and the eviction policy's own bits
//! ([`TAG_EVICTION`]). Their owners read and write them through [`ListArena::field`] and
//! [`ListArena::set_field`]; the arena itself never looks at a tag, and linking or unlinking a
//! node keeps it. Tags fit beside the links while `2w + TAG_BITS <= 64`, i.e. up to about 2^26
//! nodes; a bigger arena keeps them in a side array of `u16` instead (2 bytes more per line, for
//! caches of 64M lines and up). Keeping a line's tag in its link word also means a hit that
//! reads its class and bumps its eviction bits touches one word, not three arrays.
//!
//! Invariant: a node is either unlinked (`prev == next == NIL`) or on exactly one list.

/// "No node".
pub const NIL: u32 = u32::MAX;

/// Sentinels and extra nodes the arena has room for without reallocating (a reallocation
/// would double the per-line cost of the links for as long as the cache lives).
pub const EXTRA_NODES_RESERVED: usize = 8192;

/// Bits of tag per node (the sum of the fields below).
pub const TAG_BITS: u32 = 12;

/// A bit field of a node's tag.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TagField {
    shift: u32,
    bits: u32,
}

/// The line's class byte: IO class and flags (owned by `state.rs`).
pub const TAG_STATE: TagField = TagField { shift: 0, bits: 8 };
/// Per-line bits of the eviction policy (S3-FIFO's access counter and queue bit, and the
/// "off its list" bit of every policy: see `policy/eviction/mod.rs`).
pub const TAG_EVICTION: TagField = TagField { shift: 8, bits: 4 };

/// Names a list (its sentinel node id).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ListId(pub u32);

/// The arena of links.
#[derive(Debug, Clone)]
pub struct ListArena {
    /// Per node: `prev` in bits `0..w`, `next` in bits `w..2w`, then the tag (if inline).
    words: Vec<u64>,
    /// Bits per link.
    w: u32,
    /// All ones in `w` bits: "no node" inside a word.
    nil: u64,
    /// Tags are in `tags`, not beside the links (`2w + TAG_BITS > 64`).
    aside: bool,
    /// Tags, when they do not fit beside the links (empty otherwise).
    tags: Vec<u16>,
    lines: u32,
}

/// Bits a link needs so that every id below `nodes` and "none" fit.
fn link_bits(nodes: usize) -> u32 {
    (usize::BITS - nodes.leading_zeros()).max(1)
}

impl ListArena {
    /// An arena for `lines` cache lines, all unlinked, with room for
    /// [`EXTRA_NODES_RESERVED`] sentinels and extra nodes before its vectors grow.
    pub fn new(lines: u32) -> ListArena {
        Self::with_width(lines, link_bits(lines as usize + EXTRA_NODES_RESERVED))
    }

    /// [`ListArena::new`] with `w`-bit links (at least what the nodes need).
    fn with_width(lines: u32, w: u32) -> ListArena {
        let cap = lines as usize + EXTRA_NODES_RESERVED;
        let mut a = ListArena {
            words: Vec::new(),
            w: 0,
            nil: 0,
            aside: false,
            tags: Vec::new(),
            lines,
        };
        a.set_width(w.max(link_bits(cap)));
        a.words.reserve_exact(cap);
        a.words.resize(lines as usize, a.unlinked_word());
        if a.tags_aside() {
            a.tags.reserve_exact(cap);
            a.tags.resize(lines as usize, 0);
        }
        a
    }

    fn set_width(&mut self, w: u32) {
        assert!(w <= 32);
        self.w = w;
        self.nil = (1u64 << w) - 1;
        self.aside = 2 * w + TAG_BITS > 64;
    }

    /// Whether tags live in `tags` rather than beside the links.
    #[inline]
    fn tags_aside(&self) -> bool {
        self.aside
    }

    #[inline]
    fn unlinked_word(&self) -> u64 {
        self.nil | (self.nil << self.w)
    }

    /// Re-encodes every word with `w + 1`-bit links (an extra node outgrew the id space).
    fn widen(&mut self) {
        let (old_w, old_nil) = (self.w, self.nil);
        let aside_before = self.tags_aside();
        self.set_width(old_w + 1);
        let aside_after = self.tags_aside();
        let mut tags = Vec::new();
        if aside_after && !aside_before {
            tags = Vec::with_capacity(self.words.capacity());
        }
        let nil = self.nil;
        let conv = |v: u64| if v == old_nil { nil } else { v };
        for i in 0..self.words.len() {
            let x = self.words[i];
            let p = conv(x & old_nil);
            let n = conv((x >> old_w) & old_nil);
            let tag = x >> (2 * old_w);
            let mut y = p | (n << self.w);
            if aside_before {
                // Tags already aside: nothing to move.
            } else if aside_after {
                tags.push(tag as u16);
            } else {
                y |= tag << (2 * self.w);
            }
            self.words[i] = y;
        }
        if aside_after && !aside_before {
            self.tags = tags;
        }
    }

    /// Appends a node with the given links; returns its id.
    fn push_node(&mut self, linked_to_self: bool) -> u32 {
        let id = self.words.len() as u64;
        assert!(id < NIL as u64, "list arena full");
        if id >= self.nil {
            self.widen();
        }
        let word = if linked_to_self {
            id | (id << self.w)
        } else {
            self.unlinked_word()
        };
        self.words.push(word);
        if self.tags_aside() {
            self.tags.push(0);
        }
        id as u32
    }

    #[inline]
    fn prev(&self, node: u32) -> u32 {
        let v = self.words[node as usize] & self.nil;
        if v == self.nil { NIL } else { v as u32 }
    }

    #[inline]
    fn next(&self, node: u32) -> u32 {
        let v = (self.words[node as usize] >> self.w) & self.nil;
        if v == self.nil { NIL } else { v as u32 }
    }

    #[inline]
    fn enc(&self, node: u32) -> u64 {
        if node == NIL { self.nil } else { node as u64 }
    }

    #[inline]
    fn set_prev(&mut self, node: u32, prev: u32) {
        let v = self.enc(prev);
        let x = &mut self.words[node as usize];
        *x = (*x & !self.nil) | v;
    }

    #[inline]
    fn set_next(&mut self, node: u32, next: u32) {
        let (v, w, nil) = (self.enc(next), self.w, self.nil);
        let x = &mut self.words[node as usize];
        *x = (*x & !(nil << w)) | (v << w);
    }

    #[inline]
    fn set_links(&mut self, node: u32, prev: u32, next: u32) {
        let (p, n, w, nil) = (self.enc(prev), self.enc(next), self.w, self.nil);
        let x = &mut self.words[node as usize];
        *x = (*x & !(nil | (nil << w))) | p | (n << w);
    }

    /// Field `f` of `node`'s tag.
    #[inline]
    pub fn field(&self, node: u32, f: TagField) -> u8 {
        let tag = if self.tags_aside() {
            self.tags[node as usize] as u64
        } else {
            self.words[node as usize] >> (2 * self.w)
        };
        ((tag >> f.shift) & ((1 << f.bits) - 1)) as u8
    }

    /// Sets field `f` of `node`'s tag to `v` (which must fit the field).
    #[inline]
    pub fn set_field(&mut self, node: u32, f: TagField, v: u8) {
        let mask = ((1u64 << f.bits) - 1) << f.shift;
        debug_assert_eq!((v as u64) << f.shift & !mask, 0, "tag value too wide");
        let v = (v as u64) << f.shift;
        if self.tags_aside() {
            let t = &mut self.tags[node as usize];
            *t = ((*t as u64 & !mask) | v) as u16;
        } else {
            let s = 2 * self.w;
            let x = &mut self.words[node as usize];
            *x = (*x & !(mask << s)) | (v << s);
        }
    }

    /// Number of cache-line nodes.
    pub fn lines(&self) -> u32 {
        self.lines
    }

    /// A new empty list.
    pub fn new_list(&mut self) -> ListId {
        ListId(self.push_node(true))
    }

    /// A new unlinked extra node (not a cache line), for markers.
    pub fn new_node(&mut self) -> u32 {
        self.push_node(false)
    }

    /// Whether `node` is a cache line (not a sentinel or extra node).
    #[inline]
    pub fn is_line(&self, node: u32) -> bool {
        node < self.lines
    }

    /// Whether `node` is on some list.
    #[inline]
    pub fn is_linked(&self, node: u32) -> bool {
        self.next(node) != NIL
    }

    /// Whether the list is empty.
    #[inline]
    pub fn is_empty(&self, list: ListId) -> bool {
        self.next(list.0) == list.0
    }

    /// Links `node` (which must be unlinked) at the front (most recent end) of `list`.
    #[inline]
    pub fn push_front(&mut self, list: ListId, node: u32) {
        debug_assert!(!self.is_linked(node), "node {node} already linked");
        let head = list.0;
        let first = self.next(head);
        self.set_links(node, head, first);
        self.set_prev(first, node);
        self.set_next(head, node);
    }

    /// Links `node` (which must be unlinked) at the back (oldest end) of `list`.
    #[inline]
    pub fn push_back(&mut self, list: ListId, node: u32) {
        debug_assert!(!self.is_linked(node), "node {node} already linked");
        let head = list.0;
        let last = self.prev(head);
        self.set_links(node, last, head);
        self.set_next(last, node);
        self.set_prev(head, node);
    }

    /// Unlinks `node` from whatever list it is on. No-op if unlinked.
    #[inline]
    pub fn unlink(&mut self, node: u32) {
        let n = self.next(node);
        if n == NIL {
            return;
        }
        let p = self.prev(node);
        self.set_next(p, n);
        self.set_prev(n, p);
        self.set_links(node, NIL, NIL);
    }

    /// Moves `node` to the front of `list`.
    #[inline]
    pub fn move_to_front(&mut self, list: ListId, node: u32) {
        self.unlink(node);
        self.push_front(list, node);
    }

    /// The front (most recent) node, if any.
    #[inline]
    pub fn front(&self, list: ListId) -> Option<u32> {
        let n = self.next(list.0);
        (n != list.0).then_some(n)
    }

    /// The back (oldest) node, if any.
    #[inline]
    pub fn back(&self, list: ListId) -> Option<u32> {
        let p = self.prev(list.0);
        (p != list.0).then_some(p)
    }

    /// The node after `node` towards the back of its list, or `None` at the end.
    #[inline]
    pub fn next_towards_back(&self, list: ListId, node: u32) -> Option<u32> {
        let p = self.prev(node);
        (p != list.0 && p != NIL).then_some(p)
    }

    /// The node after `node` towards the front of its list, or `None` at the end.
    #[inline]
    pub fn next_towards_front(&self, list: ListId, node: u32) -> Option<u32> {
        let n = self.next(node);
        (n != list.0 && n != NIL).then_some(n)
    }

    /// Iterates `list` from the back (oldest) to the front.
    pub fn iter_from_back(&self, list: ListId) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.back(list);
        std::iter::from_fn(move || {
            let c = cur?;
            cur = self.next_towards_back(list, c);
            Some(c)
        })
    }

    /// Hints that `node`'s word (links and tag) is about to be read (see `crate::hint`).
    #[inline]
    pub fn prefetch(&self, node: u32) {
        crate::hint::prefetch(&self.words, node as usize);
    }

    /// Bytes of heap this arena holds.
    pub fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8 + self.tags.capacity() * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_unlink_iterate() {
        let mut a = ListArena::new(10);
        let l = a.new_list();
        let m = a.new_list();
        assert!(a.is_empty(l));
        a.push_front(l, 1);
        a.push_front(l, 2);
        a.push_back(l, 3);
        a.push_front(m, 4);
        assert_eq!(a.iter_from_back(l).collect::<Vec<_>>(), vec![3, 1, 2]);
        assert_eq!(a.front(l), Some(2));
        assert_eq!(a.back(l), Some(3));
        a.unlink(1);
        assert_eq!(a.iter_from_back(l).collect::<Vec<_>>(), vec![3, 2]);
        a.move_to_front(l, 3);
        assert_eq!(a.iter_from_back(l).collect::<Vec<_>>(), vec![2, 3]);
        a.unlink(2);
        a.unlink(3);
        assert!(a.is_empty(l));
        assert!(!a.is_linked(2));
        assert_eq!(a.iter_from_back(m).collect::<Vec<_>>(), vec![4]);
        let x = a.new_node();
        a.push_front(m, x);
        assert!(!a.is_line(x));
        assert_eq!(a.iter_from_back(m).collect::<Vec<_>>(), vec![4, x]);
    }

    #[test]
    fn tags_survive_linking_and_widening() {
        // 7 lines: ids up to 7 + EXTRA_NODES_RESERVED fit; the nodes below outgrow that width
        // (twice) and every link and tag must come through the re-encoding.
        let mut a = ListArena::new(7);
        let l = a.new_list();
        for n in 0..7 {
            a.push_back(l, n);
            a.set_field(n, TAG_STATE, 0x80 | n as u8);
            a.set_field(n, TAG_EVICTION, (n % 8) as u8);
        }
        a.unlink(3);
        let w0 = a.w;
        let mut extra = Vec::new();
        for _ in 0..4 * EXTRA_NODES_RESERVED {
            let x = a.new_node();
            a.push_front(l, x);
            extra.push(x);
        }
        assert!(a.w > w0 + 1, "the arena widened twice");
        for n in 0..7 {
            assert_eq!(a.field(n, TAG_STATE), 0x80 | n as u8);
            assert_eq!(a.field(n, TAG_EVICTION), (n % 8) as u8);
        }
        assert!(!a.is_linked(3));
        // Oldest first: the lines (pushed at the back), then the extra nodes (at the front).
        let mut want: Vec<u32> = vec![6, 5, 4, 2, 1, 0];
        want.extend(extra.iter().copied());
        assert_eq!(a.iter_from_back(l).collect::<Vec<_>>(), want);
    }

    #[test]
    fn tags_aside_when_links_are_wide() {
        // Links of 27 bits (a cache of 2^26 lines) leave 10 bits: tags go to the side array.
        // A small arena with wide links behaves the same and costs no 512 MiB.
        let lines = 1000;
        let mut a = ListArena::with_width(lines, 27);
        assert!(a.tags_aside());
        let l = a.new_list();
        a.push_front(l, 5);
        a.set_field(5, TAG_STATE, 0xff);
        a.set_field(5, TAG_EVICTION, 7);
        a.set_field(5, TAG_STATE, 0x12);
        assert_eq!(a.field(5, TAG_STATE), 0x12);
        assert_eq!(a.field(5, TAG_EVICTION), 7);
        assert_eq!(a.front(l), Some(5));
        assert_eq!(a.heap_bytes(), (lines as usize + EXTRA_NODES_RESERVED) * 10);
        // Widening from 26-bit links (tags beside them) to 27 moves the tags aside.
        let mut a = ListArena::with_width(10, 26);
        assert!(!a.tags_aside());
        let l = a.new_list();
        for n in 0..10 {
            a.push_front(l, n);
            a.set_field(n, TAG_STATE, n as u8 + 1);
        }
        a.widen();
        assert!(a.tags_aside());
        for n in 0..10 {
            assert_eq!(a.field(n, TAG_STATE), n as u8 + 1);
        }
        assert_eq!(
            a.iter_from_back(l).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
    }
}
