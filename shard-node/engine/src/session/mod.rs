//! Read sessions: a read transaction plus the caches that make searching
//! it fast, reused across searches until the next commit.

mod filtered;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use heed::{RoTxn, WithoutTls};

use crate::cache::SharedAddrs;
use crate::codec::{self, NodeRecord, State};
use crate::error::{Error, InvalidInput, Location, Result};
use crate::hnsw::{Scored, Scratch, greedy_closest, search_layer};
use crate::index::Rescore;
use crate::links_log::{LogIndex, LogVersions};
use crate::params::IndexParams;
use crate::planner::{Explain, Plan, PlannerOptions};
use crate::quant::{Query, QueryCode};
use crate::stop::Stop;
use crate::store::Store;
use crate::tombstone_set::TombstoneSet;
use crate::view::{Frozen, Graph, NodeCache, TxnView};

pub use filtered::{Found, Page};

/// One search result.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    /// The point's external id.
    pub id: u64,
    /// Distance to the query under the index's metric (smaller is closer;
    /// for `dot` it is the negated inner product).
    pub distance: f32,
    /// The point's payload, when asked for and present.
    pub payload: Option<Vec<u8>>,
}

/// A stored point, as `get` returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredPoint {
    /// The external id.
    pub id: u64,
    /// The stored vector (unit length under the cosine metric).
    pub vector: Vec<f32>,
    /// The payload, if any.
    pub payload: Option<Vec<u8>>,
}

/// How to search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchParams {
    /// Number of results.
    pub k: usize,
    /// Candidate list length; raised to `k` if smaller. Larger is slower
    /// and finds more of the true neighbours.
    pub ef: usize,
    /// Return payloads with the hits.
    pub with_payload: bool,
}

/// Largest accepted `k`.
pub const MAX_K: usize = 10_000;
/// Largest accepted `ef`.
pub const MAX_EF: usize = 100_000;

impl SearchParams {
    /// `k` results with candidate list `ef`, no payloads.
    pub fn new(k: usize, ef: usize) -> Self {
        SearchParams { k, ef, with_payload: false }
    }

    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
        if self.k == 0 || self.k > MAX_K {
            return Err(InvalidInput::BadK { k: self.k, max: MAX_K });
        }
        if self.ef == 0 || self.ef > MAX_EF {
            return Err(InvalidInput::BadEf { ef: self.ef, max: MAX_EF });
        }
        Ok(())
    }
}

/// A read transaction with its pointer cache and search buffers.
pub(crate) struct Session {
    // Field order matters: the cache holds pointers into `txn`'s pages and
    // must never outlive it. Both are dropped together; `cache` first.
    cache: NodeCache,
    scratch: Scratch,
    found: Vec<Scored>,
    pub(crate) state: State,
    pub(crate) generation: u64,
    /// The count of page-moving commits this transaction began under, if
    /// it is certain (see [`Session::open`]).
    moved: Option<u64>,
    /// The link log's index as of this transaction's commit.
    log: Arc<LogIndex>,
    /// This transaction's tombstones, read by the first search that needs
    /// them (`Some(None)`: the retired table disagreed, records answer).
    tombstones: Option<Option<TombstoneSet>>,
    /// This transaction's field indexes, read by the first filter.
    schema: Option<Arc<crate::fields::Schema>>,
    /// Where this transaction's column blocks are (like `cache`, it holds
    /// pointers into `txn`'s pages and goes before it).
    columns: crate::fields::columns::ColumnCache,
    /// The ids a scan goes over, kept for its capacity.
    list: Vec<u32>,
    pub(crate) txn: RoTxn<'static, WithoutTls>,
}

impl Session {
    /// Opens a read transaction on the last commit. `moved` counts the
    /// commits that moved pages holding frozen ids (reused slots); the
    /// writer raises it before such a commit, so a count that reads the
    /// same before and after the transaction opened is the one the
    /// transaction's data belongs to.
    pub(crate) fn open(store: &Store, log: &LogVersions, generation: u64, moved: &AtomicU64, cache_budget: usize) -> Result<Session> {
        let before = moved.load(Ordering::SeqCst);
        let ((txn, state), log) = log.pair(store, || {
            let txn = store.env.clone().static_read_txn().map_err(|e| store.err(e))?;
            let state = read_state(store, &txn)?;
            Ok(((txn, state), state.log_epoch))
        })?;
        let after = moved.load(Ordering::SeqCst);
        let moved = (before == after).then_some(before);
        Ok(Session {
            cache: NodeCache::new(cache_budget),
            scratch: Scratch::new(),
            found: Vec::new(),
            state,
            generation,
            moved,
            log,
            tombstones: None,
            schema: None,
            columns: Default::default(),
            list: Vec::new(),
            txn,
        })
    }

    /// The shared addresses this transaction may use: only those gathered
    /// under the same count of page-moving commits.
    fn frozen<'s>(&self, shared: &'s SharedAddrs) -> Option<Frozen<'s>> {
        (self.moved == Some(shared.valid_for)).then(|| Frozen::new(shared, self.state.next_id))
    }

    fn view<'s>(&'s mut self, store: &'s Store, shared: &'s SharedAddrs, params: &IndexParams) -> TxnView<'s> {
        let frozen = self.frozen(shared);
        // SAFETY: `self.cache` only ever receives pointers read through
        // `self.txn`: it is created with the session and never shared; and
        // `frozen` is derived from the state this txn reads, `log` was paired
        // with it when the session opened.
        unsafe { TxnView::new(&self.txn, store, &mut self.cache, frozen, &self.log, params) }
    }

    /// Searches with a prepared (validated, normalised) query, until done
    /// or `stop` says so.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search(
        &mut self,
        store: &Store,
        shared: &SharedAddrs,
        params: &IndexParams,
        query: &[f32],
        sp: SearchParams,
        rescore: Rescore,
        planner: &PlannerOptions,
        stop: &Stop,
    ) -> Result<Found> {
        stop.check()?;
        let state = self.state;
        let Some((entry, top)) = state.entry.filter(|_| state.live > 0) else {
            return Ok(Found { hits: Vec::new(), explain: Explain { plan: Plan::Empty, matches: 0, matches_exact: true, compared: 0 } });
        };
        let metric = params.metric;
        let skip = state.tombstones > 0;
        // A graph that is mostly tombstones is a filter matching few
        // points: compare them all rather than walk the dead.
        let share = state.live as f64 / f64::from(state.next_id.max(1));
        if skip && crate::planner::choose(planner, state.live, true, share, sp.ef, false) == Plan::Exact {
            return self.search_live_exactly(store, shared, params, query, sp, stop);
        }
        // Capped at the live count: results can never hold more, and with
        // many tombstones a longer list would only be filled by visiting
        // every node.
        let ef = sp.ef.max(sp.k).min(self.state.live.max(1) as usize);
        if skip && self.tombstones.is_none() {
            self.tombstones = Some(TombstoneSet::read(store, &self.txn, &self.state)?);
        }
        let frozen = self.frozen(shared);
        let Session { cache, scratch, found, txn, log, tombstones, .. } = self;
        // SAFETY: `cache` only ever receives pointers read through `txn`: it
        // is created with the session and never shared; `frozen` is derived
        // from the state this txn reads, `log` was paired with it.
        let view = unsafe { TxnView::new(txn, store, cache, frozen, log, params) };
        // Read through this same transaction.
        let mut view = view.with_tombstones(tombstones.as_ref().and_then(Option::as_ref));
        let qc = QueryCode::new(query);
        scratch.compared = 0;
        let mut best = Scored { dist: qc.distance(metric, view.code(entry)?), id: entry };
        for l in (1..=top).rev() {
            best = greedy_closest(&mut view, scratch, metric, &qc, best, l, stop)?;
        }
        search_layer(&mut view, scratch, metric, &qc, &[best], ef, 0, skip, found, stop)?;
        // The walk ranked candidates by their codes; re-score the best ones
        // with the exact vectors, so results and distances are exact. Each
        // may be a page read on a cold cache: keep looking at `stop`.
        found.truncate(rescore.count(sp.k, found.len(), ef >= state.live as usize));
        let rescored = found.len();
        stop.check()?;
        let mut pacer = stop.pacer();
        for s in found.iter_mut() {
            pacer.step()?;
            s.dist = metric.distance(query, view.vector(s.id)?);
        }
        found.sort_unstable();
        found.truncate(sp.k);
        let mut hits = Vec::with_capacity(found.len());
        for s in found.iter() {
            pacer.step()?;
            let record = view.node(s.id)?;
            hits.push(Hit { id: record.external, distance: metric.reported(s.dist), payload: None });
        }
        if sp.with_payload {
            stop.check()?;
            for (hit, s) in hits.iter_mut().zip(found.iter()) {
                pacer.step()?;
                hit.payload = payload(store, txn, s.id)?;
            }
        }
        let compared = scratch.compared + rescored as u64;
        Ok(Found { hits, explain: Explain { plan: Plan::Graph, matches: state.live, matches_exact: true, compared } })
    }

    /// The live point with external id `id`.
    pub(crate) fn get(&mut self, store: &Store, shared: &SharedAddrs, params: &IndexParams, id: u64) -> Result<Option<StoredPoint>> {
        let Some(internal) = lookup_external(store, &self.txn, id)? else { return Ok(None) };
        let payload = payload(store, &self.txn, internal)?;
        let vector = self.view(store, shared, params).vector(internal)?.to_vec();
        Ok(Some(StoredPoint { id, vector, payload }))
    }

    /// Highest applied offset of `source`.
    pub(crate) fn offset(&self, store: &Store, source: &str) -> Result<Option<u64>> {
        read_offset(store, &self.txn, source)
    }

    /// Every source with its highest applied offset, sorted by name.
    pub(crate) fn offsets(&self, store: &Store) -> Result<Vec<(String, u64)>> {
        offsets(store, &self.txn)
    }

    /// The digest of every live point as of this session's commit.
    pub(crate) fn digest(&self, store: &Store, params: &IndexParams) -> Result<crate::ContentDigest> {
        crate::digest::content_digest(store, &self.txn, params)
    }

    /// Lists in the link log as of this session's commit.
    pub(crate) fn log_records(&self) -> u64 {
        self.log.records()
    }

    /// The epoch of the link log's newest value, if it holds any.
    pub(crate) fn log_newest_value(&self) -> Option<u64> {
        self.log.values().last().copied()
    }

    /// The epoch of the link log's oldest value, if it holds any.
    pub(crate) fn log_oldest_value(&self) -> Option<u64> {
        self.log.values().first().copied()
    }

    /// Where the link log's fold under way is, if one is.
    pub(crate) fn log_fold_cursor(&self) -> Option<u32> {
        self.log.pass().map(|p| p.cursor)
    }

    /// Pointers copied because LMDB misaligned them (expected: none).
    pub(crate) fn unaligned_vectors(&self) -> usize {
        self.cache.unaligned_count()
    }

    pub(crate) fn cache_bytes(&self) -> usize {
        self.cache.bytes() + self.scratch.bytes() + self.log.bytes()
    }
}

fn payload(store: &Store, txn: &RoTxn<'_, WithoutTls>, internal: u32) -> Result<Option<Vec<u8>>> {
    let p = store.dbs.payloads.get(txn, internal).map_err(|e| store.err(e))?;
    if let Some(p) = p {
        store.check_len(p.len(), || format!("the payload of node {internal}"))?;
    }
    Ok(p.map(<[u8]>::to_vec))
}

pub(crate) fn read_state(store: &Store, txn: &RoTxn<'_, WithoutTls>) -> Result<State> {
    let bytes = store.dbs.meta.get(txn, codec::META_STATE).map_err(|e| store.err(e))?;
    match bytes {
        None => Ok(State::default()),
        Some(b) => State::decode(b).ok_or_else(|| Error::Corrupt { path: store.path.clone(), detail: "index state is malformed".into() }),
    }
}

pub(crate) fn lookup_external(store: &Store, txn: &RoTxn, id: u64) -> Result<Option<u32>> {
    let v = store.dbs.external.get(txn, id).map_err(|e| store.err(e))?;
    match v {
        None => Ok(None),
        Some(b) => codec::decode_mapped_id(b)
            .map(Some)
            .ok_or_else(|| Error::Corrupt { path: store.path.clone(), detail: format!("id map entry of {id} is malformed") }),
    }
}

/// The stored bytes of node `internal`'s vector (`vector_bytes` each,
/// `per_block` to a block), checked against its block's length: a damaged
/// length would read past the map.
pub(crate) fn stored_vector<'t>(
    store: &Store,
    txn: &'t RoTxn<'_, WithoutTls>,
    vector_bytes: usize,
    per_block: u32,
    internal: u32,
) -> Result<&'t [u8]> {
    let corrupt = |detail: String| Error::Corrupt { path: store.path.clone(), detail };
    let (block, slot) = (internal / per_block, (internal % per_block) as usize);
    let values = store
        .dbs
        .vectors
        .get(txn, block)
        .map_err(|e| store.err(e))?
        .ok_or_else(|| corrupt(format!("the vector block of node {internal} is missing")))?;
    values
        .get(slot * vector_bytes..(slot + 1) * vector_bytes)
        .filter(|_| values.len() % vector_bytes == 0 && values.len() <= per_block as usize * vector_bytes)
        .ok_or_else(|| corrupt(format!("vector block {block} (of node {internal}) has {} bytes", values.len())))
}

pub(crate) fn read_offset(store: &Store, txn: &RoTxn<'_, WithoutTls>, source: &str) -> Result<Option<u64>> {
    let v = store.dbs.offsets.get(txn, source.as_bytes()).map_err(|e| store.err(e))?;
    match v {
        None => Ok(None),
        Some(b) => decode_offset(b)
            .map(Some)
            .ok_or_else(|| Error::Corrupt { path: store.path.clone(), detail: format!("offset of source {source} is malformed") }),
    }
}

/// Every source with its highest applied offset, sorted by name.
pub(crate) fn offsets(store: &Store, txn: &RoTxn<'_, WithoutTls>) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for item in store.dbs.offsets.iter(txn).map_err(|e| store.err(e))? {
        let (k, v) = item.map_err(|e| store.err(e))?;
        let name = String::from_utf8_lossy(k).into_owned();
        let offset = decode_offset(v)
            .ok_or_else(|| Error::Corrupt { path: store.path.clone(), detail: format!("offset of source {name} is malformed") })?;
        out.push((name, offset));
    }
    Ok(out)
}

pub(crate) fn decode_offset(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.try_into().ok()?))
}

/// Record of node `id` read without a cache (cold paths).
pub(crate) fn read_node(store: &Store, txn: &RoTxn, id: u32) -> Result<NodeRecord> {
    let b = store.dbs.nodes.get(txn, id).map_err(|e| store.err(e))?;
    b.and_then(NodeRecord::decode)
        .ok_or_else(|| Error::Corrupt { path: store.path.clone(), detail: format!("record of node {id} is missing") })
}

/// Validates and prepares a query vector.
pub(crate) fn prepare_query(params: &IndexParams, query: &[f32]) -> Result<Vec<f32>, InvalidInput> {
    params.metric.validate(query, params.dim as usize).map_err(|error| InvalidInput::Vector { at: Location::Query, error })?;
    let mut q = query.to_vec();
    params.metric.prepare(&mut q);
    Ok(q)
}
