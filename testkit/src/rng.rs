//! The seeded generators of the tests: the same seed gives the same sequence on every
//! machine, so a failing case is found again from its seed. Two kinds, kept bit for bit as the
//! tests had them (a test's cases are the sequence it draws):
//!
//! - [`SplitMix`]: SplitMix64 (a counter through [`mix`]), any seed;
//! - [`XorShift`]: Marsaglia's xorshift64 (13, 7, 17), a seed other than 0.

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// SplitMix64: the state counts up by one and each output is its [`mix`].
#[derive(Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next output.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0)
    }
    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// xorshift64 (shifts 13, 7, 17); the state must not be 0.
#[derive(Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The next output.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A number in `0..n` (0 for `n` = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A number in `[0, 1)` (53 bits).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `n` bytes: the low byte of each output.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// `n` bytes: each output, little-endian (the last one cut to what is left).
    pub fn words(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        for c in buf.chunks_mut(8) {
            c.copy_from_slice(&self.next().to_le_bytes()[..c.len()]);
        }
        buf
    }
}
