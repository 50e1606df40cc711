//! Helpers shared by the IO test files: the test kit's temporary directory (a fresh one per
//! call, removed at the end unless the test panicked).

#![allow(dead_code)]

pub use tiercache_testkit::Dir as TempDir;
