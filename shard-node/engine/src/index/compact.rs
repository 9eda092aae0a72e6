//! Giving a shard's free pages back to the disk while it stays in service.
//!
//! LMDB reuses the pages a commit frees but never shrinks its file: a
//! shard under churn keeps the high-water mark of every batch's
//! copy-on-write pages (docs/engine.md, "Compaction: giving free pages
//! back"), and a shard that shrank keeps its old size. A compaction
//! writes a compacted copy of the last commit (`MDB_CP_COMPACT`: live
//! pages only, renumbered) beside the file and swaps it in:
//!
//! 1. under the writer lock (batches wait; searches go on) the copy is
//!    written to `<dir>/.compact/data.mdb`, flushed, and opened there once,
//!    which proves it is a sound environment before anything changes;
//! 2. with every read transaction closed (the `resize` lock taken
//!    exclusively, as growing the map does) it is renamed over `data.mdb`,
//!    the old environment closes and the new file is opened in its place.
//!
//! The rename is atomic: a crash before it leaves the old file and a
//! staging directory that the next open removes; a crash after it leaves
//! the compacted file, which holds the same commit. Either way nothing
//! committed is lost.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use heed::CompactionOption;

use super::exclusive::Copies;
use super::{Index, store_options};
use crate::error::{Error, Result};
use crate::session;
use crate::store::Store;

/// Where a compaction stages its copy, inside the index's directory.
const STAGING: &str = ".compact";

/// What a compaction did.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactOutcome {
    /// `data.mdb` before.
    pub bytes_before: u64,
    /// `data.mdb` after.
    pub bytes_after: u64,
    /// Writing the copy: batches waited this long, searches did not.
    pub copy_seconds: f64,
    /// The swap: searches and batches waited this long.
    pub swap_seconds: f64,
}

impl Index {
    /// Bytes of `data.mdb` that no table holds (free pages LMDB keeps):
    /// what a compaction would give back, within a few pages.
    pub fn free_bytes(&self) -> Result<u64> {
        let _shared = self.resize.read();
        let txn = self.store.env.read_txn().map_err(|e| self.store.err(e))?;
        self.store.free_bytes(&txn)
    }

    /// True when free pages are at least `compact_free_ratio` of a file of
    /// at least `compact_min_bytes` (see [`crate::IndexOptions`]).
    /// False while a copy (a snapshot) streams.
    pub fn compact_due(&self) -> Result<bool> {
        self.compact_due_at(self.opts.compact_free_ratio)
    }

    /// [`Index::compact_due`] at another ratio (0: never): a shard at rest
    /// is worth compacting at a lower one, since no batch is about to
    /// need the pages again (the shard node's `writer.rest_compact_ratio`).
    pub fn compact_due_at(&self, ratio: f64) -> Result<bool> {
        if self.copies.load(Ordering::Acquire) > 0 {
            return Ok(false);
        }
        let file = {
            let _shared = self.resize.read();
            self.store.disk_bytes()
        };
        if ratio <= 0.0 || file < self.opts.compact_min_bytes.max(1) {
            return Ok(false);
        }
        Ok(self.free_bytes()? as f64 >= ratio * file as f64)
    }

    /// Rewrites `data.mdb` without its free pages, in place, while the
    /// index stays open: batches wait for the copy (about a second per
    /// 500 MiB on a local disk), searches only for the swap (milliseconds).
    /// [`Error::CompactBlocked`] while a copy (a snapshot) streams, or if
    /// read transactions stay open longer than `resize_wait`; nothing
    /// changes then.
    pub fn compact(&self) -> Result<CompactOutcome> {
        let _writer = self.writer.lock();
        // A copy counts itself before it takes any lock; one that comes
        // later makes `exclusive` give up rather than wait for it.
        if self.copies.load(Ordering::Acquire) > 0 {
            return Err(Error::CompactBlocked { path: self.path.clone(), waited: Duration::ZERO });
        }
        let _span = tracing::info_span!("engine.compact").entered();
        let staging = self.path.join(STAGING);
        let bytes_before = {
            let _shared = self.resize.read();
            self.store.disk_bytes()
        };
        let started = Instant::now();
        let spare = match self.write_copy(&staging) {
            Ok(spare) => spare,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                return Err(e);
            }
        };
        let copy_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        self.swap_in(spare, &staging)?;
        let bytes_after = self.store.disk_bytes();
        let outcome = CompactOutcome { bytes_before, bytes_after, copy_seconds, swap_seconds: started.elapsed().as_secs_f64() };
        tracing::info!(path = %self.path.display(), before = bytes_before, after = bytes_after, copy_s = copy_seconds,
            swap_s = outcome.swap_seconds, "compacted the index file");
        Ok(outcome)
    }

    /// Writes the compacted copy of the last commit into `staging`, flushes
    /// it and opens it: the environment that will replace the current one.
    /// Runs under the writer lock, so no commit happens meanwhile.
    fn write_copy(&self, staging: &Path) -> Result<Store> {
        let io = |path: &Path, source| Error::Io { path: path.to_owned(), source };
        let _ = std::fs::remove_dir_all(staging);
        std::fs::create_dir(staging).map_err(|e| io(staging, e))?;
        let file = staging.join("data.mdb");
        let expected = {
            // Held while LMDB copies: a remap under its read transaction
            // would leave it reading unmapped memory.
            let _shared = self.resize.read();
            let store = &self.store;
            let txn = store.env.read_txn().map_err(|e| store.err(e))?;
            let state = session::read_state(store, &txn)?;
            drop(txn);
            let copy = store.env.copy_to_path(&file, CompactionOption::Enabled).map_err(|e| store.err(e))?;
            copy.sync_all().map_err(|e| io(&file, e))?;
            state
        };
        let mut spare = Store::open(staging, &store_options(&self.opts))?;
        // Errors and sizes name the index's own directory, where the file
        // is about to move.
        spare.path = self.path.clone();
        let txn = spare.env.read_txn().map_err(|e| spare.err(e))?;
        let copied = session::read_state(&spare, &txn)?;
        drop(txn);
        if copied != expected {
            return Err(Error::Corrupt {
                path: self.path.clone(),
                detail: "the compacted copy does not hold the commit it was taken from".into(),
            });
        }
        Ok(spare)
    }

    /// Moves the copy in place of `data.mdb` and reopens the index's
    /// environment on it, then removes `staging`. Takes the `resize` lock
    /// exclusively: searches wait for the few milliseconds this takes.
    fn swap_in(&self, spare: Store, staging: &Path) -> Result<()> {
        let moved = self.move_in(spare, staging);
        if !matches!(moved, Err(Moved::Serving(_))) {
            // The spare is closed (moved in and replaced, or dropped).
            let _ = std::fs::remove_dir_all(staging);
        }
        moved.map_err(|e| match e {
            Moved::Serving(e) | Moved::Before(e) => e,
        })
    }

    fn move_in(&self, spare: Store, staging: &Path) -> std::result::Result<(), Moved> {
        let Some(mut exclusive) = self.exclusive(Copies::GiveWay) else {
            return Err(Moved::Before(Error::CompactBlocked { path: self.path.clone(), waited: self.opts.resize_wait }));
        };
        let data = self.path.join("data.mdb");
        std::fs::rename(staging.join("data.mdb"), &data).map_err(|source| Moved::Before(Error::Io { path: data.clone(), source }))?;
        // From here the file at `data` is the copy, which holds the same
        // commit: idle sessions (they hold read transactions of the old
        // environment) and every shared address into the old map go.
        self.sessions.lock().clear();
        exclusive.clear(self.moved.load(Ordering::SeqCst));
        self.link_blocks.lock().clear();
        self.generation.fetch_add(1, Ordering::AcqRel);
        // SAFETY: the writer lock and the exclusive resize lock are held
        // and the idle sessions are dropped: nothing refers to the store.
        let old = unsafe { self.store.replace(spare) };
        // The last handle of the old environment: it closes, and LMDB's
        // registry frees its path for the reopen below.
        drop(old);
        // Before any commit lands in the new file (the writer lock is still
        // held): were the rename lost in a crash, the old file would come
        // back, holding the same commit.
        let synced = sync_dir(&self.path);
        match Store::open(&self.path, &store_options(&self.opts)) {
            Ok(reopened) => {
                // SAFETY: as above; the spare environment closes here.
                drop(unsafe { self.store.replace(reopened) });
                synced.map_err(Moved::Before)
            }
            Err(e) => {
                // The spare, open on the same file through the staging
                // directory's lock file, keeps serving; the next open of
                // the index uses the directory's own again.
                tracing::error!(path = %self.path.display(), error = %e,
                    "reopening the compacted index failed; serving it through its staging directory until the shard reopens");
                Err(Moved::Serving(e))
            }
        }
    }
}

/// How a swap failed.
enum Moved {
    /// Before the spare took over, or after it was closed again.
    Before(Error),
    /// The spare serves: its staging directory (with its lock file) stays.
    Serving(Error),
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|source| Error::Io { path: dir.to_owned(), source })
}

/// Removes what a compaction that died left in `dir` (its staging copy);
/// `data.mdb` is whole either way. Runs before the index opens.
pub(super) fn clean_up(dir: &Path) -> Result<()> {
    let staging: PathBuf = dir.join(STAGING);
    if staging.exists() {
        tracing::warn!(path = %staging.display(), "removing the staging copy of an interrupted compaction");
        std::fs::remove_dir_all(&staging).map_err(|source| Error::Io { path: staging, source })?;
    }
    Ok(())
}
