//! One way for a [`Backend`](crate::Backend) wrapper to pass on what it does not change.
//!
//! The trait has defaults for its optional methods (`inline`, `prefetch`, `extents`,
//! `ring_fd`, `ring_completed`, `is_async`, `submit_async`, `submit_batch`): a wrapper that forgets one silently
//! turns the inner device's capability off (history: the claimed device once ran an RBD image
//! synchronously behind its claim). So a wrapper states what it does with each of them:
//!
//! - [`forward_backend!`](crate::forward_backend)`(field; m1, m2, ...)` forwards the named
//!   methods to `self.field`; `forward_backend!(field; all)` forwards every method of the trait
//!   (a pure pass-through: a new trait method is added to `all` here, once, and reaches every
//!   such wrapper). `forward_backend!(*; all)` forwards through `**self` (`Box`, `Arc`).
//! - [`sync_only_backend!`](crate::sync_only_backend)`()` says the wrapper must see every IO
//!   through its synchronous calls — it injects faults, delays or timeouts, or keeps state of
//!   its own — and so is neither asynchronous nor runs on a caller's ring: `is_async` is
//!   false, `submit_async` runs the wrapper's own calls, `ring_fd` is `None`.
//!
//! `io/tests/wrappers.rs` checks each wrapper's stance against a probe device that has every
//! capability.

/// Forwards the named [`Backend`](crate::Backend) methods (or `all` of them) to a field of the
/// wrapper, or with `*` through `**self`. See the module docs (`io/src/forward.rs`).
#[macro_export]
macro_rules! forward_backend {
    ($f:tt; all) => {
        $crate::forward_backend!($f; name, blocks, read, write, write_zeroes, trim, flush,
            inline, prefetch, extents, ring_fd, ring_completed, is_async, submit_async,
            submit_batch);
    };
    ($f:tt; $($m:ident),+ $(,)?) => {
        $( $crate::forward_backend!(@one $f $m); )+
    };
    (@to $s:ident *) => { (**$s) };
    (@to $s:ident $f:ident) => { $s.$f };
    (@one $f:tt name) => {
        fn name(&self) -> String {
            $crate::forward_backend!(@to self $f).name()
        }
    };
    (@one $f:tt blocks) => {
        fn blocks(&self) -> u64 {
            $crate::forward_backend!(@to self $f).blocks()
        }
    };
    (@one $f:tt read) => {
        fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), $crate::IoErr> {
            $crate::forward_backend!(@to self $f).read(lba, buf)
        }
    };
    (@one $f:tt write) => {
        fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), $crate::IoErr> {
            $crate::forward_backend!(@to self $f).write(lba, buf, fua)
        }
    };
    (@one $f:tt write_zeroes) => {
        fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), $crate::IoErr> {
            $crate::forward_backend!(@to self $f).write_zeroes(lba, blocks, fua)
        }
    };
    (@one $f:tt trim) => {
        fn trim(&self, lba: u64, blocks: u64) -> Result<(), $crate::IoErr> {
            $crate::forward_backend!(@to self $f).trim(lba, blocks)
        }
    };
    (@one $f:tt flush) => {
        fn flush(&self) -> Result<(), $crate::IoErr> {
            $crate::forward_backend!(@to self $f).flush()
        }
    };
    (@one $f:tt inline) => {
        fn inline(&self) -> bool {
            $crate::forward_backend!(@to self $f).inline()
        }
    };
    (@one $f:tt prefetch) => {
        fn prefetch(&self, lba: u64, blocks: u64) {
            $crate::forward_backend!(@to self $f).prefetch(lba, blocks)
        }
    };
    (@one $f:tt extents) => {
        fn extents(&self, lba: u64, blocks: u64) -> Result<Vec<$crate::Extent>, $crate::IoErr> {
            $crate::forward_backend!(@to self $f).extents(lba, blocks)
        }
    };
    (@one $f:tt ring_fd) => {
        fn ring_fd(&self) -> Option<std::os::unix::io::RawFd> {
            $crate::forward_backend!(@to self $f).ring_fd()
        }
    };
    (@one $f:tt ring_completed) => {
        fn ring_completed(&self, io: $crate::RingCompleted<'_>) -> Result<(), $crate::IoErr> {
            $crate::forward_backend!(@to self $f).ring_completed(io)
        }
    };
    (@one $f:tt is_async) => {
        fn is_async(&self) -> bool {
            $crate::forward_backend!(@to self $f).is_async()
        }
    };
    (@one $f:tt submit_async) => {
        fn submit_async(&self, req: $crate::AsyncReq, done: $crate::AsyncDone) {
            $crate::forward_backend!(@to self $f).submit_async(req, done)
        }
    };
    (@one $f:tt submit_batch) => {
        fn submit_batch(&self, reqs: &mut [$crate::Req<'_>]) -> Vec<Result<(), $crate::IoErr>> {
            $crate::forward_backend!(@to self $f).submit_batch(reqs)
        }
    };
}

/// Declares a [`Backend`](crate::Backend) wrapper synchronous: every IO goes through its own
/// calls (`submit_async` runs them and then the callback; not asynchronous; no ring
/// descriptor). For wrappers that inject faults, delays or timeouts, or keep state of their
/// own, which an IO going straight to the inner device would bypass.
#[macro_export]
macro_rules! sync_only_backend {
    () => {
        fn is_async(&self) -> bool {
            false
        }
        fn submit_async(&self, req: $crate::AsyncReq, done: $crate::AsyncDone) {
            $crate::submit_sync(self, req, done)
        }
        fn ring_fd(&self) -> Option<std::os::unix::io::RawFd> {
            None
        }
    };
}
