//! How an index is opened: threads, memory, durability, the link log and
//! re-scoring. None of it changes what is stored.

use std::sync::Arc;
use std::time::Duration;

use crate::batch_log::BatchLogRetention;
use crate::planner::PlannerOptions;

/// How an index is opened; none of these change what is stored.
#[derive(Clone, Debug)]
pub struct IndexOptions {
    /// Threads that link a batch into the graph, the calling thread
    /// included. Default: the machine's available parallelism.
    pub build_threads: usize,
    /// Share a rayon pool between indexes instead of each making its own;
    /// the calling thread works beside the pool's threads.
    pub pool: Option<Arc<rayon::ThreadPool>>,
    /// Per-thread budget for memoised page pointers (builders and search
    /// sessions). Past it a cache starts over; it is never a correctness
    /// matter. Default 64 MiB.
    pub cache_budget_bytes: usize,
    /// Memory map size to start with. Default 256 MiB.
    pub initial_map_size: u64,
    /// Ceiling the map grows to on demand; past it writes fail with
    /// [`Error::MapSizeLimit`](crate::Error::MapSizeLimit). Default 1 TiB (address space, not disk).
    pub max_map_size: u64,
    /// Flush every commit to disk before acknowledging it. Default true.
    pub durable: bool,
    /// Memory a write transaction keeps for the pages it changes before
    /// LMDB writes some of them to the file ahead of the commit (pages no
    /// reader can see until it commits) and frees their copies. This is
    /// what keeps a batch's memory flat in the index's size: a 10k-point
    /// batch into 1M points changes lists in nearly every bottom-layer
    /// block. Pages in use by LMDB's cursors and a value larger than the
    /// limit stay in memory. 0: no limit but LMDB's own (131,071 changed
    /// pages or values, 512 MiB or more); liblmdb raises anything under
    /// 1 MiB (256 pages) to that. Default 4 MiB: builds measured the same
    /// from 1 to 32 MiB, and the builder's memory as flat, but batches of
    /// upserts and deletes over reused slots spill far more often than a
    /// build's appends, and at 1 MiB they took 1.3x as long as at 4 or 32
    /// (docs/engine.md, "The write memory under churn"; figures in
    /// docs/benchmarks.md, "Write memory under churn").
    pub write_memory_bytes: u64,
    /// New points take the ids (and so the vector, code and link slots) of
    /// points deleted or replaced by earlier batches, as hnswlib's
    /// `replace_deleted` does, so a shard under churn stays the size of its
    /// live set. Off: retired nodes stay as tombstones until a rebuild.
    /// Default: on.
    pub reuse_retired: bool,
    /// Share of the graph's nodes that tombstones still linked into it may
    /// reach before [`crate::Index::vacuum_due`] says so (the shard node
    /// then vacuums whenever its writer is idle). Default: 0.05.
    pub vacuum_ratio: f64,
    /// Share of `data.mdb` that pages no table holds (LMDB's free list,
    /// which it reuses but never gives back) may reach before
    /// [`crate::Index::compact_due`] says so; the shard node then compacts
    /// when its writer is idle. 0: never on its own. Default 0.2.
    pub compact_free_ratio: f64,
    /// Lists per graph node that the link log may hold before
    /// [`crate::Index::fold_due`] says so; the shard node then folds the log
    /// into the blocks when its writer is idle, before compacting. 0: only
    /// batches fold (past `LinkLog`'s `fold_lists`). Default 0.1.
    pub idle_fold_ratio: f64,
    /// Bottom-layer blocks one write transaction of an idle fold rewrites
    /// (two blocks to a 4 KiB page at M=16): what bounds the pages such a
    /// commit dirties whatever the index's size. Default 4,096 (~8 MiB).
    pub fold_step_blocks: u32,
    /// Files below this size are never compacted on their own: the copy
    /// would cost more than the space is worth. Default 64 MiB.
    pub compact_min_bytes: u64,
    /// Let the kernel read ahead around page faults. Default false: graph
    /// searches read scattered pages, and readahead fills the page cache with
    /// pages nobody asked for (see `docs/engine.md`).
    pub read_ahead: bool,
    /// When the index opens, a data file of at most this many bytes is
    /// written back, dropped from the page cache and read back in order
    /// before it is mapped: searches over a file read in order ran 1.3x
    /// faster than over one faulted in page by page or written by commits
    /// (`docs/benchmarks.md`, "Page cache warm-up"). Default 0: never
    /// (a shard node sets it from its memory, `engine.warm_max_share`).
    pub warm_max_bytes: u64,
    /// Largest payload accepted per point. Default 64 KiB.
    pub max_payload_bytes: usize,
    /// LMDB reader slots (search sessions plus build threads). Default 512.
    pub max_readers: u32,
    /// Idle search sessions kept for reuse. Default 64.
    pub max_idle_sessions: usize,
    /// How long growing the map waits for open read transactions (snapshots,
    /// searches) before the batch fails with [`Error::ResizeBlocked`](crate::Error::ResizeBlocked).
    /// Searches keep running meanwhile. Default 30 s.
    pub resize_wait: Duration,
    /// Budget for the vector addresses all threads share across commits
    /// (8 bytes per vector). Default 256 MiB, enough for 32M vectors.
    pub shared_cache_bytes: usize,
    /// Which of a search's candidates are re-scored with the exact vectors
    /// (the walk ranks them by their codes). Default `Rescore::TopK(2)`.
    pub rescore: Rescore,
    /// How a search under a filter chooses between comparing the matching
    /// points and walking the graph (see [`PlannerOptions`]).
    pub planner: PlannerOptions,
    /// Where a batch writes the changed bottom-layer lists of existing
    /// nodes. Default `LinkLog::Auto { fold_lists: 131_072 }`.
    pub link_log: LinkLog,
    /// How many recent batches the batch log keeps for other copies to
    /// catch up from (see [`Index::read_log`](crate::Index::read_log)). Default 10,000 batches or
    /// 256 MiB, whichever is reached first; [`BatchLogRetention::OFF`]
    /// keeps none.
    pub batch_log: BatchLogRetention,
}

/// Where a batch writes the bottom-layer lists of existing nodes that it
/// changed (new nodes' lists always go to their blocks).
///
/// Patching a list into its block makes LMDB copy the block's whole page,
/// and at 100k points a batch of 1,000 changes lists in 84% of the blocks.
/// The log appends them instead, and a *fold* later patches everything it
/// holds into the blocks at once (see `docs/engine.md`). Searches read
/// through the log either way; none of this changes results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLog {
    /// Patch them into their blocks in every commit; a log left by an
    /// earlier setting is folded by the next batch.
    Off,
    /// Append them to the log when that, with the batch's share of the
    /// later fold, writes fewer bytes than patching their blocks would (so
    /// a small index, whose few blocks a batch rewrites anyway, keeps
    /// patching in place); fold once the log would hold more than
    /// `fold_lists` lists, or four times the changed lists of this batch
    /// or of the largest one the log holds if that is more (so that large
    /// batches into a large index fold in passes rather than each rewriting
    /// every block), but never more lists than the index has nodes.
    Auto {
        /// Lists the log may hold before a batch folds it. Each is
        /// `4 + 2 + 4·M0` bytes (134 with M=16) of disk, and every reader
        /// keeps 4 bytes per id for the log's index while it is not empty.
        fold_lists: usize,
    },
    /// Always append, folding past `fold_lists` (for tests and benchmarks).
    Always {
        /// As in `Auto`.
        fold_lists: usize,
    },
}

impl Default for LinkLog {
    fn default() -> Self {
        LinkLog::Auto { fold_lists: 131_072 }
    }
}

impl LinkLog {
    /// Lists the log may hold before a fold; `None` for `Off`.
    pub fn fold_lists(self) -> Option<usize> {
        match self {
            LinkLog::Off => None,
            LinkLog::Auto { fold_lists } | LinkLog::Always { fold_lists } => Some(fold_lists),
        }
    }
}

/// Which of a search's candidates (found by walking the graph on codes)
/// are re-scored with exact vectors. Hits and distances returned are always
/// exact; what changes is how many candidates compete for the top `k`.
///
/// On the PyPI set (384-d, cosine) `TopK(2)` gives the same recall@10 as
/// `All` at every `ef` from 16 to 256, while `TopK(1)` loses up to 0.007
/// (`docs/benchmarks.md`, "Re-scoring"); each re-scored candidate is one
/// exact-vector read, i.e. one page on a cold cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rescore {
    /// Every candidate (`ef` of them).
    All,
    /// The best `max(k × n, 20)` candidates by code distance (never more
    /// than `ef`).
    TopK(u16),
}

impl Default for Rescore {
    fn default() -> Self {
        Rescore::TopK(2)
    }
}

impl Rescore {
    /// Fewest candidates `TopK` re-scores: with `k = 1` the exact nearest
    /// neighbour must not hinge on a code-distance tie.
    const FLOOR: usize = 20;

    /// How many of `found` candidates to re-score for a top-`k` search;
    /// all of them when the search asked for every live point
    /// (`every_point`: its ef reaches the live count), so that such a
    /// search is exact: 4-bit codes rank low dimensions too coarsely for
    /// the best 2k by code to be sure to hold the true k.
    pub(crate) fn count(self, k: usize, found: usize, every_point: bool) -> usize {
        match self {
            _ if every_point => found,
            Rescore::All => found,
            Rescore::TopK(n) => k.saturating_mul(usize::from(n).max(1)).max(Self::FLOOR).min(found),
        }
    }
}

impl Default for IndexOptions {
    fn default() -> Self {
        IndexOptions {
            build_threads: std::thread::available_parallelism().map_or(1, usize::from),
            pool: None,
            cache_budget_bytes: 64 << 20,
            initial_map_size: 256 << 20,
            max_map_size: 1 << 40,
            durable: true,
            write_memory_bytes: 4 << 20,
            reuse_retired: true,
            vacuum_ratio: 0.05,
            compact_free_ratio: 0.2,
            idle_fold_ratio: 0.1,
            fold_step_blocks: 4096,
            compact_min_bytes: 64 << 20,
            read_ahead: false,
            warm_max_bytes: 0,
            max_payload_bytes: 64 << 10,
            max_readers: 512,
            max_idle_sessions: 64,
            shared_cache_bytes: 256 << 20,
            resize_wait: Duration::from_secs(30),
            rescore: Rescore::default(),
            planner: PlannerOptions::default(),
            link_log: LinkLog::default(),
            batch_log: BatchLogRetention::default(),
        }
    }
}
