//! Linking a batch into the graph, in parallel, inside the write transaction.
//!
//! By the time this runs, the batch's vectors and node records are already
//! written to the (uncommitted) write transaction. Each thread then opens a
//! nested read transaction on it, so it reads old and new vectors alike
//! straight from LMDB, touching only the pages its searches need. Link
//! changes never go to LMDB during this phase: the readers forbid writes.
//! They are collected in an [`Overlay`] that every thread reads through, so
//! new nodes of the same batch find each other, and the caller writes them
//! once all readers are gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use dashmap::DashMap;
use heed::{RoTxn, RwTxn, WithoutTls};
use parking_lot::{Mutex, MutexGuard, RawMutex, lock_api::ArcMutexGuard};
use rustc_hash::FxBuildHasher;

use crate::error::{Error, Result};
use crate::hnsw::{Scored, Scratch};
use crate::links_log::LogIndex;
use crate::params::IndexParams;
use crate::quant::Code;
use crate::store::Store;
use crate::view::{Frozen, Graph, NodeCache, TxnView};

/// Link lists changed by the batch, held in memory until the readers close.
pub(crate) struct Overlay {
    pub(super) first_new: u32,
    /// Retired ids the batch gives to new points, ascending. New nodes are
    /// these, then `first_new..`; `levels` and `new_links` follow that order.
    pub(super) reused: Vec<u32>,
    /// One bit per id below `first_new`: set for the reused ones.
    pub(super) reused_bits: Vec<u64>,
    /// One bit per id below `first_new`: set once a reused node has its own
    /// lists on every level. Lists of existing nodes can still name a
    /// reused slot (links to the retired node that no repair or vacuum
    /// found), so a walk could reach a reused node before it is linked and
    /// start from its empty lists: measured, one in ten reused nodes of a
    /// batch then linked to the few far nodes such a dead end offered, and
    /// 8% of them were not found by a search for their own vector.
    pub(super) reused_linked: Vec<AtomicU64>,
    pub(super) levels: Vec<u8>,
    /// New nodes: one list per level they live on.
    pub(super) new_links: Vec<Box<[Mutex<Vec<u32>>]>>,
    /// Lists of existing nodes that the batch changed, keyed (level, id).
    pub(super) touched: DashMap<(u8, u32), Arc<Mutex<Vec<u32>>>, FxBuildHasher>,
    /// One bit per existing id: set once any of its lists is in `touched`,
    /// so reads of untouched nodes skip the map.
    pub(super) touched_bits: Vec<AtomicU64>,
}

/// A lock on one link list, new or existing.
pub(super) enum ListGuard<'o> {
    New(MutexGuard<'o, Vec<u32>>),
    Touched(ArcMutexGuard<RawMutex, Vec<u32>>),
}

impl std::ops::Deref for ListGuard<'_> {
    type Target = Vec<u32>;
    fn deref(&self) -> &Vec<u32> {
        match self {
            ListGuard::New(g) => g,
            ListGuard::Touched(g) => g,
        }
    }
}

impl std::ops::DerefMut for ListGuard<'_> {
    fn deref_mut(&mut self) -> &mut Vec<u32> {
        match self {
            ListGuard::New(g) => g,
            ListGuard::Touched(g) => g,
        }
    }
}

impl Overlay {
    /// The overlay of a batch whose new nodes are `reused` (ascending, all
    /// below `first_new`) and then `first_new..`, with `levels` in that order.
    pub(crate) fn new(first_new: u32, reused: Vec<u32>, levels: Vec<u8>) -> Self {
        let new_links = levels.iter().map(|&l| (0..=l).map(|_| Mutex::new(Vec::new())).collect::<Box<[_]>>()).collect();
        let words = (first_new as usize).div_ceil(64);
        let mut reused_bits = vec![0u64; if reused.is_empty() { 0 } else { words }];
        for &id in &reused {
            reused_bits[id as usize / 64] |= 1 << (id % 64);
        }
        let reused_linked = (0..reused_bits.len()).map(|_| AtomicU64::new(0)).collect();
        Overlay {
            first_new,
            reused,
            reused_bits,
            reused_linked,
            levels,
            new_links,
            touched: DashMap::with_hasher(FxBuildHasher),
            touched_bits: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    pub(super) fn is_new(&self, id: u32) -> bool {
        id >= self.first_new || self.reused_bits.get(id as usize / 64).is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    /// Whether `id` is a reused node not yet linked: a walk must not step
    /// onto it (see `reused_linked`).
    #[inline]
    fn is_unlinked_reuse(&self, id: u32) -> bool {
        let (w, bit) = (id as usize / 64, 1u64 << (id % 64));
        self.reused_bits.get(w).is_some_and(|r| r & bit != 0)
            && self.reused_linked.get(w).is_some_and(|l| l.load(Ordering::Acquire) & bit == 0)
    }

    /// Marks reused node `id` as linked: walks may reach it from now on.
    pub(super) fn mark_linked(&self, id: u32) {
        if let Some(l) = self.reused_linked.get(id as usize / 64) {
            l.fetch_or(1 << (id % 64), Ordering::Release);
        }
    }

    /// Where new node `id` is in the batch's order (None: not new).
    fn slot_of_new(&self, id: u32) -> Option<usize> {
        if id >= self.first_new {
            return Some(self.reused.len() + (id - self.first_new) as usize);
        }
        self.reused.binary_search(&id).ok()
    }

    /// The id of the batch's `i`-th new node.
    pub(crate) fn new_id(&self, i: usize) -> u32 {
        match self.reused.get(i) {
            Some(&id) => id,
            None => self.first_new + (i - self.reused.len()) as u32,
        }
    }

    pub(crate) fn level_of_new(&self, id: u32) -> u8 {
        self.slot_of_new(id).and_then(|i| self.levels.get(i)).copied().unwrap_or(0)
    }

    /// The list of new node `id` on `level`. An id past the batch or a level
    /// above the node's can only come from a corrupt link list.
    pub(super) fn new_list(&self, store: &Store, id: u32, level: u8) -> Result<&Mutex<Vec<u32>>> {
        self.slot_of_new(id).and_then(|i| self.new_links.get(i)).and_then(|levels| levels.get(level as usize)).ok_or_else(|| {
            Error::Corrupt {
                path: store.path.clone(),
                detail: format!("a link list names node {id} on level {level}, which does not exist"),
            }
        })
    }

    pub(super) fn bit(&self, id: u32) -> (&AtomicU64, u64) {
        (&self.touched_bits[id as usize / 64], 1u64 << (id % 64))
    }

    /// Locks the list of `id` on `level` for modification, loading an
    /// existing node's list from `base` on first touch.
    pub(super) fn list_mut<'o>(&'o self, base: &mut TxnView<'_>, id: u32, level: u8) -> Result<ListGuard<'o>> {
        if self.is_new(id) {
            return Ok(ListGuard::New(self.new_list(base.store(), id, level)?.lock()));
        }
        let key = (level, id);
        let existing = self.touched.get(&key).map(|r| Arc::clone(&r));
        let list = match existing {
            Some(list) => list,
            None => {
                let mut init = Vec::new();
                base.links(id, level, &mut init)?;
                let list = Arc::clone(&self.touched.entry(key).or_insert_with(|| Arc::new(Mutex::new(init))));
                let (word, mask) = self.bit(id);
                word.fetch_or(mask, Ordering::Release);
                list
            }
        };
        Ok(ListGuard::Touched(list.lock_arc()))
    }

    /// The changes, once every thread is done with the overlay.
    pub(crate) fn into_changes(self) -> LinkChanges {
        let new = self.new_links.into_iter().map(|levels| levels.into_vec().into_iter().map(Mutex::into_inner).collect()).collect();
        let mut touched: Vec<((u8, u32), Vec<u32>)> = self
            .touched
            .into_iter()
            .map(|(k, list)| {
                let list = Arc::try_unwrap(list).map_or_else(|shared| shared.lock().clone(), Mutex::into_inner);
                (k, list)
            })
            .collect();
        touched.sort_unstable_by_key(|(k, _)| *k);
        LinkChanges { first_new: self.first_new, reused: self.reused, new, touched }
    }
}

/// The link lists to write: every new node's, and the changed existing ones.
pub(crate) struct LinkChanges {
    pub(crate) first_new: u32,
    /// The reused ids, the first new nodes (see [`Overlay`]).
    pub(crate) reused: Vec<u32>,
    /// Per new node (reused ids, then `first_new..`), per level.
    pub(crate) new: Vec<Vec<Vec<u32>>>,
    /// Changed lists of existing nodes, sorted by (level, id).
    pub(crate) touched: Vec<((u8, u32), Vec<u32>)>,
}

impl LinkChanges {
    /// The id of the `i`-th new node.
    pub(crate) fn new_id(&self, i: usize) -> u32 {
        match self.reused.get(i) {
            Some(&id) => id,
            None => self.first_new + (i - self.reused.len()) as u32,
        }
    }
}

/// The graph as a builder thread sees it: committed and uncommitted data
/// through its nested reader, link changes through the overlay.
pub(crate) struct BuildView<'t> {
    pub(super) base: TxnView<'t>,
    pub(super) overlay: &'t Overlay,
    pub(super) link_blocks: &'t LinkBlocks,
    pub(super) has_tombstones: bool,
}

impl BuildView<'_> {
    /// The list of `id` on `level` as the batch has it so far: the
    /// overlay's for new and changed nodes, else the committed one.
    fn links_as_stored(&mut self, id: u32, level: u8, out: &mut Vec<u32>) -> Result<()> {
        let ov = self.overlay;
        if ov.is_new(id) {
            let list = ov.new_list(self.base.store(), id, level)?.lock();
            out.clear();
            out.extend_from_slice(&list);
            return Ok(());
        }
        let (word, mask) = ov.bit(id);
        if word.load(Ordering::Acquire) & mask != 0 {
            let list = ov.touched.get(&(level, id)).map(|r| Arc::clone(&r));
            if let Some(list) = list {
                out.clear();
                out.extend_from_slice(&list.lock());
                return Ok(());
            }
        }
        if level == 0 {
            let link_blocks = self.link_blocks;
            return self.base.links0(id, out, |v| link_blocks.get(v, id));
        }
        self.base.links(id, level, out)
    }
}

impl<'t> Graph<'t> for BuildView<'t> {
    #[inline]
    fn code(&mut self, id: u32) -> Result<Code<'t>> {
        self.base.code(id)
    }

    #[inline]
    fn links(&mut self, id: u32, level: u8, out: &mut Vec<u32>) -> Result<()> {
        self.links_as_stored(id, level, out)?;
        let ov = self.overlay;
        if !ov.reused.is_empty() {
            out.retain(|&x| !ov.is_unlinked_reuse(x));
        }
        Ok(())
    }

    #[inline]
    fn is_tombstone(&mut self, id: u32) -> Result<bool> {
        if !self.has_tombstones || self.overlay.is_new(id) {
            return Ok(false);
        }
        self.base.is_tombstone(id)
    }

    #[inline]
    fn prefetch_links(&mut self, id: u32, level: u8) {
        // Lists the batch changed live in the overlay; the rest in the map.
        if level == 0
            && !self.overlay.is_new(id)
            && !self.base.prefetch_logged(id)
            && let Some(block) = self.link_blocks.known(id)
        {
            self.base.prefetch_links0_in(block, id);
        }
    }
}

/// Addresses of the bottom-layer link blocks as the last commit left them,
/// shared by the builder threads of a batch and kept from batch to batch
/// by the writer (`Index::link_blocks`).
///
/// Within the linking phase nothing is written to LMDB (changes go to the
/// [`Overlay`]), so an address one nested reader found is valid for all of
/// them, and each block is looked up once per batch instead of once per
/// thread. Across commits, an address stays valid as long as its block's
/// leaf page is not rewritten: blocks are inline values, a few to a leaf
/// page, and a commit that writes one of them copies the whole page. So
/// `Index::patch_blocks`, the only writer of blocks, forgets every block
/// that may share a page with one it writes or appends
/// ([`LinkBlocks::forget_near`]); a remap of the map or a compaction
/// forgets everything. Without this, each batch into 1M points looked up
/// nearly all of its ~32k blocks through the B-tree again: LMDB's B-tree
/// code was 11% of such a batch's CPU time, 5.4% with it
/// (docs/benchmarks.md, "Variants on 1k into 1M").
/// Readers other than the writer's never use it: a search on an older
/// snapshot needs that snapshot's pages.
pub(crate) struct LinkBlocks {
    pub(super) per_block: u32,
    pub(super) blocks: Vec<AtomicUsize>,
    /// Blocks that may share a leaf page with a given block, on either
    /// side of it.
    reach: u32,
}

impl LinkBlocks {
    /// An empty table for blocks of `per_block` lists (at least 1), of
    /// which a leaf page holds at most `per_leaf` (`codec::values_per_leaf`):
    /// a page holding block b then holds no block further than
    /// `per_leaf - 1` from it, and forgetting `per_leaf` on each side has
    /// one to spare.
    pub(crate) fn new(per_block: u32, per_leaf: u32) -> Self {
        LinkBlocks { per_block: per_block.max(1), blocks: Vec::new(), reach: per_leaf.max(1) }
    }

    /// Makes room for the blocks of ids below `first_new` (the blocks a
    /// batch's threads may look up through the table).
    pub(crate) fn prepare(&mut self, first_new: u32) {
        let n = first_new.div_ceil(self.per_block) as usize;
        if self.blocks.len() > n {
            self.blocks.truncate(n);
        } else {
            self.blocks.resize_with(n, || AtomicUsize::new(0));
        }
    }

    /// Forgets the addresses of blocks that may share a leaf page with
    /// `block`, which a commit is rewriting.
    pub(crate) fn forget_near(&mut self, block: u32) {
        let from = block.saturating_sub(self.reach) as usize;
        let to = (block.saturating_add(self.reach) as usize + 1).min(self.blocks.len());
        for slot in self.blocks.get_mut(from..to).into_iter().flatten() {
            *slot.get_mut() = 0;
        }
    }

    /// Forgets everything (the map moved, or the file was replaced).
    pub(crate) fn clear(&mut self) {
        self.blocks.clear();
    }

    /// The start of the block holding `id`'s list, through `view` the
    /// first time any thread asks for it.
    #[inline]
    pub(super) fn get(&self, view: &mut TxnView<'_>, id: u32) -> Result<*const u8> {
        let Some(slot) = self.blocks.get((id / self.per_block) as usize) else {
            return view.links0_block_ptr(id);
        };
        let known = slot.load(Ordering::Relaxed);
        if known != 0 {
            // A stale address would read another page's bytes as links:
            // debug builds (every test) check each one against the B-tree.
            #[cfg(debug_assertions)]
            {
                let fresh = view.links0_block_ptr(id)?;
                assert_eq!(known, fresh as usize, "kept address of the link block of node {id} is stale");
            }
            return Ok(known as *const u8);
        }
        let p = view.links0_block_ptr(id)?;
        slot.store(p as usize, Ordering::Relaxed);
        Ok(p)
    }

    /// The start of the block holding `id`'s list, if a thread looked it
    /// up already.
    #[inline]
    pub(super) fn known(&self, id: u32) -> Option<*const u8> {
        let addr = self.blocks.get((id / self.per_block) as usize)?.load(Ordering::Relaxed);
        (addr != 0).then_some(addr as *const u8)
    }
}

/// Read-only context shared by all builder threads.
pub(crate) struct BuildCtx<'a> {
    pub(crate) store: &'a Store,
    pub(crate) params: &'a IndexParams,
    pub(crate) overlay: &'a Overlay,
    pub(crate) link_blocks: &'a LinkBlocks,
    /// True if the graph holds tombstones (old, or retired by this batch).
    pub(crate) has_tombstones: bool,
    /// Live points once the batch commits.
    pub(crate) live: u64,
    /// Per-thread pointer cache budget.
    pub(crate) cache_budget: usize,
    /// Vector addresses shared across threads and transactions.
    pub(crate) frozen: Option<Frozen<'a>>,
    /// The link log as the write transaction found it.
    pub(crate) log: &'a LogIndex,
}

/// One builder thread's reusable buffers.
pub(crate) struct Worker {
    pub(super) scratch: Scratch,
    pub(super) found: Vec<Scored>,
    pub(super) entry: Vec<Scored>,
    pub(super) cands: Vec<Scored>,
    pub(super) chosen: Vec<u32>,
    pub(super) pruned: Vec<u32>,
    /// Back links a new node owes, (level, neighbour and its distance).
    pub(super) back: Vec<(u8, Scored)>,
    pub(super) links: Vec<u32>,
    pub(super) other: Vec<u32>,
    /// Candidates of a repair: the live nodes near a retired one.
    pub(super) pool: Vec<u32>,
}

impl Worker {
    pub(super) fn new() -> Self {
        Worker {
            scratch: Scratch::new(),
            found: Vec::new(),
            entry: Vec::new(),
            cands: Vec::new(),
            chosen: Vec::new(),
            pruned: Vec::new(),
            back: Vec::new(),
            links: Vec::new(),
            other: Vec::new(),
            pool: Vec::new(),
        }
    }
}

impl BuildCtx<'_> {
    /// Runs `work` on the calling thread and on every thread of `pool`, each
    /// with its own nested read transaction on `wtxn` and its own caches.
    /// `work` pulls its items from a shared counter until none are left.
    pub(crate) fn run<F>(&self, wtxn: &RwTxn<'_>, pool: Option<&rayon::ThreadPool>, work: F) -> Result<()>
    where
        F: Fn(&mut BuildView<'_>, &mut Worker) -> Result<bool> + Sync,
    {
        let extra = pool.map_or(0, rayon::ThreadPool::current_num_threads);
        // All readers are opened here, on the thread that owns the write
        // transaction (it is !Sync); each is then moved to one thread.
        let mut readers = Vec::with_capacity(extra + 1);
        for _ in 0..=extra {
            readers.push(wtxn.nested_read_txn().map_err(|e| self.store.err(e))?);
        }
        let failed = AtomicBool::new(false);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let thread_body = |reader: RoTxn<'_, WithoutTls>| {
            let mut cache = NodeCache::new(self.cache_budget);
            // SAFETY: the cache is new, so it holds no pointer of another txn.
            // `frozen` and `log` describe the committed state the write txn
            // started from.
            let base = unsafe { TxnView::new(&reader, self.store, &mut cache, self.frozen, self.log, self.params) };
            let mut view = BuildView { base, overlay: self.overlay, link_blocks: self.link_blocks, has_tombstones: self.has_tombstones };
            let mut worker = Worker::new();
            while !failed.load(Ordering::Relaxed) {
                match work(&mut view, &mut worker) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        first_error.lock().get_or_insert(e);
                    }
                }
            }
        };
        let mut readers = readers.into_iter();
        let own = readers.next();
        match pool {
            Some(pool) => pool.in_place_scope(|scope| {
                for reader in readers {
                    let body = &thread_body;
                    scope.spawn(move |_| body(reader));
                }
                if let Some(own) = own {
                    thread_body(own);
                }
            }),
            None => {
                if let Some(own) = own {
                    thread_body(own);
                }
            }
        }
        match first_error.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Hands out item indices `0..len` to threads.
pub(crate) struct WorkQueue {
    pub(super) next: AtomicUsize,
    pub(super) len: usize,
}

impl WorkQueue {
    pub(crate) fn new(len: usize) -> Self {
        WorkQueue { next: AtomicUsize::new(0), len }
    }

    pub(crate) fn pop(&self) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.len).then_some(i)
    }
}
