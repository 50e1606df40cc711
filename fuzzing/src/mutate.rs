//! The seeded RNG, valid samples and the structure-aware mutator.
//!
//! A [`Sample`] is a valid encoded value (built with the crates' own encoders) plus what the
//! mutator needs to damage it *meaningfully*: the integer fields worth editing (lengths, counts,
//! codes), a `seal` that recomputes a checksum after a mutation (so mutations reach the
//! decoder's logic behind the checksum instead of dying at it), and a dictionary of tokens for
//! text formats.

/// A small deterministic PRNG (splitmix64): the same seed gives the same cases everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6a09_e667_f3bc_c909)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    /// True with probability `1 / den`.
    pub fn one_in(&mut self, den: u64) -> bool {
        self.below(den) == 0
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64) < p * (1u64 << 53) as f64
    }
    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
    /// A "interesting" integer of `bits` bits: boundaries, small values, powers of two, or
    /// random.
    pub fn interesting(&mut self, bits: u32) -> u64 {
        let max = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        match self.below(8) {
            0 => 0,
            1 => self.below(4),
            2 => max,
            3 => max - self.below(3).min(max),
            4 => (1u64 << self.below(bits as u64)) & max,
            5 => (max >> 1) + self.below(3) - 1,
            _ => self.next_u64() & max,
        }
    }
}

/// An integer field of an encoded sample.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// Byte offset.
    pub offset: usize,
    /// Width in bytes: 1, 2, 4 or 8.
    pub width: usize,
    /// Big endian (NBD) rather than little endian (the on-disk format).
    pub big_endian: bool,
}

impl Field {
    /// A little-endian field.
    pub fn le(offset: usize, width: usize) -> Field {
        Field {
            offset,
            width,
            big_endian: false,
        }
    }
    /// A big-endian field.
    pub fn be(offset: usize, width: usize) -> Field {
        Field {
            offset,
            width,
            big_endian: true,
        }
    }
    fn get(&self, b: &[u8]) -> Option<u64> {
        let s = b.get(self.offset..self.offset + self.width)?;
        let mut v = 0u64;
        for i in 0..self.width {
            let byte = if self.big_endian {
                s[i]
            } else {
                s[self.width - 1 - i]
            };
            v = (v << 8) | byte as u64;
        }
        Some(v)
    }
    fn set(&self, b: &mut [u8], v: u64) {
        let Some(s) = b.get_mut(self.offset..self.offset + self.width) else {
            return;
        };
        for i in 0..self.width {
            let byte = (v >> (8 * i)) as u8;
            if self.big_endian {
                s[self.width - 1 - i] = byte;
            } else {
                s[i] = byte;
            }
        }
    }
}

/// A valid input of a target, and how to mutate it.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// The encoded bytes.
    pub bytes: Vec<u8>,
    /// Integer fields worth editing.
    pub fields: Vec<Field>,
    /// Recomputes a checksum (or other seal) after a mutation, where the format has one.
    pub seal: Option<fn(&mut [u8])>,
    /// Tokens worth inserting (text formats).
    pub dict: &'static [&'static str],
}

impl Sample {
    /// A sample of plain bytes.
    pub fn new(bytes: Vec<u8>) -> Sample {
        Sample {
            bytes,
            ..Sample::default()
        }
    }
}

/// Applies one random mutation to `data`; `other` is a second valid input for splicing.
fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, s: &Sample, other: &[u8]) {
    let len = data.len();
    match rng.below(12) {
        // Bit flip.
        0 | 1 if len > 0 => {
            let i = rng.below(len as u64) as usize;
            data[i] ^= 1 << rng.below(8);
        }
        // Byte set to an interesting value.
        2 if len > 0 => {
            let i = rng.below(len as u64) as usize;
            data[i] = rng.interesting(8) as u8;
        }
        // Truncation.
        3 if len > 0 => {
            let n = rng.below(len as u64) as usize;
            data.truncate(n);
        }
        // Extension: zeros, random bytes, or a repeat of a chunk.
        4 => {
            let max = if rng.one_in(8) { 4096 } else { 32 };
            let n = 1 + rng.below(max) as usize;
            match rng.below(3) {
                0 => data.resize(len + n, 0),
                1 => data.extend(rng.bytes(n)),
                _ if len > 0 => {
                    let a = rng.below(len as u64) as usize;
                    let b = (a + n).min(len);
                    let chunk = data[a..b].to_vec();
                    data.extend_from_slice(&chunk);
                }
                _ => data.push(rng.byte()),
            }
        }
        // Insert or delete a range in the middle.
        5 if len > 0 => {
            let a = rng.below(len as u64 + 1) as usize;
            if rng.one_in(2) {
                let n = 1 + rng.below(16) as usize;
                let ins = rng.bytes(n);
                data.splice(a..a, ins);
            } else {
                let b = (a + 1 + rng.below(16) as usize).min(len);
                data.drain(a..b);
            }
        }
        // Length/count/code field edit.
        6..=8 if !s.fields.is_empty() => {
            let f = *rng.pick(&s.fields);
            let cur = f.get(data);
            let bits = 8 * f.width as u32;
            let v = match (rng.below(6), cur) {
                (0, Some(c)) => c.wrapping_add(1),
                (1, Some(c)) => c.wrapping_sub(1),
                (2, Some(c)) => c.wrapping_mul(2).wrapping_add(rng.below(2)),
                (3, _) => (data.len() as u64 + rng.below(3)).saturating_sub(1),
                _ => rng.interesting(bits),
            };
            f.set(data, v);
        }
        // Splice with the other valid input: a prefix of one, a suffix of the other.
        9 if !other.is_empty() => {
            let a = rng.below(len as u64 + 1) as usize;
            let b = rng.below(other.len() as u64 + 1) as usize;
            data.truncate(a);
            data.extend_from_slice(&other[b..]);
        }
        // Overwrite a chunk with a chunk of the other input.
        10 if !other.is_empty() && len > 0 => {
            let b = rng.below(other.len() as u64) as usize;
            let n = (1 + rng.below(32) as usize).min(other.len() - b);
            let a = rng.below(len as u64) as usize;
            let n = n.min(len - a);
            data[a..a + n].copy_from_slice(&other[b..b + n]);
        }
        // Dictionary token (text formats).
        11 if !s.dict.is_empty() => {
            let t = rng.pick(s.dict).as_bytes();
            let a = rng.below(len as u64 + 1) as usize;
            if rng.one_in(3) && len > 0 {
                let b = (a + t.len()).min(len);
                data.splice(a..b, t.iter().copied());
            } else {
                data.splice(a..a, t.iter().copied());
            }
        }
        _ if len > 0 => {
            let i = rng.below(len as u64) as usize;
            data[i] = rng.byte();
        }
        _ => {
            let n = 1 + rng.below(8) as usize;
            data.extend(rng.bytes(n));
        }
    }
}

/// How a case's input was made.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A valid sample as generated.
    Valid,
    /// A valid sample with 1–6 mutations.
    Mutated,
    /// Two valid samples spliced, maybe mutated further.
    Spliced,
    /// Random bytes.
    Random,
}

/// Builds one case's input: mostly mutated valid samples (sealed again half the time), some
/// valid ones, splices, and a few random byte strings.
pub fn make_input(rng: &mut Rng, generate: fn(&mut Rng) -> Sample) -> (Vec<u8>, Kind) {
    let r = rng.below(100);
    if r < 4 {
        let max = if rng.one_in(4) { 2048 } else { 64 };
        let n = rng.below(max) as usize;
        return (rng.bytes(n), Kind::Random);
    }
    let s = generate(rng);
    if r < 16 {
        return (s.bytes, Kind::Valid);
    }
    let mut data = s.bytes.clone();
    let other = if r < 26 || rng.one_in(4) {
        generate(rng).bytes
    } else {
        Vec::new()
    };
    let kind = if r < 26 {
        let a = rng.below(data.len() as u64 + 1) as usize;
        let b = rng.below(other.len() as u64 + 1) as usize;
        data.truncate(a);
        data.extend_from_slice(&other[b..]);
        Kind::Spliced
    } else {
        Kind::Mutated
    };
    let n = if kind == Kind::Spliced {
        rng.below(3)
    } else {
        let max = if rng.one_in(4) { 6 } else { 2 };
        1 + rng.below(max)
    };
    for _ in 0..n {
        mutate_once(rng, &mut data, &s, &other);
    }
    if let Some(seal) = s.seal
        && rng.chance(0.6)
    {
        seal(&mut data);
    }
    (data, kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_what_they_write() {
        let mut b = vec![0u8; 16];
        for f in [
            Field::le(1, 4),
            Field::be(3, 8),
            Field::le(0, 1),
            Field::be(14, 2),
        ] {
            let v = 0x1122_3344_5566_7788u64 & (u64::MAX >> (64 - 8 * f.width));
            f.set(&mut b, v);
            assert_eq!(f.get(&b), Some(v));
        }
        assert_eq!(Field::le(15, 4).get(&b), None);
    }

    #[test]
    fn same_seed_same_inputs() {
        let g = |r: &mut Rng| Sample {
            bytes: r.bytes(40),
            fields: vec![Field::le(0, 4)],
            ..Sample::default()
        };
        let a: Vec<_> = (0..50).map(|i| make_input(&mut Rng::new(i), g).0).collect();
        let b: Vec<_> = (0..50).map(|i| make_input(&mut Rng::new(i), g).0).collect();
        assert_eq!(a, b);
    }
}
