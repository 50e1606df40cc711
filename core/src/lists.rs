//! Intrusive, circular, doubly linked lists over cache lines, sharing one pair of links per line.
//!
//! Why one arena: a clean line is on exactly one eviction list and a dirty line on exactly one
//! cleaning list, never both (eviction only ever sees clean lines). Sharing the `prev`/`next`
//! links between the eviction and cleaning policies costs 8 bytes per line instead of 16, which
//! is most of the difference between our metadata footprint and Open CAS's (SPEC P7).
//!
//! Each list has a sentinel node, so a node can be unlinked without knowing which list it is on.
//! Node ids `0..lines` are cache lines; ids from `lines` up are sentinels and extra nodes
//! (for example the cleaning policy's time markers), allocated with [`ListArena::new_list`] and
//! [`ListArena::new_node`].
//!
//! Invariant: a node is either unlinked (`prev == next == NIL`) or on exactly one list.

/// "No node".
pub const NIL: u32 = u32::MAX;

/// Sentinels and extra nodes the arena has room for without reallocating (a reallocation
/// would double the per-line cost of the links for as long as the cache lives).
pub const EXTRA_NODES_RESERVED: usize = 8192;

/// Names a list (its sentinel node id).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ListId(pub u32);

/// The arena of links.
#[derive(Debug, Clone)]
pub struct ListArena {
    prev: Vec<u32>,
    next: Vec<u32>,
    lines: u32,
}

impl ListArena {
    /// An arena for `lines` cache lines, all unlinked, with room for
    /// [`EXTRA_NODES_RESERVED`] sentinels and extra nodes before its vectors grow.
    pub fn new(lines: u32) -> ListArena {
        let cap = lines as usize + EXTRA_NODES_RESERVED;
        let mut prev = Vec::with_capacity(cap);
        let mut next = Vec::with_capacity(cap);
        prev.resize(lines as usize, NIL);
        next.resize(lines as usize, NIL);
        ListArena { prev, next, lines }
    }

    /// Number of cache-line nodes.
    pub fn lines(&self) -> u32 {
        self.lines
    }

    /// A new empty list.
    pub fn new_list(&mut self) -> ListId {
        let id = self.prev.len() as u32;
        assert!(id != NIL, "list arena full");
        self.prev.push(id);
        self.next.push(id);
        ListId(id)
    }

    /// A new unlinked extra node (not a cache line), for markers.
    pub fn new_node(&mut self) -> u32 {
        let id = self.prev.len() as u32;
        assert!(id != NIL, "list arena full");
        self.prev.push(NIL);
        self.next.push(NIL);
        id
    }

    /// Whether `node` is a cache line (not a sentinel or extra node).
    #[inline]
    pub fn is_line(&self, node: u32) -> bool {
        node < self.lines
    }

    /// Whether `node` is on some list.
    #[inline]
    pub fn is_linked(&self, node: u32) -> bool {
        self.next[node as usize] != NIL
    }

    /// Whether the list is empty.
    #[inline]
    pub fn is_empty(&self, list: ListId) -> bool {
        self.next[list.0 as usize] == list.0
    }

    /// Links `node` (which must be unlinked) at the front (most recent end) of `list`.
    #[inline]
    pub fn push_front(&mut self, list: ListId, node: u32) {
        debug_assert!(!self.is_linked(node), "node {node} already linked");
        let head = list.0;
        let first = self.next[head as usize];
        self.next[node as usize] = first;
        self.prev[node as usize] = head;
        self.prev[first as usize] = node;
        self.next[head as usize] = node;
    }

    /// Links `node` (which must be unlinked) at the back (oldest end) of `list`.
    #[inline]
    pub fn push_back(&mut self, list: ListId, node: u32) {
        debug_assert!(!self.is_linked(node), "node {node} already linked");
        let head = list.0;
        let last = self.prev[head as usize];
        self.prev[node as usize] = last;
        self.next[node as usize] = head;
        self.next[last as usize] = node;
        self.prev[head as usize] = node;
    }

    /// Unlinks `node` from whatever list it is on. No-op if unlinked.
    #[inline]
    pub fn unlink(&mut self, node: u32) {
        let n = self.next[node as usize];
        if n == NIL {
            return;
        }
        let p = self.prev[node as usize];
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
        self.next[node as usize] = NIL;
        self.prev[node as usize] = NIL;
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
        let n = self.next[list.0 as usize];
        (n != list.0).then_some(n)
    }

    /// The back (oldest) node, if any.
    #[inline]
    pub fn back(&self, list: ListId) -> Option<u32> {
        let p = self.prev[list.0 as usize];
        (p != list.0).then_some(p)
    }

    /// The node after `node` towards the back of its list, or `None` at the end.
    #[inline]
    pub fn next_towards_back(&self, list: ListId, node: u32) -> Option<u32> {
        let p = self.prev[node as usize];
        (p != list.0 && p != NIL).then_some(p)
    }

    /// The node after `node` towards the front of its list, or `None` at the end.
    #[inline]
    pub fn next_towards_front(&self, list: ListId, node: u32) -> Option<u32> {
        let n = self.next[node as usize];
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

    /// Hints that `node`'s links are about to be read (see `crate::hint`).
    #[inline]
    pub fn prefetch(&self, node: u32) {
        crate::hint::prefetch(&self.prev, node as usize);
        crate::hint::prefetch(&self.next, node as usize);
    }

    /// Bytes of heap this arena holds.
    pub fn heap_bytes(&self) -> usize {
        (self.prev.capacity() + self.next.capacity()) * 4
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
}
