//! The tokio runtime a shoal process serves on.
//!
//! tokio starts one worker thread per core. That is right for one process
//! per machine, and wrong for several sharing its cores: on 2 cores, a
//! coordinator, 3 shard nodes and a load generator with 2 workers each
//! served 15-20% fewer searches than with 1 each (docs/benchmarks.md,
//! "Worker threads"), because every request then wakes tasks on other
//! threads that the cores must switch to, and each walk's cache is cooled
//! by the other threads in between. So the number is a setting
//! (`worker_threads`, `--worker-threads`), for operators who run several
//! processes on one machine.

/// Most worker threads a process may ask for: more is a typo, not a plan.
pub const MAX_WORKER_THREADS: usize = 1024;

/// A multi-threaded runtime with `worker_threads` workers; 0 leaves the
/// number to tokio (`TOKIO_WORKER_THREADS`, else one per core).
pub fn build(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    anyhow::ensure!(
        worker_threads <= MAX_WORKER_THREADS,
        "worker_threads must be between 0 (one per core) and {MAX_WORKER_THREADS}, got {worker_threads}"
    );
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        b.worker_threads(worker_threads);
    }
    Ok(b.enable_all().build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_has_the_workers_it_was_asked_for() {
        assert_eq!(build(1).unwrap().metrics().num_workers(), 1);
        assert_eq!(build(3).unwrap().metrics().num_workers(), 3);
        let e = build(MAX_WORKER_THREADS + 1).unwrap_err().to_string();
        assert!(e.contains("worker_threads must be between 0 (one per core) and 1024, got 1025"), "{e}");
    }
}
