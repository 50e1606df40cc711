//! The test kit shared by the crates' integration tests (a `[dev-dependencies]` entry only):
//!
//! - [`Dir`]: a fresh temporary directory, removed at the end unless the test panicked;
//! - [`have`], [`installed`], [`run`], [`run_ok`], [`free_port`], [`env_u64`], [`sparse`]:
//!   external programs and the machine;
//! - [`Proc`]: a process a test started; dropping it kills and reaps exactly that process;
//! - [`block_pattern`]: self-describing 4 KiB blocks;
//! - [`rng`]: the seeded generators (the same seed gives the same cases);
//! - [`pki`]: test certificates made by the `openssl` command.
//!
//! It depends on no tiercache crate: each crate's `tests/common` adds what is its own.

pub mod pki;
mod proc;
pub mod rng;

pub use proc::{Proc, env_u64, free_port, have, installed, run, run_ok, sparse};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// 4 KiB identifying (`block`, `version`): 512 little-endian words, word `i` being
/// `block * 1_000_003 + version * 7919 + i`.
pub fn block_pattern(block: u64, version: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (i, c) in b.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(block * 1_000_003 + version * 7919 + i as u64).to_le_bytes());
    }
    b
}

/// A fresh directory under the temporary directory, removed at the end unless the test
/// panicked (then it is kept for a look at what the test left, e.g. a daemon's log).
pub struct Dir(pub PathBuf);

impl Dir {
    /// `$TMPDIR/tc-NAME-PID`, emptied first (one per name and test process).
    pub fn new(name: &str) -> Dir {
        Dir::at(std::env::temp_dir().join(format!("tc-{name}-{}", std::process::id())))
    }

    /// `$TMPDIR/tc-NAME-PID-N`: a new one on each call.
    pub fn fresh(name: &str) -> Dir {
        Dir::fresh_in(&std::env::temp_dir(), name)
    }

    /// `BASE/tc-NAME-PID-N`: a new one on each call.
    pub fn fresh_in(base: &Path, name: &str) -> Dir {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Dir::at(base.join(format!("tc-{name}-{}-{n}", std::process::id())))
    }

    /// The directory `p`, emptied first.
    fn at(p: PathBuf) -> Dir {
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        Dir(p)
    }

    /// The path of `f` in this directory, as a string.
    pub fn path(&self, f: &str) -> String {
        self.0.join(f).display().to_string()
    }

    /// The path of `f` in this directory.
    pub fn join(&self, f: impl AsRef<Path>) -> PathBuf {
        self.0.join(f)
    }

    /// A sparse file of `bytes` in this directory; its path.
    pub fn sparse(&self, f: &str, bytes: u64) -> String {
        let p = self.path(f);
        sparse(&p, bytes);
        p
    }
}

impl std::ops::Deref for Dir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Dir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
