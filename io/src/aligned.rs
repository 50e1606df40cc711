use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::pool::Arena;

/// Alignment of an [`AlignedBuf`] in bytes, enough for `O_DIRECT` on any common device.
pub const ALIGN: usize = 4096;

/// A zero-initialised heap buffer whose start is aligned to [`ALIGN`] (4096) bytes, as
/// `O_DIRECT` requires. Dereferences to a byte slice of the requested length.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    /// The pool the memory came from (given back there on drop), if any.
    home: Option<Arc<Arena>>,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8], like a Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to 4096. Aborts on allocation failure like `Vec`.
    /// An empty buffer allocates nothing.
    pub fn new(len: usize) -> Self {
        if len == 0 {
            return AlignedBuf {
                ptr: NonNull::new(ALIGN as *mut u8).expect("ALIGN is not zero"),
                len: 0,
                cap: 0,
                home: None,
            };
        }
        let cap = len.div_ceil(ALIGN) * ALIGN;
        let layout = Layout::from_size_align(cap, ALIGN).expect("AlignedBuf: size overflow");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf {
            ptr,
            len,
            cap,
            home: None,
        }
    }

    /// A buffer of `len` bytes on a block of `cap` bytes of a pool's arena, given back to it
    /// on drop.
    pub(crate) fn from_arena(ptr: NonNull<u8>, len: usize, cap: usize, home: Arc<Arena>) -> Self {
        debug_assert!(len <= cap && Self::is_aligned(ptr.as_ptr()));
        AlignedBuf {
            ptr,
            len,
            cap,
            home: Some(home),
        }
    }

    /// Whether the buffer came from a [`crate::BufPool`].
    pub fn pooled(&self) -> bool {
        self.home.is_some()
    }

    /// The length in bytes, as requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `p` is aligned to [`ALIGN`], that is, usable for `O_DIRECT` as it is.
    pub fn is_aligned(p: *const u8) -> bool {
        (p as usize) % ALIGN == 0
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialised bytes owned by self (zeroed at
        // allocation; a pool's block holds what its last user wrote), or len is 0 and ptr is
        // non-null and aligned (an empty buffer).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.release(self.ptr, self.cap);
            return;
        }
        if self.cap == 0 {
            return; // an empty buffer: nothing was allocated
        }
        let layout = Layout::from_size_align(self.cap, ALIGN).expect("layout was valid at new");
        // SAFETY: ptr was allocated by alloc_zeroed with this same layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}
