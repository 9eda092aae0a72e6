//! Reading the graph through one LMDB transaction without a B-tree lookup
//! per access.
//!
//! An HNSW insert or search evaluates thousands of distances; a B-tree get
//! costs about a microsecond (more inside a nested read transaction), which
//! is more than the arithmetic. So the first access to a node's vector, link
//! list or record goes through LMDB and the returned pointer is memoised per
//! thread; later accesses cost a table load. The pointers stay valid exactly
//! as long as the transaction they were read through, which is why a
//! [`NodeCache`] is tied to one transaction (see [`TxnView::new`]).

use heed::{RoTxn, WithoutTls};
use rustc_hash::FxHashMap;

use crate::cache::{DenseTable, RawPtr, SharedAddrs, SharedTable};
use crate::codec::{self, NodeRecord};
use crate::error::{Error, Result};
use crate::links_log::{self, LogIndex};
use crate::params::IndexParams;
use crate::quant::Code;
use crate::store::Store;
use crate::table::{Table, TableKey};
use crate::tombstone_set::TombstoneSet;

/// Memoised pointers into one transaction's pages.
pub(crate) struct NodeCache {
    /// Keyed by block (see `codec::codes_block_nodes`).
    codes: DenseTable<BlockPtr>,
    /// Keyed by block (see `codec::vectors_block_nodes`).
    vectors: DenseTable<BlockPtr>,
    /// Keyed by block (see `codec::links0_block_nodes`).
    links0: DenseTable<RawPtr>,
    nodes: DenseTable<RawPtr>,
    upper: FxHashMap<(u8, u32), RawPtr>,
    /// Per slot of the transaction's link log version: where the value's
    /// records start, and how many it holds.
    log_values: Vec<(RawPtr, u32)>,
    /// Copies of vectors that LMDB did not place on a 4-byte boundary. A
    /// block in overflow pages starts 16 bytes into its first page, and a
    /// partial one inline in a leaf is a multiple of 4 bytes under a 4-byte
    /// key, so every vector is aligned (see `docs/engine.md`) and this stays
    /// empty; it exists so that a layout surprise costs speed, not
    /// correctness.
    unaligned: Vec<Box<[f32]>>,
}

impl NodeCache {
    /// An empty cache; `budget_bytes` caps each of its tables.
    pub(crate) fn new(budget_bytes: usize) -> Self {
        NodeCache {
            codes: DenseTable::with_budget(budget_bytes / 4),
            vectors: DenseTable::with_budget(budget_bytes / 4),
            links0: DenseTable::with_budget(budget_bytes / 4),
            nodes: DenseTable::with_budget(budget_bytes / 4),
            upper: FxHashMap::default(),
            log_values: Vec::new(),
            unaligned: Vec::new(),
        }
    }

    /// Vectors that had to be copied because they were misaligned.
    pub(crate) fn unaligned_count(&self) -> usize {
        self.unaligned.len()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.codes.bytes()
            + self.vectors.bytes()
            + self.links0.bytes()
            + self.nodes.bytes()
            + self.upper.len() * 24
            + self.log_values.len() * 16
    }
}

/// Where a block of values starts, and how many values it held when read
/// (the newest block is partial).
#[derive(Clone, Copy, Default)]
struct BlockPtr {
    start: RawPtr,
    len: u32,
}

/// The graph as one transaction sees it.
pub(crate) trait Graph<'g> {
    /// The code (compact form) of `id`'s vector: what distances in the
    /// graph are computed on.
    fn code(&mut self, id: u32) -> Result<Code<'g>>;
    /// The neighbours of `id` on `level`, written into `out`.
    fn links(&mut self, id: u32, level: u8, out: &mut Vec<u32>) -> Result<()>;
    /// True if `id` was deleted or replaced (kept only for routing).
    fn is_tombstone(&mut self, id: u32) -> Result<bool>;
    /// Hints that the links of `id` on `level` are needed soon: starts
    /// loading them if their address is already known. Never blocks.
    fn prefetch_links(&mut self, _id: u32, _level: u8) {}
}

/// Addresses of code and vector blocks that stay valid across transactions.
///
/// Codes and vectors are appended in blocks (`codec::codes_block_nodes`,
/// `codec::vectors_block_nodes`), each one value in its own overflow pages;
/// only the newest, partial block is ever rewritten (and blocks holding
/// reused slots, after which the shared addresses are dropped: see
/// `Index::moved`), so a full block's pages never move. Addresses of ids
/// well below the newest committed one can therefore be remembered for the
/// life of the map and shared by all threads; the index clears the tables
/// before it remaps (`Env::resize`).
#[derive(Clone, Copy)]
pub(crate) struct Frozen<'a> {
    pub(crate) shared: &'a SharedAddrs,
    /// Ids below these are on full, never-again-written leaf pages (or in
    /// full code blocks). A write transaction dirties only the rightmost
    /// leaf (APPEND), the newest code block and the pages of its own new
    /// entries, all at or above these bounds, so even a nested reader of an
    /// uncommitted transaction sees these ids in the map.
    codes_below: u32,
    vectors_below: u32,
    /// Code and vector blocks below these bounds that the write transaction
    /// rewrote (ids it reuses), ascending: read through the transaction,
    /// never shared, because their committed pages hold the old values and
    /// the transaction's copies die with it.
    dirty_codes: &'a [u32],
    dirty_vectors: &'a [u32],
}

impl<'a> Frozen<'a> {
    /// The frozen ranges of a committed state whose next id is `next_id`.
    pub(crate) fn new(shared: &'a SharedAddrs, next_id: u32) -> Self {
        Frozen {
            shared,
            codes_below: next_id.saturating_sub(shared.codes.lag()),
            vectors_below: next_id.saturating_sub(shared.vectors.lag()),
            dirty_codes: &[],
            dirty_vectors: &[],
        }
    }

    /// The same, with the code and vector blocks a write transaction
    /// rewrote below the frozen bounds (each ascending).
    pub(crate) fn with_dirty_blocks(self, dirty_codes: &'a [u32], dirty_vectors: &'a [u32]) -> Self {
        Frozen { dirty_codes, dirty_vectors, ..self }
    }

    #[inline]
    fn shares_block(&self, kind: Blocks, id: u32, block: u32) -> bool {
        let (below, dirty) = match kind {
            Blocks::Codes => (self.codes_below, self.dirty_codes),
            Blocks::Vectors => (self.vectors_below, self.dirty_vectors),
        };
        id < below && (dirty.is_empty() || dirty.binary_search(&block).is_err())
    }

    #[inline]
    fn table(&self, kind: Blocks) -> &'a SharedTable {
        match kind {
            Blocks::Codes => &self.shared.codes,
            Blocks::Vectors => &self.shared.vectors,
        }
    }
}

/// The tables of fixed-size values stored in blocks of consecutive ids.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Blocks {
    Codes,
    Vectors,
}

/// How one such table is laid out.
#[derive(Clone, Copy)]
struct BlockLayout {
    per_block: u32,
    value_bytes: usize,
}

/// Reads through `txn`, memoising pointers in `cache`.
pub(crate) struct TxnView<'t> {
    txn: &'t RoTxn<'t, WithoutTls>,
    store: &'t Store,
    cache: &'t mut NodeCache,
    frozen: Option<Frozen<'t>>,
    /// Where the transaction's newest bottom lists are, for the nodes whose
    /// list is in the link log rather than in its block.
    log: &'t LogIndex,
    /// The transaction's tombstones, when read (searches); else the node
    /// records answer.
    tombstones: Option<&'t TombstoneSet>,
    dim: usize,
    codes: BlockLayout,
    vectors: BlockLayout,
    links0_bytes: usize,
    links0_block: u32,
    links_up_bytes: usize,
}

impl<'t> TxnView<'t> {
    /// # Safety
    /// `cache` must be empty or hold only pointers read through `txn`
    /// (by earlier views over the same, still open, transaction), and
    /// `frozen` must describe the committed state `txn` is based on, and
    /// `log` must be the link log version of that state.
    pub(crate) unsafe fn new(
        txn: &'t RoTxn<'t, WithoutTls>,
        store: &'t Store,
        cache: &'t mut NodeCache,
        frozen: Option<Frozen<'t>>,
        log: &'t LogIndex,
        params: &IndexParams,
    ) -> Self {
        let m0 = params.max_links(0);
        TxnView {
            txn,
            store,
            cache,
            frozen,
            log,
            tombstones: None,
            dim: params.dim as usize,
            codes: BlockLayout { per_block: params.codes_per_block(), value_bytes: params.code_bytes() },
            vectors: BlockLayout { per_block: params.vectors_per_block(), value_bytes: params.vector_bytes() },
            links0_bytes: codec::links_bytes(m0),
            links0_block: codec::links0_block_nodes(m0) as u32,
            links_up_bytes: codec::links_bytes(params.max_links(1)),
        }
    }

    pub(crate) fn store(&self) -> &'t Store {
        self.store
    }

    /// Answers `is_tombstone` from `set`, which must be the tombstones of
    /// this view's transaction.
    pub(crate) fn with_tombstones(self, set: Option<&'t TombstoneSet>) -> Self {
        TxnView { tombstones: set, ..self }
    }

    fn corrupt(&self, detail: String) -> Error {
        Error::Corrupt { path: self.store.path.clone(), detail }
    }

    fn fetch<K: TableKey>(&self, table: Table<K>, key: K::Key<'_>, len: usize, what: &str, id: u32) -> Result<*const u8> {
        match table.get(self.txn, key).map_err(|e| self.store.err(e))? {
            Some(bytes) if bytes.len() == len => Ok(bytes.as_ptr()),
            Some(bytes) => Err(self.corrupt(format!("{what} of node {id} has {} bytes, expected {len}", bytes.len()))),
            None => Err(self.corrupt(format!("{what} of node {id} is missing"))),
        }
    }

    /// The node record of `id`.
    pub(crate) fn node(&mut self, id: u32) -> Result<NodeRecord> {
        let ptr = match self.cache.nodes.get(id).get() {
            Some(p) => p,
            None => {
                let p = self.fetch(self.store.dbs.nodes, id, NodeRecord::SIZE, "record", id)?;
                *self.cache.nodes.slot(id) = RawPtr::new(p);
                p
            }
        };
        // SAFETY: `ptr` points at NodeRecord::SIZE bytes inside a page of
        // `self.txn`, which outlives this call (TxnView::new's contract).
        let bytes = unsafe { std::slice::from_raw_parts(ptr, NodeRecord::SIZE) };
        NodeRecord::decode(bytes).ok_or_else(|| self.corrupt(format!("record of node {id} is malformed")))
    }

    /// The address of `id`'s code: its block's plus its slot. A walk
    /// resolves ~15 codes per node it expands before it can prefetch them,
    /// so the table it looks addresses up in must stay in the CPU caches:
    /// one entry per block of codes stays there at 100k points, where one
    /// per code (800 KB) missed the L2 cache on every lookup and made that
    /// step two to three times as slow at 100k as at 10k
    /// (`docs/benchmarks.md`, "The table of code addresses").
    #[inline]
    fn code_ptr(&mut self, id: u32) -> Result<*const u8> {
        self.block_value(Blocks::Codes, id)
    }

    /// The address of `id`'s value in a table of `kind`: its block's plus
    /// its slot.
    ///
    /// A block is frozen once every id in it is older than the lag (see
    /// `Index::open`): it is then full and never rewritten, so the shared
    /// table keeps only its address. Newer blocks, the newest of which is
    /// partial, are memoised per transaction with their length.
    #[inline]
    fn block_value(&mut self, kind: Blocks, id: u32) -> Result<*const u8> {
        let layout = self.layout(kind);
        let (block, slot) = (id / layout.per_block, id % layout.per_block);
        let offset = slot as usize * layout.value_bytes;
        let frozen = self.frozen.filter(|f| f.shares_block(kind, id, block));
        if let Some(f) = frozen {
            let addr = f.table(kind).get(block);
            if addr != 0 {
                return Ok((addr + offset) as *const u8);
            }
        }
        let cached = self.blocks(kind).get(block);
        if let Some(p) = cached.start.get()
            && slot < cached.len
        {
            // SAFETY: the slot is inside the block (its length was checked
            // when it was read through this transaction).
            return Ok(unsafe { p.add(offset) });
        }
        let (p, len) = self.fetch_block(kind, block, slot, id)?;
        let full = len == layout.per_block;
        if !(full && frozen.is_some_and(|f| f.table(kind).set(block, p as usize))) {
            *self.blocks(kind).slot(block) = BlockPtr { start: RawPtr::new(p), len };
        }
        // SAFETY: fetch_block checked that the slot is inside the block.
        Ok(unsafe { p.add(offset) })
    }

    /// The codes of the block holding `id`: where the block starts, the
    /// first id it holds, and how many it holds. A scan over ascending ids
    /// finds each block once and the codes in it by their slot.
    pub(crate) fn code_run(&mut self, id: u32) -> Result<(*const u8, u32, u32)> {
        let layout = self.codes;
        let (block, slot) = (id / layout.per_block, id % layout.per_block);
        let first = block * layout.per_block;
        // Where a block was found before, as `block_value` looks.
        if let Some(f) = self.frozen.filter(|f| f.shares_block(Blocks::Codes, id, block)) {
            let addr = f.table(Blocks::Codes).get(block);
            if addr != 0 {
                return Ok((addr as *const u8, first, layout.per_block));
            }
        }
        let cached = self.cache.codes.get(block);
        if let Some(p) = cached.start.get()
            && slot < cached.len
        {
            return Ok((p, first, cached.len));
        }
        let p = self.block_value(Blocks::Codes, id)?;
        let start = p.wrapping_sub(slot as usize * layout.value_bytes);
        let full = self.frozen.is_some_and(|f| f.shares_block(Blocks::Codes, id, block) && f.table(Blocks::Codes).get(block) != 0);
        let len = if full { layout.per_block } else { self.cache.codes.get(block).len.max(slot + 1) };
        Ok((start, first, len))
    }

    #[inline]
    fn layout(&self, kind: Blocks) -> BlockLayout {
        match kind {
            Blocks::Codes => self.codes,
            Blocks::Vectors => self.vectors,
        }
    }

    #[inline]
    fn blocks(&mut self, kind: Blocks) -> &mut DenseTable<BlockPtr> {
        match kind {
            Blocks::Codes => &mut self.cache.codes,
            Blocks::Vectors => &mut self.cache.vectors,
        }
    }

    /// The start of block `block` of a table of `kind` and the values it
    /// holds, checking that it holds `slot` and no more than a block's
    /// worth.
    fn fetch_block(&self, kind: Blocks, block: u32, slot: u32, id: u32) -> Result<(*const u8, u32)> {
        let BlockLayout { per_block, value_bytes: bytes } = self.layout(kind);
        let (table, what) = match kind {
            Blocks::Codes => (self.store.dbs.codes, "code"),
            Blocks::Vectors => (self.store.dbs.vectors, "vector"),
        };
        match table.get(self.txn, block).map_err(|e| self.store.err(e))? {
            Some(b) if b.len() % bytes == 0 && b.len() / bytes > slot as usize && b.len() / bytes <= per_block as usize => {
                Ok((b.as_ptr(), (b.len() / bytes) as u32))
            }
            Some(b) => Err(self.corrupt(format!("{what} block {block} (of node {id}) has {} bytes", b.len()))),
            None => Err(self.corrupt(format!("{what} block {block} (of node {id}) is missing"))),
        }
    }

    fn vector_ptr(&mut self, id: u32) -> Result<*const f32> {
        let p = self.block_value(Blocks::Vectors, id)?;
        if (p as usize).is_multiple_of(align_of::<f32>()) {
            return Ok(p.cast());
        }
        let bytes = self.vectors.value_bytes;
        // SAFETY: `p` points at a whole vector inside its block (checked by
        // `fetch_block`).
        let bytes = unsafe { std::slice::from_raw_parts(p, bytes) };
        let copy: Box<[f32]> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let ptr = copy.as_ptr();
        self.cache.unaligned.push(copy);
        Ok(ptr)
    }

    /// Where `id`'s bottom-layer list is if the link log holds a newer one
    /// than its block (see `links_log`).
    #[inline]
    pub(crate) fn logged_list(&mut self, id: u32) -> Result<Option<*const u8>> {
        let Some((slot, record)) = self.log.get(id) else { return Ok(None) };
        let (start, count) = match self.cache.log_values.get(slot).and_then(|(p, n)| p.get().map(|p| (p, *n))) {
            Some(known) => known,
            None => self.fetch_log_value(slot)?,
        };
        if record >= count as usize {
            return Err(self.corrupt(format!("link log record {record} of node {id} is past its value ({count} records)")));
        }
        // `fetch_log_value` checked that the value holds `count` whole
        // records, so the list lies inside the live transaction's value.
        Ok(Some(links_log::list_at(start, record, self.links0_bytes)))
    }

    #[cold]
    fn fetch_log_value(&mut self, slot: usize) -> Result<(*const u8, u32)> {
        let value = links_log::Value::read(self.store, self.txn, self.log, slot, self.links0_bytes)?;
        let (start, count) = (value.start(), value.len() as u32);
        if self.cache.log_values.len() <= slot {
            self.cache.log_values.resize(slot + 1, (RawPtr::default(), 0));
        }
        self.cache.log_values[slot] = (RawPtr::new(start), count);
        Ok((start, count))
    }

    /// `id`'s bottom-layer list: from the log if it holds one, else from
    /// its block (found through `block`, which is only called then).
    #[inline]
    pub(crate) fn links0(&mut self, id: u32, out: &mut Vec<u32>, block: impl FnOnce(&mut Self) -> Result<*const u8>) -> Result<()> {
        if let Some(p) = self.logged_list(id)? {
            // SAFETY: `logged_list` points at a whole list inside a value
            // of the live transaction.
            return unsafe { self.decode_list(p, self.links0_bytes, id, 0, out) };
        }
        let b = block(self)?;
        self.links0_in(b, id, out)
    }

    /// Starts loading `id`'s logged list, if it is logged and its value's
    /// address is known. Returns false if the list is not in the log.
    #[inline]
    pub(crate) fn prefetch_logged(&self, id: u32) -> bool {
        let Some((slot, record)) = self.log.get(id) else { return false };
        if let Some((p, n)) = self.cache.log_values.get(slot)
            && let Some(p) = p.get()
            && record < *n as usize
        {
            crate::prefetch::prefetch(links_log::list_at(p, record, self.links0_bytes), self.links0_bytes);
        }
        true
    }

    /// Bottom-layer lists are stored in blocks (`codec::links0_block_nodes`):
    /// the start of the block that holds `id`'s list, memoised per
    /// transaction.
    #[inline]
    pub(crate) fn links0_block_ptr(&mut self, id: u32) -> Result<*const u8> {
        let block = id / self.links0_block;
        if let Some(p) = self.cache.links0.get(block).get() {
            return Ok(p);
        }
        let block_len = self.links0_bytes * self.links0_block as usize;
        let p = self.fetch(self.store.dbs.links0, block, block_len, "link block", id)?;
        *self.cache.links0.slot(block) = RawPtr::new(p);
        Ok(p)
    }

    /// Where `id`'s bottom-layer list lies in its block starting at `block`
    /// (a pointer from [`TxnView::links0_block_ptr`] of this transaction),
    /// and its length in bytes.
    #[inline]
    fn links0_list(&self, block: *const u8, id: u32) -> (*const u8, usize) {
        let len = self.links0_bytes;
        (block.wrapping_add((id % self.links0_block) as usize * len), len)
    }

    /// `id`'s bottom-layer list, from its block starting at `block` (a
    /// pointer from [`TxnView::links0_block_ptr`] of this transaction).
    #[inline]
    pub(crate) fn links0_in(&self, block: *const u8, id: u32, out: &mut Vec<u32>) -> Result<()> {
        let (p, len) = self.links0_list(block, id);
        // SAFETY: `block` starts a whole block of `links0_block` lists in a
        // page of the live transaction (checked by `fetch`), and the list
        // is one of them.
        unsafe { self.decode_list(p, len, id, 0, out) }
    }

    /// Decodes the link list of `id` on `level` stored in the `len` bytes
    /// at `p` into `out`.
    ///
    /// # Safety
    /// `p` must point at `len` readable bytes in a page of the live
    /// transaction.
    #[inline]
    unsafe fn decode_list(&self, p: *const u8, len: usize, id: u32, level: u8, out: &mut Vec<u32>) -> Result<()> {
        // SAFETY: the caller's contract.
        let bytes = unsafe { std::slice::from_raw_parts(p, len) };
        if codec::decode_links(bytes, out) {
            Ok(())
        } else {
            Err(self.corrupt(format!("link list of node {id} on level {level} is malformed")))
        }
    }

    /// Starts loading `id`'s bottom-layer list from its block at `block`.
    #[inline]
    pub(crate) fn prefetch_links0_in(&self, block: *const u8, id: u32) {
        let (p, len) = self.links0_list(block, id);
        crate::prefetch::prefetch(p, len);
    }

    /// The exact stored (prepared) vector of `id`.
    #[inline]
    pub(crate) fn vector(&mut self, id: u32) -> Result<&'t [f32]> {
        let p = self.vector_ptr(id)?;
        // SAFETY: `p` is 4-byte aligned and points at dim f32s that live in a
        // page of `self.txn` (or in `cache.unaligned`, which is only freed by
        // `NodeCache::clear`, never while a view borrows the cache); both live
        // for 't. Values are little-endian f32, the CPU's order on the
        // platforms shoal builds for.
        Ok(unsafe { std::slice::from_raw_parts(p, self.vectors.value_bytes / 4) })
    }
}

impl<'t> Graph<'t> for TxnView<'t> {
    #[inline]
    fn code(&mut self, id: u32) -> Result<Code<'t>> {
        let p = self.code_ptr(id)?;
        // SAFETY: `p` points at code_bytes bytes in a page of `self.txn`
        // (checked by `fetch` when first read), which lives for 't.
        let bytes = unsafe { std::slice::from_raw_parts(p, self.codes.value_bytes) };
        Code::from_bytes(bytes, self.dim).ok_or_else(|| self.corrupt(format!("code of node {id} is malformed")))
    }

    #[inline]
    fn links(&mut self, id: u32, level: u8, out: &mut Vec<u32>) -> Result<()> {
        if level == 0 {
            return self.links0(id, out, |v| v.links0_block_ptr(id));
        }
        let len = self.links_up_bytes;
        let ptr = match self.cache.upper.get(&(level, id)).and_then(|p| p.get()) {
            Some(p) => p,
            None => {
                let p = self.fetch(self.store.dbs.links_up, (level, id), len, "upper link list", id)?;
                self.cache.upper.insert((level, id), RawPtr::new(p));
                p
            }
        };
        // SAFETY: `fetch` checked `len` bytes at `ptr`, in a page of the
        // live transaction.
        unsafe { self.decode_list(ptr, len, id, level, out) }
    }

    #[inline]
    fn is_tombstone(&mut self, id: u32) -> Result<bool> {
        match self.tombstones {
            Some(set) => Ok(set.contains(id)),
            None => Ok(self.node(id)?.is_tombstone()),
        }
    }

    #[inline]
    fn prefetch_links(&mut self, id: u32, level: u8) {
        if level == 0
            && !self.prefetch_logged(id)
            && let Some(block) = self.cache.links0.get(id / self.links0_block).get()
        {
            self.prefetch_links0_in(block, id);
        }
    }
}
