//! Progress of a running snapshot or restore, readable from any thread
//! while it runs (the shard's stats and the CLI's bar show it).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What is running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Taking a snapshot.
    Snapshot,
    /// Restoring one.
    Restore,
}

impl Operation {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Snapshot => "snapshot",
            Operation::Restore => "restore",
        }
    }
}

/// Where a running operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Reading the manifest, checking the store.
    Starting = 0,
    /// Moving chunks.
    Transferring = 1,
    /// Snapshot: checking reused chunks and writing the manifest. Restore:
    /// opening the environment and checking it against the manifest.
    Finishing = 2,
    /// Finished.
    Done = 3,
}

impl Phase {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Transferring => "transferring",
            Phase::Finishing => "finishing",
            Phase::Done => "done",
        }
    }
}

/// Counters updated by the pipeline.
#[derive(Debug)]
pub struct Progress {
    op: Operation,
    started: Instant,
    phase: AtomicU8,
    total: AtomicU64,
    done: AtomicU64,
    transferred: AtomicU64,
    chunks_done: AtomicU64,
    chunks_reused: AtomicU64,
}

/// A reading of [`Progress`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProgressReport {
    /// What runs.
    pub op: Operation,
    /// Where it is.
    pub phase: Phase,
    /// Image bytes processed (copied and chunked, or restored).
    pub bytes_done: u64,
    /// Image bytes expected (an estimate for a snapshot: the environment
    /// may grow while it is copied).
    pub bytes_total: u64,
    /// Compressed bytes sent to or received from the store.
    pub bytes_transferred: u64,
    /// Chunks uploaded, reused or restored.
    pub chunks_done: u64,
    /// Chunks the store had already (snapshot only).
    pub chunks_reused: u64,
    /// Time since the start.
    pub elapsed: Duration,
}

impl ProgressReport {
    /// Image bytes per second so far.
    pub fn rate(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 { self.bytes_done as f64 / s } else { 0.0 }
    }

    /// Time left at the rate so far (None until there is a rate).
    pub fn remaining(&self) -> Option<Duration> {
        let rate = self.rate();
        (rate > 0.0).then(|| Duration::from_secs_f64(self.bytes_total.saturating_sub(self.bytes_done) as f64 / rate))
    }
}

impl Progress {
    /// Counters at zero, the clock started.
    pub fn new(op: Operation) -> Progress {
        Progress {
            op,
            started: Instant::now(),
            phase: AtomicU8::new(Phase::Starting as u8),
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
            transferred: AtomicU64::new(0),
            chunks_done: AtomicU64::new(0),
            chunks_reused: AtomicU64::new(0),
        }
    }

    /// The counters now.
    pub fn report(&self) -> ProgressReport {
        let phase = match self.phase.load(Ordering::Relaxed) {
            0 => Phase::Starting,
            1 => Phase::Transferring,
            2 => Phase::Finishing,
            _ => Phase::Done,
        };
        let done = self.done.load(Ordering::Relaxed);
        ProgressReport {
            op: self.op,
            phase,
            bytes_done: done,
            // A snapshot can copy more than estimated if the shard grew.
            bytes_total: self.total.load(Ordering::Relaxed).max(done),
            bytes_transferred: self.transferred.load(Ordering::Relaxed),
            chunks_done: self.chunks_done.load(Ordering::Relaxed),
            chunks_reused: self.chunks_reused.load(Ordering::Relaxed),
            elapsed: self.started.elapsed(),
        }
    }

    pub(crate) fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }

    pub(crate) fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn add_done(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn add_chunk(&self, transferred: u64, reused: bool) {
        self.transferred.fetch_add(transferred, Ordering::Relaxed);
        self.chunks_done.fetch_add(1, Ordering::Relaxed);
        if reused {
            self.chunks_reused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_rate_and_remaining() {
        let p = Progress::new(Operation::Restore);
        p.set_total(1000);
        assert_eq!(p.report().remaining(), None);
        std::thread::sleep(Duration::from_millis(20));
        p.add_done(250);
        p.add_chunk(100, false);
        let r = p.report();
        assert_eq!((r.bytes_done, r.bytes_total, r.bytes_transferred, r.chunks_done), (250, 1000, 100, 1));
        assert!(r.rate() > 0.0);
        let left = r.remaining().unwrap();
        assert!(left > r.elapsed * 2 && left < r.elapsed * 4, "{left:?} vs {:?}", r.elapsed);
    }
}
