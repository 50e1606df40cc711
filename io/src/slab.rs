//! [`Slab`]: values addressed by a small index that is reused once its value is taken — the
//! tokens of operations on a ring ([`crate::Ring`]) and of requests in flight.

/// Index-addressed storage with reuse.
#[derive(Debug)]
pub struct Slab<T> {
    v: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            v: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// An empty slab.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `t` and returns its index (a freed one if there is one).
    pub fn insert(&mut self, t: T) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.v[i] = Some(t);
                i
            }
            None => {
                self.v.push(Some(t));
                self.v.len() - 1
            }
        }
    }

    /// Takes the value at `i` (none if `i` holds none), freeing the index.
    pub fn take(&mut self, i: usize) -> Option<T> {
        let t = self.v.get_mut(i)?.take()?;
        self.free.push(i);
        Some(t)
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.v.len() - self.free.len()
    }

    /// Whether no value is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every value with its index.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.v
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.as_ref().map(|t| (i, t)))
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn indexes_are_reused_and_taken_once() {
        let mut s = Slab::new();
        let (a, b) = (s.insert('a'), s.insert('b'));
        assert_eq!((a, b, s.len()), (0, 1, 2));
        assert_eq!(s.take(a), Some('a'));
        assert_eq!(s.take(a), None, "taken once");
        assert_eq!(s.take(99), None);
        assert_eq!(s.insert('c'), a, "a freed index is reused");
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, &'c'), (1, &'b')]);
        assert!(!s.is_empty());
    }
}
