//! The index of one shard: open, write batches, search.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use heed::{PutFlags, RwTxn};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::batch::{Batch, BatchOutcome, Op, Write, Written};
use crate::batch_log::{self, BatchLogRetention, LogApplied, LogEntry, LogRead};
use crate::build::{BuildCtx, LinkBlocks, Overlay, WorkQueue};
use crate::cache::SharedAddrs;
use crate::codec::{self, NODE_TOMBSTONE, NodeRecord, State};
use crate::error::{Error, InvalidInput, Rejected, Result};
use crate::hnsw::level_for;
use crate::links_log::{self, LogIndex, LogVersions};
use crate::params::IndexParams;
use crate::plan::{self, Done, Item, Kind, Plan};
use crate::session::{self, Hit, SearchParams, Session, StoredPoint};
use crate::stop::Stop;
use crate::store::{self, Store, StoreOptions};
use crate::view::Frozen;

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
    /// [`Error::MapSizeLimit`]. Default 1 TiB (address space, not disk).
    pub max_map_size: u64,
    /// Flush every commit to disk before acknowledging it. Default true.
    pub durable: bool,
    /// Let the kernel read ahead around page faults. Default false: graph
    /// searches read scattered pages, and readahead fills the page cache with
    /// pages nobody asked for (see `docs/engine.md`).
    pub read_ahead: bool,
    /// Largest payload accepted per point. Default 64 KiB.
    pub max_payload_bytes: usize,
    /// LMDB reader slots (search sessions plus build threads). Default 512.
    pub max_readers: u32,
    /// Idle search sessions kept for reuse. Default 64.
    pub max_idle_sessions: usize,
    /// How long growing the map waits for open read transactions (snapshots,
    /// searches) before the batch fails with [`Error::ResizeBlocked`].
    /// Searches keep running meanwhile. Default 30 s.
    pub resize_wait: Duration,
    /// Budget for the vector addresses all threads share across commits
    /// (8 bytes per vector). Default 256 MiB, enough for 32M vectors.
    pub shared_cache_bytes: usize,
    /// Which of a search's candidates are re-scored with the exact vectors
    /// (the walk ranks them by their codes). Default `Rescore::TopK(2)`.
    pub rescore: Rescore,
    /// Where a batch writes the changed bottom-layer lists of existing
    /// nodes. Default `LinkLog::Auto { fold_lists: 131_072 }`.
    pub link_log: LinkLog,
    /// How many recent batches the batch log keeps for other copies to
    /// catch up from (see [`Index::read_log`]). Default 10,000 batches or
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
    /// `fold_lists` lists, or more lists than the index has nodes.
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
/// (see `docs/engine.md`); each re-scored candidate is one exact-vector read,
/// i.e. one page on a cold cache.
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

    /// How many of `found` candidates to re-score for a top-`k` search.
    pub(crate) fn count(self, k: usize, found: usize) -> usize {
        match self {
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
            read_ahead: false,
            max_payload_bytes: 64 << 10,
            max_readers: 512,
            max_idle_sessions: 64,
            shared_cache_bytes: 256 << 20,
            resize_wait: Duration::from_secs(30),
            rescore: Rescore::default(),
            link_log: LinkLog::default(),
            batch_log: BatchLogRetention::default(),
        }
    }
}

/// Counters and sizes of an index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexStats {
    /// Creation parameters.
    pub params: IndexParams,
    /// Points a search can return.
    pub live: u64,
    /// Retired nodes kept for routing.
    pub tombstones: u64,
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
    /// [`LinkLog`]); a list changed by two batches counts twice.
    pub link_log_lists: u64,
    /// The shard's epoch (see [`Index::fence`]).
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
}

/// One shard's vector index in its own LMDB environment.
///
/// Writes are serialised (LMDB has one writer per environment) and each
/// [`Index::apply_group`] call is one atomic commit. Searches run from any
/// number of threads on committed snapshots and never wait for writers.
pub struct Index {
    pub(crate) store: Store,
    pub(crate) params: IndexParams,
    opts: IndexOptions,
    pool: Option<Arc<rayon::ThreadPool>>,
    /// Serialises writers; also held by `copy` to pin the commit it copies.
    pub(crate) writer: Mutex<()>,
    /// Held shared by every user of a transaction; taken exclusively to grow
    /// the map, which LMDB allows only with no transaction open. It guards
    /// the shared vector addresses, which the remap invalidates.
    pub(crate) resize: RwLock<SharedAddrs>,
    sessions: Mutex<Vec<Session>>,
    generation: AtomicU64,
    /// The link log's index per epoch a reader may pair with.
    log: LogVersions,
    /// The environment's page size: the least a log value takes, so that
    /// it lives in overflow pages no later commit rewrites.
    page_size: usize,
}

/// What [`Index::open`] does when the directory holds no index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    /// Create it with these parameters, at this epoch.
    Create(IndexParams, u64),
    Fail,
}

impl Index {
    /// Opens the index in `path`, creating it with `params` if there is
    /// none. An existing index must have been created with the same params.
    pub fn open_or_create(path: impl AsRef<Path>, params: IndexParams, opts: IndexOptions) -> Result<Index> {
        Self::open_or_create_at_epoch(path, params, 1, opts)
    }

    /// As [`Index::open_or_create`]; an index it creates starts at
    /// `epoch` (0 reads as 1). An existing index keeps its own epoch.
    pub fn open_or_create_at_epoch(path: impl AsRef<Path>, params: IndexParams, epoch: u64, opts: IndexOptions) -> Result<Index> {
        params.validate()?;
        Self::open_with(path.as_ref(), Missing::Create(params, epoch.max(1)), opts)
    }

    /// Opens an existing index.
    pub fn open(path: impl AsRef<Path>, opts: IndexOptions) -> Result<Index> {
        Self::open_with(path.as_ref(), Missing::Fail, opts)
    }

    fn open_with(path: &Path, missing: Missing, opts: IndexOptions) -> Result<Index> {
        if missing == Missing::Fail && !path.join("data.mdb").exists() {
            return Err(Error::NotFound { path: path.to_owned() });
        }
        // A create that fails (a full disk, too many open files) leaves
        // nothing behind; the index and its environment are closed by then.
        let creation = store::Creation::before(path);
        let opened = Self::open_store(path, missing, opts);
        if opened.is_err() {
            creation.undo();
        }
        opened
    }

    fn open_store(path: &Path, missing: Missing, opts: IndexOptions) -> Result<Index> {
        let store = Store::open(
            path,
            &StoreOptions {
                initial_map_size: opts.initial_map_size,
                max_map_size: opts.max_map_size,
                max_readers: opts.max_readers,
                durable: opts.durable,
                read_ahead: opts.read_ahead,
            },
        )?;
        let params = Self::load_or_init_params(&store, missing)?;
        let pool = match (&opts.pool, opts.build_threads) {
            (Some(pool), _) => Some(Arc::clone(pool)),
            (None, 0 | 1) => None,
            (None, n) => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n - 1)
                    .thread_name(|i| format!("shoal-build-{i}"))
                    .build()
                    .map_err(|e| Error::Io { path: path.to_owned(), source: std::io::Error::other(e) })?,
            )),
        };
        let page = store.page_size() as usize;
        let lag = |bytes| codec::values_per_leaf(bytes, page) as u32 + 1;
        // Code blocks live in overflow pages that move only while the block
        // is the newest, partial one.
        let codes_lag = params.codes_per_block() + 1;
        let shared = SharedAddrs::new(opts.shared_cache_bytes, codes_lag, lag(params.vector_bytes()));
        let log = {
            let txn = store.env.read_txn().map_err(|e| store.err(e))?;
            let state = session::read_state(&store, &txn)?;
            check_counts(&store, &txn, &state)?;
            let list_bytes = codec::links_bytes(params.max_links(0));
            LogVersions::new(state.log_epoch, LogIndex::load(&store, &txn, list_bytes, state.next_id)?)
        };
        Ok(Index {
            store,
            params,
            opts,
            pool,
            writer: Mutex::new(()),
            resize: RwLock::new(shared),
            sessions: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            log,
            page_size: page,
        })
    }

    fn load_or_init_params(store: &Store, missing: Missing) -> Result<IndexParams> {
        let mut wtxn = store.env.write_txn().map_err(|e| store.err(e))?;
        let stored = store.dbs.meta.get(&wtxn, codec::META_PARAMS).map_err(|e| store.err(e))?.map(<[u8]>::to_vec);
        match (stored, missing) {
            (Some(bytes), _) => {
                let found = codec::decode_params(&bytes).map_err(|e| match e {
                    codec::ParamsDecodeError::Version(found) => {
                        Error::UnsupportedFormat { path: store.path.clone(), found, supported: codec::FORMAT_VERSION }
                    }
                    codec::ParamsDecodeError::Malformed => {
                        Error::Corrupt { path: store.path.clone(), detail: "index parameters are malformed".into() }
                    }
                })?;
                found.validate().map_err(|e| Error::Corrupt {
                    path: store.path.clone(),
                    detail: format!("stored index parameters are invalid: {e}"),
                })?;
                if let Missing::Create(requested, _) = missing
                    && requested != found
                {
                    return Err(Error::ParamsMismatch {
                        path: store.path.clone(),
                        found: found.to_string(),
                        requested: requested.to_string(),
                    });
                }
                wtxn.abort();
                Ok(found)
            }
            (None, Missing::Create(params, epoch)) => {
                let state = State { shard_epoch: epoch, ..State::default() };
                store.dbs.meta.put(&mut wtxn, codec::META_PARAMS, &codec::encode_params(&params)).map_err(|e| store.err(e))?;
                store.dbs.meta.put(&mut wtxn, codec::META_STATE, &state.encode()).map_err(|e| store.err(e))?;
                wtxn.commit().map_err(|e| store.err(e))?;
                Ok(params)
            }
            // A create that died before its parameters were written leaves
            // no state either; a state without parameters is damage.
            (None, Missing::Fail)
                if store.dbs.meta.get(&wtxn, codec::META_STATE).map_err(|e| store.err(e))?.is_some()
                    || store.dbs.nodes.len(&wtxn).map_err(|e| store.err(e))? > 0 =>
            {
                Err(Error::Corrupt { path: store.path.clone(), detail: "the index holds data but its parameters record is missing".into() })
            }
            (None, Missing::Fail) => Err(Error::NotFound { path: store.path.clone() }),
        }
    }

    /// The parameters the index was created with.
    pub fn params(&self) -> &IndexParams {
        &self.params
    }

    /// Directory of the environment.
    pub fn path(&self) -> &Path {
        &self.store.path
    }

    /// Applies one batch atomically, unfenced. Invalid input is an
    /// [`Error::Invalid`] and changes nothing.
    pub fn apply(&self, batch: Batch) -> Result<BatchOutcome> {
        self.apply_fenced(batch, 0)
    }

    /// Applies one batch atomically if `epoch` is not below the shard's
    /// (0: unfenced); a higher epoch becomes the shard's in the batch's
    /// transaction. A lower one is [`Error::StaleEpoch`] and changes
    /// nothing.
    pub fn apply_fenced(&self, batch: Batch, epoch: u64) -> Result<BatchOutcome> {
        match self.write_one(Item { batch, kind: Kind::Fresh, epoch })? {
            Done::Batch(outcome, _) => Ok(outcome),
            Done::Fenced { .. } | Done::Replayed { .. } => Err(self.mixed_up()),
        }
    }

    /// Raises the shard's epoch to `epoch` durably and returns it; from
    /// then on writes stamped with a lower epoch are refused. Ordered
    /// with batches by the writer lock: a batch in flight commits first.
    /// Raising to the current epoch changes nothing; lowering it is
    /// [`Error::EpochLowered`].
    pub fn fence(&self, epoch: u64) -> Result<u64> {
        match self.write_one(Item { batch: Batch::default(), kind: Kind::Fence, epoch })? {
            Done::Fenced { epoch } => Ok(epoch),
            Done::Batch(..) | Done::Replayed { .. } => Err(self.mixed_up()),
        }
    }

    /// Applies several unfenced batches in one write transaction (group
    /// commit). Each batch is accepted or rejected whole; the accepted ones
    /// commit together. The outer error means nothing was committed.
    pub fn apply_group(&self, batches: Vec<Batch>) -> Result<Vec<Result<BatchOutcome, Rejected>>> {
        let writes = batches.into_iter().map(|batch| Write::Batch { batch, epoch: 0 }).collect();
        let outcomes = self.write(writes)?;
        Ok(outcomes
            .into_iter()
            .map(|o| match o {
                Ok(Written::Batch { outcome, .. }) => Ok(outcome),
                // Only batches were written.
                Ok(Written::Fenced { epoch }) => Err(Rejected::EpochLowered { current: epoch, requested: 0 }),
                Err(e) => Err(e),
            })
            .collect())
    }

    /// Applies a group of writes, in order, in one write transaction
    /// (the shard writer's group commit). Each write is accepted or
    /// refused on its own ([`Rejected`]: invalid, or fenced off by its
    /// epoch) and a refused one leaves no trace; the accepted ones commit
    /// together. The outer error means nothing was committed.
    pub fn write(&self, writes: Vec<Write>) -> Result<Vec<Result<Written, Rejected>>> {
        let items = writes
            .into_iter()
            .map(|w| match w {
                Write::Batch { batch, epoch } => Item { batch, kind: Kind::Fresh, epoch },
                Write::Fence { epoch } => Item { batch: Batch::default(), kind: Kind::Fence, epoch },
            })
            .collect();
        let (done, _) = self.write_items(items, false)?;
        Ok(done
            .into_iter()
            .map(|d| match d? {
                Done::Batch(outcome, seq) => Ok(Written::Batch { outcome, seq }),
                Done::Fenced { epoch } => Ok(Written::Fenced { epoch }),
                // Only batches and fences were written.
                Done::Replayed { .. } => Err(Rejected::Invalid(InvalidInput::EmptyBatch)),
            })
            .collect())
    }

    /// Applies entries of another copy's batch log (see
    /// [`Index::read_log`]) in one write transaction, all or none, fenced
    /// by `epoch` like a batch. Each entry applies only if its sequence
    /// number is the one after this copy's last: entries this copy holds
    /// already are skipped, a gap is [`Error::LogGap`]. An applied entry
    /// moves its source's offset (never backwards) and is appended to
    /// this copy's own log under the same number, so this copy's log
    /// continues the other's.
    pub fn apply_log(&self, entries: Vec<LogEntry>, epoch: u64) -> Result<LogApplied> {
        let items: Vec<Item> = entries
            .into_iter()
            .map(|e| {
                let mut ops: Vec<Op> = Vec::with_capacity(e.deletes.len() + e.points.len());
                ops.extend(e.deletes.into_iter().map(Op::DeleteIfPresent));
                ops.extend(e.points.into_iter().map(Op::Upsert));
                Item { batch: Batch { ops, source: e.source }, kind: Kind::Replay(e.seq), epoch }
            })
            .collect();
        let (done, last_seq) = self.write_items(items, true)?;
        let (mut applied, mut skipped) = (0, 0);
        for d in done {
            match d? {
                Done::Replayed { skipped: true } => skipped += 1,
                Done::Replayed { skipped: false } => applied += 1,
                Done::Batch(..) | Done::Fenced { .. } => return Err(self.mixed_up()),
            }
        }
        Ok(LogApplied { last_seq, applied, skipped })
    }

    /// Entries of the batch log from sequence number `from_seq` on, as
    /// many as fit in `max_bytes` of stored entries (at least one if there
    /// is one), with the log's first and last numbers. A copy restored
    /// from a snapshot of this shard holds the batches up to its own
    /// `last_seq` and reads from the one after. [`Error::LogTruncated`]
    /// if the log no longer reaches back to `from_seq` (re-seed the copy
    /// from a snapshot); [`Error::LogAhead`] if `from_seq` is past the
    /// next batch.
    pub fn read_log(&self, from_seq: u64, max_bytes: u64) -> Result<LogRead> {
        let _shared = self.resize.read();
        let txn = self.store.env.read_txn().map_err(|e| self.store.err(e))?;
        let state = session::read_state(&self.store, &txn)?;
        batch_log::read(&self.store, &txn, &state, from_seq, max_bytes, self.params.dim as usize)
    }

    fn mixed_up(&self) -> Error {
        Error::Corrupt { path: self.store.path.clone(), detail: "a write's outcome is of another kind (a bug)".into() }
    }

    /// One item in its own transaction; its refusal is the error.
    fn write_one(&self, item: Item) -> Result<Done> {
        let (mut done, _) = self.write_items(vec![item], true)?;
        match done.pop() {
            Some(d) => Ok(d?),
            None => Err(self.mixed_up()),
        }
    }

    /// Writes a group of items in one transaction. With `all_or_nothing`,
    /// one refused item aborts the transaction (the outcomes say which).
    /// Also returns the last sequence number after the group.
    fn write_items(&self, mut items: Vec<Item>, all_or_nothing: bool) -> Result<(Vec<Result<Done, Rejected>>, u64)> {
        let checked: Vec<Result<(), InvalidInput>> =
            items.iter_mut().map(|item| plan::prepare_item(item, &self.params, self.opts.max_payload_bytes)).collect();
        let _writer = self.writer.lock();
        let _span = tracing::debug_span!("engine.apply", batches = items.len()).entered();
        loop {
            let attempt = {
                let shared = self.resize.read();
                self.write_once(&items, &checked, &shared, all_or_nothing)
            };
            match attempt {
                Ok(outcomes) => return Ok(outcomes),
                Err(Attempt::MapFull) => self.grow_map()?,
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
    }

    fn write_once(
        &self,
        items: &[Item],
        checked: &[Result<(), InvalidInput>],
        shared: &SharedAddrs,
        all_or_nothing: bool,
    ) -> Result<(Vec<Result<Done, Rejected>>, u64), Attempt> {
        let store = &self.store;
        let mut wtxn = store.env.write_txn().map_err(|e| attempt(store, e))?;
        let state = session::read_state(store, &wtxn)?;
        let resolving = tracing::debug_span!("resolve").entered();
        let mut plan = plan::resolve(
            items,
            checked,
            plan::Start { epoch: state.shard_epoch, last_seq: state.last_seq },
            |id| session::lookup_external(store, &wtxn, id),
            |source| session::read_offset(store, &wtxn, source),
        )?;
        crate::locality::order(&mut plan.inserts, &self.params);
        drop(resolving);
        if all_or_nothing && plan.outcomes.iter().any(Result::is_err) {
            wtxn.abort();
            return Ok((plan.outcomes, state.last_seq));
        }
        if plan.is_empty(state.shard_epoch) {
            wtxn.abort();
            return Ok((plan.outcomes, plan.last_seq));
        }
        let next = u64::from(state.next_id) + plan.inserts.len() as u64;
        if next > u64::from(u32::MAX) {
            return Err(Attempt::Failed(Error::IdSpaceExhausted { used: u64::from(state.next_id), max: u64::from(u32::MAX) }));
        }
        let live = (state.live + plan.inserts.len() as u64).checked_sub(plan.tombstones.len() as u64).ok_or_else(|| Error::Corrupt {
            path: store.path.clone(),
            detail: format!("{} live points, but {} to retire", state.live, plan.tombstones.len()),
        })?;
        let levels = tracing::debug_span!("write_points", inserts = plan.inserts.len(), retired = plan.tombstones.len())
            .in_scope(|| self.write_points(&mut wtxn, &plan, state.next_id))?;
        let log = self.log.get(state.log_epoch).ok_or_else(|| Error::Corrupt {
            path: store.path.clone(),
            detail: format!("link log epoch {} has no index (the file changed under the index?)", state.log_epoch),
        })?;
        let Linked { entry, log: new_log } = self.link(&mut wtxn, &plan, levels, Base { state: &state, shared, log: &log }, live)?;
        let (log_first_seq, log_bytes) = tracing::debug_span!("batch_log", entries = plan.logged.len())
            .in_scope(|| self.write_batch_log(&mut wtxn, items, &plan, &state))?;
        let new_state = State {
            next_id: next as u32,
            entry,
            live,
            tombstones: state.tombstones + plan.tombstones.len() as u64,
            log_epoch: state.log_epoch + u64::from(new_log.is_some()),
            shard_epoch: plan.epoch,
            last_seq: plan.last_seq,
            log_first_seq,
            log_bytes,
        };
        let put = |w: &mut RwTxn<'_>, db: store::Db, k: &[u8], v: &[u8]| db.put(w, k, v).map_err(|e| attempt(store, e));
        put(&mut wtxn, store.dbs.meta, codec::META_STATE, &new_state.encode())?;
        for &(source, offset) in &plan.offsets {
            put(&mut wtxn, store.dbs.offsets, source.as_bytes(), &offset.to_be_bytes())?;
        }
        // Readers that see this commit pair with its log version, so it must
        // exist before the commit does (`links_log::LogVersions`).
        if let Some(new_log) = new_log {
            self.log.stage(new_state.log_epoch, Arc::new(new_log));
        }
        let committed = tracing::debug_span!("commit").in_scope(|| wtxn.commit());
        if let Err(e) = committed {
            if new_state.log_epoch != state.log_epoch {
                self.log.unstage(new_state.log_epoch);
            }
            return Err(attempt(store, e));
        }
        self.log.settle(new_state.log_epoch);
        self.generation.fetch_add(1, Ordering::Release);
        // Idle sessions pin the previous snapshot's pages; let them go.
        self.sessions.lock().clear();
        Ok((plan.outcomes, plan.last_seq))
    }

    /// Appends the group's accepted batches to the batch log under their
    /// sequence numbers and drops the oldest entries past the retention.
    /// Returns the log's first sequence number and bytes afterwards.
    fn write_batch_log(&self, wtxn: &mut RwTxn<'_>, items: &[Item], plan: &Plan<'_>, state: &State) -> Result<(u64, u64), Attempt> {
        let store = &self.store;
        let db = store.dbs.batch_log;
        let err = |e| attempt(store, e);
        let BatchLogRetention { max_batches, max_bytes } = self.opts.batch_log;
        if max_batches == 0 {
            // Off: nothing is kept, and entries an earlier setting kept
            // would leave a hole in the numbers: drop them.
            if state.log_entries() > 0 {
                db.clear(wtxn).map_err(err)?;
            }
            return Ok((plan.last_seq + 1, 0));
        }
        let (mut first, mut bytes) = (state.log_first_seq, state.log_bytes);
        let dim = self.params.dim as usize;
        let mut value = Vec::new();
        for logged in &plan.logged {
            let batch = &items[logged.item].batch;
            let points = logged.upserts.iter().filter_map(|&op| match &batch.ops[op] {
                Op::Upsert(p) => Some((p.id, p.vector.as_slice(), p.payload.as_deref())),
                Op::Delete(_) | Op::DeleteIfPresent(_) => None,
            });
            let points: Vec<_> = points.collect();
            batch_log::encode(&mut value, batch.source.as_ref(), &logged.deletes, points.into_iter(), dim);
            // Sequence numbers only grow: every entry is the largest key.
            db.put_with_flags(wtxn, PutFlags::APPEND, &batch_log::key(logged.seq), &value).map_err(err)?;
            bytes += value.len() as u64;
        }
        // The oldest go first; the newest always stays.
        let mut entries = (plan.last_seq + 1).saturating_sub(first);
        while entries > max_batches || (entries > 1 && bytes > max_bytes) {
            let key = batch_log::key(first);
            let len = db
                .get(wtxn, &key)
                .map_err(err)?
                .map(<[u8]>::len)
                .ok_or_else(|| Error::Corrupt { path: store.path.clone(), detail: format!("batch log entry {first} is missing") })?;
            db.delete(wtxn, &key).map_err(err)?;
            bytes = bytes.saturating_sub(len as u64);
            first += 1;
            entries -= 1;
        }
        Ok((first, bytes))
    }

    /// Retires replaced and deleted nodes and writes the new points' vectors,
    /// records, payloads and ids. Returns the new points' levels.
    fn write_points(&self, wtxn: &mut RwTxn<'_>, plan: &Plan<'_>, first_new: u32) -> Result<Vec<u8>, Attempt> {
        let store = &self.store;
        let dbs = &store.dbs;
        let err = |e| attempt(store, e);
        for &dead in &plan.tombstones {
            let mut record = session::read_node(store, wtxn, dead)?;
            record.flags |= NODE_TOMBSTONE;
            dbs.nodes.put(wtxn, &codec::id_key(dead), &record.encode()).map_err(err)?;
            dbs.payloads.delete(wtxn, &codec::id_key(dead)).map_err(err)?;
        }
        for &external in &plan.removed {
            dbs.external.delete(wtxn, &codec::external_key(external)).map_err(err)?;
        }
        let scale = self.params.level_scale();
        let mut code = Vec::with_capacity(self.params.code_bytes());
        let mut levels = Vec::with_capacity(plan.inserts.len());
        let mut ids: Vec<(u64, u32)> = Vec::with_capacity(plan.inserts.len());
        let mut codes = Vec::with_capacity(plan.inserts.len() * code.capacity());
        for (i, p) in plan.inserts.iter().enumerate() {
            let id = first_new + i as u32;
            let key = codec::id_key(id);
            let level = level_for(self.params.seed, id, scale);
            levels.push(level);
            // Ids only grow, so every new key is the largest: APPEND fills
            // pages completely instead of splitting them in half.
            dbs.vectors.put_with_flags(wtxn, PutFlags::APPEND, &key, codec::vector_bytes(p.vector)).map_err(err)?;
            code.clear();
            crate::quant::encode(p.vector, &mut code);
            codes.extend_from_slice(&code);
            let record = NodeRecord { external: p.external, level, flags: 0 };
            dbs.nodes.put_with_flags(wtxn, PutFlags::APPEND, &key, &record.encode()).map_err(err)?;
            if let Some(payload) = p.payload {
                dbs.payloads.put_with_flags(wtxn, PutFlags::APPEND, &key, payload).map_err(err)?;
            }
            ids.push((p.external, id));
        }
        self.write_blocks(wtxn, dbs.codes, self.params.codes_per_block(), self.params.code_bytes(), first_new, &codes)?;
        // External ids are the user's and may be random: writing them in key
        // order at least keeps each touched page touched once.
        ids.sort_unstable();
        for (external, id) in ids {
            dbs.external.put(wtxn, &codec::external_key(external), &codec::id_key(id)).map_err(err)?;
        }
        Ok(levels)
    }

    /// Appends `values` (consecutive fixed-size values of ids `first_new..`)
    /// to `db`, stored `per_block` to a value keyed by block number: the
    /// newest block may be partial, so it is read and completed first; the
    /// rest are appended.
    fn write_blocks(
        &self,
        wtxn: &mut RwTxn<'_>,
        db: store::Db,
        per_block: u32,
        value_bytes: usize,
        first_new: u32,
        values: &[u8],
    ) -> Result<(), Attempt> {
        let store = &self.store;
        let err = |e| attempt(store, e);
        let full = per_block as usize * value_bytes;
        let mut block_no = first_new / per_block;
        let mut block: Vec<u8> = Vec::with_capacity(full);
        let held = (first_new % per_block) as usize;
        if held > 0 {
            match db.get(wtxn, &codec::id_key(block_no)).map_err(err)? {
                Some(old) if old.len() == held * value_bytes => block.extend_from_slice(old),
                found => {
                    let detail = format!("block {block_no} has {} bytes, expected {}", found.map_or(0, <[u8]>::len), held * value_bytes);
                    return Err(Attempt::Failed(Error::Corrupt { path: store.path.clone(), detail }));
                }
            }
        }
        let mut replace = held > 0;
        let mut rest = values;
        while !rest.is_empty() {
            let take = (full - block.len()).min(rest.len());
            block.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if block.len() == full || rest.is_empty() {
                let key = codec::id_key(block_no);
                // Block numbers only grow: a new block is the largest key.
                if replace { db.put(wtxn, &key, &block) } else { db.put_with_flags(wtxn, PutFlags::APPEND, &key, &block) }.map_err(err)?;
                block.clear();
                block_no += 1;
                replace = false;
            }
        }
        Ok(())
    }

    /// Repairs around retired nodes and links the new ones, in parallel on
    /// nested read transactions; then writes every changed link list.
    fn link(&self, wtxn: &mut RwTxn<'_>, plan: &Plan<'_>, levels: Vec<u8>, from: Base<'_>, live: u64) -> Result<Linked, Attempt> {
        let Base { state, shared, log } = from;
        let first_new = state.next_id;
        let mut entry = state.entry;
        // Nodes whose level is above every level before them become the entry
        // point in turn; they are linked one by one first (there are only
        // O(log n) of them), so that the parallel phase has a fixed entry.
        // A retired entry point still routes, but the first new node that
        // reaches its level takes over, so searches start on a live node.
        let mut entry_retired = match entry {
            Some((id, _)) => session::read_node(&self.store, wtxn, id)?.is_tombstone(),
            None => false,
        };
        let mut promoters = Vec::new();
        let mut top = entry.map(|e| e.1);
        for (i, &l) in levels.iter().enumerate() {
            if top.is_none_or(|t| l > t || (entry_retired && l == t)) {
                promoters.push(i as u32);
                top = Some(l);
                entry_retired = false;
            }
        }
        let overlay = Overlay::new(first_new, levels);
        let link_blocks = LinkBlocks::new(first_new, codec::links0_block_nodes(self.params.max_links(0)) as u32);
        let ctx = BuildCtx {
            store: &self.store,
            params: &self.params,
            overlay: &overlay,
            link_blocks: &link_blocks,
            has_tombstones: state.tombstones > 0 || !plan.tombstones.is_empty(),
            live,
            cache_budget: self.opts.cache_budget_bytes,
            frozen: Frozen::new(shared, first_new),
            log,
        };
        let pool = self.pool.as_deref();
        if !plan.tombstones.is_empty() {
            let _span = tracing::debug_span!("repair", retired = plan.tombstones.len()).entered();
            let queue = WorkQueue::new(plan.tombstones.len());
            ctx.run(wtxn, pool, |view, w| match queue.pop() {
                Some(i) => ctx.repair(view, w, plan.tombstones[i]).map(|()| true),
                None => Ok(false),
            })?;
        }
        if !promoters.is_empty() {
            let _span = tracing::debug_span!("promote", nodes = promoters.len()).entered();
            let shared_entry = Mutex::new(entry);
            ctx.run(wtxn, None, |view, w| {
                for &p in &promoters {
                    let id = first_new + p;
                    let level = overlay.level_of_new(id);
                    let current = *shared_entry.lock();
                    if let Some(e) = current {
                        ctx.insert(view, w, id, e)?;
                    }
                    *shared_entry.lock() = Some((id, level));
                }
                Ok(false)
            })?;
            entry = shared_entry.into_inner();
        }
        if let Some(e) = entry {
            let rest: Vec<u32> = (0..overlay_len(plan)).filter(|i| promoters.binary_search(i).is_err()).collect();
            let _span = tracing::debug_span!("insert", nodes = rest.len()).entered();
            let queue = WorkQueue::new(rest.len());
            ctx.run(wtxn, pool, |view, w| match queue.pop() {
                Some(i) => ctx.insert(view, w, first_new + rest[i], e).map(|()| true),
                None => Ok(false),
            })?;
        }
        let _span = tracing::debug_span!("write_links", lists = tracing::field::Empty, blocks = tracing::field::Empty).entered();
        let changes = overlay.into_changes();
        let log = self.write_links(wtxn, changes, first_new, state.log_epoch, log)?;
        Ok(Linked { entry, log })
    }

    /// Writes every changed link list: upper layers one value per node;
    /// on the bottom layer, new nodes' lists into their blocks and existing
    /// nodes' lists either into theirs or appended to the link log (see
    /// [`LinkLog`]). Returns the log's next version if this commit appends
    /// to it or folds it.
    fn write_links(
        &self,
        wtxn: &mut RwTxn<'_>,
        changes: crate::build::LinkChanges,
        first_new: u32,
        epoch: u64,
        log: &LogIndex,
    ) -> Result<Option<LogIndex>, Attempt> {
        let span = tracing::Span::current();
        let dbs = &self.store.dbs;
        let err = |e| attempt(&self.store, e);
        let mut old: Vec<(u32, &[u32])> = Vec::with_capacity(changes.touched.len());
        let mut new: Vec<(u32, &[u32])> = Vec::with_capacity(changes.new.len());
        let mut buf = Vec::new();
        // `touched` is sorted by (level, id): `old` comes out in id order.
        for ((l, id), list) in &changes.touched {
            if *l == 0 {
                old.push((*id, list));
            } else {
                codec::encode_links(list, self.params.max_links(*l), &mut buf);
                dbs.links_up.put(wtxn, &codec::upper_key(*l, *id), &buf).map_err(err)?;
            }
        }
        for (i, lists) in changes.new.iter().enumerate() {
            let id = changes.first_new + i as u32;
            new.push((id, &lists[0]));
            for (l, list) in lists.iter().enumerate().skip(1) {
                codec::encode_links(list, self.params.max_links(l as u8), &mut buf);
                dbs.links_up.put(wtxn, &codec::upper_key(l as u8, id), &buf).map_err(err)?;
            }
        }
        span.record("lists", old.len() + new.len());
        let m0 = self.params.max_links(0);
        let next_epoch = epoch + 1;
        match self.log_decision(log, &old, first_new) {
            LogDecision::Keep => {
                let blocks = self.patch_blocks(wtxn, first_new, &new, &LogIndex::default())?;
                span.record("blocks", blocks);
                Ok(None)
            }
            LogDecision::Append => {
                let _s = tracing::debug_span!("append_log", lists = old.len()).entered();
                let blocks = self.patch_blocks(wtxn, first_new, &new, &LogIndex::default())?;
                span.record("blocks", blocks);
                // Written straight into the pages LMDB reserves: a batch's
                // value is about a megabyte at 100k points.
                let len = links_log::value_bytes(old.len(), m0, self.page_size);
                dbs.links0_log
                    .put_reserved(wtxn, &next_epoch.to_be_bytes(), len, |space| {
                        links_log::write_value(old.iter().copied(), m0, space)?;
                        space.fill_zeroes();
                        Ok(())
                    })
                    .map_err(err)?;
                Ok(Some(log.with_value(next_epoch, old.iter().map(|(id, _)| *id))))
            }
            LogDecision::Fold => {
                let _s = tracing::debug_span!("fold_log", logged = log.records()).entered();
                let mut direct = old;
                direct.extend_from_slice(&new);
                let blocks = self.patch_blocks(wtxn, first_new, &direct, log)?;
                span.record("blocks", blocks);
                if log.is_empty() {
                    return Ok(None);
                }
                dbs.links0_log.clear(wtxn).map_err(err)?;
                Ok(Some(LogIndex::default()))
            }
        }
    }

    /// What this batch does with the changed lists of existing nodes,
    /// `old` (ascending ids), in an index of `nodes` nodes before it.
    fn log_decision(&self, log: &LogIndex, old: &[(u32, &[u32])], nodes: u32) -> LogDecision {
        // The log never holds more lists than the index has nodes: past
        // that it is larger than the blocks it shadows, and a fold (which
        // rewrites at most every block) costs less than carrying it.
        let Some(fold_lists) = self.opts.link_log.fold_lists() else { return LogDecision::Fold };
        let fold_lists = (fold_lists as u64).min(u64::from(nodes));
        if old.is_empty() {
            return LogDecision::Keep;
        }
        if log.records() + old.len() as u64 > fold_lists
            || log.values().len() >= links_log::MAX_VALUES
            || old.len() > links_log::MAX_RECORDS
        {
            return LogDecision::Fold;
        }
        if matches!(self.opts.link_log, LinkLog::Always { .. }) || !log.is_empty() {
            return LogDecision::Append;
        }
        // With an empty log, choose by the bytes a batch costs: patching in
        // place writes the blocks it touches; appending writes the records,
        // plus its share of the fold that will rewrite (nearly) every block
        // once the log holds `fold_lists` lists. A small index has few
        // blocks and a batch touches most of them, so it keeps patching.
        let list_bytes = codec::links_bytes(self.params.max_links(0)) as u64;
        let per_block = codec::links0_block_nodes(self.params.max_links(0)) as u32;
        let block_bytes = list_bytes * u64::from(per_block);
        let mut touched = 0u64;
        let mut last = None;
        for (id, _) in old {
            if last != Some(id / per_block) {
                touched += 1;
                last = Some(id / per_block);
            }
        }
        let lists = old.len() as u64;
        let all_blocks = u64::from(nodes.div_ceil(per_block));
        // `fold_lists` ≥ `lists` ≥ 1 here (checked above).
        let append = lists * links_log::record_bytes(list_bytes as usize) as u64 + all_blocks * block_bytes * lists / fold_lists;
        if touched * block_bytes <= append { LogDecision::Fold } else { LogDecision::Append }
    }

    /// Patches bottom-layer lists into their blocks: `direct` (ascending
    /// ids), and every list the log version `fold` holds that `direct`
    /// does not replace (an empty version when not folding). Blocks are read, patched and rewritten
    /// once each, in key order; blocks past the ones that existed before
    /// `first_new` are appended. Returns how many blocks were written.
    fn patch_blocks(&self, wtxn: &mut RwTxn<'_>, first_new: u32, direct: &[(u32, &[u32])], fold: &LogIndex) -> Result<usize, Attempt> {
        // Lists are gathered a round at a time, as bytes, because the
        // logged ones are read from values of this very transaction, which
        // cannot be borrowed while blocks are written; a round bounds the
        // memory a fold needs whatever the log holds.
        const ROUND: usize = 4096;
        let dbs = &self.store.dbs;
        let err = |e| attempt(&self.store, e);
        let m0 = self.params.max_links(0);
        let per_block = codec::links0_block_nodes(m0) as u32;
        let list_len = codec::links_bytes(m0);
        // Blocks that held no node before this batch do not exist yet.
        let first_unwritten_block = first_new.div_ceil(per_block);
        let mut logged = fold.entries().peekable();
        let mut direct = direct.iter().peekable();
        let mut round: Vec<u32> = Vec::with_capacity(ROUND);
        let mut bytes: Vec<u8> = Vec::with_capacity(ROUND * list_len);
        let mut block_buf = Vec::new();
        let mut written = 0usize;
        let mut last_block: Option<u32> = None;
        loop {
            round.clear();
            bytes.clear();
            {
                // Each log value read once per round.
                let mut values: Vec<Option<links_log::Value<'_>>> = Vec::new();
                while round.len() < ROUND {
                    let next_logged = logged.peek().map(|(id, _)| *id);
                    let next_direct = direct.peek().map(|(id, _)| *id);
                    let at = bytes.len();
                    // A list of this batch replaces the logged one of its id.
                    let take_direct = match (next_direct, next_logged) {
                        (None, None) => break,
                        (Some(d), Some(l)) => d <= l,
                        (Some(_), None) => true,
                        (None, Some(_)) => false,
                    };
                    if take_direct {
                        let Some(&(id, list)) = direct.next() else { break };
                        if next_logged == Some(id) {
                            logged.next();
                        }
                        bytes.resize(at + list_len, 0);
                        codec::write_links(list, &mut bytes[at..]);
                        round.push(id);
                    } else {
                        let Some((id, (slot, record))) = logged.next() else { break };
                        if values.len() <= slot {
                            values.resize(slot + 1, None);
                        }
                        let value = match values[slot] {
                            Some(v) => v,
                            None => *values[slot].insert(links_log::Value::read(&self.store, wtxn, fold, slot, list_len)?),
                        };
                        let list = value.list(record).ok_or_else(|| Error::Corrupt {
                            path: self.store.path.clone(),
                            detail: format!("link log record {record} of node {id} is past its value"),
                        })?;
                        bytes.extend_from_slice(list);
                        round.push(id);
                    }
                }
            }
            if round.is_empty() {
                break;
            }
            let mut i = 0;
            while i < round.len() {
                let block = round[i] / per_block;
                let key = codec::id_key(block);
                let exists = block < first_unwritten_block || last_block == Some(block);
                block_buf.clear();
                let block_len = list_len * per_block as usize;
                match dbs.links0.get(wtxn, &key).map_err(err)? {
                    // A damaged block would make the patch below write
                    // outside it.
                    Some(old) if exists && old.len() != block_len => {
                        return Err(Attempt::Failed(Error::Corrupt {
                            path: self.store.path.clone(),
                            detail: format!("link block {block} has {} bytes, expected {block_len}", old.len()),
                        }));
                    }
                    Some(old) if exists => block_buf.extend_from_slice(old),
                    Some(_) | None => block_buf.resize(block_len, 0),
                }
                while i < round.len() && round[i] / per_block == block {
                    let at = (round[i] % per_block) as usize * list_len;
                    block_buf[at..at + list_len].copy_from_slice(&bytes[i * list_len..(i + 1) * list_len]);
                    i += 1;
                }
                if exists {
                    dbs.links0.put(wtxn, &key, &block_buf).map_err(err)?;
                } else {
                    dbs.links0.put_with_flags(wtxn, PutFlags::APPEND, &key, &block_buf).map_err(err)?;
                }
                if last_block != Some(block) {
                    written += 1;
                }
                last_block = Some(block);
            }
        }
        Ok(written)
    }

    fn grow_map(&self) -> Result<()> {
        let new_size = self.store.next_map_size()?;
        // LMDB may only remap with no transaction open in the process: wait
        // for searches to finish. Polling `try_write` instead of queueing as
        // a writer keeps new searches flowing meanwhile (a fair lock would
        // park every reader behind the waiting resize).
        let deadline = std::time::Instant::now() + self.opts.resize_wait;
        let mut pause = Duration::from_micros(50);
        let mut exclusive = loop {
            if let Some(guard) = self.resize.try_write() {
                break guard;
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::ResizeBlocked { path: self.store.path.clone(), waited: self.opts.resize_wait });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        };
        self.sessions.lock().clear();
        // The remap may move the map: every shared vector address goes stale.
        exclusive.clear();
        // SAFETY: the writer lock is held and its transaction was dropped; the
        // exclusive resize lock guarantees no session or snapshot of this
        // index has a read transaction open.
        unsafe { self.store.env.resize(new_size as usize) }.map_err(|e| self.store.err(e))
    }

    /// The `k` nearest live points to `query`.
    pub fn search(&self, query: &[f32], params: SearchParams) -> Result<Vec<Hit>> {
        self.search_until(query, params, &Stop::never())
    }

    /// As [`Index::search`], but gives up with [`Error::Stopped`] once
    /// `stop` says so (a deadline passed, the caller went away).
    pub fn search_until(&self, query: &[f32], params: SearchParams, stop: &Stop) -> Result<Vec<Hit>> {
        params.validate()?;
        let query = session::prepare_query(&self.params, query)?;
        let shared = self.resize.read();
        let mut s = self.take_session()?;
        let result = s.search(&self.store, &shared, &self.params, &query, params, self.opts.rescore, stop);
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
        let session = Session::open(&self.store, &self.log, generation, self.opts.cache_budget_bytes)?;
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
            max_level: s.entry.map(|e| e.1),
            disk_bytes: self.store.disk_bytes(),
            map_size: self.store.map_size(),
            used_bytes: self.store.used_bytes(),
            commits: self.generation.load(Ordering::Acquire),
            link_log_lists: snap.session.log_records(),
            epoch: s.shard_epoch,
            last_seq: s.last_seq,
            batch_log_first_seq: s.log_first_seq,
            batch_log_entries: s.log_entries(),
            batch_log_bytes: s.log_bytes,
        })
    }

    fn take_session(&self) -> Result<Session> {
        let generation = self.generation.load(Ordering::Acquire);
        while let Some(s) = self.sessions.lock().pop() {
            if s.generation == generation {
                return Ok(s);
            }
        }
        Session::open(&self.store, &self.log, generation, self.opts.cache_budget_bytes)
    }

    /// Keeps `s` for reuse unless its read failed in LMDB or on damaged
    /// data: LMDB marks a transaction that met an error unusable (every
    /// later read is `MDB_BAD_TXN`), so the next read starts a fresh one.
    fn return_session_after<T>(&self, s: Session, result: &Result<T>) {
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

/// A consistent read view of one commit (see [`Index::snapshot`]).
pub struct Snapshot<'i> {
    index: &'i Index,
    session: Session,
    shared: RwLockReadGuard<'i, SharedAddrs>,
}

impl Snapshot<'_> {
    /// The `k` nearest live points, as of this snapshot.
    pub fn search(&mut self, query: &[f32], params: SearchParams) -> Result<Vec<Hit>> {
        self.search_until(query, params, &Stop::never())
    }

    /// As [`Snapshot::search`], but gives up with [`Error::Stopped`] once
    /// `stop` says so.
    pub fn search_until(&mut self, query: &[f32], params: SearchParams, stop: &Stop) -> Result<Vec<Hit>> {
        params.validate()?;
        let query = session::prepare_query(&self.index.params, query)?;
        self.session.search(&self.index.store, &self.shared, &self.index.params, &query, params, self.index.opts.rescore, stop)
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

/// What a write transaction's linking starts from: the committed state, the
/// addresses shared across commits, and the link log as of that state.
#[derive(Clone, Copy)]
struct Base<'a> {
    state: &'a State,
    shared: &'a SharedAddrs,
    log: &'a LogIndex,
}

/// What linking a batch leaves for the commit.
struct Linked {
    /// The graph's entry point.
    entry: Option<(u32, u8)>,
    /// The link log's next version, if the batch appended to it or folded it.
    log: Option<LogIndex>,
}

/// What a batch does with the changed bottom lists of existing nodes.
enum LogDecision {
    /// It changed none: the log stays as it is.
    Keep,
    /// Append them to the log as one value.
    Append,
    /// Patch them and everything the log holds into the blocks, and empty
    /// the log (with an empty log: plain patching in place).
    Fold,
}

/// Why one write attempt stopped.
enum Attempt {
    /// The map is full: grow it and replay the batches.
    MapFull,
    Failed(Error),
}

impl From<Error> for Attempt {
    fn from(e: Error) -> Self {
        match e {
            Error::Storage { source, .. } if store::is_map_full(&source) => Attempt::MapFull,
            other @ (Error::Invalid(_)
            | Error::ParamsMismatch { .. }
            | Error::NotFound { .. }
            | Error::UnsupportedFormat { .. }
            | Error::MapSizeLimit { .. }
            | Error::ResizeBlocked { .. }
            | Error::DiskFull { .. }
            | Error::OpenFileLimit { .. }
            | Error::Stopped { .. }
            | Error::StaleEpoch { .. }
            | Error::EpochLowered { .. }
            | Error::LogGap { .. }
            | Error::LogTruncated { .. }
            | Error::LogAhead { .. }
            | Error::Corrupt { .. }
            | Error::IdSpaceExhausted { .. }
            | Error::Storage { .. }
            | Error::Io { .. }) => Attempt::Failed(other),
        }
    }
}

/// Cheap checks of the state against the tables on open: LMDB keeps each
/// table's entry count in its database record, so these read no table.
/// A damaged state record, or a damaged database record, shows up here
/// instead of as wrong answers later.
fn check_counts(store: &Store, txn: &heed::RoTxn<'_, heed::WithoutTls>, state: &State) -> Result<()> {
    let corrupt = |detail: String| Error::Corrupt { path: store.path.clone(), detail };
    let nodes = store.dbs.nodes.len(txn).map_err(|e| store.err(e))?;
    if nodes != u64::from(state.next_id) {
        return Err(corrupt(format!("the index state counts {} nodes, the node table holds {nodes}", state.next_id)));
    }
    let external = store.dbs.external.len(txn).map_err(|e| store.err(e))?;
    if external != state.live {
        return Err(corrupt(format!("the index state counts {} live points, the id map holds {external}", state.live)));
    }
    if let Some((entry, _)) = state.entry
        && entry >= state.next_id
    {
        return Err(corrupt(format!("the entry point {entry} is past the last node {}", state.next_id)));
    }
    Ok(())
}

fn attempt(store: &Store, e: heed::Error) -> Attempt {
    if store::is_map_full(&e) { Attempt::MapFull } else { Attempt::Failed(store.err(e)) }
}

fn overlay_len(plan: &Plan<'_>) -> u32 {
    plan.inserts.len() as u32
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Index>();
    let _ = PathBuf::new();
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::batch::{Op, Point};

    /// Codes live in blocks, and the newest one is rewritten by every
    /// batch until it is full: batches of a few points each must leave
    /// every point findable as its own nearest neighbour, across block
    /// boundaries and a reopen.
    #[test]
    fn partial_code_blocks_grow_across_batches() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 2, durable: false, ..IndexOptions::default() };
        let params = IndexParams::new(384, crate::Metric::Euclidean);
        let block = codec::codes_block_nodes(crate::quant::code_bytes(384)) as u64;
        let vector = |id: u64| -> Vec<f32> { (0..384).map(|j| ((id * 7 + j) % 23) as f32 - 11.0 + id as f32 * 0.01).collect() };
        let index = Index::open_or_create(dir.path(), params, opts.clone()).unwrap();
        let total = 3 * block + 5;
        let mut id = 0;
        while id < total {
            let n = (id % 7 + 1).min(total - id);
            index.apply(Batch::upserts((id..id + n).map(|i| (i, vector(i))))).unwrap();
            id += n;
        }
        drop(index);
        let index = Index::open(dir.path(), opts).unwrap();
        for i in 0..total {
            let hits = index.search(&vector(i), SearchParams::new(1, 64)).unwrap();
            assert_eq!(hits[0].id, i, "point {i} (block {})", i / block);
        }
    }

    /// A code block shorter than its ids need (a damaged file) is reported
    /// as corruption, never read past its end.
    #[test]
    fn a_truncated_code_block_is_reported_as_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 1, durable: false, ..IndexOptions::default() };
        let index = Index::open_or_create(dir.path(), IndexParams::new(384, crate::Metric::Cosine), opts.clone()).unwrap();
        let block = codec::codes_block_nodes(crate::quant::code_bytes(384)) as u64;
        let points = (0..block + 4).map(|i| (i, (0..384).map(|j| ((i + 1) * (j + 3) % 17) as f32 - 8.0).collect()));
        index.apply(Batch::upserts(points)).unwrap();
        drop(index);
        let index = Index::open(dir.path(), opts).unwrap();
        {
            let mut wtxn = index.store.env.write_txn().unwrap();
            let cb = crate::quant::code_bytes(384);
            let key = codec::id_key(1);
            let short = index.store.dbs.codes.get(&wtxn, &key).unwrap().unwrap()[..2 * cb].to_vec();
            index.store.dbs.codes.put(&mut wtxn, &key, &short).unwrap();
            wtxn.commit().unwrap();
        }
        let q: Vec<f32> = (0..384).map(|j| (j % 5) as f32 - 2.0).collect();
        match index.search(&q, SearchParams::new(10, 200)) {
            Err(Error::Corrupt { detail, .. }) => assert!(detail.contains("code block 1"), "{detail}"),
            other => panic!("expected a corruption error, got {other:?}"),
        }
    }

    /// A damaged link log is reported when the index opens, naming the
    /// value, never read past its end.
    #[test]
    fn a_damaged_link_log_is_reported_as_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let opts =
            IndexOptions { build_threads: 1, durable: false, link_log: LinkLog::Always { fold_lists: 1 << 20 }, ..IndexOptions::default() };
        let index = Index::open_or_create(dir.path(), IndexParams::new(8, crate::Metric::Euclidean), opts.clone()).unwrap();
        let point = |i: u64| (i, (0..8).map(|j| ((i * 3 + j) % 11) as f32 - 5.0).collect::<Vec<f32>>());
        index.apply(Batch::upserts((0..100).map(point))).unwrap();
        index.apply(Batch::upserts((100..150).map(point))).unwrap();
        assert!(index.stats().unwrap().link_log_lists > 0);
        let (key, value) = {
            let txn = index.store.env.read_txn().unwrap();
            let (k, v) = index.store.dbs.links0_log.first(&txn).unwrap().unwrap();
            (k.to_vec(), v.to_vec())
        };
        let epoch = u64::from_be_bytes(key.as_slice().try_into().unwrap());
        let damage = |index: &Index, value: &[u8]| {
            let mut wtxn = index.store.env.write_txn().unwrap();
            index.store.dbs.links0_log.put(&mut wtxn, &key, value).unwrap();
            wtxn.commit().unwrap();
        };
        // Cut short: the count promises more records than the value holds.
        damage(&index, &value[..40]);
        drop(index);
        match Index::open(dir.path(), opts.clone()) {
            Err(Error::Corrupt { detail, .. }) => assert!(detail.contains(&format!("link log value {epoch}")), "{detail}"),
            Err(other) => panic!("expected a corruption error, got {other}"),
            Ok(_) => panic!("a damaged log was accepted"),
        }
        // A record naming a node past the index.
        let index = {
            let store = crate::store::Store::open(
                dir.path(),
                &crate::store::StoreOptions {
                    initial_map_size: 1 << 20,
                    max_map_size: 1 << 30,
                    max_readers: 16,
                    durable: false,
                    read_ahead: false,
                },
            )
            .unwrap();
            let mut bad = value.clone();
            bad[4..8].copy_from_slice(&10_000u32.to_le_bytes());
            let mut wtxn = store.env.write_txn().unwrap();
            store.dbs.links0_log.put(&mut wtxn, &key, &bad).unwrap();
            wtxn.commit().unwrap();
            drop(store);
            Index::open(dir.path(), opts)
        };
        match index {
            Err(Error::Corrupt { detail, .. }) => assert!(detail.contains("node 10000"), "{detail}"),
            Err(other) => panic!("expected a corruption error, got {other}"),
            Ok(_) => panic!("a damaged log was accepted"),
        }
    }

    /// An index written before epochs and the batch log (format 7 with a
    /// 34-byte state and no `batch_log` database) opens unchanged, at
    /// epoch 1 with an empty log, and numbers its next batch 1.
    #[test]
    fn an_index_from_before_epochs_opens_at_epoch_1_with_an_empty_log() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 1, durable: false, ..IndexOptions::default() };
        let point = |i: u64| (i, (0..8).map(|j| ((i * 7 + j * 3) % 101) as f32 + i as f32 * 0.01).collect::<Vec<f32>>());
        let index = Index::open_or_create(dir.path(), IndexParams::new(8, crate::Metric::Euclidean), opts.clone()).unwrap();
        index.apply(Batch::upserts((0..50).map(point)).with_source("job", 3)).unwrap();
        index.fence(6).unwrap();
        drop(index);
        // Make it what the previous build wrote.
        {
            let store = Store::open(
                dir.path(),
                &StoreOptions { initial_map_size: 1 << 20, max_map_size: 1 << 30, max_readers: 16, durable: false, read_ahead: false },
            )
            .unwrap();
            let mut wtxn = store.env.write_txn().unwrap();
            let state = session::read_state(&store, &wtxn).unwrap();
            let old = State { shard_epoch: 1, last_seq: 0, log_first_seq: 1, log_bytes: 0, ..state };
            store.dbs.meta.put(&mut wtxn, codec::META_STATE, &old.encode()[..34]).unwrap();
            // SAFETY: no other handle of this database is used afterwards.
            unsafe { store.dbs.batch_log.remove(&mut wtxn).unwrap() };
            wtxn.commit().unwrap();
            let txn = store.env.read_txn().unwrap();
            assert_eq!(store.dbs.meta.get(&txn, codec::META_STATE).unwrap().unwrap().len(), 34);
        }
        let index = Index::open(dir.path(), opts).unwrap();
        let s = index.stats().unwrap();
        assert_eq!((s.live, s.epoch, s.last_seq, s.batch_log_first_seq, s.batch_log_entries), (50, 1, 0, 1, 0));
        assert_eq!(index.offsets().unwrap(), vec![("job".to_string(), 3)]);
        assert!(index.read_log(1, u64::MAX).unwrap().entries.is_empty());
        for i in 0..50 {
            assert_eq!(index.search(&point(i).1, SearchParams::new(1, 64)).unwrap()[0].id, i);
        }
        index.apply(Batch::upserts((50..60).map(point))).unwrap();
        let read = index.read_log(1, u64::MAX).unwrap();
        assert_eq!((read.first_seq, read.last_seq, read.entries.len()), (1, 1, 1));
        assert_eq!(index.stats().unwrap().live, 60);
    }

    /// The shared vector addresses must stay valid across commits: after
    /// each one, every remembered address must be exactly where a fresh
    /// B-tree lookup finds the vector, holding the same bytes.
    #[test]
    fn shared_vector_addresses_survive_commits() {
        let seed: u64 = rand::random();
        eprintln!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 2, durable: false, ..IndexOptions::default() };
        for dim in [3u32, 96, 384, 700] {
            let index =
                Index::open_or_create(dir.path().join(dim.to_string()), IndexParams::new(dim, crate::Metric::Euclidean), opts.clone())
                    .unwrap();
            let mut next_external = 0u64;
            for round in 0..12 {
                let mut ops = Vec::new();
                for _ in 0..rng.random_range(1..400) {
                    let vector = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
                    ops.push(Op::Upsert(Point { id: next_external, vector, payload: None }));
                    next_external += 1;
                }
                if round > 2 {
                    for _ in 0..20 {
                        let id = rng.random_range(0..next_external);
                        ops.push(Op::Upsert(Point { id, vector: vec![0.5; dim as usize], payload: None }));
                    }
                }
                index.apply(Batch { ops, source: None }).unwrap();
                for _ in 0..5 {
                    let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
                    index.search(&q, SearchParams::new(10, 40)).unwrap();
                }
                let shared = index.resize.read();
                let txn = index.store.env.read_txn().unwrap();
                let state = session::read_state(&index.store, &txn).unwrap();
                let mut checked = 0;
                // The codes table is keyed by block, the vectors one by id,
                // each like its database.
                for (table, db) in [(&shared.codes, index.store.dbs.codes), (&shared.vectors, index.store.dbs.vectors)] {
                    for id in 0..state.next_id {
                        let addr = table.get(id);
                        if addr == 0 {
                            continue;
                        }
                        let fresh = db.get(&txn, &codec::id_key(id)).unwrap().unwrap();
                        assert_eq!(addr, fresh.as_ptr() as usize, "dim {dim} round {round}: id {id} moved");
                        checked += 1;
                    }
                }
                assert!(round < 3 || checked > 0, "nothing was shared");
            }
        }
    }
}
