//! An io_uring owned by one thread, for callers that run IO without waiting for each one: an
//! NBD connection's reactor submits the reads and writes its requests need, polls its socket
//! on the same ring, and goes to sleep in one `io_uring_enter` until any of them completes.
//!
//! Operations own their buffers ([`AlignedBuf`]): the ring keeps each buffer until the kernel
//! is done with it and gives it back with the completion ([`RingDone`]), so no borrowed memory
//! is ever in flight. Dropping the ring cancels its polls and waits for the IO still in flight
//! before the buffers are freed.
//!
//! Everything a wake-up produced is submitted with one system call ([`Ring::wait`] submits the
//! queued entries and waits in the same `io_uring_enter`), and completions are reaped in
//! batches.

use crate::{AlignedBuf, BufPool, Slab};
use io_uring::{IoUring, opcode, squeue, types};
use std::io;
use std::os::unix::io::RawFd;
use std::time::Duration;

/// One operation for a [`Ring`].
#[derive(Debug)]
pub enum RingOp {
    /// Read `buf.len()` bytes at byte offset `off` of `fd`.
    Read {
        /// The file.
        fd: RawFd,
        /// Byte offset.
        off: u64,
        /// Destination (given back in the completion).
        buf: AlignedBuf,
    },
    /// Write `buf` at byte offset `off` of `fd`, with `RWF_DSYNC` when `dsync`.
    Write {
        /// The file.
        fd: RawFd,
        /// Byte offset.
        off: u64,
        /// Source (given back in the completion).
        buf: AlignedBuf,
        /// Durable on completion (force unit access).
        dsync: bool,
    },
    /// Receive into `buf[at..]` from the socket `fd` (`recv(2)`): the result is the bytes
    /// received, 0 at the end of the stream.
    Recv {
        /// The socket.
        fd: RawFd,
        /// Destination (given back in the completion).
        buf: AlignedBuf,
        /// Where in `buf` the bytes go (below its length).
        at: usize,
    },
    /// `fdatasync(fd)`.
    Fsync {
        /// The file.
        fd: RawFd,
    },
    /// Wait until `fd` polls with any of `events` (`POLLIN`, `POLLOUT`); one shot. The result
    /// is the events that fired.
    Poll {
        /// The file.
        fd: RawFd,
        /// `libc::POLL*` bits.
        events: u32,
    },
}

/// A completed [`RingOp`]: the caller's token, the kernel's result (bytes transferred, events
/// for a poll, or `-errno`; `-ECANCELED` for a poll cancelled at drop) and the buffer.
#[derive(Debug)]
pub struct RingDone {
    /// The token given to [`Ring::push`].
    pub token: u64,
    /// The result.
    pub res: i32,
    /// A read's or a write's buffer.
    pub buf: Option<AlignedBuf>,
}

struct Slot {
    token: u64,
    buf: Option<AlignedBuf>,
    /// It may never complete on its own (a poll, a receive): cancelled at drop.
    waits: bool,
}

/// An io_uring used by one thread (see the module docs).
pub struct Ring {
    ring: IoUring,
    /// Operations in flight, by the user data of their entries.
    slots: Slab<Slot>,
    /// Memory registered with the ring ([`Ring::register_pool`]): reads and writes into it
    /// are `READ_FIXED`/`WRITE_FIXED` (no page pinning per IO). The pool is kept so the
    /// memory outlives the registration.
    fixed: Option<(BufPool, usize, usize)>,
    /// Reads and writes pushed as fixed-buffer operations.
    fixed_ios: u64,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ring({} in flight)", self.slots.len())
    }
}

/// Whether an `io_uring_enter` error only means "try again" (nothing was lost).
fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ETIME)
    )
}

impl Ring {
    /// A ring with `entries` submission entries (a power of two; the completion queue is
    /// twice as long, and a full completion queue is reaped, never lost, on kernels with
    /// `IORING_FEAT_NODROP`).
    ///
    /// A plain ring: `IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN` was tried
    /// (2026-11-27) and taken out: no gain measured, and with it the daemon dropped an NBD
    /// connection reading dirty data over an RBD core (`cli/tests/ceph.rs`
    /// `rbd_core_end_to_end`, at the same offset every run; cause not found).
    pub fn new(entries: u32) -> io::Result<Ring> {
        let ring = IoUring::builder()
            .setup_cqsize(entries * 2)
            .build(entries)?;
        if !ring.params().is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring without IORING_FEAT_EXT_ARG (kernel older than 5.11)",
            ));
        }
        Ok(Ring {
            ring,
            slots: Slab::new(),
            fixed: None,
            fixed_ios: 0,
        })
    }

    /// Registers the first `max` bytes of `pool`'s memory with the ring (one fixed buffer),
    /// so that reads and writes whose buffer lies there skip the kernel's per-IO page
    /// pinning. Registration pins those pages (and counts against `RLIMIT_MEMLOCK` for a
    /// process without `CAP_IPC_LOCK`); when the kernel refuses, nothing changes and the
    /// error says why. At most one region: a second call replaces nothing and fails.
    pub fn register_pool(&mut self, pool: &BufPool, max: usize) -> io::Result<()> {
        if self.fixed.is_some() {
            return Err(io::Error::other(
                "a pool is already registered with this ring",
            ));
        }
        let (base, len) = pool.front(max);
        let iov = libc::iovec {
            iov_base: base.as_ptr().cast(),
            iov_len: len,
        };
        // SAFETY: the region is inside the pool's arena, which `self.fixed` keeps alive
        // (a clone of the pool) for as long as the ring, and so the registration, exists.
        unsafe { self.ring.submitter().register_buffers(&[iov]) }?;
        self.fixed = Some((pool.clone(), base.as_ptr() as usize, len));
        Ok(())
    }

    /// Whether `buf` lies in the registered region (its fixed-buffer index is 0); counts it.
    fn is_fixed(&mut self, buf: &AlignedBuf) -> bool {
        let p = buf.as_ptr() as usize;
        let fixed = matches!(self.fixed, Some((_, start, len)) if p >= start && p + buf.len() <= start + len);
        self.fixed_ios += fixed as u64;
        fixed
    }

    /// Reads and writes that went as fixed-buffer operations ([`Ring::register_pool`]).
    pub fn fixed_ios(&self) -> u64 {
        self.fixed_ios
    }

    /// Operations pushed and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.slots.len()
    }

    /// Queues `op` with `token` (submitted by the next [`Ring::wait`]). When the submission
    /// queue is full, what is queued is submitted first, and completions that were ready are
    /// reaped into `out`.
    pub fn push(&mut self, op: RingOp, token: u64, out: &mut Vec<RingDone>) -> io::Result<()> {
        let (entry, buf, waits) = match op {
            RingOp::Read { fd, off, mut buf } => {
                let (fd, len) = (types::Fd(fd), buf.len() as u32);
                let e = if self.is_fixed(&buf) {
                    opcode::ReadFixed::new(fd, buf.as_mut_ptr(), len, 0)
                        .offset(off)
                        .build()
                } else {
                    opcode::Read::new(fd, buf.as_mut_ptr(), len)
                        .offset(off)
                        .build()
                };
                (e, Some(buf), false)
            }
            RingOp::Write {
                fd,
                off,
                buf,
                dsync,
            } => {
                let (fd, len) = (types::Fd(fd), buf.len() as u32);
                let flags = if dsync { libc::RWF_DSYNC } else { 0 };
                let e = if self.is_fixed(&buf) {
                    opcode::WriteFixed::new(fd, buf.as_ptr(), len, 0)
                        .offset(off)
                        .rw_flags(flags)
                        .build()
                } else {
                    opcode::Write::new(fd, buf.as_ptr(), len)
                        .offset(off)
                        .rw_flags(flags)
                        .build()
                };
                (e, Some(buf), false)
            }
            RingOp::Recv { fd, mut buf, at } => {
                assert!(at < buf.len(), "a receive needs room in its buffer");
                let room = &mut buf[at..];
                let e =
                    opcode::Recv::new(types::Fd(fd), room.as_mut_ptr(), room.len() as u32).build();
                (e, Some(buf), true)
            }
            RingOp::Fsync { fd } => {
                let e = opcode::Fsync::new(types::Fd(fd))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build();
                (e, None, false)
            }
            RingOp::Poll { fd, events } => (
                opcode::PollAdd::new(types::Fd(fd), events).build(),
                None,
                true,
            ),
        };
        let idx = self.slots.insert(Slot { token, buf, waits });
        self.push_entry(entry.user_data(idx as u64), out)
    }

    fn push_entry(&mut self, entry: squeue::Entry, out: &mut Vec<RingDone>) -> io::Result<()> {
        loop {
            // SAFETY: the entry's buffer (if any) is owned by its slot, which keeps it (and its
            // heap memory, which does not move) until the completion is reaped; a poll and an
            // fsync point at no memory.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return Ok(());
            }
            // The submission queue is full: hand it to the kernel, and take what completed.
            self.submit()?;
            self.reap(out);
        }
    }

    /// Submits what is queued and waits until at least `want` operations have completed (or
    /// `timeout` passed; `want` 0 does not wait), then reaps every completion into `out`.
    pub fn wait(
        &mut self,
        want: usize,
        timeout: Duration,
        out: &mut Vec<RingDone>,
    ) -> io::Result<()> {
        let want = want.min(self.slots.len());
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(want, &args) {
            Ok(_) => {}
            Err(e) if transient(&e) => {}
            Err(e) => return Err(e),
        }
        self.reap(out);
        Ok(())
    }

    /// Hands what is queued to the kernel without waiting for anything (completions are
    /// taken by the next [`Ring::wait`]).
    pub fn submit(&mut self) -> io::Result<()> {
        match self.ring.submit() {
            Ok(_) => Ok(()),
            Err(e) if transient(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes every completion the kernel has posted.
    fn reap(&mut self, out: &mut Vec<RingDone>) {
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let Some(slot) = self.slots.take(cqe.user_data() as usize) else {
                continue; // a cancellation's own completion (see Drop)
            };
            out.push(RingDone {
                token: slot.token,
                res: cqe.result(),
                buf: slot.buf,
            });
        }
    }
}

/// The user data of cancellation entries (no slot has it).
const CANCEL: u64 = u64::MAX;

impl Drop for Ring {
    fn drop(&mut self) {
        // Polls and receives may never fire: cancel them. Reads and writes finish on their
        // own.
        let polls: Vec<u64> = (self.slots.iter())
            .filter(|(_, s)| s.waits)
            .map(|(i, _)| i as u64)
            .collect();
        let mut out = Vec::new();
        for p in polls {
            let e = opcode::AsyncCancel::new(p).build().user_data(CANCEL);
            let _ = self.push_entry(e, &mut out);
        }
        let mut tries = 0u32;
        while !self.slots.is_empty() {
            out.clear();
            if let Err(e) = self.wait(1, Duration::from_millis(100), &mut out) {
                tries += 1;
                if tries > 100 {
                    // The kernel may still write into buffers we would free.
                    eprintln!("tiercache-io: io_uring failed with IO in flight at drop: {e}");
                    std::process::abort();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::io::AsRawFd;

    fn file(bytes: usize) -> (std::fs::File, std::path::PathBuf) {
        let p = std::env::temp_dir().join(format!(
            "tiercache-ring-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.set_len(bytes as u64).unwrap();
        (f, p)
    }

    #[test]
    fn buffers_of_a_registered_pool_go_as_fixed_ios() {
        let (f, p) = file(1 << 20);
        let fd = f.as_raw_fd();
        let pool = BufPool::new(256 << 10);
        let mut ring = Ring::new(8).unwrap();
        ring.register_pool(&pool, 64 << 10).unwrap();
        assert!(
            ring.register_pool(&pool, 64 << 10).is_err(),
            "one region only"
        );
        let mut out = Vec::new();
        // 16 pages inside the registered 64 KiB, then 16 beyond it (not fixed), then one of
        // another pool's.
        let mut bufs: Vec<AlignedBuf> = (0..32).map(|_| pool.try_get(4096).unwrap()).collect();
        bufs.push(AlignedBuf::new(4096));
        for (i, mut buf) in bufs.into_iter().enumerate() {
            buf.fill(i as u8 + 1);
            let op = RingOp::Write {
                fd,
                off: i as u64 * 4096,
                buf,
                dsync: false,
            };
            ring.push(op, i as u64, &mut out).unwrap();
        }
        while ring.in_flight() > 0 {
            ring.wait(1, Duration::from_secs(5), &mut out).unwrap();
        }
        assert!(out.iter().all(|d| d.res == 4096), "{out:?}");
        assert_eq!(ring.fixed_ios(), 16);
        out.clear();
        for i in 0..33u64 {
            let buf = pool.try_get(4096).unwrap();
            ring.push(
                RingOp::Read {
                    fd,
                    off: i * 4096,
                    buf,
                },
                i,
                &mut out,
            )
            .unwrap();
            while ring.in_flight() > 0 {
                ring.wait(1, Duration::from_secs(5), &mut out).unwrap();
            }
        }
        // The read buffers are kept (in `out`): again 16 inside the region, 17 beyond it.
        assert_eq!(ring.fixed_ios(), 16 + 16);
        for d in &out {
            let b = d.buf.as_ref().unwrap();
            assert!(
                b.iter().all(|&x| x == d.token as u8 + 1),
                "read {}",
                d.token
            );
        }
        drop(out);
        drop(ring);
        drop(pool);
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn writes_then_reads_back_with_tokens_and_buffers() {
        let (f, p) = file(1 << 20);
        let fd = f.as_raw_fd();
        let mut ring = Ring::new(8).unwrap();
        let mut out = Vec::new();
        // More operations than submission entries: push submits on its own.
        for i in 0..32u64 {
            let mut buf = AlignedBuf::new(4096);
            buf.fill(i as u8);
            let op = RingOp::Write {
                fd,
                off: i * 4096,
                buf,
                dsync: i % 2 == 0,
            };
            ring.push(op, i, &mut out).unwrap();
        }
        while ring.in_flight() > 0 {
            ring.wait(1, Duration::from_secs(5), &mut out).unwrap();
        }
        assert_eq!(out.len(), 32);
        assert!(out.iter().all(|d| d.res == 4096 && d.buf.is_some()));
        out.clear();
        ring.push(RingOp::Fsync { fd }, 100, &mut out).unwrap();
        for i in 0..32u64 {
            let op = RingOp::Read {
                fd,
                off: i * 4096,
                buf: AlignedBuf::new(4096),
            };
            ring.push(op, 1000 + i, &mut out).unwrap();
        }
        while ring.in_flight() > 0 {
            ring.wait(1, Duration::from_secs(5), &mut out).unwrap();
        }
        assert_eq!(out.len(), 33);
        for d in &out {
            assert!(d.res >= 0, "{d:?}");
            if d.token >= 1000 {
                let b = d.buf.as_ref().unwrap();
                assert!(b.iter().all(|&x| x == (d.token - 1000) as u8));
            }
        }
        std::fs::remove_file(p).unwrap();
    }

    /// More completions than the completion queue holds, posted while nobody reaps: the
    /// kernel keeps the overflow (`IORING_FEAT_NODROP`) and `wait` gets every one back.
    #[test]
    fn a_completion_queue_overflow_loses_nothing() {
        let (f, p) = file(1 << 20);
        let fd = f.as_raw_fd();
        let mut ring = Ring::new(4).unwrap(); // 4 submission entries, 8 completions
        assert!(
            ring.ring.params().is_feature_nodrop(),
            "kernel keeps overflowed completions"
        );
        let mut out = Vec::new();
        for batch in 0..6u64 {
            for i in 0..4u64 {
                let n = batch * 4 + i;
                let mut buf = AlignedBuf::new(4096);
                buf.fill(n as u8);
                let op = RingOp::Write {
                    fd,
                    off: n * 4096,
                    buf,
                    dsync: false,
                };
                ring.push(op, n, &mut out).unwrap();
            }
            // Submitted and completed, not reaped.
            ring.ring.submit_and_wait(4).unwrap();
        }
        assert!(out.is_empty(), "nothing reaped yet");
        let t0 = std::time::Instant::now();
        while ring.in_flight() > 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "completions lost");
            ring.wait(1, Duration::from_millis(100), &mut out).unwrap();
        }
        let mut tokens: Vec<u64> = out.iter().map(|d| d.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (0..24).collect::<Vec<_>>());
        assert!(out.iter().all(|d| d.res == 4096));
        std::fs::remove_file(p).unwrap();
    }

    /// A signal that interrupts `io_uring_enter` (EINTR) is not an error: `wait` returns with
    /// what completed (nothing) and the operation stays in flight.
    #[test]
    fn a_signal_during_wait_is_not_an_error() {
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: a handler that does nothing, installed without SA_RESTART so that the signal
        // interrupts the system call; sigaction is given valid, initialised memory.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = a.as_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        // One thread does both waits: the kernel cancels a thread's ring requests when it ends.
        let waiter = std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let mut ring = Ring::new(4).unwrap();
            let mut out = Vec::new();
            let op = RingOp::Recv {
                fd,
                buf: AlignedBuf::new(512),
                at: 0,
            };
            ring.push(op, 1, &mut out).unwrap();
            let r = ring.wait(1, Duration::from_secs(2), &mut out);
            first_tx
                .send((r.is_ok(), out.len(), ring.in_flight()))
                .unwrap();
            // The receive is still there and completes once data comes.
            ring.wait(1, Duration::from_secs(5), &mut out).unwrap();
            out.iter().map(|d| d.res).collect::<Vec<_>>()
        });
        let t = rx.recv().unwrap();
        let first = loop {
            if let Ok(r) = first_rx.try_recv() {
                break r;
            }
            // SAFETY: `t` is a live thread of this process (joined below) and SIGUSR1 has a
            // handler.
            unsafe { libc::pthread_kill(t, libc::SIGUSR1) };
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            first,
            (true, 0, 1),
            "(ok, reaped, in flight) after the signal"
        );
        use std::io::Write;
        b.write_all(b"hi").unwrap();
        assert_eq!(waiter.join().unwrap(), vec![2]);
        drop(a);
    }

    #[test]
    fn errors_come_back_as_negative_results() {
        let mut ring = Ring::new(4).unwrap();
        let mut out = Vec::new();
        let op = RingOp::Read {
            fd: -1,
            off: 0,
            buf: AlignedBuf::new(512),
        };
        ring.push(op, 7, &mut out).unwrap();
        ring.wait(1, Duration::from_secs(5), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].res, -libc::EBADF);
        assert!(out[0].buf.is_some());
    }

    #[test]
    fn polls_fire_and_unfired_polls_are_cancelled_at_drop() {
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut ring = Ring::new(4).unwrap();
        let mut out = Vec::new();
        let poll_in = |ring: &mut Ring, fd, token, out: &mut Vec<RingDone>| {
            let events = libc::POLLIN as u32;
            ring.push(RingOp::Poll { fd, events }, token, out).unwrap();
            ring.wait(0, Duration::ZERO, out).unwrap();
        };
        poll_in(&mut ring, a.as_raw_fd(), 1, &mut out);
        assert!(out.is_empty(), "nothing to read yet");
        std::io::Write::write_all(&mut b, b"x").unwrap();
        ring.wait(1, Duration::from_secs(5), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert!(out[0].res & libc::POLLIN as i32 != 0);
        // A poll that never fires does not keep the drop waiting.
        let (c, _d) = std::os::unix::net::UnixStream::pair().unwrap();
        poll_in(&mut ring, c.as_raw_fd(), 2, &mut out);
        drop(ring);
    }
}
