//! The read side of an index: searches, point lookups, offsets, stats and
//! consistent snapshots, all on committed state and never waiting for the writer.

use std::sync::atomic::Ordering;

use parking_lot::RwLockReadGuard;

use crate::batch_log::{self, LogRead};
use crate::cache::SharedAddrs;
use crate::error::{Error, InvalidInput, Result};
use crate::params::IndexParams;
use crate::scrub::{self, ScrubCursor, ScrubStep};
use crate::session::{self, Hit, SearchParams, Session, StoredPoint};
use crate::stop::Stop;

use super::Index;

/// Counters and sizes of an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexStats {
    /// Creation parameters.
    pub params: IndexParams,
    /// Points a search can return.
    pub live: u64,
    /// Retired nodes: deleted or replaced points whose slots wait for new
    /// points (those not yet vacuumed still route searches).
    pub tombstones: u64,
    /// Tombstones the vacuum has unlinked from the graph and whose
    /// payloads it dropped (part of `tombstones`); their slots wait for
    /// new points.
    pub vacuumed: u64,
    /// Top layer of the graph (None while empty).
    pub max_level: Option<u8>,
    /// Size of the data file.
    pub disk_bytes: u64,
    /// Current memory map size.
    pub map_size: u64,
    /// Bytes of the map in use, up to the last page written (LMDB's free
    /// pages below it included); `map_size - used_bytes` is the room left
    /// before the map grows.
    pub used_bytes: u64,
    /// Commits since the index was opened.
    pub commits: u64,
    /// Bottom-layer lists in the link log, waiting for a fold (see
    /// [`LinkLog`](crate::LinkLog)); a list changed by two batches counts twice.
    pub link_log_lists: u64,
    /// The first node id the link log's fold under way has not reached
    /// yet, if one is under way (batches and the idle fold fold the log a
    /// range of blocks per commit; a reopen starts over).
    pub link_log_fold_cursor: Option<u32>,
    /// The shard's epoch (see [`Index::fence`](crate::Index::fence)).
    pub epoch: u64,
    /// Sequence number of the last applied batch (0: none yet).
    pub last_seq: u64,
    /// First sequence number the batch log holds (`last_seq + 1` when
    /// it holds none).
    pub batch_log_first_seq: u64,
    /// Entries in the batch log.
    pub batch_log_entries: u64,
    /// Bytes of the batch log's entries.
    pub batch_log_bytes: u64,
    /// Bytes of `data.mdb` no table holds (LMDB's free pages): what
    /// [`Index::compact`](crate::Index::compact) would give back.
    pub free_bytes: u64,
    /// Bytes each table holds, by name (see `docs/engine.md`, "Storage
    /// layout"): where the file goes.
    pub table_bytes: Vec<(&'static str, u64)>,
}

impl Index {
    /// Entries of the batch log from sequence number `from_seq` on, as
    /// many as fit in `max_bytes` of stored entries (at least one if there
    /// is one), with the log's first and last numbers. A copy restored
    /// from a snapshot of this shard holds the batches up to its own
    /// `last_seq` and reads from the one after. [`Error::LogTruncated`](crate::Error::LogTruncated)
    /// if the log no longer reaches back to `from_seq` (re-seed the copy
    /// from a snapshot); [`Error::LogAhead`](crate::Error::LogAhead) if `from_seq` is past the
    /// next batch.
    pub fn read_log(&self, from_seq: u64, max_bytes: u64) -> Result<LogRead> {
        let _shared = self.resize.read();
        let txn = self.store.env.read_txn().map_err(|e| self.store.err(e))?;
        let state = session::read_state(&self.store, &txn)?;
        batch_log::read(&self.store, &txn, &state, from_seq, max_bytes, self.params.dim as usize)
    }

    /// Checks the stored values from `from` on against their checksums,
    /// about `budget_bytes` of them (at least one value), in one read
    /// transaction: a background scrub calls this in a loop at its own
    /// pace, starting each step where the last one ended.
    /// [`Error::Corrupt`](crate::Error::Corrupt) names the first damaged
    /// value found.
    pub fn scrub(&self, from: &ScrubCursor, budget_bytes: u64) -> Result<ScrubStep> {
        let _shared = self.resize.read();
        let txn = self.store.env.read_txn().map_err(|e| self.store.err(e))?;
        scrub::step(&self.store, &txn, from, budget_bytes)
    }

    /// The `k` nearest live points to `query`.
    pub fn search(&self, query: &[f32], params: SearchParams) -> Result<Vec<Hit>> {
        self.search_until(query, params, &Stop::never())
    }

    /// As [`Index::search`](crate::Index::search), but gives up with [`Error::Stopped`](crate::Error::Stopped) once
    /// `stop` says so (a deadline passed, the caller went away).
    pub fn search_until(&self, query: &[f32], params: SearchParams, stop: &Stop) -> Result<Vec<Hit>> {
        self.search_with(query, params, stop).map(|f| f.hits)
    }

    /// As [`Index::search_until`], with what the search did to find them.
    pub fn search_with(&self, query: &[f32], params: SearchParams, stop: &Stop) -> Result<crate::Found> {
        params.validate()?;
        let query = session::prepare_query(&self.params, query)?;
        let shared = self.resize.read();
        let mut s = self.take_session()?;
        let result = s.search(&self.store, &shared, &self.params, &query, params, self.opts.rescore, &self.opts.planner, stop);
        self.return_session_after(s, &result);
        result
    }

    /// The live point with external id `id`.
    pub fn get(&self, id: u64) -> Result<Option<StoredPoint>> {
        let shared = self.resize.read();
        let mut s = self.take_session()?;
        let result = s.get(&self.store, &shared, &self.params, id);
        self.return_session_after(s, &result);
        result
    }

    /// The highest offset applied for `source`, if any: where an ingest job
    /// resumes.
    pub fn offset(&self, source: &str) -> Result<Option<u64>> {
        check_source(source)?;
        self.snapshot()?.offset(source)
    }

    /// Every source's highest applied offset.
    pub fn offsets(&self) -> Result<Vec<(String, u64)>> {
        self.snapshot()?.offsets()
    }

    /// A consistent view of the last commit: everything read through it
    /// sees the same state, whatever commits meanwhile. Hold it briefly: it
    /// pins the pages of its commit and delays map growth.
    pub fn snapshot(&self) -> Result<Snapshot<'_>> {
        let guard = self.resize.read();
        let generation = self.generation.load(Ordering::Acquire);
        let session = Session::open(&self.store, &self.log, generation, &self.moved, self.opts.cache_budget_bytes)?;
        Ok(Snapshot { index: self, session, shared: guard })
    }

    /// Counters and sizes.
    pub fn stats(&self) -> Result<IndexStats> {
        let snap = self.snapshot()?;
        let s = snap.session.state;
        Ok(IndexStats {
            params: self.params,
            live: s.live,
            tombstones: s.tombstones,
            vacuumed: s.vacuumed,
            max_level: s.entry.map(|e| e.1),
            disk_bytes: self.store.disk_bytes(),
            map_size: self.store.map_size(),
            used_bytes: self.store.used_bytes(),
            commits: self.generation.load(Ordering::Acquire),
            link_log_lists: snap.session.log_records(),
            link_log_fold_cursor: snap.session.log_fold_cursor(),
            epoch: s.shard_epoch,
            last_seq: s.last_seq,
            batch_log_first_seq: s.log_first_seq,
            batch_log_entries: s.log_entries(),
            batch_log_bytes: s.log_bytes,
            free_bytes: self.store.free_bytes(&snap.session.txn)?,
            table_bytes: self.store.table_bytes(&snap.session.txn)?,
        })
    }

    pub(super) fn take_session(&self) -> Result<Session> {
        let generation = self.generation.load(Ordering::Acquire);
        while let Some(s) = self.sessions.lock().pop() {
            if s.generation == generation {
                return Ok(s);
            }
        }
        Session::open(&self.store, &self.log, generation, &self.moved, self.opts.cache_budget_bytes)
    }

    /// Keeps `s` for reuse unless its read failed in LMDB or on damaged
    /// data: LMDB marks a transaction that met an error unusable (every
    /// later read is `MDB_BAD_TXN`), so the next read starts a fresh one.
    pub(super) fn return_session_after<T>(&self, s: Session, result: &Result<T>) {
        if matches!(result, Ok(_) | Err(Error::Stopped { .. } | Error::Invalid(_))) {
            self.return_session(s);
        }
    }

    fn return_session(&self, s: Session) {
        if s.generation == self.generation.load(Ordering::Acquire) {
            let mut idle = self.sessions.lock();
            if idle.len() < self.opts.max_idle_sessions {
                idle.push(s);
            }
        }
    }
}

/// A consistent read view of one commit (see [`Index::snapshot`](crate::Index::snapshot)).
pub struct Snapshot<'i> {
    pub(super) index: &'i Index,
    pub(super) session: Session,
    pub(super) shared: RwLockReadGuard<'i, SharedAddrs>,
}

impl Snapshot<'_> {
    /// The `k` nearest live points, as of this snapshot.
    pub fn search(&mut self, query: &[f32], params: SearchParams) -> Result<Vec<Hit>> {
        self.search_until(query, params, &Stop::never())
    }

    /// As [`Snapshot::search`], but gives up with [`Error::Stopped`](crate::Error::Stopped) once
    /// `stop` says so.
    pub fn search_until(&mut self, query: &[f32], params: SearchParams, stop: &Stop) -> Result<Vec<Hit>> {
        params.validate()?;
        let query = session::prepare_query(&self.index.params, query)?;
        let opts = &self.index.opts;
        Ok(self
            .session
            .search(&self.index.store, &self.shared, &self.index.params, &query, params, opts.rescore, &opts.planner, stop)?
            .hits)
    }

    /// The live point with external id `id`, as of this snapshot.
    pub fn get(&mut self, id: u64) -> Result<Option<StoredPoint>> {
        self.session.get(&self.index.store, &self.shared, &self.index.params, id)
    }

    /// Live points.
    pub fn len(&self) -> u64 {
        self.session.state.live
    }

    /// True if no live point exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Highest applied offset of `source`.
    pub fn offset(&self, source: &str) -> Result<Option<u64>> {
        check_source(source)?;
        self.session.offset(&self.index.store, source)
    }

    /// The shard's epoch.
    pub fn epoch(&self) -> u64 {
        self.session.state.shard_epoch
    }

    /// Sequence number of the last applied batch (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.session.state.last_seq
    }

    /// Every source's highest applied offset.
    pub fn offsets(&self) -> Result<Vec<(String, u64)>> {
        self.session.offsets(&self.index.store)
    }

    /// A digest of every live point (id, vector, payload) as of this
    /// snapshot: equal on two copies exactly when they hold the same
    /// points. A full scan, for checks, never for the write path.
    pub fn digest(&self) -> Result<crate::ContentDigest> {
        self.session.digest(&self.index.store, &self.index.params)
    }

    /// Vectors that had to be copied because LMDB misaligned them. The
    /// layout is designed so this stays zero; tests check it.
    pub fn unaligned_vectors(&self) -> usize {
        self.session.unaligned_vectors()
    }

    /// Bytes held by this snapshot's caches and the shared vector table.
    pub fn cache_bytes(&self) -> usize {
        self.session.cache_bytes() + self.shared.bytes()
    }
}

fn check_source(source: &str) -> Result<(), InvalidInput> {
    if source.is_empty() || source.len() > crate::batch::MAX_SOURCE_BYTES {
        return Err(InvalidInput::BadSourceName { len: source.len(), max: crate::batch::MAX_SOURCE_BYTES });
    }
    Ok(())
}
