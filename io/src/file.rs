use crate::uring::{RING_ENTRIES, UOp, Uring};
use crate::{AlignedBuf, BLOCK, Backend, Extent, IoErr, Req, check_blocks, check_bytes};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Most runs [`Backend::extents`] gives in one call.
const MAX_EXTENTS: usize = 1 << 16;
/// Largest chunk written at once when zeros have to be written by hand (1 MiB).
const ZERO_CHUNK: usize = 1 << 20;

/// Which IO path a [`FileBackend`] uses, chosen at run time when it is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoPath {
    /// `O_DIRECT`: the page cache is bypassed and unaligned caller buffers are copied through an
    /// [`AlignedBuf`]. Otherwise buffered IO through the page cache (the file system refused
    /// `O_DIRECT`, an aligned test IO failed, or it was not asked for).
    pub direct: bool,
    /// Reads and writes go through io_uring. Otherwise `pread`/`pwrite` (the kernel refused
    /// io_uring, a test IO through it failed, or it was not asked for).
    pub io_uring: bool,
}

impl std::fmt::Display for IoPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cache = if self.direct { "O_DIRECT" } else { "buffered" };
        let engine = if self.io_uring {
            "io_uring"
        } else {
            "pread/pwrite"
        };
        write!(f, "{cache}, {engine}")
    }
}

/// How [`FileBackend::open_with`] may open a device. The default tries everything and falls
/// back at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOptions {
    /// Try `O_DIRECT` (falling back to buffered IO when refused).
    pub direct: bool,
    /// Try io_uring (falling back to `pread`/`pwrite` when refused).
    pub io_uring: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            direct: true,
            io_uring: true,
        }
    }
}

/// A regular file or a block device as a [`Backend`].
///
/// Opens with `O_DIRECT` when the file system allows it and an aligned test IO succeeds, and
/// falls back to buffered IO otherwise. Reads and writes go through io_uring when the kernel
/// allows it and a test read through it succeeds, and through `pread`/`pwrite` otherwise (also
/// per call, when a ring cannot be set up). [`Backend::name`] and [`FileBackend::io_path`]
/// report the path chosen. FUA writes carry `RWF_DSYNC` (or are followed by `fdatasync` where
/// the kernel refuses it); flush is `fdatasync`; trim punches a hole
/// (`fallocate(PUNCH_HOLE | KEEP_SIZE)`), falling back to writing zeros.
/// [`Backend::submit_batch`] submits runs of reads and writes to one ring together.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    path: PathBuf,
    blocks: u64,
    direct: bool,
    uring: Option<Uring>,
    is_block_device: bool,
    fallback_reasons: Vec<String>,
    /// Cleared once the kernel refuses `pwritev2(RWF_DSYNC)`.
    dsync_ok: AtomicBool,
    /// Cleared once the file system refuses `fallocate(PUNCH_HOLE)`.
    punch_ok: AtomicBool,
    /// Cleared once the file system refuses `fallocate(ZERO_RANGE)`.
    zero_range_ok: AtomicBool,
}

impl FileBackend {
    /// Opens an existing file or block device read-write. Its capacity is its size rounded down
    /// to 512 bytes.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, IoErr> {
        Self::open_with(path, FileOptions::default())
    }

    /// Opens like [`FileBackend::open`], trying only the IO paths `opts` allows (to test the
    /// fallbacks, or where direct IO or io_uring is undesirable).
    pub fn open_with(path: impl AsRef<Path>, opts: FileOptions) -> Result<Self, IoErr> {
        let path = path.as_ref().to_path_buf();
        let meta = std::fs::metadata(&path).map_err(|e| IoErr::io(path.display(), &e))?;
        let is_block_device = meta.file_type().is_block_device();
        let mut fallback_reasons = Vec::new();
        let direct = if opts.direct {
            Self::open_direct(&path)
        } else {
            Err("buffered by request".to_string())
        };
        let (file, direct) = match direct {
            Ok(f) => (f, true),
            Err(reason) => {
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|e| IoErr::io(format!("open {}", path.display()), &e))?;
                fallback_reasons.push(reason);
                (f, false)
            }
        };
        let size = (&file)
            .seek(SeekFrom::End(0))
            .map_err(|e| IoErr::io(format!("size of {}", path.display()), &e))?;
        let blocks = size / BLOCK as u64;
        let uring = if opts.io_uring {
            match Self::probe_uring(&file, blocks) {
                Ok(u) => Some(u),
                Err(why) => {
                    fallback_reasons.push(why);
                    None
                }
            }
        } else {
            fallback_reasons.push("pread/pwrite by request".into());
            None
        };
        Ok(FileBackend {
            file,
            path,
            blocks,
            direct,
            uring,
            is_block_device,
            fallback_reasons,
            dsync_ok: AtomicBool::new(true),
            punch_ok: AtomicBool::new(true),
            zero_range_ok: AtomicBool::new(true),
        })
    }

    /// Opens with `O_DIRECT` and checks it with an aligned read and rewrite of one block
    /// (block 1, so that 512-byte offsets are tested too). Returns why it could not.
    fn open_direct(path: &Path) -> Result<File, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| format!("O_DIRECT open refused: {e}"))?;
        let size = (&file)
            .seek(SeekFrom::End(0))
            .map_err(|e| format!("size: {e}"))?;
        let blocks = size / BLOCK as u64;
        if blocks > 0 {
            let off = if blocks >= 2 { BLOCK as u64 } else { 0 };
            let mut buf = AlignedBuf::new(BLOCK);
            file.read_exact_at(&mut buf, off)
                .map_err(|e| format!("O_DIRECT test read failed: {e}"))?;
            file.write_all_at(&buf, off)
                .map_err(|e| format!("O_DIRECT test write failed: {e}"))?;
        }
        Ok(file)
    }

    /// Sets up io_uring and checks it with an aligned read of one block.
    fn probe_uring(file: &File, blocks: u64) -> Result<Uring, String> {
        let u = Uring::new(file.as_raw_fd()).map_err(|e| format!("io_uring refused: {e}"))?;
        if blocks > 0 {
            let mut buf = AlignedBuf::new(BLOCK);
            let op = UOp::Read {
                ptr: buf.as_mut_ptr(),
                len: BLOCK as u32,
                off: 0,
            };
            // SAFETY: buf is valid for writes of BLOCK bytes for the whole call.
            let r = unsafe { u.run(&[op]) }.map_err(|e| format!("io_uring refused: {e}"))?;
            if r[0] != BLOCK as i32 {
                let e = std::io::Error::from_raw_os_error(-r[0]);
                return Err(format!("io_uring test read failed: {e} ({})", r[0]));
            }
        }
        Ok(u)
    }

    /// Creates a device file of `blocks` blocks (all zeros) and opens it.
    ///
    /// A regular file is preallocated (`fallocate`, or `set_len` where the file system cannot).
    /// An existing non-empty file, or a block device whose first 64 KiB are not all zeros, is
    /// refused with an [`IoErr::Io`] of kind `AlreadyExists` unless `force`; a block device must
    /// have at least `blocks` blocks and is not resized.
    pub fn create(path: impl AsRef<Path>, blocks: u64, force: bool) -> Result<Self, IoErr> {
        let path = path.as_ref();
        let bytes = blocks
            .checked_mul(BLOCK as u64)
            .filter(|b| *b <= i64::MAX as u64)
            .ok_or(IoErr::OutOfRange {
                lba: 0,
                blocks,
                dev_blocks: i64::MAX as u64 / BLOCK as u64,
            })?;
        let refuse = |what: String| IoErr::Io {
            kind: std::io::ErrorKind::AlreadyExists,
            msg: format!(
                "refusing to overwrite {}: {what}; use force to overwrite it",
                path.display()
            ),
        };
        match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_block_device() => {
                let dev = Self::open(path)?;
                if !force {
                    let probe = (dev.blocks as usize).min(128) * BLOCK;
                    let mut buf = AlignedBuf::new(probe);
                    dev.read(0, &mut buf)?;
                    if buf.iter().any(|&b| b != 0) {
                        return Err(refuse("the device holds data".into()));
                    }
                }
                if dev.blocks < blocks {
                    return Err(IoErr::OutOfRange {
                        lba: 0,
                        blocks,
                        dev_blocks: dev.blocks,
                    });
                }
                return Ok(dev);
            }
            Ok(m) if m.len() > 0 && !force => {
                return Err(refuse(format!(
                    "it is a non-empty file of {} bytes",
                    m.len()
                )));
            }
            _ => {}
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| IoErr::io(format!("create {}", path.display()), &e))?;
        if bytes > 0 {
            // SAFETY: plain syscall on a valid open fd; no memory is passed.
            let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
            if r != 0 {
                file.set_len(bytes)
                    .map_err(|e| IoErr::io(format!("set_len {}", path.display()), &e))?;
            }
        }
        file.sync_all()
            .map_err(|e| IoErr::io(format!("fsync {}", path.display()), &e))?;
        drop(file);
        Self::open(path)
    }

    /// The IO path chosen when the device was opened.
    pub fn io_path(&self) -> IoPath {
        IoPath {
            direct: self.direct,
            io_uring: self.uring.is_some(),
        }
    }

    /// Why `O_DIRECT` or io_uring is not used, when one is not.
    pub fn fallback_reasons(&self) -> &[String] {
        &self.fallback_reasons
    }

    /// The path the device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs a group of reads and writes through io_uring, finishing short transfers with
    /// `pread`/`pwrite` and retrying a refused `RWF_DSYNC` as write + `fdatasync`. Returns
    /// `None` when no ring could be had (the caller then uses `pread`/`pwrite`).
    ///
    /// # Safety
    /// As [`Uring::run`]: every pointer is valid for its access of `len` bytes during the call
    /// and the buffers do not overlap.
    unsafe fn uring_group(&self, ops: &[UOp]) -> Option<Vec<Result<(), IoErr>>> {
        let uring = self.uring.as_ref()?;
        // SAFETY: forwarded from the caller.
        let res = unsafe { uring.run(ops) }.ok()?;
        let out = ops
            .iter()
            .zip(res)
            .map(|(op, r)| {
                let (len, off) = match *op {
                    UOp::Read { len, off, .. } | UOp::Write { len, off, .. } => (len, off),
                };
                let lba = off / BLOCK as u64;
                if r < 0 {
                    let e = std::io::Error::from_raw_os_error(-r);
                    return match *op {
                        UOp::Write { ptr, dsync, .. }
                            if dsync && matches!(-r, libc::EOPNOTSUPP | libc::EINVAL) =>
                        {
                            // SAFETY: ptr is valid for reads of len bytes (caller's contract).
                            let buf = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
                            self.pwrite(lba, buf, true)
                        }
                        UOp::Read { .. } => Err(self.err("read (io_uring)", lba, &e)),
                        UOp::Write { .. } => Err(self.err("write (io_uring)", lba, &e)),
                    };
                }
                let n = r as usize;
                if n == len as usize {
                    return Ok(());
                }
                // A short transfer: finish the rest synchronously.
                match *op {
                    UOp::Read { ptr, .. } => {
                        // SAFETY: ptr is valid for writes of len bytes (caller's contract).
                        let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len as usize) };
                        self.file
                            .read_exact_at(&mut buf[n..], off + n as u64)
                            .map_err(|e| self.err("read", lba, &e))
                    }
                    UOp::Write { ptr, dsync, .. } => {
                        // SAFETY: ptr is valid for reads of len bytes (caller's contract).
                        let buf = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
                        self.file
                            .write_all_at(&buf[n..], off + n as u64)
                            .map_err(|e| self.err("write", lba, &e))?;
                        if dsync {
                            self.file
                                .sync_data()
                                .map_err(|e| self.err("fdatasync after FUA write", lba, &e))?;
                        }
                        Ok(())
                    }
                }
            })
            .collect();
        Some(out)
    }

    /// Reads into a buffer that is aligned when the device is opened with `O_DIRECT`.
    fn read_raw(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        let off = lba * BLOCK as u64;
        if let Ok(len) = u32::try_from(buf.len()) {
            let op = UOp::Read {
                ptr: buf.as_mut_ptr(),
                len,
                off,
            };
            // SAFETY: buf is exclusively borrowed for the whole call.
            if let Some(mut r) = unsafe { self.uring_group(&[op]) } {
                return r.pop().expect("one result");
            }
        }
        self.file
            .read_exact_at(buf, off)
            .map_err(|e| self.err("read", lba, &e))
    }

    /// Writes a buffer that is aligned when the device is opened with `O_DIRECT`.
    fn write_raw(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        if let Ok(len) = u32::try_from(buf.len()) {
            let op = UOp::Write {
                ptr: buf.as_ptr(),
                len,
                off: lba * BLOCK as u64,
                dsync: fua && self.dsync_ok.load(Ordering::Relaxed),
            };
            // SAFETY: buf is borrowed for the whole call.
            if let Some(mut r) = unsafe { self.uring_group(&[op]) } {
                let r = r.pop().expect("one result");
                if r.is_ok() && fua && !self.dsync_ok.load(Ordering::Relaxed) {
                    return self.flush();
                }
                return r;
            }
        }
        self.pwrite(lba, buf, fua)
    }

    fn err(&self, op: &str, lba: u64, e: &std::io::Error) -> IoErr {
        IoErr::io(format!("{op} at lba {lba} of {}", self.path.display()), e)
    }

    fn pwrite(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        let off = lba * BLOCK as u64;
        if fua && self.dsync_ok.load(Ordering::Relaxed) {
            match self.pwrite_dsync(buf, off) {
                Ok(()) => return Ok(()),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
                    ) =>
                {
                    self.dsync_ok.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(self.err("write (FUA)", lba, &e)),
            }
        }
        self.file
            .write_all_at(buf, off)
            .map_err(|e| self.err("write", lba, &e))?;
        if fua {
            self.file
                .sync_data()
                .map_err(|e| self.err("fdatasync after FUA write", lba, &e))?;
        }
        Ok(())
    }

    /// `pwritev2(RWF_DSYNC)` until all of `buf` is written.
    fn pwrite_dsync(&self, mut buf: &[u8], mut off: u64) -> std::io::Result<()> {
        while !buf.is_empty() {
            let iov = libc::iovec {
                iov_base: buf.as_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            };
            // SAFETY: iov points at buf, valid for reads for its length during the call.
            let n = unsafe {
                libc::pwritev2(
                    self.file.as_raw_fd(),
                    &iov,
                    1,
                    off as libc::off_t,
                    libc::RWF_DSYNC,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "pwritev2 wrote nothing",
                ));
            }
            buf = &buf[n as usize..];
            off += n as u64;
        }
        Ok(())
    }

    fn fallocate(&self, mode: libc::c_int, lba: u64, blocks: u64) -> std::io::Result<()> {
        // SAFETY: plain syscall on a valid open fd; no memory is passed.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                (lba * BLOCK as u64) as libc::off_t,
                (blocks * BLOCK as u64) as libc::off_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// `lseek(fd, off, whence)` for `SEEK_DATA`/`SEEK_HOLE`: `Ok(None)` when there is no more
    /// data (`ENXIO`). It moves the file offset, which nothing here uses (all IO is positional).
    fn seek(&self, off: u64, whence: libc::c_int) -> std::io::Result<Option<u64>> {
        // SAFETY: plain syscall on a valid open fd; no memory is passed.
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), off as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        }
    }

    /// The file's holes and data in `[lba, lba + blocks)` from `SEEK_DATA`/`SEEK_HOLE`; a block
    /// that is partly data is data. At most [`MAX_EXTENTS`] runs (the caller asks again).
    fn sparse_extents(&self, lba: u64, blocks: u64) -> std::io::Result<Vec<Extent>> {
        let b = BLOCK as u64;
        let end = (lba + blocks) * b;
        let mut pos = lba * b;
        let mut out = Vec::new();
        while pos < end && out.len() < MAX_EXTENTS {
            let data = self.seek(pos, libc::SEEK_DATA)?.unwrap_or(end).min(end);
            // The hole's whole blocks; a block the data starts inside is data.
            let hole_end = (data / b * b).max(pos);
            Extent::push(&mut out, (hole_end - pos) / b, true);
            pos = hole_end;
            if pos >= end {
                break;
            }
            let hole = self.seek(pos, libc::SEEK_HOLE)?.unwrap_or(end).min(end);
            let data_end = hole.div_ceil(b).saturating_mul(b).clamp(pos + b, end);
            Extent::push(&mut out, (data_end - pos) / b, false);
            pos = data_end;
        }
        Ok(out)
    }

    /// Writes zeros by hand, in chunks of at most 1 MiB.
    fn write_zero_blocks(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        let chunk_blocks = (ZERO_CHUNK / BLOCK) as u64;
        let zeros = AlignedBuf::new(ZERO_CHUNK.min(blocks as usize * BLOCK));
        let mut done = 0;
        while done < blocks {
            let n = (blocks - done).min(chunk_blocks);
            self.pwrite(lba + done, &zeros[..n as usize * BLOCK], false)?;
            done += n;
        }
        Ok(())
    }

    /// Runs one request of a batch synchronously.
    fn run_one(&self, r: &mut Req<'_>) -> Result<(), IoErr> {
        match r {
            Req::Read { lba, buf } => self.read(*lba, buf),
            Req::Write { lba, buf, fua } => self.write(*lba, buf, *fua),
            Req::WriteZeroes { lba, blocks, fua } => self.write_zeroes(*lba, *blocks, *fua),
            Req::Trim { lba, blocks } => self.trim(*lba, *blocks),
            Req::Flush => self.flush(),
        }
    }

    fn unsupported(e: &std::io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) | Some(libc::ENODEV)
        )
    }
}

impl Backend for FileBackend {
    fn name(&self) -> String {
        let kind = if self.is_block_device {
            "block device"
        } else {
            "file"
        };
        let path = self.io_path();
        if self.fallback_reasons.is_empty() {
            format!("file:{} ({kind}; {path})", self.path.display())
        } else {
            let why = self.fallback_reasons.join("; ");
            format!("file:{} ({kind}; {path}; {why})", self.path.display())
        }
    }

    /// A regular file's holes (`SEEK_DATA`/`SEEK_HOLE`); a block device's or a file system's
    /// that cannot say: all allocated.
    fn extents(&self, lba: u64, blocks: u64) -> Result<Vec<Extent>, IoErr> {
        check_blocks(lba, blocks, self.blocks)?;
        if self.is_block_device || blocks == 0 {
            return Ok(Extent::allocated(blocks));
        }
        Ok(self
            .sparse_extents(lba, blocks)
            .unwrap_or_else(|_| Extent::allocated(blocks)))
    }

    /// The file's descriptor where io_uring works on it (see [`Backend::ring_fd`]).
    fn ring_fd(&self) -> Option<std::os::unix::io::RawFd> {
        self.uring.as_ref().map(|_| self.file.as_raw_fd())
    }

    fn blocks(&self) -> u64 {
        self.blocks
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        check_bytes(lba, buf.len(), self.blocks)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct && !AlignedBuf::is_aligned(buf.as_ptr()) {
            let mut tmp = AlignedBuf::new(buf.len());
            self.read_raw(lba, &mut tmp)?;
            buf.copy_from_slice(&tmp);
            Ok(())
        } else {
            self.read_raw(lba, buf)
        }
    }

    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        check_bytes(lba, buf.len(), self.blocks)?;
        if buf.is_empty() {
            return if fua { self.flush() } else { Ok(()) };
        }
        if self.direct && !AlignedBuf::is_aligned(buf.as_ptr()) {
            let mut tmp = AlignedBuf::new(buf.len());
            tmp.copy_from_slice(buf);
            self.write_raw(lba, &tmp, fua)
        } else {
            self.write_raw(lba, buf, fua)
        }
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.blocks)?;
        if blocks > 0 {
            let mut done = false;
            if self.zero_range_ok.load(Ordering::Relaxed) {
                let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
                match self.fallocate(mode, lba, blocks) {
                    Ok(()) => done = true,
                    Err(e) if Self::unsupported(&e) => {
                        self.zero_range_ok.store(false, Ordering::Relaxed)
                    }
                    Err(e) => return Err(self.err("write zeroes", lba, &e)),
                }
            }
            if !done {
                self.write_zero_blocks(lba, blocks)?;
            }
        }
        if fua { self.flush() } else { Ok(()) }
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.blocks)?;
        if blocks == 0 {
            return Ok(());
        }
        if self.punch_ok.load(Ordering::Relaxed) {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            match self.fallocate(mode, lba, blocks) {
                Ok(()) => return Ok(()),
                Err(e) if Self::unsupported(&e) => self.punch_ok.store(false, Ordering::Relaxed),
                Err(e) => return Err(self.err("trim", lba, &e)),
            }
        }
        self.write_zeroes(lba, blocks, false)
    }

    fn submit_batch(&self, reqs: &mut [Req<'_>]) -> Vec<Result<(), IoErr>> {
        let mut out: Vec<Option<Result<(), IoErr>>> = (0..reqs.len()).map(|_| None).collect();
        let mut i = 0;
        while i < reqs.len() {
            if self.uring.is_none() || !matches!(reqs[i], Req::Read { .. } | Req::Write { .. }) {
                out[i] = Some(self.run_one(&mut reqs[i]));
                i += 1;
                continue;
            }
            // A group of consecutive reads and writes, submitted to one ring together.
            let mut ops = Vec::new();
            let mut slots = Vec::new(); // (request index, bounce buffer)
            let mut any_fua = false;
            let mut j = i;
            while j < reqs.len() && ops.len() < RING_ENTRIES {
                let (lba, len) = match &reqs[j] {
                    Req::Read { lba, buf } => (*lba, buf.len()),
                    Req::Write { lba, buf, .. } => (*lba, buf.len()),
                    _ => break,
                };
                match check_bytes(lba, len, self.blocks) {
                    Err(e) => out[j] = Some(Err(e)),
                    Ok(_) if len == 0 || u32::try_from(len).is_err() => {
                        out[j] = Some(self.run_one(&mut reqs[j]))
                    }
                    Ok(_) => {
                        let off = lba * BLOCK as u64;
                        let len32 = len as u32;
                        match &mut reqs[j] {
                            Req::Read { buf, .. } => {
                                let mut bounce = (self.direct
                                    && !AlignedBuf::is_aligned(buf.as_ptr()))
                                .then(|| AlignedBuf::new(len));
                                let ptr = match &mut bounce {
                                    Some(b) => b.as_mut_ptr(),
                                    None => buf.as_mut_ptr(),
                                };
                                ops.push(UOp::Read {
                                    ptr,
                                    len: len32,
                                    off,
                                });
                                slots.push((j, bounce));
                            }
                            Req::Write { buf, fua, .. } => {
                                let bounce = (self.direct && !AlignedBuf::is_aligned(buf.as_ptr()))
                                    .then(|| {
                                        let mut b = AlignedBuf::new(len);
                                        b.copy_from_slice(buf);
                                        b
                                    });
                                let ptr = match &bounce {
                                    Some(b) => b.as_ptr(),
                                    None => buf.as_ptr(),
                                };
                                any_fua |= *fua;
                                ops.push(UOp::Write {
                                    ptr,
                                    len: len32,
                                    off,
                                    dsync: *fua && self.dsync_ok.load(Ordering::Relaxed),
                                });
                                slots.push((j, bounce));
                            }
                            _ => unreachable!("only reads and writes are grouped"),
                        }
                    }
                }
                j += 1;
            }
            // SAFETY: each pointer is into a caller buffer borrowed for this whole call or into
            // a bounce buffer in `slots`, alive until after the group completes; requests of a
            // batch do not overlap (the trait's contract) and bounce buffers are distinct.
            match unsafe { self.uring_group(&ops) } {
                Some(res) => {
                    for ((k, bounce), r) in slots.into_iter().zip(res) {
                        if let (Ok(()), Some(b), Req::Read { buf, .. }) =
                            (&r, &bounce, &mut reqs[k])
                        {
                            buf.copy_from_slice(b);
                        }
                        out[k] = Some(r);
                    }
                    if any_fua && !self.dsync_ok.load(Ordering::Relaxed) {
                        if let Err(e) = self.flush() {
                            for (k, r) in out.iter_mut().enumerate().take(j).skip(i) {
                                if matches!(reqs[k], Req::Write { fua: true, .. }) {
                                    *r = Some(Err(IoErr::Io {
                                        kind: std::io::ErrorKind::Other,
                                        msg: format!("fdatasync after FUA write: {e}"),
                                    }));
                                }
                            }
                        }
                    }
                }
                None => {
                    for (k, _) in slots {
                        out[k] = Some(self.run_one(&mut reqs[k]));
                    }
                }
            }
            i = j;
        }
        out.into_iter()
            .map(|r| r.expect("every request has a result"))
            .collect()
    }

    fn flush(&self) -> Result<(), IoErr> {
        self.file
            .sync_data()
            .map_err(|e| IoErr::io(format!("fdatasync {}", self.path.display()), &e))
    }
}
