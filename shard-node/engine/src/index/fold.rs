//! Folding the link log into the bottom-layer blocks while the shard is
//! idle, so searches read lists where their neighbours' lists are.
//!
//! A batch appends the lists it changes to the link log rather than patch
//! their blocks (see [`LinkLog`](crate::LinkLog)), and only folds once the
//! log would pass `fold_lists`. Under churn that threshold is reached only
//! after most lists have been logged: after ten rounds of `loadtest
//! churn` at 100k, 101,269 lists were in the log and a search walked
//! them there, scattered over the batches' values in the order the
//! batches wrote them, instead of in blocks of consecutive ids. With the
//! same instructions and distances as a fresh build (callgrind), the
//! churned index searched at 0.85x its speed. Folding while idle, as
//! vacuum and compaction run, gives searches the blocks back and takes
//! the fold's rewrite of every block out of a batch's commit.

use std::sync::atomic::Ordering;

use super::Index;
use super::writer::{Attempt, attempt};
use crate::codec;
use crate::error::{Error, Result};
use crate::links_log::LogIndex;
use crate::session;

/// What an idle fold did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldOutcome {
    /// Lists the log held (a list logged by two batches counts twice).
    pub lists: u64,
    /// Bottom-layer blocks rewritten.
    pub blocks: u64,
}

impl Index {
    /// True if the link log holds at least `IndexOptions::idle_fold_ratio`
    /// lists per node of the graph: the shard node then folds it when its
    /// writer is idle. False while a copy (a snapshot) streams, whose pages
    /// the fold's rewrite would keep from being reused.
    pub fn fold_due(&self) -> Result<bool> {
        let ratio = self.opts.idle_fold_ratio;
        if ratio <= 0.0 || self.copies.load(Ordering::Acquire) > 0 {
            return Ok(false);
        }
        let snap = self.snapshot()?;
        let lists = snap.session.log_records();
        let s = snap.session.state;
        Ok(lists > 0 && lists as f64 >= ratio * (s.live + s.tombstones) as f64)
    }

    /// Writes every list of the link log into its block and empties the
    /// log, in one write transaction queued behind the writer like a batch.
    /// Nothing a search returns changes.
    pub fn fold_link_log(&self) -> Result<FoldOutcome> {
        let _writer = self.writer.lock();
        let _span = tracing::debug_span!("engine.fold").entered();
        loop {
            let attempt = {
                let _shared = self.resize.read();
                self.fold_once()
            };
            match attempt {
                Ok(outcome) => return Ok(outcome),
                Err(Attempt::MapFull) => self.grow_map()?,
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
    }

    fn fold_once(&self) -> Result<FoldOutcome, Attempt> {
        let store = &self.store;
        let mut wtxn = store.env.write_txn().map_err(|e| attempt(store, e))?;
        let state = session::read_state(store, &wtxn)?;
        let log = self.log.get(state.log_epoch).ok_or_else(|| Error::Corrupt {
            path: store.path.clone(),
            detail: format!("link log epoch {} has no index (the file changed under the index?)", state.log_epoch),
        })?;
        if log.is_empty() {
            wtxn.abort();
            return Ok(FoldOutcome { lists: 0, blocks: 0 });
        }
        let blocks = self.patch_blocks(&mut wtxn, state.next_id, &[], &log)?;
        store.dbs.links0_log.clear(&mut wtxn).map_err(|e| attempt(store, e))?;
        let new_state = codec::State { log_epoch: state.log_epoch + 1, ..state };
        store.dbs.meta.put(&mut wtxn, codec::META_STATE, &new_state.encode()).map_err(|e| attempt(store, e))?;
        self.commit(wtxn, &state, &new_state, Some(LogIndex::default()), false)?;
        Ok(FoldOutcome { lists: log.records(), blocks: blocks as u64 })
    }
}
