//! One daemon per device (SPEC C18): a local cache or core device (a file or block device) is
//! held under an advisory `flock(LOCK_EX)` while the daemon has it open, so a second daemon
//! (or any program that takes the same lock) is refused in one line instead of writing under
//! the first one's feet. The lock is taken before the device is opened (opening it may write:
//! the `O_DIRECT` probe rewrites a block).
//!
//! Within one daemon the registry refuses a device used twice, by identity under any spelling
//! (`crate::identity`, checked before the device is opened); handles of
//! the same process share the lock, so a device reopened while an old handle is still being
//! dropped (a cache stopped and loaded again, a core resized) is not refused by itself.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Mutex;
use tiercache_engine::Device;
use tiercache_io::Backend;

/// Locks held by this process: (st_dev, st_ino) to the locked file and its handle count.
static HELD: Mutex<BTreeMap<(u64, u64), (std::fs::File, usize)>> = Mutex::new(BTreeMap::new());

/// This process's claim on a device; the lock goes with the last claim.
pub struct DeviceLock {
    key: (u64, u64),
}

impl DeviceLock {
    /// Claims the device at `path` (`shown` names it in errors).
    pub fn take(path: &Path, shown: &str) -> Result<DeviceLock, String> {
        let md = std::fs::metadata(path).map_err(|e| format!("{shown}: cannot open: {e}"))?;
        let key = (md.dev(), md.ino());
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = held.get_mut(&key) {
            *n += 1;
            return Ok(DeviceLock { key });
        }
        let f = std::fs::File::open(path).map_err(|e| format!("{shown}: cannot open: {e}"))?;
        // SAFETY: flock on a file descriptor we own; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                format!(
                    "{shown} is in use by another process (another tiercache daemon holds its lock); stop the cache that uses it there first"
                )
            } else {
                format!("{shown}: cannot lock it: {e}")
            });
        }
        held.insert(key, (f, 1));
        Ok(DeviceLock { key })
    }
}

impl Drop for DeviceLock {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key); // closing the file releases the lock
            }
        }
    }
}

/// A device with its claim: the claim ends when the device is dropped.
pub struct Locked {
    inner: Device,
    _lock: DeviceLock,
}

impl Locked {
    /// `inner`, holding `lock` for as long as it lives.
    pub fn new(inner: Device, lock: DeviceLock) -> Locked {
        Locked { inner, _lock: lock }
    }
}

/// A pure pass-through: every method, the asynchronous and ring paths included, reaches the
/// claimed device.
impl Backend for Locked {
    tiercache_io::forward_backend!(inner; all);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_shares_the_lock_another_is_refused() {
        let p = std::env::temp_dir().join(format!("tc-devlock-{}", std::process::id()));
        std::fs::write(&p, [0u8; 4096]).unwrap();
        let a = DeviceLock::take(&p, "dev").unwrap();
        let b = DeviceLock::take(&p, "dev").unwrap();
        // Another open file description (as another process would have) cannot lock it.
        let other = std::fs::File::open(&p).unwrap();
        // SAFETY: flock on a file descriptor we own.
        let try_lock = || unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_ne!(try_lock(), 0);
        drop(a);
        assert_ne!(try_lock(), 0, "still held by the second claim");
        drop(b);
        assert_eq!(try_lock(), 0, "released with the last claim");
        // Held by someone else: refused in one line naming the device.
        let e = DeviceLock::take(&p, "dev").err().unwrap();
        assert!(e.starts_with("dev is in use by another process"), "{e}");
        assert_eq!(e.lines().count(), 1);
        drop(other);
        DeviceLock::take(&p, "dev").unwrap();
        let e = DeviceLock::take(&p.with_extension("nope"), "gone")
            .err()
            .unwrap();
        assert!(e.starts_with("gone: cannot open:"), "{e}");
        let _ = std::fs::remove_file(&p);
    }

    /// The claim passes everything on: a claimed RBD image stays asynchronous, a claimed file
    /// stays on the reactor's ring (the probe has every optional capability).
    #[test]
    fn a_claimed_device_keeps_every_capability() {
        use tiercache_io::conformance::{PROBE_FD, Probe};
        let p = std::env::temp_dir().join(format!("tc-devlock-fwd-{}", std::process::id()));
        std::fs::write(&p, [0u8; 4096]).unwrap();
        let probe = std::sync::Arc::new(Probe::new(4096));
        let l = Locked::new(probe.clone(), DeviceLock::take(&p, "dev").unwrap());
        assert!(l.inline() && l.is_async());
        assert_eq!(l.ring_fd(), Some(PROBE_FD));
        assert!(l.extents(0, 8).unwrap()[0].hole);
        l.prefetch(0, 8);
        assert_eq!(Probe::get(&probe.prefetches), 1);
        let (tx, rx) = std::sync::mpsc::channel();
        l.submit_async(
            tiercache_io::AsyncReq::Flush,
            Box::new(move |_, r| tx.send(r).unwrap()),
        );
        rx.recv().unwrap().unwrap();
        assert_eq!(Probe::get(&probe.async_calls), 1);
        drop(l);
        let _ = std::fs::remove_file(&p);
    }
}
