//! The index of one shard: opening it and the state it shares between the
//! writer (`writer`, one group of batches per write transaction) and the
//! readers (`reader`, searches and snapshots on committed state).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::{Mutex, RwLock};

use crate::cache::SharedAddrs;
use crate::codec::{self, State};
use crate::error::{Error, Result};
use crate::hnsw::build::LinkBlocks;
use crate::links_log::{LogIndex, LogVersions};
use crate::params::IndexParams;
use crate::session::{self, Session};
use crate::store::{self, Store, StoreCell, StoreOptions};
use crate::table::Retired;

mod compact;
mod exclusive;
mod fields;
mod filtered;
mod fold;
mod log_policy;
mod options;
mod reader;
mod vacuum;
mod writer;

pub use compact::CompactOutcome;
pub use fields::BuildStep;
pub use filtered::{MAX_SCROLL_LIMIT, Where};
pub use fold::{FoldOutcome, FoldStep};
pub use options::{IndexOptions, LinkLog, Rescore};
pub use reader::{IndexStats, Snapshot};
pub use vacuum::VacuumOutcome;

/// One shard's vector index in its own LMDB environment.
///
/// Writes are serialised (LMDB has one writer per environment) and each
/// [`Index::apply_group`] call is one atomic commit. Searches run from any
/// number of threads on committed snapshots and never wait for writers.
pub struct Index {
    /// Replaced only by a compaction (see `StoreCell` for the rules).
    pub(crate) store: StoreCell,
    /// The environment's directory; outside the store so that it can be
    /// read without the locks the store asks for.
    path: PathBuf,
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
    /// Commits that moved pages of frozen ids (by reusing retired slots),
    /// raised before each such commit; the shared addresses are valid only
    /// for readers that began under the count they were gathered under
    /// (`SharedAddrs::valid_for`).
    moved: AtomicU64,
    /// True from the moment tombstones pass `vacuum_ratio` until a vacuum
    /// has caught up with them (`Index::vacuum_due`).
    pub(crate) vacuum_running: std::sync::atomic::AtomicBool,
    /// True while a field index is being built (`Index::field_index_building`).
    pub(crate) fields_building: std::sync::atomic::AtomicBool,
    /// Copies (`copy_to`, snapshots) streaming now: each holds a read
    /// transaction for its whole length, so a compaction does not start
    /// meanwhile (it would hold the writer lock while waiting for them).
    pub(crate) copies: std::sync::atomic::AtomicUsize,
    /// The link log's index per epoch a reader may pair with.
    log: LogVersions,
    /// The environment's page size: the least a log value takes, so that
    /// it lives in overflow pages no later commit rewrites.
    page_size: usize,
    /// The writer's addresses of the link blocks as the last commit left
    /// them (see `LinkBlocks`). Locked by the writer only, under `writer`,
    /// and never while `patch_blocks` runs (which forgets what it writes).
    pub(crate) link_blocks: Mutex<LinkBlocks>,
}

/// An empty table of link block addresses for an index's blocks.
fn link_blocks_table(params: &IndexParams, page_size: usize) -> LinkBlocks {
    let per_block = codec::links0_block_nodes(params.max_links(0));
    let block_bytes = per_block * codec::links_bytes(params.max_links(0));
    LinkBlocks::new(per_block as u32, codec::values_per_leaf(block_bytes, page_size) as u32)
}

/// How the index's environment is opened.
fn store_options(opts: &IndexOptions) -> StoreOptions {
    StoreOptions {
        initial_map_size: opts.initial_map_size,
        max_map_size: opts.max_map_size,
        max_readers: opts.max_readers,
        durable: opts.durable,
        read_ahead: opts.read_ahead,
        write_memory_bytes: opts.write_memory_bytes,
    }
}

/// What [`Index::open`] does when the directory holds no index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    /// Create it with these parameters, at this epoch.
    Create(IndexParams, u64),
    Fail,
}

impl Index {
    /// An empty table of this index's link block addresses.
    pub(crate) fn new_link_blocks(&self) -> LinkBlocks {
        link_blocks_table(&self.params, self.page_size)
    }

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
        compact::clean_up(path)?;
        if opts.warm_max_bytes > 0 {
            // Only a hint for speed: a file that cannot be warmed still opens
            // (and a read error shows again where it matters, in the map).
            match crate::warm::warm(&path.join("data.mdb"), opts.warm_max_bytes) {
                Ok(crate::warm::Warmed::Read { bytes, seconds }) => {
                    tracing::info!(path = %path.display(), bytes, seconds, "read the index file into the page cache in order");
                }
                Ok(crate::warm::Warmed::Skipped) => {}
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not warm the index file; opening it cold"),
            }
        }
        let store = Store::open(path, &store_options(&opts))?;
        let params = Self::load_or_init_params(&store, missing)?;
        list_retired_ids(&store)?;
        crate::batch_log::split_whole_entries(&store)?;
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
        // Code and vector blocks live in overflow pages that move only while
        // the block is the newest, partial one; a block small enough to sit
        // in a leaf (large pages, tiny values) also moves while it shares
        // the newest leaf.
        let lag = |per_block: u32, bytes: usize| {
            per_block.saturating_mul(codec::values_per_leaf(per_block as usize * bytes, page) as u32).saturating_add(1)
        };
        let shared = SharedAddrs::new(
            opts.shared_cache_bytes,
            lag(params.codes_per_block(), params.code_bytes()),
            lag(params.vectors_per_block(), params.vector_bytes()),
        );
        let building = {
            let txn = store.env.read_txn().map_err(|e| store.err(e))?;
            crate::fields::Schema::read(&store, &txn)?.fields.iter().any(|d| d.building.is_some())
        };
        let log = {
            let txn = store.env.read_txn().map_err(|e| store.err(e))?;
            let state = session::read_state(&store, &txn)?;
            check_counts(&store, &txn, &state)?;
            let list_bytes = codec::links_bytes(params.max_links(0));
            LogVersions::new(state.log_epoch, LogIndex::load(&store, &txn, list_bytes, state.next_id)?)
        };
        Ok(Index {
            store: StoreCell::new(store),
            path: path.to_owned(),
            params,
            opts,
            pool,
            writer: Mutex::new(()),
            resize: RwLock::new(shared),
            sessions: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            vacuum_running: std::sync::atomic::AtomicBool::new(false),
            fields_building: std::sync::atomic::AtomicBool::new(building),
            copies: std::sync::atomic::AtomicUsize::new(0),
            log,
            page_size: page,
            link_blocks: Mutex::new(link_blocks_table(&params, page)),
        })
    }

    fn load_or_init_params(store: &Store, missing: Missing) -> Result<IndexParams> {
        let mut wtxn = store.env.write_txn().map_err(|e| store.err(e))?;
        let stored = store.dbs.meta.get(&wtxn, codec::META_PARAMS).map_err(|e| store.err(e))?.map(<[u8]>::to_vec);
        match (stored, missing) {
            (Some(bytes), _) => {
                let (version, found) = codec::decode_params(&bytes).map_err(|e| match e {
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
                if version < codec::FORMAT_VERSION {
                    crate::migrate::to_current(store, &mut wtxn, &found, version)?;
                    store.dbs.meta.put(&mut wtxn, codec::META_PARAMS, &codec::encode_params(&found)).map_err(|e| store.err(e))?;
                    wtxn.commit().map_err(|e| store.err(e))?;
                    tracing::info!(path = %store.path.display(), from = version, to = codec::FORMAT_VERSION, "migrated the index's on-disk format");
                } else {
                    wtxn.abort();
                }
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
        &self.path
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

/// Makes the table of retired ids agree with the node records. An index
/// written before the table existed (or by a build without it) has
/// tombstones the table does not list; they are found once, here, by a
/// scan of the node records (the only scan, on open, never on a write).
fn list_retired_ids(store: &Store) -> Result<()> {
    let err = |e| store.err(e);
    let mut wtxn = store.env.write_txn().map_err(err)?;
    let state = session::read_state(store, &wtxn)?;
    let listed = store.dbs.retired.len(&wtxn).map_err(err)?;
    if listed == state.tombstones {
        wtxn.abort();
        return Ok(());
    }
    tracing::info!(path = %store.path.display(), listed, tombstones = state.tombstones, "listing the retired ids of the index");
    let mut ids = Vec::with_capacity(state.tombstones as usize);
    for item in store.dbs.nodes.iter(&wtxn).map_err(err)? {
        let (id, value) = item.map_err(err)?;
        let record = codec::NodeRecord::decode(value)
            .ok_or_else(|| Error::Corrupt { path: store.path.clone(), detail: format!("record of node {id} is malformed") })?;
        if record.is_tombstone() {
            ids.push((if record.is_vacuumed() { Retired::Vacuumed } else { Retired::Linked }, id));
        }
    }
    let vacuumed = ids.iter().filter(|(k, _)| *k == Retired::Vacuumed).count() as u64;
    if ids.len() as u64 != state.tombstones || vacuumed != state.vacuumed {
        return Err(Error::Corrupt {
            path: store.path.clone(),
            detail: format!(
                "the index state counts {} tombstones ({} vacuumed), the node records hold {} ({vacuumed})",
                state.tombstones,
                state.vacuumed,
                ids.len()
            ),
        });
    }
    store.dbs.retired.clear(&mut wtxn).map_err(err)?;
    ids.sort_unstable_by_key(|&(k, id)| (k as u8, id));
    for (kind, id) in ids {
        store.dbs.retired.append(&mut wtxn, (kind, id), &[]).map_err(err)?;
    }
    wtxn.commit().map_err(err)
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
    use crate::batch::{Batch, Op, Point};
    use crate::session::SearchParams;

    /// An ef at or above the live count asks for every point: the answer
    /// is exact even where 4-bit codes rank coarsely (16-d), as a scan
    /// would give it.
    #[test]
    fn a_search_with_ef_at_the_live_count_is_exact() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 2, durable: false, ..IndexOptions::default() };
        let dim = 16;
        let index = Index::open_or_create(dir.path(), IndexParams::new(dim, crate::Metric::Euclidean), opts).unwrap();
        let mut rng = StdRng::seed_from_u64(5);
        let points: Vec<(u64, Vec<f32>)> = (0..900).map(|i| (i, (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect())).collect();
        index.apply(Batch::upserts(points.clone())).unwrap();
        for _ in 0..500 {
            let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut scan: Vec<(f32, u64)> =
                points.iter().map(|(id, v)| (v.iter().zip(&q).map(|(a, b)| (a - b) * (a - b)).sum::<f32>(), *id)).collect();
            scan.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut want: Vec<u64> = scan[..10].iter().map(|e| e.1).collect();
            let mut got: Vec<u64> = index.search(&q, SearchParams::new(10, 900)).unwrap().iter().map(|h| h.id).collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want);
        }
    }

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
            let short = index.store.dbs.codes.get(&wtxn, 1).unwrap().unwrap()[..2 * cb].to_vec();
            index.store.dbs.codes.put(&mut wtxn, 1, &short).unwrap();
            wtxn.commit().unwrap();
        }
        let q: Vec<f32> = (0..384).map(|j| (j % 5) as f32 - 2.0).collect();
        match index.search(&q, SearchParams::new(10, 200)) {
            Err(Error::Corrupt { detail, .. }) => assert!(detail.contains("code block 1"), "{detail}"),
            other => panic!("expected a corruption error, got {other:?}"),
        }
    }

    /// Likewise a vector block: a search re-scores with exact vectors, a
    /// `get` returns one, and the content digest hashes them.
    #[test]
    fn a_truncated_vector_block_is_reported_as_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 1, durable: false, ..IndexOptions::default() };
        let index = Index::open_or_create(dir.path(), IndexParams::new(384, crate::Metric::Cosine), opts.clone()).unwrap();
        let block = u64::from(index.params.vectors_per_block());
        let vector = |i: u64| (0..384).map(|j| ((i + 1) * (j + 3) % 17) as f32 - 8.0).collect::<Vec<f32>>();
        index.apply(Batch::upserts((0..3 * block).map(|i| (i, vector(i))))).unwrap();
        drop(index);
        let index = Index::open(dir.path(), opts).unwrap();
        {
            let mut wtxn = index.store.env.write_txn().unwrap();
            let short = index.store.dbs.vectors.get(&wtxn, 1).unwrap().unwrap()[..2 * 384 * 4].to_vec();
            index.store.dbs.vectors.put(&mut wtxn, 1, &short).unwrap();
            wtxn.commit().unwrap();
        }
        let expect_corrupt = |what: &str, got: Result<()>| match got {
            Err(Error::Corrupt { detail, .. }) => assert!(detail.contains("vector block 1"), "{what}: {detail}"),
            other => panic!("{what}: expected a corruption error, got {other:?}"),
        };
        // The last id of block 1 is past the two vectors left in it.
        let last = 2 * block - 1;
        expect_corrupt("get", index.get(last).map(drop));
        expect_corrupt("search", index.search(&vector(last), SearchParams::new(10, 200)).map(drop));
        expect_corrupt("digest", index.snapshot().and_then(|s| s.digest()).map(drop));
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
        let (epoch, value) = {
            let txn = index.store.env.read_txn().unwrap();
            let (epoch, v) = index.store.dbs.links0_log.iter(&txn).unwrap().next().unwrap().unwrap();
            (epoch, v.to_vec())
        };
        let damage = |index: &Index, value: &[u8]| {
            let mut wtxn = index.store.env.write_txn().unwrap();
            index.store.dbs.links0_log.put(&mut wtxn, epoch, value).unwrap();
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
            let store = crate::store::Store::open(dir.path(), &crate::store::StoreOptions::small()).unwrap();
            let mut bad = value.clone();
            bad[4..8].copy_from_slice(&10_000u32.to_le_bytes());
            let mut wtxn = store.env.write_txn().unwrap();
            store.dbs.links0_log.put(&mut wtxn, epoch, &bad).unwrap();
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
            let store = Store::open(dir.path(), &StoreOptions::small()).unwrap();
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

    /// A batch log written before entries were stored in parts (each entry
    /// one value under its sequence number) is split into parts on open,
    /// reads back the same entries, trims and grows as before.
    #[test]
    fn a_log_of_whole_entries_is_split_into_parts_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let retention = crate::BatchLogRetention { max_batches: 4, max_bytes: u64::MAX, ..crate::BatchLogRetention::default() };
        let opts = IndexOptions { build_threads: 1, durable: false, batch_log: retention, ..IndexOptions::default() };
        let point = |i: u64| (i, (0..8).map(|j| ((i * 7 + j * 3) % 101) as f32 + i as f32 * 0.01).collect::<Vec<f32>>());
        let index = Index::open_or_create(dir.path(), IndexParams::new(8, crate::Metric::Euclidean), opts.clone()).unwrap();
        // 600 points logged by reference: an entry of ~8 KB, 4 parts.
        index.apply(Batch::upserts((0..600).map(point)).with_source("job", 1)).unwrap();
        index.apply(Batch { ops: vec![Op::Delete(3), Op::Delete(5)], source: None }).unwrap();
        index.apply(Batch::upserts((600..601).map(point))).unwrap();
        let before = index.read_log(1, u64::MAX).unwrap();
        assert_eq!(before.entries.len(), 3);
        drop(index);
        let store_opts = StoreOptions::small();
        {
            let store = Store::open(dir.path(), &store_opts).unwrap();
            let mut wtxn = store.env.write_txn().unwrap();
            let mut whole: std::collections::BTreeMap<u64, Vec<u8>> = std::collections::BTreeMap::new();
            for item in store.dbs.batch_log.iter(&wtxn).unwrap() {
                let ((seq, _), v) = item.unwrap();
                whole.entry(seq).or_default().extend_from_slice(v);
            }
            assert!(store.dbs.batch_log.len(&wtxn).unwrap() > 4, "the first entry is in parts");
            store.dbs.batch_log.clear(&mut wtxn).unwrap();
            let old: crate::table::Table<crate::table::Seq> = store.dbs.batch_log.retyped();
            for (seq, v) in &whole {
                old.append(&mut wtxn, *seq, v).unwrap();
            }
            wtxn.commit().unwrap();
        }
        let index = Index::open(dir.path(), opts).unwrap();
        assert_eq!(index.read_log(1, u64::MAX).unwrap(), before);
        assert_eq!(index.read_log(2, u64::MAX).unwrap().entries, before.entries[1..]);
        // Two more batches: the oldest entry is trimmed, parts and all.
        index.apply(Batch::upserts((601..603).map(point))).unwrap();
        index.apply(Batch::upserts((603..605).map(point))).unwrap();
        let after = index.read_log(2, u64::MAX).unwrap();
        assert_eq!((after.first_seq, after.last_seq, after.entries.len()), (2, 5, 4));
        assert_eq!(after.entries[..2], before.entries[1..]);
        let s = index.stats().unwrap();
        let held: u64 = {
            let txn = index.store.env.read_txn().unwrap();
            let keys: Vec<usize> =
                index.store.dbs.batch_log.retyped::<crate::table::Name>().iter(&txn).unwrap().map(|i| i.unwrap().0.len()).collect();
            assert!(keys.iter().all(|&k| k == 12), "every key is (seq, part): {keys:?}");
            let mut whole: std::collections::BTreeMap<u64, Vec<u8>> = std::collections::BTreeMap::new();
            for item in index.store.dbs.batch_log.iter(&txn).unwrap() {
                let ((seq, _), v) = item.unwrap();
                whole.entry(seq).or_default().extend_from_slice(v);
            }
            // The deletes' old vectors went with entry 1 (nothing before
            // entry 2 is left to need them).
            assert_eq!(index.store.dbs.log_vectors.len(&txn).unwrap(), 0);
            whole.iter().map(|(&seq, v)| crate::batch_log::decode(seq, v, 8).unwrap().logical).sum()
        };
        assert_eq!((s.batch_log_entries, s.batch_log_bytes), (4, held));
    }

    /// The shared code and vector addresses must stay valid across commits
    /// (batches that reuse slots, vacuum steps): after each one, every
    /// remembered address must be exactly where a fresh B-tree lookup
    /// finds the block.
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
                // Big enough batches that the ids pass the lag (a few
                // hundred at dim 3) well before the last round.
                for _ in 0..rng.random_range(100..400) {
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
                // A vacuum step keeps the shared addresses (it leaves code
                // and vector blocks alone); searches after it use them.
                if round > 3 {
                    assert!(index.vacuum(8).unwrap().vacuumed > 0, "dim {dim} round {round}: nothing to vacuum");
                    for _ in 0..5 {
                        let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
                        index.search(&q, SearchParams::new(10, 40)).unwrap();
                    }
                }
                let shared = index.resize.read();
                let txn = index.store.env.read_txn().unwrap();
                let state = session::read_state(&index.store, &txn).unwrap();
                let mut checked = 0;
                // Both tables are keyed by block, like their databases.
                let code_block = |block| index.store.dbs.codes.get(&txn, block).unwrap().unwrap().as_ptr() as usize;
                let vector_block = |block| index.store.dbs.vectors.get(&txn, block).unwrap().unwrap().as_ptr() as usize;
                let fresh: [&dyn Fn(u32) -> usize; 2] = [&code_block, &vector_block];
                for (table, fresh) in [&shared.codes, &shared.vectors].into_iter().zip(fresh) {
                    for id in 0..state.next_id {
                        let addr = table.get(id);
                        if addr == 0 {
                            continue;
                        }
                        assert_eq!(addr, fresh(id), "dim {dim} round {round}: id {id} moved");
                        checked += 1;
                    }
                }
                // Blocks within the lag of the newest id are never shared;
                // past it, the searches above must have shared some.
                let lag = shared.codes.lag().max(shared.vectors.lag());
                assert!(round < 3 || state.next_id <= lag || checked > 0, "dim {dim} round {round}: nothing was shared");
                if round == 11 {
                    assert!(state.next_id > lag, "dim {dim}: {} ids never passed the lag {lag}", state.next_id);
                }
            }
        }
    }

    /// A write transaction that changes more pages than `write_memory_bytes`
    /// has LMDB write some of them to the file before the commit (a spill)
    /// and free their copies; the transaction, its nested readers (the
    /// build's threads) and later transactions must then read those pages
    /// from the map. The same batches into an index without the limit must
    /// leave the same points and the same graph: with one build thread the
    /// build is deterministic, so every search answers the same.
    #[test]
    fn batches_past_the_write_memory_spill_and_read_back_the_same() {
        // SAFETY: reads a thread-local counter of the patched liblmdb.
        let spilled = || unsafe { lmdb_master_sys::mdb_shoal_spilled() };
        let dir = tempfile::tempdir().unwrap();
        let base = IndexOptions {
            build_threads: 1,
            durable: false,
            // Lists go to the log and fold in passes: log values and fold
            // steps are written under the limit too.
            link_log: crate::LinkLog::Always { fold_lists: 3_000 },
            ..IndexOptions::default()
        };
        // 256 pages: LMDB's default is 131,071.
        let small = IndexOptions { write_memory_bytes: 1 << 20, ..base.clone() };
        let unlimited = IndexOptions { write_memory_bytes: 0, ..base };
        let params = IndexParams::new(96, crate::Metric::Cosine);
        let a = Index::open_or_create(dir.path().join("unlimited"), params, unlimited).unwrap();
        let b = Index::open_or_create(dir.path().join("small"), params, small).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let mut vector = || (0..96).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>();
        let mut batches = Vec::new();
        for round in 0..6u64 {
            let mut ops: Vec<Op> =
                (0..1_200).map(|i| Op::Upsert(Point { id: round * 1_200 + i, vector: vector(), payload: None })).collect();
            if round > 0 {
                // Upserts and deletes retire nodes whose slots later batches reuse.
                ops.extend((0..150).map(|i| Op::Upsert(Point { id: i * 7 + round, vector: vector(), payload: None })));
                ops.extend((0..50).map(|i| Op::Delete(i * 11 + round * 3)));
            }
            batches.push(Batch { ops, source: None });
        }
        let queries: Vec<Vec<f32>> = (0..30).map(|_| vector()).collect();

        let before = spilled();
        for batch in &batches {
            a.apply(batch.clone()).unwrap();
        }
        assert_eq!(spilled(), before, "an index without the limit spilled");
        for batch in &batches {
            b.apply(batch.clone()).unwrap();
        }
        let spills = spilled() - before;
        assert!(spills > 1_000, "batches of 1,200 points under a 256-page limit spilled only {spills} pages");
        for index in [&a, &b] {
            assert!(index.vacuum(100).unwrap().vacuumed > 0);
            index.fold_link_log().unwrap();
        }

        assert_eq!(a.snapshot().unwrap().digest().unwrap(), b.snapshot().unwrap().digest().unwrap());
        let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
        assert_eq!((sa.live, sa.tombstones), (sb.live, sb.tombstones));
        for q in &queries {
            let (ha, hb) = (a.search(q, SearchParams::new(10, 64)).unwrap(), b.search(q, SearchParams::new(10, 64)).unwrap());
            assert_eq!(ha, hb);
            assert_eq!(ha.len(), 10);
        }
        // And after reopening, from the file alone.
        let path = b.path().to_owned();
        drop(b);
        let b = Index::open(&path, IndexOptions::default()).unwrap();
        assert_eq!(a.snapshot().unwrap().digest().unwrap(), b.snapshot().unwrap().digest().unwrap());
        for q in &queries {
            assert_eq!(a.search(q, SearchParams::new(10, 64)).unwrap(), b.search(q, SearchParams::new(10, 64)).unwrap());
        }
    }
}
