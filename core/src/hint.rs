//! CPU hints for the hot path. A lookup in a big cache is bound by memory latency, not by
//! instructions: starting the loads of a line's records early lets their misses overlap.

/// Hints the CPU to start loading `slice[index]` into cache. Never changes results; does
/// nothing off x86-64 or for an index past the end.
#[inline]
pub fn prefetch<T>(slice: &[T], index: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = slice.get(index) {
        let p = x as *const T as *const i8;
        // SAFETY: SSE is part of the x86-64 baseline, and a prefetch of a valid reference
        // neither faults nor changes memory.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, index);
}
