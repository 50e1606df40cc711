//! A small synchronous io_uring executor used by [`crate::FileBackend`]: each call submits a
//! group of reads and writes to one ring and waits for all of them, so borrowed buffers stay
//! valid for the whole time the kernel may touch them. Rings are pooled so that concurrent
//! callers do not serialise on one ring.

use io_uring::{IoUring, opcode, types};
use std::os::unix::io::RawFd;
use std::sync::Mutex;

/// Entries per ring, and the largest group submitted at once.
pub(crate) const RING_ENTRIES: usize = 64;
/// Rings kept in the pool for reuse.
const POOL_MAX: usize = 16;

/// One positional operation on the file.
#[derive(Debug, Clone, Copy)]
pub(crate) enum UOp {
    /// Read `len` bytes at `off` into `ptr`.
    Read { ptr: *mut u8, len: u32, off: u64 },
    /// Write `len` bytes at `off` from `ptr`, with `RWF_DSYNC` when `dsync`.
    Write {
        ptr: *const u8,
        len: u32,
        off: u64,
        dsync: bool,
    },
}

pub(crate) struct Uring {
    fd: RawFd,
    pool: Mutex<Vec<IoUring>>,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Uring(fd {})", self.fd)
    }
}

impl Uring {
    /// Sets up a first ring (failing when the kernel refuses io_uring).
    pub(crate) fn new(fd: RawFd) -> std::io::Result<Self> {
        let ring = IoUring::new(RING_ENTRIES as u32)?;
        Ok(Uring {
            fd,
            pool: Mutex::new(vec![ring]),
        })
    }

    /// Runs up to [`RING_ENTRIES`] operations and returns each one's result (bytes transferred
    /// or `-errno`), in order.
    ///
    /// # Safety
    /// Every pointer must be valid for its access (writes for `Read`, reads for `Write`) of
    /// `len` bytes for the duration of the call, and the buffers must not overlap each other.
    pub(crate) unsafe fn run(&self, ops: &[UOp]) -> std::io::Result<Vec<i32>> {
        assert!(ops.len() <= RING_ENTRIES, "uring group too large");
        let mut ring = match self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            Some(r) => r,
            None => IoUring::new(RING_ENTRIES as u32)?,
        };
        let fd = types::Fd(self.fd);
        {
            let mut sq = ring.submission();
            for (i, op) in ops.iter().enumerate() {
                let e = match *op {
                    UOp::Read { ptr, len, off } => {
                        opcode::Read::new(fd, ptr, len).offset(off).build()
                    }
                    UOp::Write {
                        ptr,
                        len,
                        off,
                        dsync,
                    } => opcode::Write::new(fd, ptr, len)
                        .offset(off)
                        .rw_flags(if dsync { libc::RWF_DSYNC } else { 0 })
                        .build(),
                };
                // SAFETY: the caller guarantees the buffers stay valid until this function
                // returns, and it returns only after every submitted entry has completed.
                unsafe { sq.push(&e.user_data(i as u64)) }
                    .expect("ring has RING_ENTRIES free entries");
            }
        }
        let mut results = vec![0i32; ops.len()];
        let mut submitted = false;
        let mut done = 0;
        while done < ops.len() {
            match ring.submit_and_wait(ops.len() - done) {
                Ok(_) => submitted = true,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) => {}
                Err(e) if !submitted => return Err(e),
                Err(e) => {
                    // Entries are in flight with borrowed buffers: returning would let the kernel
                    // write into memory the caller may free. This is unreachable in practice.
                    eprintln!("tiercache-io: io_uring wait failed with IO in flight: {e}");
                    std::process::abort();
                }
            }
            for cqe in ring.completion() {
                results[cqe.user_data() as usize] = cqe.result();
                done += 1;
            }
        }
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOL_MAX {
            pool.push(ring);
        }
        Ok(results)
    }
}
