//! Giving free heap memory back to the operating system.
//!
//! glibc keeps freed memory in its arenas (one per thread that allocated,
//! up to 8 per CPU) and returns only what lies at the top of a heap, so the
//! memory of dropped shards, or of a large search that ended, stays
//! resident although nothing uses it. Measured in issue 17: three rounds of
//! creating and dropping a 64-shard collection left a node at 123 MiB
//! instead of 23 MiB, and a SearchBatch of 1,024 × 10,000 hits stopped at
//! its deadline left each node ~20% above where it was. Trimming walks
//! every arena once, which costs far less than what it follows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Returns the free heap memory now (blocks for as long as the walk takes).
pub(crate) fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it has no
    // preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

static SCHEDULED: AtomicBool = AtomicBool::new(false);

/// Returns the free heap memory a moment from now, once: for memory that is
/// freed after the caller returns (an answer, once it is sent). Calls while
/// one is pending are folded into it.
pub(crate) fn return_free_memory_soon() {
    if SCHEDULED.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        SCHEDULED.store(false, Ordering::Release);
        let _ = tokio::task::spawn_blocking(return_free_memory).await;
    });
}
