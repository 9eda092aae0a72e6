//! The process's own memory, as the kernel reports it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// `RssAnon` of this process in bytes: resident memory that is not a mapped
/// file, i.e. what the program allocated itself (LMDB's map excluded).
pub(crate) fn rss_anon() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Samples `RssAnon` every few milliseconds and keeps the maximum, because
/// the kernel keeps a high-water mark only for the whole RSS.
pub(crate) struct PeakSampler {
    /// `RssAnon` when sampling started (after returning freed heap).
    pub(crate) start: u64,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeakSampler {
    pub(crate) fn start() -> PeakSampler {
        release_free_memory();
        let start = rss_anon();
        let peak = Arc::new(AtomicU64::new(start));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&peak), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_anon(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        PeakSampler { start, peak, stop, thread: Some(thread) }
    }

    pub(crate) fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.fetch_max(rss_anon(), Ordering::Relaxed);
        self.peak.load(Ordering::Relaxed)
    }
}

/// Returns freed heap to the kernel, so that a measurement is not inflated
/// by what an earlier phase freed but malloc kept.
pub(crate) fn release_free_memory() {
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
