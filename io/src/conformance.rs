//! The conformance suite every [`Backend`] passes.
//!
//! [`conformance`] checks the block-device semantics in place and leaves a flushed pattern
//! behind; after reopening the device (a file backend reopens its file, the fault backend
//! cuts the power and revives), [`verify_persisted`] checks that the pattern survived.
//! Failures panic with a message naming the backend, as test assertions do.

use crate::{BLOCK, Backend, IoErr};

/// Smallest device the suite accepts, in blocks (512 KiB).
pub const MIN_BLOCKS: u64 = 1024;

/// Number of blocks at the end of the device that [`conformance`] writes and flushes last, and
/// [`verify_persisted`] checks.
pub const PERSIST_BLOCKS: u64 = 64;

const PERSIST_TAG: u64 = 0xD0_0D;

/// Deterministic content of block `lba` for test `tag` (each block differs, within and across
/// tags).
pub fn pattern_block(tag: u64, lba: u64, out: &mut [u8]) {
    let mut x = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ lba.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Fills `buf` (a multiple of 512 bytes) with the pattern of `tag` for blocks from `lba`.
pub fn fill_pattern(tag: u64, lba: u64, buf: &mut [u8]) {
    for (i, blk) in buf.chunks_mut(BLOCK).enumerate() {
        pattern_block(tag, lba + i as u64, blk);
    }
}

/// A `len`-byte buffer of the pattern of `tag` from `lba`.
pub fn pattern(tag: u64, lba: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill_pattern(tag, lba, &mut v);
    v
}

fn read_vec(b: &dyn Backend, lba: u64, blocks: u64) -> Vec<u8> {
    let mut v = vec![0xEE; blocks as usize * BLOCK];
    if let Err(e) = b.read(lba, &mut v) {
        panic!(
            "{}: read of {blocks} blocks at lba {lba} failed: {e}",
            b.name()
        );
    }
    v
}

fn expect_ok(b: &dyn Backend, what: &str, r: Result<(), IoErr>) {
    if let Err(e) = r {
        panic!("{}: {what} failed: {e}", b.name());
    }
}

fn assert_zero(b: &dyn Backend, lba: u64, blocks: u64, what: &str) {
    let v = read_vec(b, lba, blocks);
    if let Some(i) = v.iter().position(|&x| x != 0) {
        panic!(
            "{}: {what}: byte {i} of {blocks} blocks at lba {lba} is {:#x}, want 0",
            b.name(),
            v[i]
        );
    }
}

fn assert_pattern(b: &dyn Backend, tag: u64, lba: u64, blocks: u64, what: &str) {
    let got = read_vec(b, lba, blocks);
    let want = pattern(tag, lba, got.len());
    if got != want {
        let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "{}: {what}: {blocks} blocks at lba {lba} differ first at byte {i} (block {})",
            b.name(),
            lba + (i / BLOCK) as u64
        );
    }
}

/// Runs the whole suite on `b`, which must have at least [`MIN_BLOCKS`] blocks and whose content
/// it overwrites. Panics on the first failure. Ends by writing and flushing the pattern that
/// [`verify_persisted`] checks.
pub fn conformance(b: &dyn Backend) {
    let n = b.blocks();
    assert!(
        n >= MIN_BLOCKS,
        "{}: conformance needs at least {MIN_BLOCKS} blocks, device has {n}",
        b.name()
    );
    assert!(!b.name().is_empty(), "backend name is empty");
    read_after_write(b);
    unaligned_buffers(b);
    zeroes_and_trim(b);
    errors_change_nothing(b);
    fua_and_flush(b);
    concurrent_writers(b);
    batch(b);
    write_persist_pattern(b);
}

/// Writes the persistence pattern over the last [`PERSIST_BLOCKS`] blocks and flushes.
pub fn write_persist_pattern(b: &dyn Backend) {
    let lba = b.blocks() - PERSIST_BLOCKS;
    let buf = pattern(PERSIST_TAG, lba, PERSIST_BLOCKS as usize * BLOCK);
    expect_ok(b, "persistence write", b.write(lba, &buf, false));
    expect_ok(b, "persistence flush", b.flush());
}

/// Checks, after a reopen, that the pattern [`conformance`] flushed last is intact.
pub fn verify_persisted(b: &dyn Backend) {
    let lba = b.blocks() - PERSIST_BLOCKS;
    assert_pattern(
        b,
        PERSIST_TAG,
        lba,
        PERSIST_BLOCKS,
        "flushed data after reopen",
    );
}

fn read_after_write(b: &dyn Backend) {
    let n = b.blocks();
    let sizes = [1u64, 2, 3, 7, 8, 9, 16, 63, 64, 65, 255, 256];
    let mut tag = 1;
    for &len in &sizes {
        for lba in [0, 1, 5, 8, 13, n / 2 - 1, n / 2 + 3, n - len] {
            tag += 1;
            let buf = pattern(tag, lba, len as usize * BLOCK);
            expect_ok(b, "write", b.write(lba, &buf, false));
            assert_pattern(b, tag, lba, len, "read after write");
        }
    }
    // The very last block alone, and neighbours untouched by a one-block write.
    let last = n - 1;
    expect_ok(
        b,
        "write last block",
        b.write(last, &pattern(900, last, BLOCK), false),
    );
    assert_pattern(b, 900, last, 1, "last block");
    let base = 100;
    expect_ok(
        b,
        "write",
        b.write(base, &pattern(901, base, 3 * BLOCK), false),
    );
    expect_ok(
        b,
        "write",
        b.write(base + 1, &pattern(902, base + 1, BLOCK), false),
    );
    assert_pattern(b, 901, base, 1, "block before a one-block overwrite");
    assert_pattern(b, 902, base + 1, 1, "one-block overwrite");
    assert_pattern(b, 901, base + 2, 1, "block after a one-block overwrite");
    // Zero-length requests are no-ops.
    expect_ok(b, "zero-length write", b.write(base, &[], false));
    expect_ok(b, "zero-length read", b.read(base, &mut []));
    assert_pattern(b, 901, base, 1, "after zero-length requests");
}

fn unaligned_buffers(b: &dyn Backend) {
    // Buffers starting at odd addresses must work (copied through an aligned buffer when the
    // backend needs alignment).
    for (lba, blocks, shift) in [(200u64, 1u64, 1usize), (210, 8, 3), (230, 17, 511)] {
        let len = blocks as usize * BLOCK;
        let mut store = vec![0u8; len + shift];
        fill_pattern(300 + lba, lba, &mut store[shift..]);
        expect_ok(b, "unaligned write", b.write(lba, &store[shift..], false));
        let mut rd = vec![0u8; len + shift];
        expect_ok(b, "unaligned read", b.read(lba, &mut rd[shift..]));
        assert!(
            rd[shift..] == store[shift..],
            "{}: unaligned buffer round trip at lba {lba}",
            b.name()
        );
        assert_pattern(b, 300 + lba, lba, blocks, "unaligned write");
    }
}

fn zeroes_and_trim(b: &dyn Backend) {
    let n = b.blocks();
    for (i, &(lba, len)) in [(300u64, 1u64), (310, 9), (330, 128), (n - 40, 40)]
        .iter()
        .enumerate()
    {
        let tag = 400 + i as u64;
        // Surround the range with data so that an overlong zeroing shows.
        let (s, e) = (lba - 1, (lba + len + 1).min(n));
        expect_ok(
            b,
            "write",
            b.write(s, &pattern(tag, s, (e - s) as usize * BLOCK), false),
        );
        expect_ok(b, "write_zeroes", b.write_zeroes(lba, len, false));
        assert_zero(b, lba, len, "write_zeroes");
        assert_pattern(b, tag, s, 1, "block before write_zeroes");
        if lba + len < n {
            assert_pattern(b, tag, lba + len, 1, "block after write_zeroes");
        }

        let tag = tag + 50;
        expect_ok(
            b,
            "write",
            b.write(s, &pattern(tag, s, (e - s) as usize * BLOCK), false),
        );
        expect_ok(b, "trim", b.trim(lba, len));
        assert_zero(b, lba, len, "trim");
        assert_pattern(b, tag, s, 1, "block before trim");
        if lba + len < n {
            assert_pattern(b, tag, lba + len, 1, "block after trim");
        }
    }
    // A FUA write_zeroes, and zero-length requests.
    expect_ok(
        b,
        "write",
        b.write(500, &pattern(480, 500, 4 * BLOCK), false),
    );
    expect_ok(b, "write_zeroes FUA", b.write_zeroes(500, 4, true));
    assert_zero(b, 500, 4, "write_zeroes FUA");
    expect_ok(b, "zero-length trim", b.trim(500, 0));
    expect_ok(b, "zero-length write_zeroes", b.write_zeroes(500, 0, false));
}

fn errors_change_nothing(b: &dyn Backend) {
    let n = b.blocks();
    let tag = 600;
    let tail = 8;
    expect_ok(
        b,
        "write",
        b.write(
            n - tail,
            &pattern(tag, n - tail, tail as usize * BLOCK),
            false,
        ),
    );
    expect_ok(b, "write", b.write(0, &pattern(tag, 0, 8 * BLOCK), false));

    let out_of_range = |r: Result<(), IoErr>, what: &str| match r {
        Err(IoErr::OutOfRange { .. }) => {}
        other => panic!("{}: {what}: want OutOfRange, got {other:?}", b.name()),
    };
    let misaligned = |r: Result<(), IoErr>, what: &str| match r {
        Err(IoErr::Misaligned { .. }) => {}
        other => panic!("{}: {what}: want Misaligned, got {other:?}", b.name()),
    };
    let junk = vec![0xA5u8; 2 * BLOCK];
    let mut rd = vec![0u8; 2 * BLOCK];
    out_of_range(b.write(n, &junk[..BLOCK], false), "write at lba == blocks");
    out_of_range(b.write(n - 1, &junk, false), "write straddling the end");
    out_of_range(b.write(u64::MAX, &junk, false), "write at lba u64::MAX");
    out_of_range(b.write(n - 1, &junk, true), "FUA write straddling the end");
    out_of_range(b.read(n, &mut rd[..BLOCK]), "read at lba == blocks");
    out_of_range(b.read(n - 1, &mut rd), "read straddling the end");
    out_of_range(b.read(u64::MAX - 1, &mut rd), "read near u64::MAX");
    out_of_range(b.write_zeroes(n - 2, 3, false), "write_zeroes past the end");
    out_of_range(
        b.write_zeroes(1, u64::MAX, false),
        "write_zeroes of u64::MAX",
    );
    out_of_range(b.trim(n - 2, 3), "trim past the end");
    out_of_range(b.trim(u64::MAX, 1), "trim at lba u64::MAX");
    misaligned(b.write(0, &junk[..511], false), "write of 511 bytes");
    misaligned(b.write(0, &junk[..513], false), "write of 513 bytes");
    misaligned(b.write(0, &junk[..1], true), "FUA write of 1 byte");
    misaligned(b.read(0, &mut rd[..100]), "read of 100 bytes");
    misaligned(b.read(0, &mut rd[..BLOCK + 1]), "read of 513 bytes");
    // Misaligned and out of range at once: an error either way.
    assert!(b.write(n, &junk[..3], false).is_err(), "{}", b.name());
    // Prefetch hints, in range or not, change nothing and never panic.
    for (lba, blocks) in [
        (0, 8),
        (n - tail, tail),
        (n - 1, 2),
        (n, 1),
        (0, 0),
        (0, u64::MAX),
        (u64::MAX, 1),
        (u64::MAX, u64::MAX),
    ] {
        b.prefetch(lba, blocks);
    }

    assert_pattern(
        b,
        tag,
        n - tail,
        tail,
        "tail after rejected requests and prefetch hints",
    );
    assert_pattern(
        b,
        tag,
        0,
        8,
        "head after rejected requests and prefetch hints",
    );
    for e in [
        IoErr::OutOfRange {
            lba: 1,
            blocks: 2,
            dev_blocks: 3,
        },
        IoErr::Misaligned { len: 3 },
    ] {
        assert!(!e.to_string().contains('\n'), "Display is one line");
    }
}

fn fua_and_flush(b: &dyn Backend) {
    for (i, lba) in [600u64, 601, 640].into_iter().enumerate() {
        let tag = 700 + i as u64;
        expect_ok(
            b,
            "FUA write",
            b.write(lba, &pattern(tag, lba, 4 * BLOCK), true),
        );
        assert_pattern(b, tag, lba, 4, "FUA write");
    }
    expect_ok(b, "flush", b.flush());
    expect_ok(b, "second flush", b.flush());
    assert_pattern(b, 702, 640, 4, "after flush");
}

fn concurrent_writers(b: &dyn Backend) {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 64;
    let base = 700u64;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let start = base + t * PER_THREAD;
                // Mixed sizes, one to eight blocks, some FUA, in a thread-specific order.
                let mut lba = start;
                let mut k = 0u64;
                while lba < start + PER_THREAD {
                    let len = (1 + (k * 5 + t) % 8).min(start + PER_THREAD - lba);
                    let buf = pattern(800 + t, lba, len as usize * BLOCK);
                    expect_ok(b, "concurrent write", b.write(lba, &buf, k % 7 == 3));
                    lba += len;
                    k += 1;
                }
                expect_ok(b, "concurrent flush", b.flush());
            });
        }
    });
    for t in 0..THREADS {
        assert_pattern(
            b,
            800 + t,
            base + t * PER_THREAD,
            PER_THREAD,
            "concurrent writers",
        );
    }
}

fn batch(b: &dyn Backend) {
    use crate::Req;
    let w = pattern(950, 40, 2 * BLOCK);
    let mut r = vec![0u8; 2 * BLOCK];
    let mut reqs = [
        Req::Write {
            lba: 40,
            buf: &w,
            fua: false,
        },
        Req::Trim { lba: 44, blocks: 2 },
        Req::Flush,
        Req::Write {
            lba: b.blocks(),
            buf: &w,
            fua: false,
        },
    ];
    let res = b.submit_batch(&mut reqs);
    assert_eq!(res.len(), 4, "{}: one result per request", b.name());
    assert!(
        res[..3].iter().all(|r| r.is_ok()),
        "{}: batch {res:?}",
        b.name()
    );
    assert!(
        matches!(res[3], Err(IoErr::OutOfRange { .. })),
        "{}",
        b.name()
    );
    let mut reqs = [Req::Read {
        lba: 40,
        buf: &mut r,
    }];
    assert!(b.submit_batch(&mut reqs)[0].is_ok(), "{}", b.name());
    assert!(r == w, "{}: batch read after batch write", b.name());
    assert_zero(b, 44, 2, "batch trim");
}

/// A device with every optional capability of [`Backend`], counting which path each IO took:
/// for tests of what a wrapper passes on (`io/src/forward.rs`). Data lives in RAM.
pub struct Probe {
    ram: crate::RamBackend,
    /// Calls of the synchronous read/write/zero/trim/flush.
    pub sync_calls: std::sync::atomic::AtomicU64,
    /// Requests given to [`Backend::submit_async`] (answered on a thread of their own).
    pub async_calls: std::sync::atomic::AtomicU64,
    /// [`Backend::prefetch`] and [`Backend::submit_batch`] calls.
    pub prefetches: std::sync::atomic::AtomicU64,
    pub batches: std::sync::atomic::AtomicU64,
}

/// The descriptor [`Probe::ring_fd`] names (never used for IO).
pub const PROBE_FD: i32 = 1_000_000;

impl Probe {
    /// A probe of `blocks` blocks.
    pub fn new(blocks: u64) -> Probe {
        Probe {
            ram: crate::RamBackend::new(blocks),
            sync_calls: Default::default(),
            async_calls: Default::default(),
            prefetches: Default::default(),
            batches: Default::default(),
        }
    }

    fn count(c: &std::sync::atomic::AtomicU64) {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(c: &std::sync::atomic::AtomicU64) -> u64 {
        c.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Backend for Probe {
    fn name(&self) -> String {
        "probe".into()
    }
    fn blocks(&self) -> u64 {
        self.ram.blocks()
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        Self::count(&self.sync_calls);
        self.ram.read(lba, buf)
    }
    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        Self::count(&self.sync_calls);
        self.ram.write(lba, buf, fua)
    }
    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        Self::count(&self.sync_calls);
        self.ram.write_zeroes(lba, blocks, fua)
    }
    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        Self::count(&self.sync_calls);
        self.ram.trim(lba, blocks)
    }
    fn flush(&self) -> Result<(), IoErr> {
        Self::count(&self.sync_calls);
        self.ram.flush()
    }
    fn inline(&self) -> bool {
        true
    }
    fn prefetch(&self, _lba: u64, _blocks: u64) {
        Self::count(&self.prefetches);
    }
    /// The whole device is one hole (so a wrapper that forwards this is told from the
    /// default's "allocated").
    fn extents(&self, lba: u64, blocks: u64) -> Result<Vec<crate::Extent>, IoErr> {
        crate::check_blocks(lba, blocks, self.blocks())?;
        let mut v = Vec::new();
        crate::Extent::push(&mut v, blocks, true);
        Ok(v)
    }
    fn ring_fd(&self) -> Option<std::os::unix::io::RawFd> {
        Some(PROBE_FD)
    }
    fn is_async(&self) -> bool {
        true
    }
    fn submit_async(&self, req: crate::AsyncReq, done: crate::AsyncDone) {
        Self::count(&self.async_calls);
        let (buf, r) = crate::run_sync(&self.ram, req);
        std::thread::spawn(move || done(buf, r));
    }
    fn submit_batch(&self, reqs: &mut [crate::Req<'_>]) -> Vec<Result<(), IoErr>> {
        Self::count(&self.batches);
        self.ram.submit_batch(reqs)
    }
}
