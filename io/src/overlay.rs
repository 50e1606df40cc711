//! [`OverlayBackend`]: a file device with a volatile write cache that outlives the process.
//!
//! It emulates a disk whose write cache survives the death of the process using it (the host
//! stays up, only the process dies, for example by SIGKILL): writes not yet covered by a
//! completed flush are not written to the base file but appended to a side log beside it
//! (`<base>.wcache`: one record per write, with the range, the data and checksums). Reads see
//! the base file with the pending writes on top. [`Backend::flush`] applies the pending writes
//! to the base file, `fdatasync`s it and empties the log; a FUA write is written to the base
//! file and synced at once (and kept in the log, marked durable, so the order of pending
//! writes stays exact).
//!
//! After the process died, [`OverlayBackend::power_cut`] plays the power cut: every pending
//! write is kept, dropped, or torn at 512-byte granularity (seeded), durable records are always
//! kept, and a clean base file without a log is left. A record cut short by the death of the
//! process (a torn tail of the log) counts as never written.
//!
//! What the device holds now (the base file with the pending writes on top) is also kept whole
//! in a third file, `<base>.cur`, rebuilt from the base file and the log at every open. Reads
//! come from it, and it is the device's [`Backend::ring_fd`]: a caller may run reads, writes and
//! flushes on its own io_uring, and reports each write and flush that completed with
//! [`Backend::ring_completed`], which logs the write (and, for FUA, writes it to the base file)
//! or applies the flush — so writes are logged in the order they completed, before anyone is
//! told. A write the ring did but nobody reported (the process died with IOs in flight) was
//! never acknowledged: it is lost at the next open, as a write the kernel never got would be.

use crate::{
    BLOCK, Backend, IoErr, PowerCutPattern, PowerCutReport, RingCompleted, check_blocks,
    check_bytes,
};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

const MAGIC: [u8; 4] = *b"OVL1";
const HDR: usize = 48;
const KIND_DATA: u8 = 1;
const KIND_ZERO: u8 = 2;
const FLAG_DURABLE: u8 = 1;
/// Index value of a block whose pending content is zeros.
const ZERO_LOC: u64 = u64::MAX;
/// Largest record accepted by the log scanner (in blocks): 64 MiB.
const MAX_RECORD_BLOCKS: u64 = 1 << 17;

/// SplitMix64 finaliser.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A 64-bit checksum of `data` (not cryptographic; detects torn and damaged records).
fn checksum(data: &[u8]) -> u64 {
    let mut h = 0x243F_6A88_85A3_08D3u64 ^ data.len() as u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h.rotate_left(23) ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    for &b in words.remainder() {
        h = (h.rotate_left(23) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    mix(h)
}

/// One valid record of the side log.
#[derive(Debug, Clone, Copy)]
struct Rec {
    kind: u8,
    durable: bool,
    lba: u64,
    blocks: u64,
    /// Offset of the record's data in the log (data records).
    data: u64,
}

fn header(kind: u8, durable: bool, lba: u64, blocks: u64, seq: u64, data_sum: u64) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[..4].copy_from_slice(&MAGIC);
    h[4] = kind;
    h[5] = if durable { FLAG_DURABLE } else { 0 };
    h[8..16].copy_from_slice(&lba.to_le_bytes());
    h[16..24].copy_from_slice(&blocks.to_le_bytes());
    h[24..32].copy_from_slice(&seq.to_le_bytes());
    h[32..40].copy_from_slice(&data_sum.to_le_bytes());
    let s = checksum(&h[..40]);
    h[40..48].copy_from_slice(&s.to_le_bytes());
    h
}

fn le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// Reads the valid records of the log (stopping at the first torn or damaged one) and returns
/// them with the length of the valid prefix.
fn scan(log: &File, dev_blocks: u64) -> Result<(Vec<Rec>, u64), IoErr> {
    let len = log
        .metadata()
        .map_err(|e| IoErr::io("overlay log metadata", &e))?
        .len();
    let mut recs = Vec::new();
    let mut off = 0u64;
    let mut data = Vec::new();
    while off + HDR as u64 <= len {
        let mut h = [0u8; HDR];
        log.read_exact_at(&mut h, off)
            .map_err(|e| IoErr::io("reading the overlay log", &e))?;
        if h[..4] != MAGIC || checksum(&h[..40]) != le(&h[40..48]) {
            break;
        }
        let (kind, durable) = (h[4], h[5] & FLAG_DURABLE != 0);
        let (lba, blocks) = (le(&h[8..16]), le(&h[16..24]));
        if !(kind == KIND_DATA || kind == KIND_ZERO)
            || blocks > MAX_RECORD_BLOCKS
            || check_blocks(lba, blocks, dev_blocks).is_err()
        {
            break;
        }
        let dlen = if kind == KIND_DATA {
            blocks * BLOCK as u64
        } else {
            0
        };
        let end = off + HDR as u64 + dlen;
        if end > len {
            break;
        }
        data.resize(dlen as usize, 0);
        log.read_exact_at(&mut data, off + HDR as u64)
            .map_err(|e| IoErr::io("reading the overlay log", &e))?;
        if checksum(&data) != le(&h[32..40]) {
            break;
        }
        recs.push(Rec {
            kind,
            durable,
            lba,
            blocks,
            data: off + HDR as u64,
        });
        off = end;
    }
    Ok((recs, off))
}

/// Pending state: the log's length and, per block with a pending write, where its newest
/// pending content is (an offset in the log, or [`ZERO_LOC`]).
#[derive(Debug, Default)]
struct State {
    log_len: u64,
    records: u64,
    index: HashMap<u64, u64>,
}

impl State {
    fn add(&mut self, r: &Rec) {
        for i in 0..r.blocks {
            let loc = if r.kind == KIND_DATA {
                r.data + i * BLOCK as u64
            } else {
                ZERO_LOC
            };
            self.index.insert(r.lba + i, loc);
        }
        self.records += 1;
    }
}

/// A file device whose un-flushed writes live in a side log that survives the death of the
/// process (see the module documentation); [`OverlayBackend::power_cut`] then decides their
/// fate.
#[derive(Debug)]
pub struct OverlayBackend {
    path: PathBuf,
    base: File,
    log: File,
    /// What the device holds now: the base file with the pending writes applied.
    cur: File,
    blocks: u64,
    state: RwLock<State>,
}

fn zeros() -> &'static [u8] {
    static Z: [u8; 64 * BLOCK] = [0; 64 * BLOCK];
    &Z
}

/// Writes zeros over `blocks` blocks at `lba` of `f`.
fn zero_file(f: &File, lba: u64, blocks: u64) -> Result<(), IoErr> {
    let z = zeros();
    let mut b = 0;
    while b < blocks {
        let n = (blocks - b).min((z.len() / BLOCK) as u64);
        f.write_all_at(&z[..n as usize * BLOCK], (lba + b) * BLOCK as u64)
            .map_err(|e| IoErr::io("writing zeros to the overlay base", &e))?;
        b += n;
    }
    Ok(())
}

/// Writes the content `index` names to `base`, in runs: consecutive blocks whose data is
/// consecutive in the log are copied with one read and one write.
fn apply_index(base: &File, log: &File, index: &HashMap<u64, u64>) -> Result<(), IoErr> {
    let mut v: Vec<(u64, u64)> = index.iter().map(|(&b, &l)| (b, l)).collect();
    v.sort_unstable();
    let mut buf = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let (lba, loc) = v[i];
        let mut n = 1;
        while i + n < v.len() && n < 2048 {
            let (b, l) = v[i + n];
            let contiguous = b == lba + n as u64
                && if loc == ZERO_LOC {
                    l == ZERO_LOC
                } else {
                    l == loc + (n * BLOCK) as u64
                };
            if !contiguous {
                break;
            }
            n += 1;
        }
        if loc == ZERO_LOC {
            zero_file(base, lba, n as u64)?;
        } else {
            buf.resize(n * BLOCK, 0);
            log.read_exact_at(&mut buf, loc)
                .map_err(|e| IoErr::io("reading the overlay log", &e))?;
            base.write_all_at(&buf, lba * BLOCK as u64)
                .map_err(|e| IoErr::io("writing the overlay base", &e))?;
        }
        i += n;
    }
    Ok(())
}

fn open_rw(path: &Path, create: bool) -> Result<File, IoErr> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)
        .map_err(|e| IoErr::io(path.display(), &e))
}

/// One user at a time: two instances over the same file would each keep their own pending
/// writes, and a flush on one would lose the other's. Held until the base file is closed.
fn lock_exclusive(base: &File, path: &Path) -> Result<(), IoErr> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    if unsafe { libc::flock(base.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(IoErr::io(
            format!("{} (in use by another power-cut device)", path.display()),
            &e,
        ));
    }
    Ok(())
}

fn remove_if_there(path: &Path) -> Result<(), IoErr> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(IoErr::io(path.display(), &e)),
    }
}

fn base_blocks(base: &File, path: &Path) -> Result<u64, IoErr> {
    let len = base
        .metadata()
        .map_err(|e| IoErr::io(path.display(), &e))?
        .len();
    Ok(len / BLOCK as u64)
}

impl OverlayBackend {
    /// The side log of the base file at `path`: `<path>.wcache`.
    pub fn log_path(path: &Path) -> PathBuf {
        let mut s = path.as_os_str().to_owned();
        s.push(".wcache");
        PathBuf::from(s)
    }

    /// The current-content file of the base file at `path`: `<path>.cur`.
    pub fn cur_path(path: &Path) -> PathBuf {
        let mut s = path.as_os_str().to_owned();
        s.push(".cur");
        PathBuf::from(s)
    }

    /// Creates (or truncates) a zeroed base file of `blocks` blocks at `path`, with an empty
    /// log.
    pub fn create(path: &Path, blocks: u64) -> Result<OverlayBackend, IoErr> {
        let base = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| IoErr::io(path.display(), &e))?;
        lock_exclusive(&base, path)?;
        base.set_len(blocks * BLOCK as u64)
            .map_err(|e| IoErr::io(path.display(), &e))?;
        base.sync_all().map_err(|e| IoErr::io(path.display(), &e))?;
        remove_if_there(&Self::log_path(path))?;
        drop(base);
        Self::open(path)
    }

    /// Opens the base file at `path` and its log (created if missing), keeping the pending
    /// writes the log holds: the index is rebuilt from the log and a torn tail cut off.
    pub fn open(path: &Path) -> Result<OverlayBackend, IoErr> {
        let base = open_rw(path, false)?;
        lock_exclusive(&base, path)?;
        let blocks = base_blocks(&base, path)?;
        let log_path = Self::log_path(path);
        let log = open_rw(&log_path, true)?;
        let (recs, valid) = scan(&log, blocks)?;
        log.set_len(valid)
            .map_err(|e| IoErr::io(log_path.display(), &e))?;
        let mut st = State {
            log_len: valid,
            ..State::default()
        };
        for r in &recs {
            st.add(r);
        }
        // The current content: the base file, then the pending writes on top.
        let cur_path = Self::cur_path(path);
        // A new file, not the old one rewritten: writes a dead user's ring still had in flight
        // land in the old one.
        remove_if_there(&cur_path)?;
        let cur = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&cur_path)
            .map_err(|e| IoErr::io(cur_path.display(), &e))?;
        std::io::copy(&mut &base, &mut &cur).map_err(|e| IoErr::io(cur_path.display(), &e))?;
        apply_index(&cur, &log, &st.index)?;
        Ok(OverlayBackend {
            path: path.to_path_buf(),
            base,
            log,
            cur,
            blocks,
            state: RwLock::new(st),
        })
    }

    /// Plays a power cut on the device at `path`, whose user must have died (nothing may have
    /// it open): each pending write is kept or dropped as `pattern` says — [`PowerCutPattern::
    /// Torn`] decides per 512-byte block of each write, from its seed, so a block ends with the
    /// content of its last kept write or its flushed content — records written with FUA are
    /// always kept. The kept content is written to the base file, which is synced, and the log
    /// is removed. A torn record at the end of the log counts as never written.
    pub fn power_cut(path: &Path, pattern: PowerCutPattern) -> Result<PowerCutReport, IoErr> {
        let base = open_rw(path, false)?;
        lock_exclusive(&base, path)?;
        let blocks = base_blocks(&base, path)?;
        let log_path = Self::log_path(path);
        let log = match File::open(&log_path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(PowerCutReport::default());
            }
            Err(e) => return Err(IoErr::io(log_path.display(), &e)),
        };
        let (recs, _) = scan(&log, blocks)?;
        let mut report = PowerCutReport::default();
        let mut index = HashMap::new();
        for (k, r) in recs.iter().enumerate() {
            for i in 0..r.blocks {
                let keep = r.durable
                    || match pattern {
                        PowerCutPattern::KeepAll => true,
                        PowerCutPattern::DropAll => false,
                        PowerCutPattern::Torn(seed) => {
                            mix(mix(seed) ^ mix(k as u64) ^ (r.lba + i)) & 1 == 1
                        }
                    };
                if !keep {
                    report.reverted += 1;
                    continue;
                }
                report.kept += 1;
                let loc = if r.kind == KIND_DATA {
                    r.data + i * BLOCK as u64
                } else {
                    ZERO_LOC
                };
                index.insert(r.lba + i, loc);
            }
        }
        apply_index(&base, &log, &index)?;
        base.sync_data()
            .map_err(|e| IoErr::io(path.display(), &e))?;
        drop(log);
        std::fs::remove_file(&log_path).map_err(|e| IoErr::io(log_path.display(), &e))?;
        remove_if_there(&Self::cur_path(path))?;
        Ok(report)
    }

    /// Blocks with a pending (un-flushed) write.
    pub fn pending_blocks(&self) -> usize {
        self.read_state().index.len()
    }

    /// Records in the log (pending writes, FUA ones included, since the last flush).
    pub fn pending_records(&self) -> u64 {
        self.read_state().records
    }

    fn read_state(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_state(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a record (header, then `data` for data records) and indexes it.
    fn append(
        &self,
        st: &mut State,
        kind: u8,
        durable: bool,
        lba: u64,
        blocks: u64,
        data: &[u8],
    ) -> Result<(), IoErr> {
        let h = header(kind, durable, lba, blocks, st.records, checksum(data));
        let mut rec = Vec::with_capacity(HDR + data.len());
        rec.extend_from_slice(&h);
        rec.extend_from_slice(data);
        let off = st.log_len;
        if let Err(e) = self.log.write_all_at(&rec, off) {
            // Whatever part landed is a torn tail; cut it so the next record follows the last
            // whole one.
            let _ = self.log.set_len(off);
            return Err(IoErr::io("appending to the overlay log", &e));
        }
        st.log_len += rec.len() as u64;
        st.add(&Rec {
            kind,
            durable,
            lba,
            blocks,
            data: off + HDR as u64,
        });
        Ok(())
    }

    fn sync_base(&self) -> Result<(), IoErr> {
        self.base
            .sync_data()
            .map_err(|e| IoErr::io(self.path.display(), &e))
    }

    /// A modifying request: written to the current content (unless `on_cur`: a ring did that
    /// already), logged; with `fua` also written to the base file and synced.
    fn modify(
        &self,
        kind: u8,
        lba: u64,
        blocks: u64,
        data: &[u8],
        fua: bool,
        on_cur: bool,
    ) -> Result<(), IoErr> {
        if blocks == 0 {
            return Ok(());
        }
        let mut st = self.write_state();
        if !on_cur {
            if kind == KIND_DATA {
                self.cur
                    .write_all_at(data, lba * BLOCK as u64)
                    .map_err(|e| IoErr::io("writing the overlay's current content", &e))?;
            } else {
                zero_file(&self.cur, lba, blocks)?;
            }
        }
        self.append(&mut st, kind, fua, lba, blocks, data)?;
        if fua {
            if kind == KIND_DATA {
                self.base
                    .write_all_at(data, lba * BLOCK as u64)
                    .map_err(|e| IoErr::io("writing the overlay base", &e))?;
            } else {
                zero_file(&self.base, lba, blocks)?;
            }
            self.sync_base()?;
        }
        Ok(())
    }
}

impl Backend for OverlayBackend {
    fn name(&self) -> String {
        format!(
            "overlay:{} (write cache in {})",
            self.path.display(),
            Self::log_path(&self.path).display()
        )
    }

    fn blocks(&self) -> u64 {
        self.blocks
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        check_bytes(lba, buf.len(), self.blocks)?;
        self.cur
            .read_exact_at(buf, lba * BLOCK as u64)
            .map_err(|e| IoErr::io("reading the overlay's current content", &e))
    }

    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        let n = check_bytes(lba, buf.len(), self.blocks)?;
        self.modify(KIND_DATA, lba, n, buf, fua, false)
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.blocks)?;
        self.modify(KIND_ZERO, lba, blocks, &[], fua, false)
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.blocks)?;
        self.modify(KIND_ZERO, lba, blocks, &[], false, false)
    }

    fn flush(&self) -> Result<(), IoErr> {
        let mut st = self.write_state();
        if st.log_len == 0 {
            return self.sync_base();
        }
        apply_index(&self.base, &self.log, &st.index)?;
        self.sync_base()?;
        self.log
            .set_len(0)
            .map_err(|e| IoErr::io("emptying the overlay log", &e))?;
        st.log_len = 0;
        st.records = 0;
        st.index.clear();
        Ok(())
    }

    /// The current content's file: a ring's reads see what the device holds, its writes land
    /// there and are logged when reported ([`Backend::ring_completed`]).
    fn ring_fd(&self) -> Option<std::os::unix::io::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.cur.as_raw_fd())
    }

    fn ring_completed(&self, io: RingCompleted<'_>) -> Result<(), IoErr> {
        match io {
            RingCompleted::Write { lba, data, fua } => {
                let n = check_bytes(lba, data.len(), self.blocks)?;
                self.modify(KIND_DATA, lba, n, data, fua, true)
            }
            RingCompleted::Flush => self.flush(),
        }
    }
}
