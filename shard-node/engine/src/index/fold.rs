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
use crate::session;

/// What an idle fold did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldOutcome {
    /// Lists the fold took out of the log (a list logged by two batches
    /// counts twice).
    pub lists: u64,
    /// Bottom-layer blocks rewritten.
    pub blocks: u64,
}

/// What one step of a fold did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldStep {
    /// Lists the step took out of the log (only the step that ends a pass
    /// takes any: the values go with it).
    pub lists: u64,
    /// Bottom-layer blocks rewritten.
    pub blocks: u64,
    /// The pass has ended (or the log was empty).
    pub ended: bool,
}

impl Index {
    /// True if the link log holds at least `IndexOptions::idle_fold_ratio`
    /// lists per node of the graph, or a fold is under way (see
    /// [`Index::fold_link_log_step`]): the shard node then folds it, a step
    /// at a time, when its writer is idle. False while a copy (a snapshot)
    /// streams, whose pages the fold's rewrite would keep from being
    /// reused, and with a ratio of 0.
    pub fn fold_due(&self) -> Result<bool> {
        let ratio = self.opts.idle_fold_ratio;
        if ratio <= 0.0 || self.copies.load(Ordering::Acquire) > 0 {
            return Ok(false);
        }
        let snap = self.snapshot()?;
        let lists = snap.session.log_records();
        let s = snap.session.state;
        Ok(lists > 0 && (snap.session.log_fold_cursor().is_some() || lists as f64 >= ratio * (s.live + s.tombstones) as f64))
    }

    /// Writes every list of the link log into its block and empties the
    /// log of what it held when the fold began (batches may append more
    /// meanwhile): the steps of [`Index::fold_link_log_step`] until no
    /// value of that time is left. A pass under way when the fold began
    /// covers only the values before it, so its end may start another.
    /// Nothing a search returns changes.
    pub fn fold_link_log(&self) -> Result<FoldOutcome> {
        let _span = tracing::debug_span!("engine.fold").entered();
        let newest = self.snapshot()?.session.log_newest_value();
        let mut total = FoldOutcome { lists: 0, blocks: 0 };
        loop {
            let step = self.fold_link_log_step()?;
            total.lists += step.lists;
            total.blocks += step.blocks;
            if step.ended {
                // Values are keyed by increasing epochs: one at or below
                // `newest` was there when the fold began.
                let oldest = self.snapshot()?.session.log_oldest_value();
                if !matches!((oldest, newest), (Some(o), Some(n)) if o <= n) {
                    return Ok(total);
                }
            }
        }
    }

    /// One step of a fold: the next `IndexOptions::fold_step_blocks`
    /// blocks of the pass under way (starting one over every value the log
    /// holds if none is), in one write transaction queued behind the
    /// writer like a batch, so that no commit rewrites every block and
    /// batches go on between steps. The step that reaches the last block
    /// deletes the values the pass folded. Nothing a search returns
    /// changes.
    pub fn fold_link_log_step(&self) -> Result<FoldStep> {
        let _writer = self.writer.lock();
        loop {
            let attempt = {
                let _shared = self.resize.read();
                self.fold_once()
            };
            match attempt {
                Ok(step) => return Ok(step),
                Err(Attempt::MapFull) => self.grow_map()?,
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
    }

    fn fold_once(&self) -> Result<FoldStep, Attempt> {
        let store = &self.store;
        let mut wtxn = store.env.write_txn().map_err(|e| attempt(store, e))?;
        let state = session::read_state(store, &wtxn)?;
        let log = self.log.get(state.log_epoch).ok_or_else(|| Error::Corrupt {
            path: store.path.clone(),
            detail: format!("link log epoch {} has no index (the file changed under the index?)", state.log_epoch),
        })?;
        if log.is_empty() {
            wtxn.abort();
            return Ok(FoldStep { lists: 0, blocks: 0, ended: true });
        }
        let (range, ended) = self.step_range(&log, state.next_id, self.opts.fold_step_blocks);
        let blocks = self.patch_blocks(&mut wtxn, state.next_id, &[], &log, range.clone())?;
        let next = self.fold_range(&mut wtxn, &log, range, ended)?;
        let lists = log.records() - next.records();
        let new_state = codec::State { log_epoch: state.log_epoch + 1, ..state };
        store.dbs.meta.put(&mut wtxn, codec::META_STATE, &new_state.encode()).map_err(|e| attempt(store, e))?;
        self.commit(wtxn, &state, &new_state, Some(next), false)?;
        Ok(FoldStep { lists, blocks: blocks as u64, ended })
    }
}
