//! Searches, counts and scrolls under a filter, on one read session: the
//! planner's choice carried out (`planner`).

use std::collections::BinaryHeap;
use std::sync::Arc;

use roaring::RoaringBitmap;

use crate::cache::SharedAddrs;
use crate::error::{InvalidInput, Result};
use crate::fields::Schema;
use crate::filter::Filter;
use crate::filter::on_index::{Check, Evaluator, Ids, Limits, Set, matching_ids};
use crate::filter::prepare::{self, Node};
use crate::hnsw::{Admit, Scored, greedy_closest, prefetch, walk_layer};
use crate::index::Rescore;
use crate::params::IndexParams;
use crate::planner::{self, Explain, Plan, PlannerOptions};
use crate::quant::{Code, Query, QueryCode, code_bytes};
use crate::stop::Stop;
use crate::store::Store;
use crate::tombstone_set::TombstoneSet;
use crate::view::{Graph, TxnView};

use super::{Hit, SearchParams, Session, StoredPoint, payload};

/// A search's hits and what the shard did to find them.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// Closest first.
    pub hits: Vec<Hit>,
    /// The plan and its work.
    pub explain: Explain,
}

/// One page of a scroll.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    /// Matching points in ascending id order (vectors only if asked for).
    pub points: Vec<StoredPoint>,
    /// The id to pass as `after` for the next page; `None` at the end.
    pub next_after: Option<u64>,
}

/// What the walk admits: live nodes the filter matches.
struct Matching<'a, 't> {
    eval: &'a mut Evaluator<'t>,
    set: &'a Set,
    /// Whether retired ids can pass the set (only checks can).
    tombstones: bool,
}

impl<'g, G: Graph<'g>> Admit<'g, G> for Matching<'_, '_> {
    #[inline]
    fn admit(&mut self, graph: &mut G, id: u32) -> Result<bool> {
        match self.set {
            Set::Ids(b) => Ok(b.contains(id)),
            Set::Check { check, .. } => {
                if self.tombstones && graph.is_tombstone(id)? {
                    return Ok(false);
                }
                self.eval.check(check, id)
            }
        }
    }
}

impl Session {
    /// The field indexes of this session's commit.
    pub(crate) fn schema(&mut self, store: &Store) -> Result<Arc<Schema>> {
        if let Some(s) = &self.schema {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(Schema::read(store, &self.txn)?);
        self.schema = Some(Arc::clone(&s));
        Ok(s)
    }

    /// `filter` checked and resolved against this commit's indexes.
    pub(crate) fn prepare(&mut self, store: &Store, filter: &Filter, allow_unindexed: bool) -> Result<Node> {
        filter.check().map_err(InvalidInput::from)?;
        let schema = self.schema(store)?;
        prepare::prepare(filter, &schema, self.state.next_id, allow_unindexed)
    }

    fn ensure_tombstones(&mut self, store: &Store) -> Result<()> {
        if self.state.tombstones > 0 && self.tombstones.is_none() {
            self.tombstones = Some(TombstoneSet::read(store, &self.txn, &self.state)?);
        }
        Ok(())
    }

    /// Searches the points `node` matches.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search_where(
        &mut self,
        store: &Store,
        shared: &SharedAddrs,
        params: &IndexParams,
        query: &[f32],
        sp: SearchParams,
        rescore: Rescore,
        node: &Node,
        opts: &PlannerOptions,
        stop: &Stop,
    ) -> Result<Found> {
        stop.check()?;
        let state = self.state;
        self.ensure_tombstones(store)?;
        let limits = Limits { gather: opts.scan_max, defer_passes: true };
        let frozen = self.frozen(shared);
        let Session { cache, scratch, found, txn, log, tombstones, columns, list, .. } = self;
        // SAFETY: the session's column cache only holds what its own
        // transaction read.
        let mut eval = unsafe { Evaluator::new(store, txn, state.next_id, state.live, limits, columns) };
        let mut set = eval.eval(node)?;
        let (matches, known) = match &set {
            Set::Ids(b) => (b.len(), true),
            Set::Check { share, count, .. } => (count.unwrap_or((share * state.live as f64).round() as u64), count.is_some()),
        };
        let graph_share = if state.next_id == 0 { 0.0 } else { matches as f64 / f64::from(state.next_id) };
        let mut plan = planner::choose(opts, matches, known, graph_share, sp.ef.max(sp.k), true);
        if let Set::Check { check: Check::Range { field, lo, hi }, count: None, .. } = set
            && matches!(planner::choose(opts, matches, true, graph_share, sp.ef.max(sp.k), true), Plan::Exact | Plan::Scan)
        {
            // A deferred range whose estimate plans a comparison of every
            // match: gather it, and plan again on the exact count.
            set = eval.gather_range(field, lo, hi)?;
            let matches = match &set {
                Set::Ids(b) => b.len(),
                Set::Check { .. } => matches,
            };
            let graph_share = if state.next_id == 0 { 0.0 } else { matches as f64 / f64::from(state.next_id) };
            plan = planner::choose(opts, matches, true, graph_share, sp.ef.max(sp.k), true);
        }
        let (matches, known) = match &set {
            Set::Ids(b) => (b.len(), true),
            Set::Check { .. } => (matches, known),
        };
        if matches!(plan, Plan::Exact | Plan::Scan)
            && let Set::Check { check, .. } = &set
        {
            // Known to be few, but only as a count: find them.
            let ids = matching_ids(&mut eval, check, state.next_id, tombstones.as_ref().and_then(Option::as_ref))?;
            set = Set::Ids(Ids::Bits(ids));
        }
        // SAFETY: `cache` only ever receives pointers read through `txn`: it
        // is created with the session and never shared; `frozen` is derived
        // from the state this txn reads, `log` was paired with it.
        let view = unsafe { TxnView::new(txn, store, cache, frozen, log, params) };
        let mut view = view.with_tombstones(tombstones.as_ref().and_then(Option::as_ref));
        let metric = params.metric;
        scratch.compared = 0;
        let mut compared = 0u64;
        match (&plan, &set) {
            (Plan::Empty, _) => found.clear(),
            (Plan::Exact, Set::Ids(ids)) => {
                let list = listed(list, ids);
                exact(&mut view, metric, query, list, sp.k, found, stop)?;
                compared = ids.len();
            }
            (Plan::Scan, Set::Ids(ids)) => {
                let qc = QueryCode::new(query);
                let keep = sp.k.saturating_mul(opts.scan_rescore.max(1)).max(sp.k);
                let list = listed(list, ids);
                scan(&mut view, metric, &qc, query, list, sp.k, keep, found, stop)?;
                compared = ids.len() + keep.min(ids.len() as usize) as u64;
            }
            _ => {
                plan = Plan::FilteredGraph;
                // A walk asks about every node it meets: a bitmap answers
                // faster than a search of a list.
                if let Set::Ids(ids @ Ids::Sorted(_)) = &mut set {
                    *ids = Ids::Bits(std::mem::replace(ids, Ids::Sorted(Vec::new())).into_bits());
                }
                let Some((entry, top)) = state.entry.filter(|_| state.live > 0) else {
                    found.clear();
                    return Ok(Found { hits: Vec::new(), explain: Explain { plan, matches, matches_exact: known, compared: 0 } });
                };
                let mut ef = sp.ef.max(sp.k);
                if known {
                    ef = ef.min(matches.max(1) as usize);
                }
                let qc = QueryCode::new(query);
                let mut best = Scored { dist: qc.distance(metric, view.code(entry)?), id: entry };
                for l in (1..=top).rev() {
                    best = greedy_closest(&mut view, scratch, metric, &qc, best, l, stop)?;
                }
                let mut admit = Matching { eval: &mut eval, set: &set, tombstones: state.tombstones > 0 };
                walk_layer(&mut view, scratch, metric, &qc, &[best], ef, 0, &mut admit, found, stop)?;
                found.truncate(rescore.count(sp.k, found.len(), known && ef as u64 >= matches));
                stop.check()?;
                let mut pacer = stop.pacer();
                for s in found.iter_mut() {
                    pacer.step()?;
                    s.dist = metric.distance(query, view.vector(s.id)?);
                }
                compared = scratch.compared + found.len() as u64;
                found.sort_unstable();
                found.truncate(sp.k);
            }
        }
        let hits = hits_of(&mut view, store, txn, metric, found, sp.with_payload, stop)?;
        Ok(Found { hits, explain: Explain { plan, matches, matches_exact: known, compared } })
    }

    /// Searches every live point by its exact vector: for a graph that is
    /// mostly tombstones, where a walk would meet mostly dead nodes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search_live_exactly(
        &mut self,
        store: &Store,
        shared: &SharedAddrs,
        params: &IndexParams,
        query: &[f32],
        sp: SearchParams,
        stop: &Stop,
    ) -> Result<Found> {
        let mut ids = RoaringBitmap::new();
        for item in store.dbs.external.iter(&self.txn).map_err(|e| store.err(e))? {
            let (external, internal) = item.map_err(|e| store.err(e))?;
            let internal = crate::codec::decode_mapped_id(internal).ok_or_else(|| crate::Error::Corrupt {
                path: store.path.clone(),
                detail: format!("id map entry of {external} is malformed"),
            })?;
            ids.insert(internal);
        }
        let frozen = self.frozen(shared);
        let Session { cache, found, txn, log, list, .. } = self;
        // SAFETY: as in `search_where`.
        let mut view = unsafe { TxnView::new(txn, store, cache, frozen, log, params) };
        let ids = Ids::Bits(ids);
        let list = listed(list, &ids);
        exact(&mut view, params.metric, query, list, sp.k, found, stop)?;
        let hits = hits_of(&mut view, store, txn, params.metric, found, sp.with_payload, stop)?;
        Ok(Found { hits, explain: Explain { plan: Plan::Exact, matches: ids.len(), matches_exact: true, compared: ids.len() } })
    }

    /// How many live points `node` matches, exactly.
    pub(crate) fn count_where(&mut self, store: &Store, node: &Node, opts: &PlannerOptions) -> Result<u64> {
        let state = self.state;
        if matches!(node, Node::All) {
            return Ok(state.live);
        }
        self.ensure_tombstones(store)?;
        let Session { txn, tombstones, columns, .. } = self;
        // SAFETY: as in `search_where`.
        let mut eval = unsafe {
            Evaluator::new(store, txn, state.next_id, state.live, Limits { gather: opts.scan_max, defer_passes: false }, columns)
        };
        match eval.eval(node)? {
            Set::Ids(b) => Ok(b.len()),
            Set::Check { count: Some(c), .. } => Ok(c),
            Set::Check { check, .. } => {
                Ok(matching_ids(&mut eval, &check, state.next_id, tombstones.as_ref().and_then(Option::as_ref))?.len())
            }
        }
    }

    /// Up to `limit` live points `node` matches with ids above `after`,
    /// in id order.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn scroll_where(
        &mut self,
        store: &Store,
        shared: &SharedAddrs,
        params: &IndexParams,
        node: &Node,
        after: Option<u64>,
        limit: usize,
        with_vector: bool,
        opts: &PlannerOptions,
    ) -> Result<Page> {
        let state = self.state;
        let start = match after {
            Some(u64::MAX) => return Ok(Page { points: Vec::new(), next_after: None }),
            Some(a) => a + 1,
            None => 0,
        };
        let mut picked: Vec<(u64, u32)> = Vec::with_capacity(limit.min(4096) + 1);
        {
            let Session { txn, columns, .. } = &mut *self;
            // SAFETY: as in `search_where`.
            let mut eval = unsafe {
                Evaluator::new(store, txn, state.next_id, state.live, Limits { gather: opts.scan_max, defer_passes: false }, columns)
            };
            let set = if matches!(node, Node::All) { None } else { Some(eval.eval(node)?) };
            match set {
                // Few matches: map them to their ids and sort those, rather
                // than walk the id map past every point that does not match.
                Some(Set::Ids(b)) if b.len() <= (limit as u64).saturating_mul(64).max(4096) => {
                    let mut all = Vec::with_capacity(b.len() as usize);
                    for id in b.into_bits().iter() {
                        let external = super::read_node(store, txn, id)?.external;
                        if external >= start {
                            all.push((external, id));
                        }
                    }
                    all.sort_unstable();
                    all.truncate(limit + 1);
                    picked = all;
                }
                set => {
                    for item in store.dbs.external.iter_from(txn, start).map_err(|e| store.err(e))? {
                        let (external, internal) = item.map_err(|e| store.err(e))?;
                        let internal = crate::codec::decode_mapped_id(internal).ok_or_else(|| crate::Error::Corrupt {
                            path: store.path.clone(),
                            detail: format!("id map entry of {external} is malformed"),
                        })?;
                        let keep = match &set {
                            None => true,
                            Some(Set::Ids(b)) => b.contains(internal),
                            Some(Set::Check { check, .. }) => eval.check(check, internal)?,
                        };
                        if keep {
                            picked.push((external, internal));
                            if picked.len() > limit {
                                break;
                            }
                        }
                    }
                }
            }
        }
        let next_after = (picked.len() > limit).then(|| picked[limit - 1].0);
        picked.truncate(limit);
        let frozen = self.frozen(shared);
        let Session { cache, txn, log, .. } = self;
        // SAFETY: as in `search_where`.
        let mut view = unsafe { TxnView::new(txn, store, cache, frozen, log, params) };
        let mut points = Vec::with_capacity(picked.len());
        for (external, internal) in picked {
            let vector = if with_vector { view.vector(internal)?.to_vec() } else { Vec::new() };
            points.push(StoredPoint { id: external, vector, payload: payload(store, txn, internal)? });
        }
        Ok(Page { points, next_after })
    }
}

/// `ids` as a sorted list, in `buffer`.
fn listed<'b>(buffer: &'b mut Vec<u32>, ids: &'b Ids) -> &'b [u32] {
    let ids = match ids {
        Ids::Sorted(v) => return v,
        Ids::Bits(b) => b,
    };
    buffer.clear();
    buffer.resize(ids.len() as usize, 0);
    // In bulk: an id at a time through the iterator cost as much as a
    // scan's comparison of it.
    let mut it = ids.iter();
    let mut at = 0;
    while at < buffer.len() {
        let n = it.next_many(&mut buffer[at..]).len();
        if n == 0 {
            break;
        }
        at += n;
    }
    buffer.truncate(at);
    buffer
}

/// How many points ahead of the one being compared a scan starts loading:
/// a scan is bound by memory latency, as a walk is (`hnsw::search`).
const AHEAD: usize = 8;

/// The `k` nearest of `ids` by their exact vectors, into `out`, closest
/// first.
fn exact(
    view: &mut TxnView<'_>,
    metric: crate::Metric,
    query: &[f32],
    ids: &[u32],
    k: usize,
    out: &mut Vec<Scored>,
    stop: &Stop,
) -> Result<()> {
    let bytes = std::mem::size_of_val(query);
    let mut heap: BinaryHeap<Scored> = BinaryHeap::with_capacity(k + 1);
    let mut pacer = stop.pacer();
    // Each vector found once, when its prefetch starts, and kept until
    // its turn: finding it costs as much as half its distance.
    let mut ring: [&[f32]; AHEAD] = [&[]; AHEAD];
    for (slot, &id) in ring.iter_mut().zip(ids) {
        let v = view.vector(id)?;
        prefetch(v.as_ptr().cast(), bytes);
        *slot = v;
    }
    for (i, &id) in ids.iter().enumerate() {
        if i % 16 == 0 {
            pacer.step()?;
        }
        let v = ring[i % AHEAD];
        if let Some(&next) = ids.get(i + AHEAD) {
            let n = view.vector(next)?;
            prefetch(n.as_ptr().cast(), bytes);
            ring[i % AHEAD] = n;
        }
        let d = metric.distance(query, v);
        if heap.len() < k {
            heap.push(Scored { dist: d, id });
        } else if heap.peek().is_some_and(|w| d < w.dist) {
            heap.pop();
            heap.push(Scored { dist: d, id });
        }
    }
    out.clear();
    out.extend(heap.into_vec());
    out.sort_unstable();
    Ok(())
}

/// The `k` nearest of `ids`: the best `keep` by their codes, re-scored by
/// their exact vectors.
#[allow(clippy::too_many_arguments)]
fn scan(
    view: &mut TxnView<'_>,
    metric: crate::Metric,
    qc: &QueryCode,
    query: &[f32],
    ids: &[u32],
    k: usize,
    keep: usize,
    out: &mut Vec<Scored>,
    stop: &Stop,
) -> Result<()> {
    let dim = qc.dim();
    let bytes = code_bytes(dim);
    let mut heap: BinaryHeap<Scored> = BinaryHeap::with_capacity(keep + 1);
    let mut pacer = stop.pacer();
    // The block of codes the last id was in: ascending ids meet each block
    // once, and find their codes in it by slot.
    let (mut start, mut first, mut len) = (std::ptr::null::<u8>(), 0u32, 0u32);
    let mut code_of = |view: &mut TxnView<'_>, id: u32| -> Result<*const u8> {
        if id < first || id - first >= len {
            (start, first, len) = view.code_run(id)?;
        }
        Ok(start.wrapping_add((id - first) as usize * bytes))
    };
    let mut ring = [std::ptr::null::<u8>(); AHEAD];
    for (slot, &id) in ring.iter_mut().zip(ids) {
        let p = code_of(view, id)?;
        prefetch(p, bytes);
        *slot = p;
    }
    let mut worst = f32::INFINITY;
    for (i, &id) in ids.iter().enumerate() {
        if i % 64 == 0 {
            pacer.step()?;
        }
        let p = ring[i % AHEAD];
        if let Some(&next) = ids.get(i + AHEAD) {
            let q = code_of(view, next)?;
            prefetch(q, bytes);
            ring[i % AHEAD] = q;
        }
        // SAFETY: `p` lies in the block `view.code_run` returned for `id`,
        // at `id`'s slot, which the block holds: a code of `dim`
        // components in a page of the view's transaction, still open.
        let code = unsafe { Code::from_raw(p, dim) };
        let d = qc.distance(metric, code);
        if d < worst || heap.len() < keep {
            heap.push(Scored { dist: d, id });
            if heap.len() > keep {
                heap.pop();
            }
            if heap.len() == keep {
                worst = heap.peek().map_or(f32::INFINITY, |w| w.dist);
            }
        }
    }
    out.clear();
    let best = heap.into_vec();
    for s in &best {
        prefetch(view.vector(s.id)?.as_ptr().cast(), std::mem::size_of_val(query));
    }
    for s in best {
        pacer.step()?;
        out.push(Scored { dist: metric.distance(query, view.vector(s.id)?), id: s.id });
    }
    out.sort_unstable();
    out.truncate(k);
    Ok(())
}

/// Hits for `found` (exact distances, closest first).
fn hits_of(
    view: &mut TxnView<'_>,
    store: &Store,
    txn: &heed::RoTxn<'_, heed::WithoutTls>,
    metric: crate::Metric,
    found: &[Scored],
    with_payload: bool,
    stop: &Stop,
) -> Result<Vec<Hit>> {
    let mut pacer = stop.pacer();
    let mut hits = Vec::with_capacity(found.len());
    for s in found {
        pacer.step()?;
        let record = view.node(s.id)?;
        let payload = if with_payload { payload(store, txn, s.id)? } else { None };
        hits.push(Hit { id: record.external, distance: metric.reported(s.dist), payload });
    }
    Ok(hits)
}
