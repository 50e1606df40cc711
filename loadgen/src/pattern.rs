//! Random numbers, fio's Zipf distribution and the verification data pattern.

/// splitmix64: small, fast, good enough for offsets and mixes.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
    /// Uniform in `[0, n)` (n > 0).
    #[inline]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// True with probability `pct`/100.
    #[inline]
    pub(crate) fn percent(&mut self, pct: u8) -> bool {
        pct >= 100 || (pct > 0 && self.below(100) < pct as u64)
    }
}

#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// fio's `GOLDEN_RATIO_64` (lib/hash.h), used by `__hash_u64` to scatter Zipf ranks.
const GOLDEN_RATIO_64: u64 = 0x61c8_8646_80b5_83eb;
/// fio caps the terms of zeta(n) it sums (`ZIPF_MAX_GEN`).
const ZIPF_MAX_GEN: u64 = 10_000_000;

/// Zipf(θ) over `n` ranges computed the way fio's `lib/zipf.c` does (Gray et al.'s
/// "Quickly generating billion-record synthetic databases" method, zeta(n) summed over at
/// most 10M terms, ranks scattered by `rank·GOLDEN_RATIO_64 + rand_off mod n`). The uniform
/// source is our own generator, so the sequence differs from fio's; the distribution and
/// the scattering are the same.
#[derive(Clone, Debug)]
pub(crate) struct Zipf {
    n: u64,
    alpha: f64,
    eta: f64,
    zetan: f64,
    half_pow_theta: f64,
    rand_off: u64,
}

impl Zipf {
    /// `rand_off_seed` chooses where the hot ranges land (fio: the first draw of the job's
    /// generator).
    pub(crate) fn new(n: u64, theta: f64, rand_off_seed: u64) -> Zipf {
        let n = n.max(1);
        let mut zetan = 0.0;
        for i in 0..n.min(ZIPF_MAX_GEN) {
            zetan += (1.0 / (i + 1) as f64).powf(theta);
        }
        let zeta2 = 1.0f64.powf(theta) + 0.5f64.powf(theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        // fio: rand_off = __rand() (a 32-bit draw).
        let rand_off = mix64(rand_off_seed) >> 32;
        Zipf {
            n,
            alpha,
            eta,
            zetan,
            half_pow_theta: 0.5f64.powf(theta),
            rand_off,
        }
    }

    /// The next range index in `[0, n)`.
    #[inline]
    pub(crate) fn next(&self, rng: &mut Rng) -> u64 {
        let rand_uni = (rng.next_u64() >> 32) as f64 / u32::MAX as f64;
        let rand_z = rand_uni * self.zetan;
        let val: u64 = if rand_z < 1.0 {
            1
        } else if rand_z < 1.0 + self.half_pow_theta {
            2
        } else {
            1 + (self.n as f64 * (self.eta * rand_uni - self.eta + 1.0).powf(self.alpha)) as u64
        };
        (val - 1)
            .wrapping_mul(GOLDEN_RATIO_64)
            .wrapping_add(self.rand_off)
            % self.n
    }
}

/// Block pattern: a 48-byte header (magic, seq, offset, tag, length, checksum) and a body
/// generated from (seq, offset, tag).
pub(crate) const MAGIC: &[u8; 8] = b"TCLGBLK1";
pub(crate) const HDR: usize = 48;

fn body_seed(seq: u64, offset: u64, tag: u64) -> u64 {
    mix64(seq ^ mix64(offset ^ mix64(tag))) | 1
}

#[inline]
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Fills `buf` (a multiple of 8 bytes, ≥ 48) with the pattern of write `seq` at `offset`.
pub(crate) fn fill(buf: &mut [u8], seq: u64, offset: u64, tag: u64) {
    let mut x = body_seed(seq, offset, tag);
    let mut sum = 0u64;
    for w in buf[HDR..].chunks_exact_mut(8) {
        let v = xorshift(&mut x);
        sum = sum.rotate_left(5) ^ v;
        w.copy_from_slice(&v.to_le_bytes());
    }
    buf[0..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&seq.to_le_bytes());
    buf[16..24].copy_from_slice(&offset.to_le_bytes());
    buf[24..32].copy_from_slice(&tag.to_le_bytes());
    let len = buf.len() as u64;
    buf[32..40].copy_from_slice(&len.to_le_bytes());
    buf[40..48].copy_from_slice(&sum.to_le_bytes());
}

fn le(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().unwrap())
}

/// What a block holds, as far as its own header and checksum say.
fn describe(buf: &[u8], tag: u64) -> String {
    if buf.iter().all(|&b| b == 0) {
        return "found all zeroes".into();
    }
    if &buf[0..8] != MAGIC {
        return format!("found no pattern header (first bytes {:02x?})", &buf[..16]);
    }
    let mut sum = 0u64;
    for w in buf[HDR..].chunks_exact(8) {
        sum = sum.rotate_left(5) ^ u64::from_le_bytes(w.try_into().unwrap());
    }
    format!(
        "found seq {} of offset {}{} (checksum {})",
        le(buf, 8),
        le(buf, 16),
        if le(buf, 24) == tag {
            ""
        } else {
            " from another run"
        },
        if sum == le(buf, 40) { "ok" } else { "BAD" }
    )
}

/// Checks `buf` holds exactly the pattern of write `seq` at `offset`; `Err` describes the
/// difference.
pub(crate) fn check(buf: &[u8], seq: u64, offset: u64, tag: u64) -> Result<(), String> {
    let header_ok = &buf[0..8] == MAGIC
        && le(buf, 8) == seq
        && le(buf, 16) == offset
        && le(buf, 24) == tag
        && le(buf, 32) == buf.len() as u64;
    let mut first_bad = None;
    if header_ok {
        let mut x = body_seed(seq, offset, tag);
        for (i, w) in buf[HDR..].chunks_exact(8).enumerate() {
            if u64::from_le_bytes(w.try_into().unwrap()) != xorshift(&mut x) {
                first_bad = Some(HDR + i * 8);
                break;
            }
        }
        if first_bad.is_none() {
            return Ok(());
        }
    }
    let at = match first_bad {
        Some(b) => format!(", first differing byte at +{b}"),
        None => String::new(),
    };
    Err(format!(
        "block at offset {offset}: expected seq {seq}, {}{at}",
        describe(buf, tag)
    ))
}

/// Checks `buf` is some complete write of this run at `offset` (any seq): used when the
/// last write is ambiguous (overlapping writes were in flight).
pub(crate) fn check_any(buf: &[u8], offset: u64, tag: u64) -> Result<(), String> {
    if &buf[0..8] == MAGIC && le(buf, 16) == offset && le(buf, 24) == tag {
        return check(buf, le(buf, 8), offset, tag);
    }
    Err(format!(
        "block at offset {offset}: expected any write of this run, {}",
        describe(buf, tag)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_roundtrip_and_corruption() {
        let mut b = vec![0u8; 4096];
        fill(&mut b, 7, 8192, 99);
        assert!(check(&b, 7, 8192, 99).is_ok());
        assert!(check_any(&b, 8192, 99).is_ok());
        assert!(check(&b, 6, 8192, 99).unwrap_err().contains("found seq 7"));
        assert!(check(&b, 7, 4096, 99).is_err());
        b[1000] ^= 1;
        let e = check(&b, 7, 8192, 99).unwrap_err();
        assert!(e.contains("checksum BAD") && e.contains("+1000"), "{e}");
        assert!(check_any(&b, 8192, 99).is_err());
        let z = vec![0u8; 4096];
        assert!(check(&z, 1, 0, 99).unwrap_err().contains("zeroes"));
    }

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let n = 10_000;
        let z = Zipf::new(n, 0.9, 1);
        let mut rng = Rng::new(3);
        let mut counts = vec![0u32; n as usize];
        for _ in 0..200_000 {
            let v = z.next(&mut rng);
            assert!(v < n);
            counts[v as usize] += 1;
        }
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top1pct: u32 = counts[..100].iter().sum();
        // Zipf 0.9 over 10k: the top 1% of ranges take roughly 40% of accesses.
        assert!(top1pct > 200_000 * 3 / 10, "top 1% got {top1pct}");
        let mut u = vec![0u32; 100];
        for _ in 0..100_000 {
            u[rng.below(100) as usize] += 1;
        }
        assert!(u.iter().all(|&c| (800..1200).contains(&c)));
    }

    /// Same table as `fio-genzipf -t zipf -i 0.9 -g 1 -b 4096` (fio 3.33): 262144 draws over
    /// 262144 ranges, blocks that were hit sorted by hits, share of hits of the top 5%, 10%,
    /// 20% and 50% of them. fio printed 54.76%, 62.09%, 70.54%, 84.30%.
    #[test]
    fn zipf_matches_fio_genzipf() {
        let n = 262_144u64;
        let z = Zipf::new(n, 0.9, 42);
        let mut rng = Rng::new(42);
        let mut hits = vec![0u32; n as usize];
        for _ in 0..n {
            hits[z.next(&mut rng) as usize] += 1;
        }
        let mut nodes: Vec<u32> = hits.into_iter().filter(|&h| h > 0).collect();
        nodes.sort_unstable_by(|a, b| b.cmp(a));
        let share = |pct: f64| {
            let k = (nodes.len() as f64 * pct / 100.0) as usize;
            nodes[..k].iter().map(|&h| h as u64).sum::<u64>() as f64 / n as f64 * 100.0
        };
        for (pct, fio) in [(5.0, 54.76), (10.0, 62.09), (20.0, 70.54), (50.0, 84.30)] {
            let ours = share(pct);
            println!("top {pct}% of hit blocks: ours {ours:.2}%, fio-genzipf {fio:.2}%");
            assert!(
                (ours - fio).abs() < 1.0,
                "top {pct}%: ours {ours:.2} fio {fio:.2}"
            );
        }
    }
}
