//! Rounds of upserts, deletes and inserts: retired slots are reused, the
//! index stays the size of its live set, and reads stay exact while slots
//! change owners under them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use shoal_engine::{Batch, IndexOptions, IndexParams, Metric, Op, Point, SearchParams};

use crate::common::{Fixture, brute_force, random_vector, rng, test_options};

const DIM: usize = 16;

/// One round on `points` (the model): deletes 3%, then upserts 10% with
/// new vectors and inserts 3% new ids, as two batches.
fn round(rng: &mut StdRng, points: &mut BTreeMap<u64, Vec<f32>>, next_id: &mut u64) -> (Batch, Batch) {
    let mut ids: Vec<u64> = points.keys().copied().collect();
    ids.shuffle(rng);
    let n = ids.len();
    let (nd, nu, ni) = (n * 3 / 100, n / 10, n * 3 / 100);
    let deletes: Vec<Op> = ids[..nd].iter().map(|&id| Op::Delete(id)).collect();
    for id in &ids[..nd] {
        points.remove(id);
    }
    let mut ops = Vec::new();
    for &id in &ids[nd..nd + nu] {
        let v = random_vector(rng, DIM);
        points.insert(id, v.clone());
        ops.push(Op::Upsert(Point { id, vector: v, payload: None }));
    }
    for _ in 0..ni {
        let v = random_vector(rng, DIM);
        points.insert(*next_id, v.clone());
        ops.push(Op::Upsert(Point { id: *next_id, vector: v, payload: None }));
        *next_id += 1;
    }
    (Batch { ops: deletes, source: None }, Batch { ops, source: None })
}

fn recall(fx: &Fixture, points: &BTreeMap<u64, Vec<f32>>, rng: &mut StdRng) -> f64 {
    let model: Vec<(u64, Vec<f32>)> = points.iter().map(|(id, v)| (*id, v.clone())).collect();
    let (mut hits, mut total) = (0, 0);
    for _ in 0..40 {
        let q = random_vector(rng, DIM);
        let want: Vec<u64> = brute_force(Metric::Cosine, &model, &q, 10).into_iter().map(|(id, _)| id).collect();
        let got = fx.index.search(&q, SearchParams::new(10, 64)).unwrap();
        for h in &got {
            assert!(points.contains_key(&h.id), "search returned {}, which is not live", h.id);
        }
        hits += got.iter().filter(|h| want.contains(&h.id)).count();
        total += want.len();
    }
    hits as f64 / total as f64
}

#[test]
fn churn_reuses_retired_slots_and_keeps_recall() {
    let mut rng = rng("churn_reuses_retired_slots_and_keeps_recall");
    let params = IndexParams::new(DIM as u32, Metric::Cosine);
    let opts = IndexOptions { reuse_retired: true, ..test_options() };
    let mut fx = Fixture::with(params, opts.clone());
    let mut points: BTreeMap<u64, Vec<f32>> = (0..1500).map(|id| (id, random_vector(&mut rng, DIM))).collect();
    let initial: Vec<Op> = points.iter().map(|(&id, v)| Op::Upsert(Point { id, vector: v.clone(), payload: None })).collect();
    fx.index.apply(Batch { ops: initial, source: None }).unwrap();
    let start_recall = recall(&fx, &points, &mut rng);
    let mut next_id = 1500;
    for r in 0..8 {
        if r == 4 {
            fx = fx.reopen(opts.clone());
        }
        let (deletes, upserts) = round(&mut rng, &mut points, &mut next_id);
        fx.index.apply(deletes).unwrap();
        let retired = fx.index.stats().unwrap().tombstones;
        fx.index.apply(upserts).unwrap();
        let s = fx.index.stats().unwrap();
        assert_eq!(s.live, points.len() as u64, "round {r}");
        // The second batch filled the slots the first one retired (all but
        // the entry point's) and retired the upserted points' old ones.
        assert!(s.tombstones <= 150 + 1, "round {r}: {} tombstones after refilling {retired}", s.tombstones);
        assert!(s.live + s.tombstones <= 1500 + 151, "round {r}: {} nodes", s.live + s.tombstones);
        // Every reused slot answers with its new owner's vector.
        for (&id, v) in points.iter().step_by(37) {
            let stored = fx.index.get(id).unwrap().unwrap_or_else(|| panic!("round {r}: {id} is missing"));
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            for (a, b) in stored.vector.iter().zip(v) {
                assert!((a - b / norm).abs() < 1e-5, "round {r}: vector of {id}");
            }
        }
        let rc = recall(&fx, &points, &mut rng);
        assert!(rc >= start_recall - 0.05 && rc >= 0.9, "round {r}: recall {rc} (at the start {start_recall})");
    }
}

#[test]
fn without_reuse_tombstones_pile_up() {
    let mut rng = rng("without_reuse_tombstones_pile_up");
    let opts = IndexOptions { reuse_retired: false, ..test_options() };
    let fx = Fixture::with(IndexParams::new(DIM as u32, Metric::Cosine), opts);
    let mut points: BTreeMap<u64, Vec<f32>> = (0..500).map(|id| (id, random_vector(&mut rng, DIM))).collect();
    let initial: Vec<Op> = points.iter().map(|(&id, v)| Op::Upsert(Point { id, vector: v.clone(), payload: None })).collect();
    fx.index.apply(Batch { ops: initial, source: None }).unwrap();
    let mut next_id = 500;
    for _ in 0..3 {
        let (d, u) = round(&mut rng, &mut points, &mut next_id);
        fx.index.apply(d).unwrap();
        fx.index.apply(u).unwrap();
    }
    // 3 rounds × (15 deleted + 50 replaced): the option really is off.
    assert_eq!(fx.index.stats().unwrap().tombstones, 3 * (15 + 50));
}

/// Readers on snapshots while a writer reuses slots: within one snapshot,
/// every hit's distance is the distance to the vector `get` returns for it
/// in the same snapshot. A reader trusting an address of a page that a
/// reuse moved would see another point's vector here.
#[test]
fn snapshots_stay_consistent_while_slots_are_reused() {
    let mut rng = rng("snapshots_stay_consistent_while_slots_are_reused");
    let fx = Fixture::with(IndexParams::new(DIM as u32, Metric::Euclidean), test_options());
    let mut points: BTreeMap<u64, Vec<f32>> = (0..1200).map(|id| (id, random_vector(&mut rng, DIM))).collect();
    let initial: Vec<Op> = points.iter().map(|(&id, v)| Op::Upsert(Point { id, vector: v.clone(), payload: None })).collect();
    fx.index.apply(Batch { ops: initial, source: None }).unwrap();
    let done = AtomicBool::new(false);
    let queries: Vec<Vec<f32>> = (0..32).map(|_| random_vector(&mut rng, DIM)).collect();
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (index, done, queries) = (&fx.index, &done, &queries);
                s.spawn(move || {
                    let mut checked = 0u64;
                    while !done.load(Ordering::Relaxed) || checked == 0 {
                        for q in queries.iter().skip(t).step_by(2) {
                            let mut snap = index.snapshot().unwrap();
                            for h in snap.search(q, SearchParams::new(5, 48)).unwrap() {
                                let p = snap.get(h.id).unwrap().unwrap_or_else(|| panic!("hit {} has no point in its snapshot", h.id));
                                let d = p.vector.iter().zip(q).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
                                assert!(
                                    (d - h.distance).abs() <= 1e-3 * d.max(1.0),
                                    "hit {}: distance {} but its vector is at {d}",
                                    h.id,
                                    h.distance
                                );
                                checked += 1;
                            }
                        }
                    }
                    checked
                })
            })
            .collect();
        let mut next_id = 1200;
        for _ in 0..12 {
            let (d, u) = round(&mut rng, &mut points, &mut next_id);
            fx.index.apply(d).unwrap();
            fx.index.apply(u).unwrap();
        }
        done.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    });
    let s = fx.index.stats().unwrap();
    assert!(s.live + s.tombstones <= 1200 + 121, "{s:?}");
}
