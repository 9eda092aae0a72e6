//! A hint to the CPU to load memory a walk is about to read; a leaf that
//! the graph walk and the views of stored lists both use.

/// Asks the CPU to start loading `bytes` bytes at `p` into its caches.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let mut off = 0;
        while off < bytes {
            // SAFETY: prefetch is a hint; it never faults, even on an
            // invalid address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast()) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}
