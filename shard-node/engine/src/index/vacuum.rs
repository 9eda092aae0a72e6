//! The online vacuum: tombstones are unlinked from the graph and their
//! vectors dropped, a bounded step per write transaction, while ingest and
//! searches go on. Their slots (ids, codes, link places) then wait for new
//! points (`IndexOptions::reuse_retired`), vacuumed ones first.
//!
//! Each step is one commit, so a crash leaves either all of a step or none
//! of it; the next step starts where the last committed one stopped (the
//! retired table says which ids are still linked).

use std::sync::atomic::Ordering;

use heed::RwTxn;

use super::Index;
use super::writer::{Attempt, attempt};
use crate::cache::SharedAddrs;
use crate::codec::{self, NODE_VACUUMED, State};
use crate::error::{Error, Result};
use crate::hnsw::build::{BuildCtx, Overlay, WorkQueue};
use crate::session;
use crate::table::Retired;
use crate::view::Frozen;

/// What one vacuum step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VacuumOutcome {
    /// Tombstones this step unlinked and reclaimed.
    pub vacuumed: u64,
    /// Tombstones still linked afterwards (the entry point, if retired,
    /// always stays: searches start from it until a new node takes over).
    pub pending: u64,
}

impl Index {
    /// One vacuum step: unlinks up to `max` tombstones from the graph and
    /// drops their vectors, in one write transaction (queued behind the
    /// writer like a batch). Returns what it did and what is left.
    pub fn vacuum(&self, max: usize) -> Result<VacuumOutcome> {
        let _writer = self.writer.lock();
        let _span = tracing::debug_span!("engine.vacuum", max).entered();
        loop {
            let attempt = {
                let shared = self.resize.read();
                self.vacuum_once(max.max(1), &shared)
            };
            match attempt {
                Ok(outcome) => {
                    self.renew_shared_addrs();
                    return Ok(outcome);
                }
                Err(Attempt::MapFull) => self.grow_map()?,
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
    }

    /// True if tombstones still linked into the graph make up at least
    /// `IndexOptions::vacuum_ratio` of its nodes, and from then on until
    /// they are all vacuumed: the shard node runs vacuum steps whenever
    /// its writer is idle while this holds.
    ///
    /// Why run to the end rather than stop below the ratio: a slot is
    /// reused vacuumed ones first, and a tombstone reused before its
    /// vacuum leaves the in-links it still had pointing at an unrelated
    /// new point. Stopping at the ratio left 5,000 of 7,000 tombstones
    /// linked after each round of `loadtest churn` at 100k.
    pub fn vacuum_due(&self) -> Result<bool> {
        let snap = self.snapshot()?;
        let s = snap.session.state;
        let pending = s.tombstones - s.vacuumed;
        let nodes = s.live + s.tombstones;
        // One pending tombstone can be the retired entry point, which
        // stays until a new node takes over.
        if pending <= 1 {
            self.vacuum_running.store(false, Ordering::Relaxed);
            return Ok(false);
        }
        if pending as f64 >= self.opts.vacuum_ratio * nodes as f64 {
            self.vacuum_running.store(true, Ordering::Relaxed);
        }
        Ok(self.vacuum_running.load(Ordering::Relaxed))
    }

    fn vacuum_once(&self, max: usize, shared: &SharedAddrs) -> Result<VacuumOutcome, Attempt> {
        let store = &self.store;
        let mut wtxn = store.env.write_txn().map_err(|e| attempt(store, e))?;
        let state = session::read_state(store, &wtxn)?;
        let pending = state.tombstones - state.vacuumed;
        let Some(entry) = state.entry else {
            wtxn.abort();
            return Ok(VacuumOutcome { vacuumed: 0, pending });
        };
        let ids = self.retired_ids(&wtxn, Retired::Linked, max, &state, Some(entry.0))?;
        if ids.is_empty() {
            wtxn.abort();
            return Ok(VacuumOutcome { vacuumed: 0, pending });
        }
        let log = self.log.get(state.log_epoch).ok_or_else(|| Error::Corrupt {
            path: store.path.clone(),
            detail: format!("link log epoch {} has no index (the file changed under the index?)", state.log_epoch),
        })?;
        // No new node: the overlay only gathers the lists the step changes.
        let overlay = Overlay::new(state.next_id, Vec::new(), Vec::new());
        // A table of its own: this step is rare, and its blocks would
        // crowd out the batches' (their writes are forgotten either way).
        let mut link_blocks = self.new_link_blocks();
        link_blocks.prepare(state.next_id);
        let shared = (shared.valid_for == self.moved.load(Ordering::SeqCst)).then_some(shared);
        let ctx = BuildCtx {
            store,
            params: &self.params,
            overlay: &overlay,
            link_blocks: &link_blocks,
            has_tombstones: true,
            live: state.live,
            cache_budget: self.opts.cache_budget_bytes,
            frozen: shared.map(|s| Frozen::new(s, state.next_id)),
            log: &log,
        };
        {
            let _span = tracing::debug_span!("unlink", tombstones = ids.len()).entered();
            let queue = WorkQueue::new(ids.len());
            ctx.run(&wtxn, self.pool.as_deref(), |view, w| match queue.pop() {
                Some(i) => ctx.unlink(view, w, ids[i], entry).map(|()| true),
                None => Ok(false),
            })?;
        }
        let new_log = {
            let _span = tracing::debug_span!("write_links", lists = tracing::field::Empty, blocks = tracing::field::Empty).entered();
            self.write_links(&mut wtxn, overlay.into_changes(), state.next_id, state.log_epoch, &log)?
        };
        self.reclaim(&mut wtxn, &ids)?;
        let new_state =
            State { vacuumed: state.vacuumed + ids.len() as u64, log_epoch: state.log_epoch + u64::from(new_log.is_some()), ..state };
        store.dbs.meta.put(&mut wtxn, codec::META_STATE, &new_state.encode()).map_err(|e| attempt(store, e))?;
        // The vacuum leaves code and vector blocks as they are (`reclaim`),
        // so the shared addresses stay good across its steps.
        self.commit(wtxn, &state, &new_state, new_log, false)?;
        Ok(VacuumOutcome { vacuumed: ids.len() as u64, pending: pending - ids.len() as u64 })
    }

    /// Drops the payloads of unlinked tombstones and files them as vacuumed.
    /// Their vectors and codes stay in their blocks until the slot is
    /// reused: rewriting a block to blank one vector would copy its pages
    /// for no reader's benefit (nothing reads a vacuumed slot), and a
    /// compaction copies the blocks as they are.
    fn reclaim(&self, wtxn: &mut RwTxn<'_>, ids: &[u32]) -> Result<(), Attempt> {
        let store = &self.store;
        let dbs = &store.dbs;
        let err = |e| attempt(store, e);
        for &id in ids {
            let mut record = session::read_node(store, wtxn, id)?;
            record.flags |= NODE_VACUUMED;
            dbs.nodes.put(wtxn, id, &record.encode()).map_err(err)?;
            dbs.payloads.delete(wtxn, id).map_err(err)?;
            dbs.retired.delete(wtxn, (Retired::Linked, id)).map_err(err)?;
            dbs.retired.put(wtxn, (Retired::Vacuumed, id), &[]).map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{Graph, NodeCache, TxnView};
    use crate::{Batch, IndexOptions, IndexParams, Metric, Op, Point};

    /// Links from live nodes to tombstones, on every layer.
    fn links_into_tombstones(index: &Index) -> usize {
        let store = &index.store;
        let txn = store.env.read_txn().unwrap();
        let state = session::read_state(store, &txn).unwrap();
        let log = index.log.get(state.log_epoch).unwrap();
        let mut cache = NodeCache::new(1 << 20);
        // SAFETY: a new cache, no shared addresses, the log of this state.
        let mut view = unsafe { TxnView::new(&txn, store, &mut cache, None, &log, &index.params) };
        let (mut out, mut found) = (Vec::new(), 0);
        for id in 0..state.next_id {
            let node = view.node(id).unwrap();
            if node.is_tombstone() {
                continue;
            }
            for l in 0..=node.level {
                view.links(id, l, &mut out).unwrap();
                for &t in &out {
                    found += usize::from(view.node(t).unwrap().is_tombstone());
                }
            }
        }
        found
    }

    /// The vacuum finds the in-links of a tombstone without a scan. On
    /// random 24-d data (little locality) it finds about two thirds of
    /// them (measured: 938 links into 1,336 tombstones before, 326 after;
    /// twice the search's ef finds three quarters, 985 → 235); the rest
    /// still route through the tombstone's kept lists.
    #[test]
    fn vacuumed_tombstones_lose_their_in_links() {
        use rand::{Rng, SeedableRng};
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 2, durable: false, reuse_retired: false, ..IndexOptions::default() };
        let index = Index::open_or_create(dir.path(), IndexParams::new(24, Metric::Euclidean), opts).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut upserts = |ids: std::ops::Range<u64>| {
            let ops = ids.map(|id| Op::Upsert(Point { id, vector: (0..24).map(|_| rng.random_range(-1.0..1.0)).collect(), payload: None }));
            index.apply(Batch { ops: ops.collect(), source: None }).unwrap();
        };
        upserts(0..4000);
        // Deletes between inserts, as churn comes.
        for round in 0..4u64 {
            index.apply(Batch { ops: (round..4000).step_by(12).map(Op::Delete).collect(), source: None }).unwrap();
            upserts(4000 + round * 300..4300 + round * 300);
        }
        let before = links_into_tombstones(&index);
        while index.vacuum(1000).unwrap().vacuumed > 0 {}
        let after = links_into_tombstones(&index);
        assert!(after * 2 < before, "{before} links into tombstones before the vacuum, {after} after");
    }
}
