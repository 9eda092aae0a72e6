//! Taking the `resize` lock exclusively: no read transaction of this index
//! open in the process, which LMDB needs before it remaps (growing the
//! map) and before an environment is swapped (a compaction).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::RwLockWriteGuard;

use super::Index;
use crate::cache::SharedAddrs;

/// What to do about a copy (a snapshot's `copy_to`) that waits for the
/// writer lock the caller holds while its read transaction stays open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Copies {
    /// Keep trying until `resize_wait`: the batch needs the room.
    Wait,
    /// Give up at once: the work can be done later, and waiting would hold
    /// the writer lock, and so every batch, for the copy's whole length.
    GiveWay,
}

impl Index {
    /// The `resize` lock, exclusively. Under a steady stream of searches
    /// there may be no moment without a read transaction, so after a short
    /// spell of polling this queues for the lock, which holds new searches
    /// back until those in flight end (milliseconds), but for at most
    /// `QUEUE_FOR` at a time: a long reader (a snapshot's copy) must not
    /// stall every search behind it. None after `resize_wait`, or, with
    /// [`Copies::GiveWay`], as soon as a copy is waiting.
    pub(super) fn exclusive(&self, copies: Copies) -> Option<RwLockWriteGuard<'_, SharedAddrs>> {
        const POLL_FOR: Duration = Duration::from_millis(20);
        const QUEUE_FOR: Duration = Duration::from_millis(200);
        let started = Instant::now();
        let mut pause = Duration::from_micros(50);
        // A copy counts itself before it takes any lock.
        let give_way = || copies == Copies::GiveWay && self.copies.load(Ordering::Acquire) > 0;
        while started.elapsed() < POLL_FOR {
            if give_way() {
                return None;
            }
            if let Some(guard) = self.resize.try_write() {
                return Some(guard);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
        loop {
            if let Some(guard) = self.resize.try_write_for(QUEUE_FOR) {
                return Some(guard);
            }
            if give_way() || started.elapsed() >= self.opts.resize_wait {
                return None;
            }
            // Let the searches that queued behind us run before queuing again.
            std::thread::sleep(QUEUE_FOR);
        }
    }
}
