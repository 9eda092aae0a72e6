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
use crate::hnsw::{Scored, Scratch, greedy_closest, prefetch_codes, search_layer, select_neighbours};
use crate::links_log::LogIndex;
use crate::params::IndexParams;
use crate::quant::{Code, Precision, Walk};
use crate::stop::Stop;
use crate::store::Store;
use crate::view::{Frozen, Graph, NodeCache, TxnView};

/// Link lists changed by the batch, held in memory until the readers close.
pub(crate) struct Overlay {
    first_new: u32,
    levels: Vec<u8>,
    /// New nodes: one list per level they live on.
    new_links: Vec<Box<[Mutex<Vec<u32>>]>>,
    /// Lists of existing nodes that the batch changed, keyed (level, id).
    touched: DashMap<(u8, u32), Arc<Mutex<Vec<u32>>>, FxBuildHasher>,
    /// One bit per existing id: set once any of its lists is in `touched`,
    /// so reads of untouched nodes skip the map.
    touched_bits: Vec<AtomicU64>,
}

/// A lock on one link list, new or existing.
enum ListGuard<'o> {
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
    pub(crate) fn new(first_new: u32, levels: Vec<u8>) -> Self {
        let new_links = levels.iter().map(|&l| (0..=l).map(|_| Mutex::new(Vec::new())).collect::<Box<[_]>>()).collect();
        let words = (first_new as usize).div_ceil(64);
        Overlay {
            first_new,
            levels,
            new_links,
            touched: DashMap::with_hasher(FxBuildHasher),
            touched_bits: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn is_new(&self, id: u32) -> bool {
        id >= self.first_new
    }

    pub(crate) fn level_of_new(&self, id: u32) -> u8 {
        self.levels.get((id - self.first_new) as usize).copied().unwrap_or(0)
    }

    /// The list of new node `id` on `level`. An id past the batch or a level
    /// above the node's can only come from a corrupt link list.
    fn new_list(&self, store: &Store, id: u32, level: u8) -> Result<&Mutex<Vec<u32>>> {
        self.new_links.get((id - self.first_new) as usize).and_then(|levels| levels.get(level as usize)).ok_or_else(|| Error::Corrupt {
            path: store.path.clone(),
            detail: format!("a link list names node {id} on level {level}, which does not exist"),
        })
    }

    fn bit(&self, id: u32) -> (&AtomicU64, u64) {
        (&self.touched_bits[id as usize / 64], 1u64 << (id % 64))
    }

    /// Locks the list of `id` on `level` for modification, loading an
    /// existing node's list from `base` on first touch.
    fn list_mut<'o>(&'o self, base: &mut TxnView<'_>, id: u32, level: u8) -> Result<ListGuard<'o>> {
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
        LinkChanges { first_new: self.first_new, new, touched }
    }
}

/// The link lists to write: every new node's, and the changed existing ones.
pub(crate) struct LinkChanges {
    pub(crate) first_new: u32,
    /// Per new node (in id order), per level.
    pub(crate) new: Vec<Vec<Vec<u32>>>,
    /// Changed lists of existing nodes, sorted by (level, id).
    pub(crate) touched: Vec<((u8, u32), Vec<u32>)>,
}

/// The graph as a builder thread sees it: committed and uncommitted data
/// through its nested reader, link changes through the overlay.
pub(crate) struct BuildView<'t> {
    base: TxnView<'t>,
    overlay: &'t Overlay,
    link_blocks: &'t LinkBlocks,
    has_tombstones: bool,
}

impl<'t> Graph<'t> for BuildView<'t> {
    #[inline]
    fn code(&mut self, id: u32) -> Result<Code<'t>> {
        self.base.code(id)
    }

    #[inline]
    fn links(&mut self, id: u32, level: u8, out: &mut Vec<u32>) -> Result<()> {
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

/// Addresses of the bottom-layer link blocks that existed before the
/// batch, shared by all of its builder threads.
///
/// Link blocks are rewritten by every commit that changes one of their
/// lists, so their addresses cannot outlive a transaction, and each thread's
/// own cache starts empty every batch: at 100k points (6,700 blocks) every
/// thread looked most of them up through the B-tree once per batch. Within
/// the linking phase nothing is written to LMDB (changes go to the
/// [`Overlay`]), so an address one nested reader found is valid for all of
/// them, and each block is looked up once per batch instead of once per
/// thread.
pub(crate) struct LinkBlocks {
    per_block: u32,
    blocks: Box<[AtomicUsize]>,
}

impl LinkBlocks {
    /// A table for the blocks of ids below `first_new`, `per_block` lists
    /// to a block (`codec::links0_block_nodes`, at least 1).
    pub(crate) fn new(first_new: u32, per_block: u32) -> Self {
        let n = first_new.div_ceil(per_block) as usize;
        LinkBlocks { per_block, blocks: (0..n).map(|_| AtomicUsize::new(0)).collect() }
    }

    /// The start of the block holding `id`'s list, through `view` the
    /// first time any thread asks for it.
    #[inline]
    fn get(&self, view: &mut TxnView<'_>, id: u32) -> Result<*const u8> {
        let Some(slot) = self.blocks.get((id / self.per_block) as usize) else {
            return view.links0_block_ptr(id);
        };
        let known = slot.load(Ordering::Relaxed);
        if known != 0 {
            return Ok(known as *const u8);
        }
        let p = view.links0_block_ptr(id)?;
        slot.store(p as usize, Ordering::Relaxed);
        Ok(p)
    }

    /// The start of the block holding `id`'s list, if a thread looked it
    /// up already.
    #[inline]
    fn known(&self, id: u32) -> Option<*const u8> {
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
    pub(crate) frozen: Frozen<'a>,
    /// The link log as the write transaction found it.
    pub(crate) log: &'a LogIndex,
}

/// One builder thread's reusable buffers.
pub(crate) struct Worker {
    scratch: Scratch,
    found: Vec<Scored>,
    entry: Vec<Scored>,
    cands: Vec<Scored>,
    chosen: Vec<u32>,
    pruned: Vec<u32>,
    /// Back links a new node owes, (level, neighbour and its distance).
    back: Vec<(u8, Scored)>,
    links: Vec<u32>,
    other: Vec<u32>,
}

impl Worker {
    fn new() -> Self {
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
            let base = unsafe { TxnView::new(&reader, self.store, &mut cache, Some(self.frozen), self.log, self.params) };
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

    /// Links new node `node` into the graph, starting from `entry`.
    pub(crate) fn insert(&self, view: &mut BuildView<'_>, w: &mut Worker, node: u32, entry: (u32, u8)) -> Result<()> {
        let metric = self.params.metric;
        let query = view.code(node)?;
        let level = self.overlay.level_of_new(node);
        let (entry_id, top) = entry;
        // The walk only gathers candidates; they are re-scored in full
        // before any link is chosen, so it can read half of each code.
        let walk = Walk::coarse(metric);
        let full = Walk::full(metric);
        let mut best = Scored { dist: walk.distance(query, view.code(entry_id)?), id: entry_id };
        // Linking a batch is never stopped half-way.
        let never = Stop::never();
        for l in (level.saturating_add(1)..=top).rev() {
            best = greedy_closest(view, &mut w.scratch, walk, query, best, l, &never)?;
        }
        // Never longer than the live point count: with mostly tombstones,
        // a longer list could only be filled by visiting every node.
        let ef = (self.params.ef_construction as usize).max(self.params.m as usize).min(self.live.max(1) as usize);
        w.entry.clear();
        w.entry.push(best);
        w.back.clear();
        for l in (0..=level.min(top)).rev() {
            search_layer(view, &mut w.scratch, walk, query, &w.entry, ef, l, self.has_tombstones, &mut w.found, &never)?;
            w.found.retain(|s| s.id != node);
            if w.found.is_empty() && self.has_tombstones {
                // Every node this search reached is retired: link to them
                // anyway (as hnswlib links to a deleted entry point), or the
                // new node would be unreachable. Pruning drops those links
                // later, once live neighbours exist.
                search_layer(view, &mut w.scratch, walk, query, &w.entry, ef, l, false, &mut w.found, &never)?;
                w.found.retain(|s| s.id != node);
            }
            // Re-score the candidates in full: links are chosen (and later
            // pruned) on full-precision distances only.
            w.links.clear();
            w.links.extend(w.found.iter().map(|s| s.id));
            prefetch_codes(view, &w.links, full.bytes(query.dim()))?;
            w.cands.clear();
            for s in &w.found {
                w.cands.push(Scored { dist: metric.code_distance(query, view.code(s.id)?), id: s.id });
            }
            w.cands.sort_unstable();
            // As in hnswlib, a new node takes M links on every layer; M0 is
            // the room existing bottom-layer nodes have for back links.
            select_neighbours(view, full, &w.cands, self.params.m as usize, &mut w.chosen)?;
            self.set_own_links(view, w, node, l)?;
            for &n in &w.chosen {
                let d = w.cands.iter().find(|s| s.id == n).map_or(f32::INFINITY, |s| s.dist);
                w.back.push((l, Scored { dist: d, id: n }));
            }
            if !w.found.is_empty() {
                std::mem::swap(&mut w.entry, &mut w.found);
            }
        }
        // Only now, with its own lists set on every level, does the node
        // become reachable: a search that found it on an upper layer and
        // descended would otherwise meet its still empty lower lists, and
        // two new nodes could link only to each other (hnswlib prevents the
        // same by holding the node's lock for its whole insertion).
        for i in 0..w.back.len() {
            let (l, s) = w.back[i];
            self.add_back_link(view, w, s.id, node, l, s.dist)?;
        }
        Ok(())
    }

    /// Sets the list of new node `node` on `level` to `w.chosen`. Another
    /// thread may already have linked back to `node` here (it can reach
    /// `node` through an upper layer before `node` reaches this one); those
    /// links are kept, or the other node could become unreachable.
    fn set_own_links(&self, view: &mut BuildView<'_>, w: &mut Worker, node: u32, level: u8) -> Result<()> {
        let mut own = self.overlay.list_mut(&mut view.base, node, level)?;
        if own.is_empty() {
            own.extend_from_slice(&w.chosen);
            return Ok(());
        }
        for &c in &w.chosen {
            if !own.contains(&c) {
                own.push(c);
            }
        }
        let cap = self.params.max_links(level);
        if own.len() > cap {
            let metric = self.params.metric;
            let v = view.code(node)?;
            w.cands.clear();
            for &x in own.iter() {
                w.cands.push(Scored { dist: metric.code_distance(v, view.code(x)?), id: x });
            }
            w.cands.sort_unstable();
            select_neighbours(view, Walk::full(metric), &w.cands, cap, &mut w.pruned)?;
            own.clear();
            own.extend_from_slice(&w.pruned);
        }
        Ok(())
    }

    /// Adds `new` to the list of `n` on `level`; a full list is pruned with
    /// the selection heuristic, dropping tombstones on the way.
    fn add_back_link(&self, view: &mut BuildView<'_>, w: &mut Worker, n: u32, new: u32, level: u8, dist: f32) -> Result<()> {
        let cap = self.params.max_links(level);
        let metric = self.params.metric;
        let mut list = self.overlay.list_mut(&mut view.base, n, level)?;
        if list.contains(&new) {
            return Ok(());
        }
        if list.len() < cap {
            list.push(new);
            return Ok(());
        }
        let vn = view.code(n)?;
        // Pruning decides which links a node keeps: full precision (coarse
        // pruning measured 0.01 lower recall at ef=16 for no clear gain).
        let prune = Walk::full(metric);
        // Start loading every member's code before the first distance waits
        // for one: at 100k points most of them miss the CPU caches, and one
        // after the other they would cost a full memory latency each.
        prefetch_codes(view, &list[..], prune.bytes(vn.dim()))?;
        w.cands.clear();
        w.cands.push(Scored { dist, id: new });
        for &x in list.iter() {
            if !view.is_tombstone(x)? {
                w.cands.push(Scored { dist: prune.distance(vn, view.code(x)?), id: x });
            }
        }
        w.cands.sort_unstable();
        select_neighbours(view, prune, &w.cands, cap, &mut w.pruned)?;
        list.clear();
        list.extend_from_slice(&w.pruned);
        Ok(())
    }

    /// Repairs the graph around retired node `dead`, reading only the lists
    /// of `dead` and of its neighbours: no scan for in-links.
    ///
    /// For each live neighbour `x` of `dead`: if `x` links to `dead`, its
    /// list is rebuilt from its other links plus `dead`'s neighbours (the
    /// heuristic keeps the diverse ones); and `x` receives a link from the
    /// closest of `dead`'s other live neighbours, because `dead` may have
    /// been its only way in. Nodes that link to `dead` without `dead`
    /// linking back keep routing through it (a retired node keeps its
    /// vector and links) until their list is next pruned.
    pub(crate) fn repair(&self, view: &mut BuildView<'_>, w: &mut Worker, dead: u32) -> Result<()> {
        let metric = self.params.metric;
        let level = view.base.node(dead)?.level;
        for l in 0..=level {
            view.links(dead, l, &mut w.links)?;
            let mut live = std::mem::take(&mut w.other);
            live.clear();
            for &x in &w.links {
                if x != dead && !view.is_tombstone(x)? {
                    live.push(x);
                }
            }
            // Every live neighbour's code is read for every other one below.
            prefetch_codes(view, &live, Precision::Full.bytes(self.params.dim as usize))?;
            let cap = self.params.max_links(l);
            for i in 0..live.len() {
                let x = live[i];
                let vx = view.code(x)?;
                {
                    let mut list = self.overlay.list_mut(&mut view.base, x, l)?;
                    if list.contains(&dead) {
                        w.cands.clear();
                        for &y in list.iter().chain(live.iter()) {
                            if y != dead && y != x && !w.cands.iter().any(|c| c.id == y) && !view.is_tombstone(y)? {
                                w.cands.push(Scored { dist: metric.code_distance(vx, view.code(y)?), id: y });
                            }
                        }
                        w.cands.sort_unstable();
                        select_neighbours(view, Walk::full(metric), &w.cands, cap, &mut w.pruned)?;
                        list.clear();
                        list.extend_from_slice(&w.pruned);
                    }
                }
                let mut closest: Option<Scored> = None;
                for &y in &live {
                    if y != x {
                        let d = metric.code_distance(vx, view.code(y)?);
                        if closest.is_none_or(|c| d < c.dist) {
                            closest = Some(Scored { dist: d, id: y });
                        }
                    }
                }
                if let Some(c) = closest {
                    self.add_back_link(view, w, c.id, x, l, c.dist)?;
                }
            }
            w.other = live;
        }
        Ok(())
    }
}

/// Hands out item indices `0..len` to threads.
pub(crate) struct WorkQueue {
    next: AtomicUsize,
    len: usize,
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
