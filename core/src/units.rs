//! Newtypes for every index space and unit the core uses, and all conversions between them.
//!
//! The durability contract is stated per 512-byte block, so the core counts in blocks, never in
//! bytes or device sectors. Devices with 4 KiB sectors are handled by the engine (it refuses
//! combinations that cannot be atomic); the core only needs the block.

/// Bytes in a block, the unit of state (valid/dirty) and of the durability contract.
pub const BLOCK_BYTES: u64 = 512;

/// A block address on a device (core or cache), in 512-byte blocks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Lba(pub u64);

/// A core device attached to a cache. At most [`CORES_MAX`] per cache.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CoreId(pub u16);

/// Cores per cache. The per-line core id is stored in one byte.
pub const CORES_MAX: usize = 256;

/// A cache line slot on the cache device: line `i` lives at
/// `data_offset + i * blocks_per_line` on the cache device.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LineId(pub u32);

/// A client request, named by the driver (engine or simulator). Unique while in flight.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

/// A device IO the core asked for, named by the core. Unique while in flight.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoId(pub u64);

/// A point in time, in nanoseconds since an arbitrary origin chosen by the driver.
/// The core never reads a clock: time only arrives with events.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Nanos(pub u64);

impl Nanos {
    /// One second.
    pub const SECOND: Nanos = Nanos(1_000_000_000);
    /// From milliseconds.
    pub const fn from_ms(ms: u64) -> Nanos {
        Nanos(ms * 1_000_000)
    }
    /// From seconds.
    pub const fn from_secs(s: u64) -> Nanos {
        Nanos(s * 1_000_000_000)
    }
    /// `self - earlier`, or zero if `earlier` is later.
    pub fn since(self, earlier: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(earlier.0))
    }
    /// `self + d`, saturating.
    pub fn plus(self, d: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(d.0))
    }
}

/// Cache line size, fixed when the cache is created.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LineSize {
    /// 4 KiB
    K4,
    /// 8 KiB
    K8,
    /// 16 KiB
    K16,
    /// 32 KiB
    K32,
    /// 64 KiB
    K64,
}

/// Blocks in the largest line; the valid/dirty masks of one line fit in a `u128`.
pub const BLOCKS_PER_LINE_MAX: u32 = 128;

impl LineSize {
    /// Every line size, smallest first.
    pub const ALL: [LineSize; 5] = [
        LineSize::K4,
        LineSize::K8,
        LineSize::K16,
        LineSize::K32,
        LineSize::K64,
    ];

    /// Bytes in a line.
    pub const fn bytes(self) -> u64 {
        match self {
            LineSize::K4 => 4096,
            LineSize::K8 => 8192,
            LineSize::K16 => 16384,
            LineSize::K32 => 32768,
            LineSize::K64 => 65536,
        }
    }

    /// Blocks in a line (8 to 128).
    pub const fn blocks(self) -> u32 {
        (self.bytes() / BLOCK_BYTES) as u32
    }

    /// log2 of [`LineSize::blocks`].
    pub const fn blocks_shift(self) -> u32 {
        self.blocks().trailing_zeros()
    }

    /// Parses `4k`, `8k`, `16k`, `32k`, `64k` (case-insensitive, `kib` accepted).
    pub fn parse(s: &str) -> Option<LineSize> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_suffix("ib").unwrap_or(&t);
        match t {
            "4k" | "4096" => Some(LineSize::K4),
            "8k" | "8192" => Some(LineSize::K8),
            "16k" | "16384" => Some(LineSize::K16),
            "32k" | "32768" => Some(LineSize::K32),
            "64k" | "65536" => Some(LineSize::K64),
            _ => None,
        }
    }
}

impl std::fmt::Display for LineSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}k", self.bytes() / 1024)
    }
}

/// A mask of blocks inside one line: bit `i` is block `i` of the line.
pub type BlockMask = u128;

/// The mask with bits `[first, first + count)` set. `first + count <= 128`.
#[inline]
pub fn block_range_mask(first: u32, count: u32) -> BlockMask {
    debug_assert!(first + count <= BLOCKS_PER_LINE_MAX);
    if count == 0 {
        return 0;
    }
    let ones = if count == 128 {
        u128::MAX
    } else {
        (1u128 << count) - 1
    };
    ones << first
}

/// The mask of every block in a line of `blocks` blocks.
#[inline]
pub fn full_mask(blocks: u32) -> BlockMask {
    block_range_mask(0, blocks)
}

/// Iterates the maximal runs of set bits of `mask` as `(first, count)`.
pub fn mask_runs(mut mask: BlockMask) -> impl Iterator<Item = (u32, u32)> {
    let mut base = 0u32;
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let skip = mask.trailing_zeros();
        mask = if skip >= 128 { 0 } else { mask >> skip };
        base += skip;
        let len = mask.trailing_ones();
        let first = base;
        mask = if len >= 128 { 0 } else { mask >> len };
        base += len;
        Some((first, len))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_runs() {
        assert_eq!(block_range_mask(0, 0), 0);
        assert_eq!(block_range_mask(0, 8), 0xff);
        assert_eq!(block_range_mask(3, 2), 0b11000);
        assert_eq!(block_range_mask(0, 128), u128::MAX);
        assert_eq!(full_mask(8), 0xff);
        let runs: Vec<_> = mask_runs(0b1110_0110).collect();
        assert_eq!(runs, vec![(1, 2), (5, 3)]);
        let runs: Vec<_> = mask_runs(u128::MAX).collect();
        assert_eq!(runs, vec![(0, 128)]);
        let runs: Vec<_> = mask_runs(1u128 << 127).collect();
        assert_eq!(runs, vec![(127, 1)]);
    }

    #[test]
    fn line_sizes() {
        for ls in LineSize::ALL {
            assert_eq!(1u32 << ls.blocks_shift(), ls.blocks());
            assert_eq!(LineSize::parse(&ls.to_string()), Some(ls));
        }
        assert_eq!(LineSize::parse("3k"), None);
    }
}
