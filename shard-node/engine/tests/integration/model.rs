//! Random batches of upserts and deletes against a brute-force model.

use std::collections::BTreeMap;

use proptest::prelude::*;
use shoal_engine::{Batch, BatchOutcome, Error, IndexOptions, IndexParams, InvalidInput, LinkLog, Metric, Op, Point, SearchParams};

use crate::common::{Fixture, assert_exact, brute_force, test_options};

const DIM: usize = 6;
const IDS: u64 = 40;

/// Batches of operations, each with an optional source offset.
type History = Vec<(Vec<ModelOp>, Option<u64>)>;

#[derive(Clone, Debug)]
enum ModelOp {
    Upsert(u64, Vec<f32>, bool),
    Delete(u64),
    DeleteIfPresent(u64),
}

fn vector() -> impl Strategy<Value = Vec<f32>> {
    // Integers scaled down: exact ties are possible (and handled), NaN never.
    proptest::collection::vec((-8i8..=8).prop_map(|x| f32::from(x) / 8.0), DIM)
        .prop_filter("cosine needs a direction", |v| v.iter().any(|x| *x != 0.0))
}

fn op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        4 => (0..IDS, vector(), any::<bool>()).prop_map(|(id, v, p)| ModelOp::Upsert(id, v, p)),
        1 => (0..IDS).prop_map(ModelOp::Delete),
        1 => (0..IDS).prop_map(ModelOp::DeleteIfPresent),
    ]
}

fn batches() -> impl Strategy<Value = Vec<(Vec<ModelOp>, Option<u64>)>> {
    proptest::collection::vec((proptest::collection::vec(op(), 1..25), proptest::option::of(0u64..12)), 1..8)
}

/// What the model predicts for a batch: its outcome, applied to `points`
/// and `offset` only if the index must accept it.
fn predict(
    points: &mut BTreeMap<u64, (Vec<f32>, Option<Vec<u8>>)>,
    offset: &mut Option<u64>,
    ops: &[ModelOp],
    batch_offset: Option<u64>,
) -> Result<BatchOutcome, InvalidInput> {
    if let (Some(o), Some(cur)) = (batch_offset, *offset)
        && o <= cur
    {
        return Ok(BatchOutcome::Skipped { current: cur });
    }
    let mut next = points.clone();
    // Each id counts once, by its state before and after the batch: left
    // holding one of the batch's points, gone, or absent throughout after
    // a DeleteIfPresent found nothing.
    let mut named = BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            ModelOp::Upsert(id, v, p) => {
                next.insert(*id, (v.clone(), p.then(|| id.to_le_bytes().to_vec())));
                named.entry(*id).or_insert(false);
            }
            ModelOp::Delete(id) => {
                if next.remove(id).is_none() {
                    return Err(InvalidInput::UnknownId { op: i, id: *id });
                }
                named.entry(*id).or_insert(false);
            }
            ModelOp::DeleteIfPresent(id) => {
                let found_absent = next.remove(id).is_none();
                *named.entry(*id).or_insert(false) |= found_absent;
            }
        }
    }
    let (mut upserted, mut deleted, mut missing) = (0, 0, 0);
    for (id, found_absent) in named {
        match (points.contains_key(&id), next.contains_key(&id)) {
            (_, true) => upserted += 1,
            (true, false) => deleted += 1,
            (false, false) if found_absent => missing += 1,
            (false, false) => {}
        }
    }
    *points = next;
    if batch_offset.is_some() {
        *offset = batch_offset;
    }
    Ok(BatchOutcome::Applied { upserted, deleted, missing })
}

fn to_batch(ops: &[ModelOp], offset: Option<u64>) -> Batch {
    let mut b = Batch {
        ops: ops
            .iter()
            .map(|op| match op {
                ModelOp::Upsert(id, v, p) => {
                    Op::Upsert(Point { id: *id, vector: v.clone(), payload: p.then(|| id.to_le_bytes().to_vec()) })
                }
                ModelOp::Delete(id) => Op::Delete(*id),
                ModelOp::DeleteIfPresent(id) => Op::DeleteIfPresent(*id),
            })
            .collect(),
        source: None,
    };
    if let Some(o) = offset {
        b = b.with_source("model", o);
    }
    b
}

/// Repeats every vector `times` times over: distances keep their order, and
/// wide vectors take LMDB's other storage path (a value larger than half a
/// page lives in overflow pages of its own), which narrow ones never reach.
fn widen(history: History, queries: Vec<Vec<f32>>, times: usize) -> (History, Vec<Vec<f32>>) {
    let history = history
        .into_iter()
        .map(|(ops, o)| {
            let ops = ops
                .into_iter()
                .map(|op| match op {
                    ModelOp::Upsert(id, v, p) => ModelOp::Upsert(id, v.repeat(times), p),
                    other @ (ModelOp::Delete(_) | ModelOp::DeleteIfPresent(_)) => other,
                })
                .collect();
            (ops, o)
        })
        .collect();
    (history, queries.into_iter().map(|q| q.repeat(times)).collect())
}

/// Where batches write existing nodes' changed lists: in place, or to the
/// link log folded after a few to a few hundred lists (every fold point
/// and a log of many values get tried).
fn link_log() -> impl Strategy<Value = LinkLog> {
    prop_oneof![Just(LinkLog::Off), Just(LinkLog::default()), (1usize..300).prop_map(|fold_lists| LinkLog::Always { fold_lists }),]
}

fn check(metric: Metric, link_log: LinkLog, reuse_retired: bool, history: History, queries: Vec<Vec<f32>>) {
    let dim = queries.first().map_or(DIM, Vec::len);
    let opts = IndexOptions { link_log, reuse_retired, ..test_options() };
    let mut fx = Fixture::with(IndexParams::new(dim as u32, metric), opts.clone());
    let mut points = BTreeMap::new();
    let mut offset = None;
    let mut stats_before: Option<(u64, u64)> = None;
    for (step, (ops, batch_offset)) in history.iter().enumerate() {
        // Half-way, the index restarts: what it knows of the link log must
        // come back from the file.
        if step == history.len() / 2 && step > 0 {
            fx = fx.reopen(opts.clone());
        }
        let want = predict(&mut points, &mut offset, ops, *batch_offset);
        let got = fx.index.apply(to_batch(ops, *batch_offset));
        match (&got, &want) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "step {step}"),
            (Err(Error::Invalid(g)), Err(w)) => assert_eq!(g, w, "step {step}"),
            _ => panic!("step {step}: got {got:?}, model says {want:?}"),
        }
        let before = stats_before.take();
        let stats = fx.index.stats().unwrap();
        assert_eq!(stats.live, points.len() as u64, "step {step}: live count");
        // With reuse, a batch's new points fill retired slots before any
        // new id is taken: the node count grows only past the tombstones
        // (all but the entry point, which is never reused).
        if let (true, Some((nodes, tombstones)), Ok(BatchOutcome::Applied { upserted, .. })) = (reuse_retired, before, &got) {
            let now = stats.live + stats.tombstones;
            assert!(
                now <= nodes + (*upserted as u64).saturating_sub(tombstones.saturating_sub(1)),
                "step {step}: {now} nodes after {nodes} with {tombstones} tombstones and {upserted} upserts"
            );
        }
        stats_before = Some((stats.live + stats.tombstones, stats.tombstones));
        assert_eq!(fx.index.offset("model").unwrap(), offset, "step {step}: offset");

        let model: Vec<(u64, Vec<f32>)> = points.iter().map(|(id, (v, _))| (*id, v.clone())).collect();
        for (qi, q) in queries.iter().enumerate() {
            // ef far above the point count: the search must be exact.
            let hits = fx.index.search(q, SearchParams { k: 5, ef: 256, with_payload: true }).unwrap();
            let want = brute_force(metric, &model, q, 5);
            assert_exact(&hits, &want, &format!("{metric} step {step} query {qi}"));
            for h in &hits {
                assert_eq!(h.payload, points[&h.id].1, "payload of {}", h.id);
            }
        }
        for id in 0..IDS {
            let stored = fx.index.get(id).unwrap();
            assert_eq!(stored.is_some(), points.contains_key(&id), "step {step}: get({id})");
            if let Some(p) = stored {
                assert_eq!(p.payload, points[&id].1);
                if metric != Metric::Cosine {
                    assert_eq!(p.vector, points[&id].0);
                }
            }
        }
    }
}

proptest! {
    // 256 cases per metric by default; PROPTEST_CASES raises it for soaks.
    #[test]
    fn cosine_index_matches_the_model(
        history in batches(),
        queries in proptest::collection::vec(vector(), 3),
        log in link_log(),
        reuse in any::<bool>(),
    ) {
        check(Metric::Cosine, log, reuse, history, queries);
    }

    #[test]
    fn euclidean_index_matches_the_model(
        history in batches(),
        queries in proptest::collection::vec(vector(), 3),
        log in link_log(),
        reuse in any::<bool>(),
    ) {
        check(Metric::Euclidean, log, reuse, history, queries);
    }

    #[test]
    fn dot_index_matches_the_model(
        history in batches(),
        queries in proptest::collection::vec(vector(), 3),
        log in link_log(),
        reuse in any::<bool>(),
    ) {
        check(Metric::Dot, log, reuse, history, queries);
    }
}

proptest! {
    // 600 dimensions: 2,400-byte vectors, each in an overflow page.
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn wide_vectors_in_overflow_pages_match_the_model(
        history in batches(),
        queries in proptest::collection::vec(vector(), 3),
        metric in prop_oneof![Just(Metric::Cosine), Just(Metric::Euclidean), Just(Metric::Dot)],
        log in link_log(),
        reuse in any::<bool>(),
    ) {
        let (history, queries) = widen(history, queries, 100);
        check(metric, log, reuse, history, queries);
    }
}

/// Re-scoring only the best `k × n` candidates still returns exact
/// distances of the ids it returns, and nearly the exact top-k.
#[test]
fn partial_rescoring_returns_exact_distances() {
    use rand::Rng;
    let mut rng = crate::common::rng("partial_rescoring_returns_exact_distances");
    let dim = 32;
    for metric in Metric::ALL {
        let opts = shoal_engine::IndexOptions { rescore: shoal_engine::Rescore::TopK(1), ..crate::common::test_options() };
        let fx = Fixture::with(shoal_engine::IndexParams::new(dim as u32, metric), opts);
        let points: Vec<(u64, Vec<f32>)> =
            (0..2000u64).map(|id| (id, (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect())).collect();
        fx.index.apply(Batch::upserts(points.clone())).unwrap();
        let mut found = 0;
        for _ in 0..50 {
            let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let hits = fx.index.search(&q, SearchParams::new(10, 100)).unwrap();
            let all = brute_force(metric, &points, &q, points.len());
            for h in &hits {
                let exact = all.iter().find(|(id, _)| *id == h.id).map(|(_, d)| *d).unwrap();
                assert!((h.distance - exact).abs() <= 1e-4 * exact.abs().max(1.0), "{metric}: {} at {} vs {exact}", h.id, h.distance);
            }
            assert!(hits.windows(2).all(|w| w[0].distance <= w[1].distance), "{metric}: not sorted");
            let truth: Vec<u64> = all.iter().take(10).map(|(id, _)| *id).collect();
            found += hits.iter().filter(|h| truth.contains(&h.id)).count();
        }
        // Codes rank 32-d random vectors well enough for ~90% recall@10.
        assert!(found >= 400, "{metric}: recall {found}/500");
    }
}
