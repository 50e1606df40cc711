//! Read-ahead for opening a cache (SPEC P9): the metadata regions a load reads from start to
//! end — the journal, then the current checkpoint — are read by helper threads in large pieces,
//! several at a time and ahead of the core, while the core decodes and restores what it was
//! given before.
//!
//! The core's load is pure: it asks for bytes through a read function and reads the journal
//! whole, then the checkpoint one 64 KiB chunk after the other. Read straight from the device
//! that is one synchronous IO per chunk (thousands at 16M lines), with the device idle while
//! the core works and the core idle while the device reads. Here the read function is served
//! from pieces fetched in plan order, at most [`WINDOW`] pieces ahead of the core; what the
//! plan does not cover (superblocks, tables, the write log's scan), or what the core asks for
//! out of order, is read from the device as before. Nothing writes the device during a load,
//! so the bytes are the same either way; a read that needs a piece whose IO failed is done
//! again from the device, so it fails (or not) with the device's own error.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use tiercache_core::units::BLOCK_BYTES;
use tiercache_io::{AlignedBuf, Backend, IoErr};

/// Bytes per piece.
pub const PIECE: u64 = 2 << 20;
/// Pieces fetched but not yet passed by the core, at most (RAM: `WINDOW * PIECE`).
pub const WINDOW: usize = 12;
/// Helper threads (IOs in flight at once).
pub const THREADS: usize = 4;

#[derive(Clone, Copy)]
struct Piece {
    off: u64,
    len: u64,
}

#[derive(Default)]
struct State {
    plan: Vec<Piece>,
    /// The next piece to fetch.
    next: usize,
    /// Pieces before this one are not needed any more (the core went past them).
    low: usize,
    /// Fetched pieces (`None`: its IO failed).
    data: HashMap<usize, Option<AlignedBuf>>,
    quit: bool,
}

struct Shared {
    st: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Helper threads reading a plan of regions ahead of a load; see the module docs.
pub struct ReadAhead {
    dev: Arc<dyn Backend>,
    sh: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The piece the last read ended in (where the next search starts).
    cursor: usize,
    /// Reads served from pieces, and from the device directly.
    pub served: u64,
    pub direct: u64,
}

impl ReadAhead {
    /// Starts reading `regions` (byte offset, length; in the order the load reads them) from
    /// `dev`.
    pub fn start(dev: Arc<dyn Backend>, regions: &[(u64, u64)]) -> ReadAhead {
        let mut plan = Vec::new();
        for &(off, len) in regions {
            let mut at = 0;
            while at < len {
                let n = (len - at).min(PIECE);
                plan.push(Piece {
                    off: off + at,
                    len: n,
                });
                at += n;
            }
        }
        let sh = Arc::new(Shared {
            st: Mutex::new(State {
                plan,
                ..State::default()
            }),
            cv: Condvar::new(),
        });
        let threads = (0..THREADS)
            .filter_map(|i| {
                let (sh, dev) = (sh.clone(), dev.clone());
                std::thread::Builder::new()
                    .name(format!("tc-readahead-{i}"))
                    .spawn(move || fetch(&sh, &*dev))
                    .ok()
            })
            .collect();
        ReadAhead {
            dev,
            sh,
            threads,
            cursor: 0,
            served: 0,
            direct: 0,
        }
    }

    /// The pieces `[first, last]` that hold `[off, off + len)` back to back, if the plan has
    /// them and the core has not gone past the first. (Every piece the core has not gone past
    /// is at or after the one the last read ended in.)
    fn find(&self, st: &State, off: u64, len: u64) -> Option<(usize, usize)> {
        let start = (self.cursor.max(st.low)..st.plan.len())
            .find(|&i| st.plan[i].off <= off && off < st.plan[i].off + st.plan[i].len)?;
        let end = off + len;
        let mut last = start;
        while st.plan[last].off + st.plan[last].len < end {
            let (a, b) = (st.plan[last], st.plan.get(last + 1)?);
            if b.off != a.off + a.len {
                return None;
            }
            last += 1;
        }
        Some((start, last))
    }

    /// Reads `buf.len()` bytes at byte offset `off`: from the pieces when the plan covers
    /// them, else from the device.
    pub fn read(&mut self, off: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        let len = buf.len() as u64;
        let sh = self.sh.clone();
        let mut st = sh.lock();
        let Some((first, last)) = (len > 0).then(|| self.find(&st, off, len)).flatten() else {
            drop(st);
            self.direct += 1;
            return self.dev.read(off / BLOCK_BYTES, buf);
        };
        self.served += 1;
        let end = off + len;
        let mut failed = false;
        for k in first..=last {
            // Everything before piece k is behind the core now.
            pass(&mut st, &sh.cv, k);
            while !st.data.contains_key(&k) {
                st = sh.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            let p = st.plan[k];
            match &st.data[&k] {
                Some(data) => {
                    let from = off.max(p.off);
                    let to = end.min(p.off + p.len);
                    buf[(from - off) as usize..(to - off) as usize]
                        .copy_from_slice(&data[(from - p.off) as usize..(to - p.off) as usize]);
                }
                None => failed = true,
            }
        }
        // The core read up to `end`: a piece it finished is not needed again.
        let p = st.plan[last];
        pass(
            &mut st,
            &sh.cv,
            if end >= p.off + p.len { last + 1 } else { last },
        );
        self.cursor = last;
        drop(st);
        if failed {
            self.direct += 1;
            return self.dev.read(off / BLOCK_BYTES, buf);
        }
        Ok(())
    }
}

/// The core has gone past every piece before `low`: they are dropped, and the helpers may
/// fetch further.
fn pass(st: &mut State, cv: &Condvar, low: usize) {
    if st.low < low {
        st.low = low;
        st.data.retain(|&i, _| i >= low);
        cv.notify_all();
    }
}

/// A helper: fetches the next piece of the plan while it is within the window.
fn fetch(sh: &Shared, dev: &dyn Backend) {
    let mut st = sh.lock();
    loop {
        if st.quit {
            return;
        }
        if st.next < st.low {
            st.next = st.low;
        }
        if st.next >= st.plan.len() || st.next >= st.low + WINDOW {
            st = sh.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            continue;
        }
        let k = st.next;
        st.next += 1;
        let p = st.plan[k];
        drop(st);
        let mut b = AlignedBuf::new(p.len as usize);
        let r = dev.read(p.off / BLOCK_BYTES, &mut b).ok().map(|()| b);
        st = sh.lock();
        if k >= st.low {
            st.data.insert(k, r);
        }
        sh.cv.notify_all();
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.sh.lock().quit = true;
        self.sh.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_io::RamBackend;

    fn dev(bytes: usize) -> Arc<dyn Backend> {
        let d = RamBackend::new((bytes / 512) as u64);
        let data: Vec<u8> = (0..bytes).map(|i| (i * 7 + i / 4096) as u8).collect();
        d.write(0, &data, false).unwrap();
        Arc::new(d)
    }

    fn want(off: u64, len: usize) -> Vec<u8> {
        (off as usize..off as usize + len)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect()
    }

    #[test]
    fn reads_in_plan_order_out_of_order_and_outside_the_plan_all_return_the_device_bytes() {
        let d = dev(64 << 20);
        // Two regions, the second before the first on the device (as a plan may be).
        let (a, b) = ((40u64 << 20, 20u64 << 20), (4u64 << 20, 30u64 << 20));
        let mut ra = ReadAhead::start(d, &[a, b]);
        let mut buf = vec![0u8; 20 << 20];
        // Region a whole, in one read spanning many pieces (more than the window).
        ra.read(a.0, &mut buf).unwrap();
        assert!(buf == want(a.0, buf.len()));
        // Region b in 64 KiB reads, one gap skipped, then a read behind the core (direct).
        let mut c = vec![0u8; 64 << 10];
        let mut off = b.0;
        while off < b.0 + b.1 {
            if off != b.0 + (6 << 20) {
                ra.read(off, &mut c).unwrap();
                assert!(c == want(off, c.len()), "chunk at {off}");
            }
            off += 64 << 10;
        }
        ra.read(b.0, &mut c).unwrap();
        assert!(c == want(b.0, c.len()));
        // Outside the plan; across the end of a region.
        ra.read(0, &mut c).unwrap();
        assert!(c == want(0, c.len()));
        ra.read(a.0 + a.1 - 4096, &mut c).unwrap();
        assert!(c == want(a.0 + a.1 - 4096, c.len()));
        assert!(ra.served > 400, "served {}", ra.served);
        assert!(ra.direct >= 3, "direct {}", ra.direct);
    }
}
