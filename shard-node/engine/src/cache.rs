//! Per-thread memo tables keyed by dense internal ids.
//!
//! Internal ids are dense, so a two-level table (a vector of lazily
//! allocated 1,024-entry chunks) answers in a few loads with no hashing, and
//! costs memory only for the id ranges a thread actually touched. A budget
//! caps it: past the budget the table is simply emptied, because everything
//! in it can be fetched again.

use std::ptr::NonNull;

const CHUNK_BITS: u32 = 10;
const CHUNK: usize = 1 << CHUNK_BITS;

/// A lazily allocated table from dense `u32` ids to `Copy` values.
pub(crate) struct DenseTable<T: Copy + Default> {
    chunks: Vec<Option<Box<[T; CHUNK]>>>,
    allocated: usize,
    max_chunks: usize,
}

impl<T: Copy + Default> DenseTable<T> {
    /// A table that holds at most about `budget_bytes` of entries.
    pub(crate) fn with_budget(budget_bytes: usize) -> Self {
        let max_chunks = (budget_bytes / (CHUNK * size_of::<T>())).max(1);
        DenseTable { chunks: Vec::new(), allocated: 0, max_chunks }
    }

    #[inline]
    pub(crate) fn get(&self, id: u32) -> T {
        match self.chunks.get((id >> CHUNK_BITS) as usize) {
            Some(Some(chunk)) => chunk[id as usize & (CHUNK - 1)],
            Some(None) | None => T::default(),
        }
    }

    /// Mutable slot for `id`, allocating its chunk (and maybe clearing the
    /// table to stay within budget) first.
    #[inline]
    pub(crate) fn slot(&mut self, id: u32) -> &mut T {
        let c = (id >> CHUNK_BITS) as usize;
        if c >= self.chunks.len() {
            self.chunks.resize_with(c + 1, || None);
        }
        if self.chunks[c].is_none() {
            if self.allocated >= self.max_chunks {
                self.chunks.iter_mut().for_each(|chunk| *chunk = None);
                self.allocated = 0;
            }
            self.chunks[c] = Some(Box::new([T::default(); CHUNK]));
            self.allocated += 1;
        }
        match &mut self.chunks[c] {
            Some(chunk) => &mut chunk[id as usize & (CHUNK - 1)],
            None => unreachable!("chunk allocated above"),
        }
    }

    /// Heap bytes held by entries.
    pub(crate) fn bytes(&self) -> usize {
        self.allocated * CHUNK * size_of::<T>()
    }
}

/// A pointer into LMDB's map (or a write transaction's dirty page), valid as
/// long as the transaction it was read through. `None` means "not fetched".
#[derive(Clone, Copy, Default)]
pub(crate) struct RawPtr(Option<NonNull<u8>>);

// SAFETY: a RawPtr is only dereferenced by the owner of the transaction it
// came from (see `view::TxnView`); moving the table between threads together
// with that transaction is sound.
unsafe impl Send for RawPtr {}

impl RawPtr {
    #[inline]
    pub(crate) fn new(p: *const u8) -> Self {
        RawPtr(NonNull::new(p.cast_mut()))
    }

    #[inline]
    pub(crate) fn get(self) -> Option<*const u8> {
        self.0.map(|p| p.as_ptr().cast_const())
    }
}

/// Marks ids as visited during one graph search: one bit per id, and the
/// words a search set are cleared when the next one starts.
///
/// hnswlib keeps a `u16` epoch per id, which makes a reset free but costs
/// 2 bytes per id: 2 MiB per thread at a million points, more than this
/// machine's 1 MiB of L2 per core. One bit per id is 128 KiB there, and a
/// search sets a few thousand bits, so clearing only their words is cheap;
/// a batch into 1M cost 1.40x one into 100k with bits, 1.47x with a `u16`
/// (docs/benchmarks.md, "Variants on 1k into 1M"; the layout in
/// docs/scale.md, "Visited marks as bits").
pub(crate) struct Visited {
    words: Vec<u64>,
    /// Indices of the words this search made non-zero.
    touched: Vec<u32>,
    /// Ids at or above [`Visited::DIRECT`]: a damaged or hostile link can
    /// name any `u32`, and a bit for it would cost up to 512 MiB. Such an
    /// id fails when its code is read, right after it is marked.
    far: std::collections::HashSet<u32>,
}

impl Visited {
    /// Ids below this get a bit (8 MiB of them at most, at 64M points).
    const DIRECT: u32 = 1 << 26;

    pub(crate) fn new() -> Self {
        Visited { words: Vec::new(), touched: Vec::with_capacity(1024), far: Default::default() }
    }

    /// Starts a new search.
    pub(crate) fn reset(&mut self) {
        for w in self.touched.drain(..) {
            // Every touched index was in bounds when pushed, and `words`
            // never shrinks.
            if let Some(word) = self.words.get_mut(w as usize) {
                *word = 0;
            }
        }
        if !self.far.is_empty() {
            self.far.clear();
        }
    }

    /// Marks `id`; returns true if it was not marked in this search.
    #[inline]
    pub(crate) fn insert(&mut self, id: u32) -> bool {
        if id >= Self::DIRECT {
            return self.far.insert(id);
        }
        let w = (id >> 6) as usize;
        if w >= self.words.len() {
            self.grow(w);
        }
        let bit = 1u64 << (id & 63);
        let word = &mut self.words[w];
        if *word & bit != 0 {
            return false;
        }
        if *word == 0 {
            self.touched.push(w as u32);
        }
        *word |= bit;
        true
    }

    /// Makes room for word `w`, with headroom so that an index growing one
    /// batch at a time does not reallocate every batch.
    #[cold]
    fn grow(&mut self, w: usize) {
        let len = (w + 1).max(self.words.len() + self.words.len() / 4).next_multiple_of(1024).min(Self::DIRECT as usize / 64);
        self.words.resize(len, 0);
    }

    pub(crate) fn bytes(&self) -> usize {
        (self.words.capacity() * size_of::<u64>()) + (self.touched.capacity() + self.far.capacity()) * size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_keeps_values_and_respects_budget() {
        let mut t: DenseTable<u32> = DenseTable::with_budget(2 * CHUNK * 4);
        *t.slot(5) = 7;
        *t.slot(CHUNK as u32 + 1) = 9;
        assert_eq!((t.get(5), t.get(CHUNK as u32 + 1), t.get(6), t.get(1 << 30)), (7, 9, 0, 0));
        // A third chunk exceeds the budget: the table starts over.
        *t.slot(5 * CHUNK as u32) = 1;
        assert_eq!((t.get(5), t.get(5 * CHUNK as u32)), (0, 1));
        assert_eq!(t.bytes(), CHUNK * 4);
    }

    #[test]
    fn visited_forgets_every_mark_of_the_previous_search() {
        use std::collections::HashSet;
        // Ids from a small xorshift, so that searches share words and bits.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut v = Visited::new();
        for round in 0..300 {
            v.reset();
            let mut model = HashSet::new();
            let span = if round % 3 == 0 { 1 << 20 } else { 5000 };
            for _ in 0..(round % 50) * 20 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let id = (x % span) as u32;
                assert_eq!(v.insert(id), model.insert(id), "round {round}, id {id}");
            }
        }
        v.reset();
        assert!(v.insert((1 << 24) + 7) && !v.insert((1 << 24) + 7) && v.insert(3));
        // Ids a damaged link could name cost no bits, and are still marked.
        for id in [Visited::DIRECT, u32::MAX] {
            assert!(v.insert(id) && !v.insert(id));
        }
        v.reset();
        assert!(v.insert(u32::MAX) && v.insert(3));
        assert!(v.bytes() < 4 << 20, "{} bytes", v.bytes());
    }
}

/// A table from dense ids to addresses, shared by every thread of an index
/// and kept across transactions. It may only hold addresses that stay valid
/// for as long as the environment stays mapped (see `view::Frozen`);
/// [`SharedTable::clear`] must run whenever the map moves.
pub(crate) struct SharedTable {
    /// 4,096 directory slots × 1,024 chunk slots × 1,024 entries = 2^32 ids.
    dirs: Box<[std::sync::OnceLock<Directory>]>,
    chunks: AtomicUsize,
    max_chunks: usize,
    /// Ids this close to the newest committed one are never shared (they
    /// may sit on the still-changing last leaf page; see `view`).
    lag: u32,
}

use std::sync::atomic::{AtomicUsize, Ordering};

/// One directory slot: 1,024 lazily allocated chunks of addresses.
type Directory = Box<[std::sync::OnceLock<Box<[AtomicUsize]>>]>;

const DIR_SLOTS: usize = 4096;
const DIR_CHUNKS: usize = 1024;

impl SharedTable {
    /// A table that allocates at most about `budget_bytes` of entries; ids
    /// beyond the budget are simply not remembered.
    pub(crate) fn with_budget(budget_bytes: usize, lag: u32) -> Self {
        SharedTable {
            dirs: (0..DIR_SLOTS).map(|_| std::sync::OnceLock::new()).collect(),
            chunks: AtomicUsize::new(0),
            max_chunks: budget_bytes / (CHUNK * size_of::<usize>()),
            lag,
        }
    }

    pub(crate) fn lag(&self) -> u32 {
        self.lag
    }

    fn split(id: u32) -> (usize, usize, usize) {
        let id = id as usize;
        (id >> 20, (id >> CHUNK_BITS) & (DIR_CHUNKS - 1), id & (CHUNK - 1))
    }

    /// The address stored for `id`, or 0.
    #[inline]
    pub(crate) fn get(&self, id: u32) -> usize {
        let (d, c, e) = Self::split(id);
        match self.dirs[d].get().and_then(|dir| dir[c].get()) {
            Some(chunk) => chunk[e].load(Ordering::Relaxed),
            None => 0,
        }
    }

    /// Remembers `addr` for `id`; false if the budget is spent (the caller
    /// then keeps the address itself).
    pub(crate) fn set(&self, id: u32, addr: usize) -> bool {
        let (d, c, e) = Self::split(id);
        let dir = self.dirs[d].get_or_init(|| (0..DIR_CHUNKS).map(|_| std::sync::OnceLock::new()).collect());
        let chunk = match dir[c].get() {
            Some(chunk) => chunk,
            None => {
                if self.chunks.load(Ordering::Relaxed) >= self.max_chunks {
                    return false;
                }
                // Counted inside the initialiser, so a thread that loses the
                // race to create the chunk does not count it twice.
                dir[c].get_or_init(|| {
                    self.chunks.fetch_add(1, Ordering::Relaxed);
                    (0..CHUNK).map(|_| AtomicUsize::new(0)).collect()
                })
            }
        };
        chunk[e].store(addr, Ordering::Relaxed);
        true
    }

    /// Forgets everything. Callers guarantee no other thread uses the table.
    pub(crate) fn clear(&mut self) {
        for dir in self.dirs.iter_mut() {
            dir.take();
        }
        *self.chunks.get_mut() = 0;
    }

    /// Heap bytes held by entries.
    pub(crate) fn bytes(&self) -> usize {
        self.chunks.load(Ordering::Relaxed) * CHUNK * size_of::<usize>()
    }
}

/// The addresses shared across threads and transactions: codes (every
/// distance in the graph) and exact vectors (re-scoring, `get`).
pub(crate) struct SharedAddrs {
    pub(crate) codes: SharedTable,
    pub(crate) vectors: SharedTable,
    /// The count of commits that moved frozen pages (`Index::moved`) these
    /// addresses were gathered under: a reader whose transaction began
    /// under another count must not use them (see `Session::open`).
    pub(crate) valid_for: u64,
}

impl SharedAddrs {
    /// Splits `budget_bytes` between the two tables in proportion to the
    /// ids each can hold per byte (equal), with each table's own lag.
    pub(crate) fn new(budget_bytes: usize, codes_lag: u32, vectors_lag: u32) -> Self {
        SharedAddrs {
            codes: SharedTable::with_budget(budget_bytes / 2, codes_lag),
            vectors: SharedTable::with_budget(budget_bytes / 2, vectors_lag),
            valid_for: 0,
        }
    }

    /// Forgets everything; what is gathered next is valid for commits
    /// under `moved`. Callers guarantee no other thread uses the tables.
    pub(crate) fn clear(&mut self, moved: u64) {
        self.codes.clear();
        self.vectors.clear();
        self.valid_for = moved;
    }

    pub(crate) fn bytes(&self) -> usize {
        self.codes.bytes() + self.vectors.bytes()
    }
}

#[cfg(test)]
mod shared_tests {
    use super::*;

    #[test]
    fn shared_table_stores_across_the_whole_id_range_within_budget() {
        let mut t = SharedTable::with_budget(2 * CHUNK * 8, 3);
        assert!(t.set(3, 30));
        assert!(t.set(u32::MAX, 7));
        assert_eq!((t.get(3), t.get(u32::MAX), t.get(4)), (30, 7, 0));
        assert!(!t.set(5 << 20, 1)); // third chunk: over budget, refused
        assert_eq!(t.get(5 << 20), 0);
        t.clear();
        assert_eq!(t.get(3), 0);
    }
}
