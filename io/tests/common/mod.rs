//! Helpers shared by the IO test files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh directory under `base` (named after `tag`, the process and a counter), removed on
/// drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(base: &Path, tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = base.join(format!(
            "tiercache-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn in_tmp(tag: &str) -> Self {
        Self::new(&std::env::temp_dir(), tag)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
